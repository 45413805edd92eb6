"""Word from the store as a run's row settles (``benchwright.store.settled``): the transaction that ends or halts a
run tells at its commit (a NOTIFY on Postgres, a datagram to the listeners beside an SQLite file), and the API's
listener wakes whoever waits for that run, and only them; a Postgres listener whose connection is cut makes another
and goes on; an SQLite sender tells nothing before the commit, and removes the link of a listener that is gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.control import halt_run
from benchwright.store.db import make_engine, migrate
from benchwright.store.runs import create_run, finish_run, get_run
from benchwright.store.settled import (
    SettledListener,
    SocketSettledListener,
    listen_for_settles,
    notify_settled,
    settled_channel,
)

WAIT_S = 10.0
"""The longest a test waits for word; a notification normally arrives within milliseconds."""


def _runs(url: str, n: int) -> list[str]:
    engine = make_engine(url)
    migrate(engine)
    account, _ = create_account(engine, name="settled")
    ids = [create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                      launch=LaunchRequest(dataset="x.jsonl", model="openai/dev")).id for _ in range(n)]
    engine.dispose()
    return ids


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return str(request.getfixturevalue("postgres_url"))


def _listening(url: str) -> tuple[SettledListener | SocketSettledListener, Engine]:
    engine = make_engine(url)
    listener = listen_for_settles(engine)
    assert listener is not None
    listener.start()
    assert listener.listening.wait(WAIT_S), "the listener never connected"
    return listener, engine


async def test_a_run_ending_or_halting_wakes_who_waits_for_it_and_no_one_else(store_url: str) -> None:
    ended, halted, bystander = _runs(store_url, 3)
    listener, engine = _listening(store_url)
    woken = {run_id: asyncio.Event() for run_id in (ended, halted, bystander)}
    try:
        with listener.waiting(ended, woken[ended]), listener.waiting(halted, woken[halted]), \
                listener.waiting(bystander, woken[bystander]):
            await asyncio.to_thread(finish_run, engine, run_id=ended, status="ok")
            await asyncio.wait_for(woken[ended].wait(), WAIT_S)
            await asyncio.to_thread(halt_run, engine, run_id=halted, reason="paused")
            await asyncio.wait_for(woken[halted].wait(), WAIT_S)
            # Notifications arrive in commit order: had the bystander been told, it would be by now.
            assert not woken[bystander].is_set()
            # A finish that writes nothing (a retried activity) tells no one again.
            woken[ended].clear()
            await asyncio.to_thread(finish_run, engine, run_id=ended, status="ok")
            await asyncio.to_thread(halt_run, engine, run_id=bystander, reason="paused")
            await asyncio.wait_for(woken[bystander].wait(), WAIT_S)
            assert not woken[ended].is_set()
        assert get_run(engine, run_id=ended).status == "ok"
    finally:
        listener.close()
        engine.dispose()


async def test_a_listener_whose_connection_is_cut_listens_again(postgres_url: str) -> None:
    (run_id,) = _runs(postgres_url, 1)
    listener, engine = _listening(postgres_url)
    assert isinstance(listener, SettledListener)
    try:
        with engine.begin() as conn:
            cut = conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE query LIKE 'LISTEN bw_run_settled%' AND pid <> pg_backend_pid() "
                                    "AND application_name = current_setting('application_name')")).all()
        assert cut and all(ok for (ok,) in cut)
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while listener.connections < 2 or not listener.listening.is_set():
            assert asyncio.get_running_loop().time() < deadline, "the listener did not connect again"
            await asyncio.to_thread(listener.listening.wait, 0.1)
        woken = asyncio.Event()
        with listener.waiting(run_id, woken):
            await asyncio.to_thread(finish_run, engine, run_id=run_id, status="ok")
            await asyncio.wait_for(woken.wait(), WAIT_S)
    finally:
        listener.close()
        engine.dispose()


def test_on_postgres_the_rows_update_tells_with_no_round_trip_of_its_own(postgres_url: str) -> None:
    """The NOTIFY rides on the ``UPDATE`` that settles the row (trigger ``bw_runs_settled``, migration 0022): a run's
    end is two round trips (its read, then ``bw_finish_run``, migration 0026), not three. An end, a halt, a halt for
    another reason and a torn-down run's end tell; an append, a retried end, a resume and a halt again for the same
    reason do not. Word arrives in commit order, so a step that told nothing is followed by one that tells, and the
    next word must be that one's."""
    from benchwright.events import AgentTextEvent
    from benchwright.store.control import clear_halt, finish_halted
    from benchwright.store.events import NewEvent, append_events, event_key
    from benchwright.store.settled import CHANNEL
    from tests.store.conftest import round_trips

    ended, halted, torn = _runs(postgres_url, 3)
    engine = make_engine(postgres_url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        driver = conn.connection.dbapi_connection
        assert driver is not None
        driver.execute(f"LISTEN {CHANNEL}")

        def next_word() -> str:
            for note in driver.notifies(timeout=WAIT_S):  # type: ignore[attr-defined]
                if note.payload in (ended, halted, torn):  # the channel is the database's: other tests' runs too
                    return str(note.payload)
            raise AssertionError(f"no word within {WAIT_S} s")

        append_events(engine, ended, [NewEvent.of(event_key(ended, "x"), AgentTextEvent(phase="x", text="x"))])
        with round_trips(engine) as trips:
            finish_run(engine, run_id=ended, status="ok")
        assert trips == [2]
        assert next_word() == ended
        finish_run(engine, run_id=ended, status="ok")  # a retry: writes nothing
        halt_run(engine, run_id=halted, reason="paused")
        assert next_word() == halted
        assert clear_halt(engine, run_id=halted, key="resume-1")
        halt_run(engine, run_id=halted, reason="paused")
        assert next_word() == halted
        halt_run(engine, run_id=halted, reason="paused", replace=True)  # the same reason again
        halt_run(engine, run_id=torn, reason="stopped")
        assert next_word() == torn
        finish_halted(engine, run_id=torn)
        assert next_word() == torn
        halt_run(engine, run_id=halted, reason="review_requested", replace=True)
        assert next_word() == halted
    engine.dispose()


def _dead_pid() -> int:
    """A PID no process holds now (a child that exited and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def _probe(channel: Path, where: Path) -> socket.socket:
    """A datagram socket linked into ``channel`` as a listener would be, non-blocking: what a sender sent is in its
    queue once ``sendto`` returned (a Unix datagram is queued synchronously), so an empty queue means nothing was."""
    channel.mkdir(exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(where))
    sock.setblocking(False)
    (channel / "1-probe").symlink_to(where)
    return sock


def _received(sock: socket.socket) -> list[bytes]:
    got = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recv(1024))
    return got


def test_on_sqlite_word_leaves_only_at_the_commit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    run_id, other = _runs(url, 2)
    engine = make_engine(url)
    channel = settled_channel(engine)
    assert channel is not None
    with _probe(channel, tmp_path / "probe") as probe:
        with Session(engine) as session:
            notify_settled(session, run_id)
            session.execute(text("SELECT 1"))
            assert _received(probe) == []  # not before the commit
            session.rollback()  # a transaction that said so and rolled back tells no one,
            session.execute(text("SELECT 1"))
            session.commit()  # nor does the same session's next transaction
            assert _received(probe) == []
        finish_run(engine, run_id=run_id, status="ok")
        assert _received(probe) == [run_id.encode()]
        assert halt_run(engine, run_id=other, reason="paused")
        assert _received(probe) == [other.encode()]
        finish_run(engine, run_id=run_id, status="ok")  # a retried finish writes nothing and tells no one
        assert _received(probe) == []
    engine.dispose()


async def test_on_sqlite_a_gone_listeners_link_is_removed_and_the_others_left_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    ended, later = _runs(url, 2)
    listener, engine = _listening(url)
    channel = settled_channel(engine)
    assert channel is not None and isinstance(listener, SocketSettledListener)
    gone = channel / f"{_dead_pid()}-gone"
    gone.symlink_to(tmp_path / "no-such-socket")
    unseen = channel / f"{os.getpid()}-unseen"  # a live process's socket out of sight (another container's /tmp)
    unseen.symlink_to(tmp_path / "not-here")
    deaf = channel / f"{os.getpid()}-deaf"  # a socket nobody reads any more
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as bound:
        bound.bind(str(tmp_path / "deaf"))
    deaf.symlink_to(tmp_path / "deaf")
    stray = channel / "a-file"
    (tmp_path / "not-a-socket").write_text("x")
    stray.symlink_to(tmp_path / "not-a-socket")
    woken = asyncio.Event()
    try:
        with listener.waiting(ended, woken):
            await asyncio.to_thread(finish_run, engine, run_id=ended, status="ok")
            await asyncio.wait_for(woken.wait(), WAIT_S)  # the live listener was told all the same
        assert not gone.is_symlink() and not deaf.is_symlink() and unseen.is_symlink() and stray.is_symlink()
        assert (tmp_path / "not-a-socket").read_text() == "x"
    finally:
        listener.close()
    # A closed listener's link goes with it; the next settle finds no one and fails nothing.
    assert sorted(p.name for p in channel.iterdir()) == sorted(["a-file", unseen.name])
    await asyncio.to_thread(finish_run, engine, run_id=later, status="ok")
    assert get_run(engine, run_id=later).status == "ok"
    engine.dispose()


def test_sqlite_in_memory_has_no_channel() -> None:
    engine = make_engine("sqlite://")
    assert settled_channel(engine) is None and listen_for_settles(engine) is None
    engine.dispose()


async def test_the_apis_long_poll_answers_on_the_stores_word(store_url: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The API on either store, with no Temporal to watch and its own re-read of the row put off for a minute: a
    long poll still answers as soon as the run ends, on the store's word alone."""
    import httpx

    from api.main import create_app
    from api.routes import runs as runs_route
    from benchwright.settings import Settings
    from benchwright.stack.devstack import free_port
    from tests.conftest import serve_app

    monkeypatch.setattr(runs_route, "WAIT_HALT_CHECK_S", 60.0)
    engine = make_engine(store_url)
    migrate(engine)
    account, key = create_account(engine, name="long-poll")
    run_id = create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                        launch=LaunchRequest(dataset="x.jsonl", model="openai/dev")).id
    settings = Settings(data_dir=tmp_path / "api", database_url=store_url,
                        temporal_address=f"127.0.0.1:{free_port()}")  # nothing listens there
    app = create_app(settings)
    port = free_port()
    server, task = await serve_app(app, port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=90,
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            poll = asyncio.create_task(http.get(f"/v1/runs/{run_id}", params={"wait_s": 55}))
            listener = app.state.bw.settled
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not listener.waits_for(run_id):  # the long poll is waiting for this run
                assert not poll.done(), poll.result().text
                assert asyncio.get_running_loop().time() < deadline, "the long poll never waited"
                await asyncio.sleep(0.01)
            await asyncio.to_thread(finish_run, engine, run_id=run_id, status="ok")
            answer = await asyncio.wait_for(poll, WAIT_S)
        assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
        assert not listener.waits_for(run_id)
    finally:
        server.should_exit = True
        await task
        engine.dispose()
