"""Postgres restarted mid-run (issue 23, faults beyond kill -9): the run resumes, nothing lost or doubled.

The store is a private PostgreSQL instance of the test's own (the shared one at 127.0.0.1:5432 is never touched);
``pg_ctl stop -m fast`` cuts every connection of the worker and the API while Materialize is writing results; the
server stays down for a few seconds (longer than a phase activity's four quick attempts) and comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchwright.store.accounts import authenticate, create_account
from benchwright.store.db import StoreUnavailable, make_engine, migrate, outage_tolerant
from benchwright.testkit.devmodel import DevModelConfig
from tests.conftest import DevModels
from tests.faults.kit import (
    FaultStack,
    PrivatePostgres,
    exactly_once,
    postgres_bin,
    start_stack,
    wait_for,
    write_dataset,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
TASKS = 300
OUTAGE_S = 4.0


@pytest.fixture
async def pg() -> AsyncIterator[PrivatePostgres]:
    if postgres_bin() is None:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (initdb, pg_ctl) on this machine")
    server = PrivatePostgres()
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def pg_stack(tmp_path: Path, pg: PrivatePostgres, dev_models: DevModels) -> AsyncIterator[
        tuple[FaultStack, PrivatePostgres, str]]:
    answers = write_dataset(tmp_path / "tasks.jsonl", TASKS)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=20))
    stack = await start_stack(tmp_path, model_hosts=list(dev_models.allowed), database_url=pg.url)
    try:
        yield stack, pg, url
    finally:
        await stack.close()


async def test_postgres_restart_mid_run_resumes_with_nothing_lost_or_doubled(
        pg_stack: tuple[FaultStack, PrivatePostgres, str], tmp_path: Path) -> None:
    stack, pg, url = pg_stack
    run_id = await stack.launch({"dataset": str(tmp_path / "tasks.jsonl"), "concurrency": 4,
                                 "model": {"identifier": "openai/dev", "api_base": url}})
    await wait_for(lambda: sum(stack.results(run_id).values()) >= 30, "30 results recorded before the restart", 120)
    pg.ctl("stop", "-m", "fast")  # every connection of the worker and the API is cut mid-write
    async with stack.http() as http:  # while it is down the API says so, in plain words, and comes back later
        down = await http.get(f"/v1/runs/{run_id}")
    assert down.status_code == 503, down.text
    assert down.json()["error"]["code"] == "store_unavailable" and "store is unavailable" in down.json()["error"][
        "message"] and down.headers["retry-after"]
    await asyncio.sleep(OUTAGE_S)  # the outage's length (the fault itself), longer than a phase's retries last
    pg.start()
    before = sum(stack.results(run_id).values())
    assert before < TASKS, "the run finished before the restart: nothing was tested"
    await wait_for(lambda: stack.finished([run_id]), "the run finished after the restart", 180, every_s=0.2)
    run = stack.runs()[run_id]
    assert (run.status, run.halted, run.error) == ("ok", False, None)
    exactly_once(stack.results(run_id), TASKS)
    async with stack.http() as http:  # the API, whose connections were cut too, answers again
        view = (await http.get(f"/v1/runs/{run_id}")).json()
    assert view["tasks"]["summary"]["passed"] == TASKS


async def test_store_calls_wait_out_an_outage_in_place(pg: PrivatePostgres) -> None:
    """The worker's store I/O (``outage_tolerant``, under every activity's ``in_thread``) waits while Postgres is
    down and goes on once it is back, instead of spending a phase activity's four quick attempts in a second."""
    engine = make_engine(pg.url)
    migrate(engine)
    _, key = create_account(engine, name="outage", balance_usd=1.0)
    pg.ctl("stop", "-m", "fast")
    with pytest.raises(StoreUnavailable, match="store is unavailable"):  # bounded, in plain words
        await outage_tolerant(authenticate, engine, key, bound_s=0.5)
    call = asyncio.create_task(outage_tolerant(authenticate, engine, key))
    await asyncio.to_thread(pg.start)
    account = await asyncio.wait_for(call, 60)
    assert account.name == "outage"
    engine.dispose()


async def test_a_pooled_connection_cut_by_a_restart_is_replaced_before_use(pg: PrivatePostgres) -> None:
    """The pool checks a connection before each use (``benchwright.store.db._check_out``, which sends nothing while
    the server has written nothing to it): after a restart every pooled connection is dead, and the first statement
    after it still succeeds, on a new connection, with no failure seen by the caller."""
    from sqlalchemy import text

    engine = make_engine(pg.url)
    backend = text("SELECT pg_backend_pid()")
    try:
        with engine.connect() as a, engine.connect() as b:  # two connections in the pool
            pids = {a.execute(backend).scalar(), b.execute(backend).scalar()}
        with engine.connect() as c:  # alive and idle: reused as it is
            assert c.execute(backend).scalar() in pids
        await asyncio.to_thread(pg.restart)
        for _ in range(3):  # each pooled connection in turn, then a new one
            with engine.connect() as d:
                assert d.execute(backend).scalar() not in pids
    finally:
        engine.dispose()
