"""A run's row settling (it finished, or was halted), told at once to the API's long polls (issue 25).

The API's long poll (``GET /v1/runs/{id}?wait_s=``) answers when the run's row settles. Without word from the store
it learns of it through Temporal: the workflow task that ran the run's end completes, the history's long poll
answers, then the row is read, 15-30 ms after the terminal event committed (``bench/timeline.py``). So the
transaction that settles a row says so (``notify_settled``), and each API process listens:

- **Postgres**: ``NOTIFY bw_run_settled, '<run id>'`` in that transaction, delivered when it commits, sent by the
  trigger ``bw_runs_settled`` on the row's ``UPDATE`` (migration 0022: no round trip of its own); the API keeps one
  connection listening (``SettledListener``).
- **SQLite** (a database file, shared by the processes of one machine): once the transaction commits, a datagram
  with the run's id to each API process listening beside that file (``SocketSettledListener``). Each binds a Unix
  datagram socket in a private temporary directory (a socket path must stay short) and links it from the channel
  directory next to the database (``<database>.settled/``), which the sender reads. A sender only writes to sockets
  of its own user; a link whose socket nobody reads, or whose socket and process are both gone (its API died), is
  removed by the next sender.

A wake-up only makes the long poll read the run's row again, so a word lost (a listener's connection down, a full
socket buffer) costs time, never an answer: Temporal's word and the long poll's periodic re-read still answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.stack.procreg import owned_tempdir, proc_starttime

__all__ = ["CHANNEL", "SettledListener", "SocketSettledListener", "listen_for_settles", "notify_settled",
           "settled_channel"]

CHANNEL = "bw_run_settled"
_log = logging.getLogger(__name__)

_MAX_ID_BYTES = 200
"""A datagram longer than this is not a run id: dropped unread."""


def settled_channel(engine: Engine) -> Path | None:
    """Where an SQLite store's listeners are linked (``<database file>.settled/``); None for Postgres or a database
    in memory (no other process shares it)."""
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    path = Path(database).resolve()
    return path.with_name(path.name + ".settled")


def notify_settled(session: Session, run_id: str) -> None:
    """In the transaction that settles ``run_id``'s row: tell the listeners once it commits. On Postgres the row's
    ``UPDATE`` does (the trigger of migration 0022), and this adds nothing."""
    bind = session.get_bind()
    channel = settled_channel(bind) if isinstance(bind, Engine) else None
    if channel is None:
        return
    if not event.contains(session, "after_commit", _tell_committed):
        event.listen(session, "after_commit", _tell_committed)
        event.listen(session, "after_rollback", _forget_rolled_back)
    session.info.setdefault(_PENDING, set()).add((channel, run_id))


_PENDING = "bw_settled"
"""``Session.info`` key: the (channel, run id) to tell of once the session's transaction commits."""


def _tell_committed(session: Session) -> None:
    for channel, run_id in session.info.pop(_PENDING, ()):
        _send_settled(channel, run_id)


def _forget_rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


def _send_settled(channel: Path, run_id: str) -> None:
    """A datagram with ``run_id`` to each listener linked in ``channel``; never raises (a word lost costs time)."""
    try:
        entries = list(os.scandir(channel))
    except OSError:
        return  # no API listens on this machine
    payload = run_id.encode()[:_MAX_ID_BYTES]
    me = os.getuid()
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError:
        return  # out of descriptors, say: the long polls go by their other ways
    with sock:
        sock.setblocking(False)
        for entry in entries:
            try:
                target = os.path.join(channel, os.readlink(entry.path))  # a relative link is the channel's
                st = os.stat(target)
                if not stat.S_ISSOCK(st.st_mode) or st.st_uid != me:
                    continue  # only a socket of this user: a link elsewhere is not a listener
                sock.sendto(payload, target)
            except ConnectionRefusedError:  # its socket is there and nobody reads it: its API is gone
                _unlink(entry.path)
            except FileNotFoundError:  # gone, or out of this process's sight (another container): the link goes
                if not _alive(entry.name):  # only when the process it names is gone too
                    _unlink(entry.path)
            except OSError:
                continue  # not a link, a full buffer, a path too long: this listener goes by its other ways


