"""Reads through ``benchwright.store.db.reader``: on Postgres each statement runs alone in autocommit (one round trip,
no BEGIN or COMMIT), and the pooled connection goes back to transactions for the writers that use it next."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import Session

from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account, get_account
from benchwright.store.db import make_engine, migrate, reader, session_scope
from benchwright.store.models import Run
from benchwright.store.runs import create_run, get_run


def test_a_reader_reads_without_a_transaction_and_leaves_the_pool_transactional(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    try:
        account, _ = create_account(engine, name="reader")
        run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                         driver="builtin", trials_config={})
        if engine.dialect.name == "postgresql":
            # now() is the transaction's start: through the reader each statement is a transaction of its own
            with reader(engine).connect() as conn:
                assert conn.connection.dbapi_connection.autocommit is True  # type: ignore[union-attr]
                conn.execute(text("SELECT pg_sleep(0.01)"))
                assert conn.execute(text("SELECT now() = statement_timestamp()")).scalar() is True
            with engine.connect() as conn:  # the engine itself: both statements in one transaction
                conn.execute(text("SELECT pg_sleep(0.01)"))
                assert conn.execute(text("SELECT now() = statement_timestamp()")).scalar() is False
        else:
            assert reader(engine) is engine
        assert get_run(engine, run_id=run.id).account_id == account.id  # through the reader
        assert get_account(engine, account_id=account.id).name == "reader"

        # The same pooled connections, back in transactions: a failed write leaves nothing behind
        with pytest.raises(RuntimeError), session_scope(engine) as session:
            session.get(Run, run.id).status = "error"  # type: ignore[union-attr]
            session.flush()
            raise RuntimeError("the writer fails after its UPDATE")
        with Session(engine) as session:
            assert session.get(Run, run.id).status == "running"  # type: ignore[union-attr]
            if engine.dialect.name == "postgresql":
                assert session.connection().connection.dbapi_connection.autocommit is False  # type: ignore[union-attr]
    finally:
        engine.dispose()


def test_the_reader_is_made_once_per_engine_and_freed_with_it(db_url: str) -> None:
    import gc
    import weakref

    engine = make_engine(db_url)
    assert reader(engine) is reader(engine)
    gone = weakref.ref(engine)
    engine.dispose()
    del engine
    gc.collect()
    assert gone() is None, "the engine outlived its last reference"


def test_the_reads_on_every_launch_and_every_log_page_are_one_round_trip_each(store_run: tuple[Any, str]) -> None:
    """A launch reads the account's saved compute, the API's log pages read the events and the terminal seq: each
    one statement, so through the reader (on Postgres one round trip each, not BEGIN, the read and ROLLBACK)."""
    from benchwright.events import PhaseStarted
    from benchwright.store.events import NewEvent, append_events, event_key, read_events, terminal_seq
    from benchwright.store.policy import save_compute, saved_compute
    from tests.store.conftest import round_trips

    engine, run_id = store_run
    account_id = get_run(engine, run_id=run_id).account_id
    save_compute(engine, account_id=account_id, compute="local")
    append_events(engine, run_id, [NewEvent.of(event_key(run_id, "p"), PhaseStarted(phase="fetch"))])
    for read, expected in ((lambda: saved_compute(engine, account_id=account_id), "local"),
                           (lambda: [e.type for e in read_events(engine, run_id)], ["RunLaunched", "PhaseStarted"]),
                           (lambda: terminal_seq(engine, run_id), None)):
        if engine.dialect.name == "postgresql":
            with round_trips(engine) as trips:
                assert read() == expected
            assert trips == [1]
        else:
            assert read() == expected
    engine.dispose()


def test_the_route_sweeps_read_keeps_the_connections_prepared_statements(store_run: tuple[Any, str]) -> None:
    """Every worker asks which of its routes' runs ended every ``proxy_route_sweep_s`` (``runs_ended_at``). In a
    transaction of its own that read ended in ROLLBACK, at which psycopg deallocates every statement it prepared on the
    pooled connection (``DEALLOCATE ALL``): the writers that took the connection next planned their statements again.
    Through the reader it is one round trip, and what the connection prepared stays prepared."""
    from sqlalchemy import select

    from benchwright.stack.teardown import runs_ended_at
    from benchwright.store.runs import finish_run
    from tests.store.conftest import round_trips

    engine, running = store_run
    account_id = get_run(engine, run_id=running).account_id
    ended = create_run(engine, account_id=account_id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                       driver="builtin", trials_config={}).id
    finish_run(engine, run_id=ended, status="succeeded")
    asked = [running, ended, "no-such-run"]
    if engine.dialect.name != "postgresql":
        found = runs_ended_at(engine, asked)
        assert set(found) == {ended, "no-such-run"} and found["no-such-run"] == 0.0 and found[ended] > 0
        engine.dispose()
        return
    engine.pool.dispose()
    hot = select(Run.id).where(Run.id == running)
    with engine.connect() as conn:  # one pooled connection: psycopg prepares a statement from its fifth run on
        for _ in range(6):
            conn.execute(hot)
        conn.commit()
        prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
        conn.commit()
    assert prepared, "psycopg prepared nothing: the check below would prove nothing"
    with round_trips(engine) as trips:
        found = runs_ended_at(engine, asked)
    assert set(found) == {ended, "no-such-run"} and found["no-such-run"] == 0.0 and found[ended] > 0
    assert trips == [1]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar() == prepared
    engine.dispose()


def test_a_pooled_connection_with_something_to_read_is_pinged_and_handed_out_idle(postgres_url: str) -> None:
    """A pooled Postgres connection whose socket has something to read (a notification here; a server's message in
    general) is pinged at check-out (``benchwright.store.db._check_out``). The ping must not leave it in a
    transaction (the reader sets AUTOCOMMIT at check-out, which psycopg refuses inside one), nor end one with ROLLBACK
    (at which psycopg deallocates every statement it prepared on the connection)."""
    import select

    import psycopg

    engine = make_engine(postgres_url)
    migrate(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("LISTEN bw_test_ping")
        for _ in range(6):  # psycopg prepares a statement from its fifth run on
            conn.execute(text("SELECT count(*) FROM runs"))
        conn.commit()
        prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
        conn.commit()
        fd = conn.connection.dbapi_connection.fileno()  # type: ignore[union-attr]
    assert prepared, "psycopg prepared nothing: the check below would prove nothing"
    # Back in the pool, still listening: a notification from elsewhere makes its socket readable.
    with psycopg.connect(engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                         autocommit=True) as other:
        other.execute("NOTIFY bw_test_ping")
    poller = select.poll()  # not select.select: in a long test process the descriptor may pass 1,024
    poller.register(fd, select.POLLIN)
    assert poller.poll(30_000), "the notification reached the pooled connection"
    with reader(engine).connect() as conn:  # the same pooled connection, pinged first
        assert conn.connection.dbapi_connection.fileno() == fd  # type: ignore[union-attr]
        assert conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar() == prepared
    with engine.begin() as conn:  # and back for a writer, in a transaction of its own
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
    engine.dispose()


def test_a_connection_past_descriptor_1024_is_checked_out_without_a_ping(postgres_url: str) -> None:
    """A busy worker's descriptors pass 1,024, where ``select.select`` refuses to watch one. The check-out's test for
    a server's message must still work there, or every check-out pings (a round trip each)."""
    import os
    import resource
    import tempfile

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"this process may open {hard} descriptors at most; the test needs 1,100")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100) if soft != resource.RLIM_INFINITY else soft, hard))
    engine = make_engine(postgres_url)
    fillers: list[int] = []
    try:
        for _ in range(5):  # another thread of this process may free a low descriptor meanwhile: try again
            # A new descriptor is the lowest free one: once a filler passes 1,024, every one below is taken.
            while not fillers or fillers[-1] < 1025:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            with engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
            if raw.fileno() > 1024:
                break
            engine.dispose()
        assert raw.fileno() > 1024, "the store's connection never took a descriptor past 1,024"
    finally:
        for filler in fillers:
            os.close(filler)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with tempfile.TemporaryFile() as trace:
        raw.pgconn.trace(trace.fileno())  # type: ignore[attr-defined]
        with engine.connect() as conn:  # the check-out runs first, then nothing on this connection
            assert conn.connection.dbapi_connection is raw
        raw.pgconn.untrace()  # type: ignore[attr-defined]
        trace.seek(0)
        assert trace.read() == b"", "the check-out sent the server something"
    engine.dispose()
