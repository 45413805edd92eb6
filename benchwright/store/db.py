"""Engine construction and schema migrations for the store (SQLite by default, Postgres in production)."""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DisconnectionError
from sqlmodel import Session, create_engine

from benchwright import fastjson

_MIGRATIONS = Path(__file__).parent / "migrations"
_migrate_lock = threading.Lock()
T = TypeVar("T")
log = logging.getLogger("benchwright.store")


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a generous busy timeout and foreign keys.

    SQLite serializes writers; WAL lets readers (the API, SSE) proceed while a worker appends, and the busy timeout
    makes a second writer wait instead of failing.
    """
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60},
                               json_serializer=fastjson.dumps)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        return engine
    engine = create_engine(url, pool_size=10, max_overflow=20, json_serializer=fastjson.dumps)
    event.listen(engine.pool, "checkout", _check_out)
    return engine


def reader(engine: Engine) -> Engine:
    """``engine`` for statements that only read. On Postgres each statement runs on its own in autocommit: one round
    trip instead of three (BEGIN, the statement, then COMMIT or ROLLBACK; measured with psycopg on loopback, 0.64
    against 0.18 ms for a one-row read). Each statement still sees committed data only, through a snapshot of its
    own, as each statement of the READ COMMITTED transaction it replaces did (Postgres takes a new snapshot per
    statement at that level, its default and ours). Not for a read that locks rows, nor one that a write in the same
    transaction depends on. On SQLite: ``engine`` itself. Shares ``engine``'s pool."""
    if engine.dialect.name != "postgresql":
        return engine
    found: Engine | None = vars(engine).get("_benchwright_reader")
    if found is None:  # kept on the engine itself (a cycle the collector frees with it; a weak map's value would not)
        found = engine.execution_options(isolation_level="AUTOCOMMIT")
        vars(engine)["_benchwright_reader"] = found
    return found


def _check_out(dbapi_conn: Any, record: Any, proxy: Any) -> None:
    """A pooled Postgres connection is checked before use, without a round trip while it is evidently alive: an idle
    connection's socket has nothing to read unless the server has written to it, and a server that restarted or cut
    the connection has (its FATAL message, then end of file). Only then does it get the ``SELECT 1`` that
    ``pool_pre_ping`` would send every time (~0.3 ms a transaction on loopback, the round trip and the server's
    work, measured: 1.14 against 0.85 ms for a one-statement transaction); a dead one is replaced by the pool.

    Raises:
        DisconnectionError: the connection is dead (the pool discards it and checks out another).
    """
    try:
        readable = _readable(dbapi_conn.fileno())
    except (OSError, ValueError, AttributeError):
        readable = True  # closed here already, or not a socket we can watch: ask the server
    if not readable:
        return
    try:
        # In autocommit the ping is one round trip and leaves no transaction behind: the pool hands out idle
        # connections only (the reader's AUTOCOMMIT cannot be set inside one: "can't change 'autocommit' now", seen in
        # a CI rehearsal), and closing one with ROLLBACK would deallocate every statement psycopg prepared on it.
        was_autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT 1")
        dbapi_conn.autocommit = was_autocommit
    except Exception as exc:
        raise DisconnectionError(f"the store's connection was lost ({exc})") from exc


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read, without waiting. ``poll``, not ``select``: a busy worker's descriptors
    pass 1,024, where ``select`` refuses ("filedescriptor out of range", seen in CI), and every check-out then took the
    ping."""
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent; safe to call at every start)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with _migrate_lock, engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


STORE_OUTAGE_S = 120.0
"""How long store I/O is retried in place while the store is out (a restarting Postgres, a full disk) before the
failure is handed to Temporal's retry policy (``store_outage``, ``activities.common.in_thread``)."""
_SQLITE_OUTAGES = ("disk is full", "disk i/o error", "unable to open database", "database is locked",
                   "readonly database")


def store_outage(exc: BaseException) -> str | None:
    """Plain words for ``exc`` when it says the store is out for a while (a lost or refused connection, a server
    starting up, a full disk) rather than that the statement is wrong; else None."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    if not isinstance(exc, DBAPIError):
        return None
    said = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    if exc.connection_invalidated:
        return f"the store's connection was lost ({said})"
    if not isinstance(exc, OperationalError):
        return None
    if type(exc.orig).__module__.startswith("sqlite3"):
        low = said.lower()
        if not any(m in low for m in _SQLITE_OUTAGES):
            return None
        if "full" in low:
            return f"the store's disk is full ({said}); free space in the data directory"
        return f"the store cannot write ({said})"
    return f"the store is unavailable ({said})"


class StoreUnavailable(RuntimeError):
    """The store stayed out for longer than ``STORE_OUTAGE_S``; transient (Temporal's retry policy takes over)."""


async def outage_tolerant(fn: Callable[..., T], *args: Any, bound_s: float = STORE_OUTAGE_S, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a thread, tried again in place while the store is out (``store_outage``).

    Store writes are keyed (idempotent) and a failed transaction rolled back, so a second try is what a retry of
    the whole activity would do, without spending its attempts in the first second of a Postgres restart.

    Raises:
        StoreUnavailable: still out after ``bound_s``, in plain words.
    """
    deadline = time.monotonic() + bound_s
    wait = 0.1
    while True:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:
            outage = store_outage(exc)
            if outage is None:
                raise
            if time.monotonic() + wait > deadline:
                raise StoreUnavailable(f"{outage}; still failing after {bound_s:g} s") from exc
            log.warning("%s; trying again in %.1f s", outage, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 2.0)