def _alive(link_name: str) -> bool:
    """Whether the process a link is named for (``<pid>-<random>``) is alive here."""
    pid = link_name.partition("-")[0]
    return pid.isdigit() and proc_starttime(int(pid)) is not None


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class _Waiters:
    """Who waits for which run's row to settle; ``_wake(run_id)`` sets their events on the loops they registered on.
    Callable from any thread."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def waiting(self, run_id: str, woken: asyncio.Event) -> Iterator[None]:
        """While inside: ``woken`` is set when ``run_id``'s row settles."""
        entry = (asyncio.get_running_loop(), woken)
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
        for loop, woken in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(woken.set)


class SettledListener(_Waiters):
    """One Postgres connection of its own, in a thread, listening on ``CHANNEL``; ``waiting(run_id, event)`` sets
    ``event`` (on the loop that registered it) when that run's row settles. A lost connection is made again
    (backing off up to ``MAX_BACKOFF_S``); meanwhile nothing is told, and the long poll's other ways cover it."""

    POLL_S = 0.5
    """How often the thread looks up from its connection to see whether it should stop."""
    MAX_BACKOFF_S = 30.0

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self._url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
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


class SocketSettledListener(_Waiters):
    """An SQLite store's listener (module docstring): a Unix datagram socket of its own in a private temporary
    directory, linked from the store's channel directory, read in a thread. Should it not bind (a channel directory
    it cannot write), it says so in the log and tells nothing: the long poll's other ways answer."""

    POLL_S = 0.5
    """How often the thread looks up from its socket (a close also wakes it at once)."""

    def __init__(self, channel: Path) -> None:
        super().__init__()
        self.channel = channel
        self.listening = threading.Event()
        """Set while the socket listens (tests wait for it)."""
        self._stop = threading.Event()
        self._dir: Path | None = None
        self._link: Path | None = None
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="run-settled-listener", daemon=True)

    def start(self) -> None:
        try:
            self.channel.mkdir(mode=0o700, exist_ok=True)
            self._dir = owned_tempdir("settled")
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.bind(str(self._dir / "s"))
            self._sock.settimeout(self.POLL_S)
            link = self.channel / f"{os.getpid()}-{secrets.token_hex(4)}"
            link.symlink_to(self._dir / "s")
            self._link = link
        except OSError as exc:
            _log.warning("runs settling are not told to this API at once (%s): its long polls go by Temporal", exc)
            self._release()
            return
        self.listening.set()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._dir is not None:
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as poke:
                poke.sendto(b"", str(self._dir / "s"))  # wakes the thread from its recv
            self._thread.join(timeout=self.POLL_S * 4)
        self._release()

    def _release(self) -> None:
        self.listening.clear()
        if self._link is not None:
            with contextlib.suppress(OSError):
                self._link.unlink()
            self._link = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                data = sock.recv(_MAX_ID_BYTES + 1)
            except TimeoutError:
                continue
            except OSError as exc:  # not expected of a bound datagram socket: pause rather than spin
                _log.info("the run-settled socket failed (%s)", exc)
                self._stop.wait(self.POLL_S)
                continue
            if data and len(data) <= _MAX_ID_BYTES:
                with contextlib.suppress(UnicodeDecodeError):
                    self._wake(data.decode())


def listen_for_settles(engine: Engine) -> SettledListener | SocketSettledListener | None:
    """The listener for ``engine``'s store (not started), or None where no other process can tell (SQLite in
    memory)."""
    if engine.dialect.name == "postgresql":
        return SettledListener(engine)
    channel = settled_channel(engine)
    return SocketSettledListener(channel) if channel is not None else None
