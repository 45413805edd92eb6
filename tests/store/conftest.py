"""Store backends for the store tests: a SQLite file, and Postgres at 127.0.0.1:5432 in a schema of its own."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Select, create_engine, event, text
from sqlalchemy.engine import Engine

from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.runs import create_run

POSTGRES_URL = os.environ.get("BENCHWRIGHT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _postgres_schema_url() -> Iterator[str]:
    schema = f"bw_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
    except Exception as exc:  # report why and skip, never silently (re-raised on CI)
        admin.dispose()
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Postgres at {POSTGRES_URL} is not reachable ({type(exc).__name__}); set "
                    "BENCHWRIGHT_TEST_POSTGRES_URL to run the Postgres half of the store tests")
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        # Named for its schema too, so a test acting on its own sessions (pg_stat_activity) leaves the other test
        # process's alone.
        yield f"{POSTGRES_URL}{sep}application_name={schema}&options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        yield from _postgres_schema_url()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """Postgres alone, for what only Postgres does (its ``COPY``, its connections)."""
    yield from _postgres_schema_url()


@pytest.fixture
def store_run(db_url: str) -> tuple[Engine, str]:
    """A migrated store (each of ``db_url``'s) and the id of one run in it, of an account of its own."""
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="store-run")
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})
    return engine, run.id


@contextmanager
def round_trips(engine: Engine) -> Iterator[list[int]]:
    """How many round trips to Postgres the block makes on ``engine``'s pooled connections: libpq's trace of each
    connection checked out meanwhile, counted by the server's ReadyForQuery messages (one ends every exchange: a
    simple query, BEGIN and COMMIT included, or an extended query's Sync). The count is in the list after the block.
    """
    counted: list[int] = []
    with tempfile.TemporaryFile() as trace:
        def on_checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
            dbapi_conn.pgconn.trace(trace.fileno())

        def on_checkin(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.pgconn.untrace()

        event.listen(engine.pool, "checkout", on_checkout)
        event.listen(engine.pool, "checkin", on_checkin)
        try:
            yield counted
        finally:
            event.remove(engine.pool, "checkout", on_checkout)
            event.remove(engine.pool, "checkin", on_checkin)
        trace.seek(0)
        counted.append(sum(1 for line in trace.read().decode(errors="replace").splitlines()
                           if line.split("\t")[1:4:2] == ["B", "ReadyForQuery"]))


def explain(engine: Engine, statement: Select[Any], params: dict[str, Any], table: str) -> str:
    """The plan the store makes for ``statement`` with ``params`` (``table`` analyzed first, as a store in use would
    be): SQLite's ``EXPLAIN QUERY PLAN`` rows, or Postgres's ``EXPLAIN`` lines."""
    compiled = statement.compile(dialect=engine.dialect)
    values = {key: value.isoformat(" ") if isinstance(value, datetime) else value
              for key, value in compiled.construct_params(params).items()}
    with engine.connect() as conn:
        driver: Any = conn.connection.dbapi_connection
        cursor = driver.cursor()
        try:
            if engine.dialect.name == "sqlite":
                cursor.execute("ANALYZE")
                cursor.execute(f"EXPLAIN QUERY PLAN {compiled.string}",
                               tuple(values[key] for key in compiled.positiontup or ()))
                return "\n".join(str(row) for row in cursor.fetchall())
            cursor.execute(f"ANALYZE {table}")
            cursor.execute(f"EXPLAIN {compiled.string}", values)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.close()
