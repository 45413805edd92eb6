"""A run's row settling (it finished, or was halted), told at once on Postgres (issue 25).

The API's long poll (``GET /v1/runs/{id}?wait_s=``) answers when the run's row settles. Without word from the store
it learns of it through Temporal: the workflow task that ran the run's end completes, the history's long poll
answers, then the row is read, 20-30 ms after the terminal event committed on Postgres (``bench/timeline.py``). On
Postgres the transaction that settles the row also sends ``NOTIFY bw_run_settled, '<run id>'`` (``notify_settled``,
delivered when it commits), and the API keeps one connection listening (``SettledListener``) that wakes the long
polls waiting for that run. SQLite has no such channel between processes: there the long poll goes by Temporal's
word and its own periodic re-read, which on Postgres also cover a notification lost with the listener's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session

__all__ = ["CHANNEL", "SettledListener", "notify_settled"]

CHANNEL = "bw_run_settled"
_log = logging.getLogger(__name__)

_NOTIFY = text("SELECT pg_notify(:channel, :run_id)")


def notify_settled(session: Session, run_id: str) -> None:
    """In the transaction that settles ``run_id``'s row: on Postgres, tell the listeners when it commits."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_NOTIFY, {"channel": CHANNEL, "run_id": run_id})


class SettledListener:
    """One Postgres connection of its own, in a thread, listening on ``CHANNEL``; ``waiting(run_id, event)`` sets
    ``event`` (on the loop that registered it) when that run's row settles. A lost connection is made again
    (backing off up to ``MAX_BACKOFF_S``); meanwhile nothing is told, and the long poll's other ways cover it."""

    POLL_S = 0.5
    """How often the thread looks up from its connection to see whether it should stop."""
    MAX_BACKOFF_S = 30.0

    def __init__(self, engine: Engine) -> None:
        self._url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.listening = threading.Event()
        """Set while the connection listens (tests wait for it)."""
        self.connections = 0
        """Connections made so far (a reconnection makes it grow)."""
        self._thread = threading.Thread(target=self._run, name="run-settled-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.POLL_S * 4)

    @contextlib.contextmanager
    def waiting(self, run_id: str, event: asyncio.Event) -> Iterator[None]:
        """While inside: ``event`` is set when ``run_id``'s row settles."""
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.setdefault(run_id, set()).add(entry)
        try:
            yield
        finally:
            with self._lock:
                waiters = self._waiters.get(run_id)
                if waiters is not None:
                    waiters.discard(entry)
                    if not waiters:
                        del self._waiters[run_id]

    def waits_for(self, run_id: str) -> bool:
        """Whether someone is waiting for ``run_id`` now."""
        with self._lock:
            return run_id in self._waiters

    def _wake(self, run_id: str) -> None:
        with self._lock:
            waiters = list(self._waiters.get(run_id, ()))
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def _run(self) -> None:
        import psycopg

        backoff = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connections += 1
                    self.listening.set()
                    backoff = 0.5
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=self.POLL_S):
                            self._wake(note.payload)
            except Exception as exc:  # noqa: BLE001 - whatever broke the connection, the thread makes another
                _log.info("the run-settled listener lost its connection (%s); again in %.1f s", exc, backoff)
            finally:
                self.listening.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.MAX_BACKOFF_S)
