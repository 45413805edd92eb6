"""The event log under concurrent appends from several processes, on SQLite and Postgres."""

from __future__ import annotations

import multiprocessing as mp

from sqlalchemy import select
from sqlmodel import Session

from benchwright.events import AgentTextEvent
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.models import EventRow, Run
from benchwright.store.runs import create_run

PROCESSES = 6
PER_PROCESS = 40
SHARED_KEYS = 10
"""Keys every process appends: each must land exactly once however the processes interleave."""


def _appender(url: str, run_id: str, worker: int) -> None:
    engine = make_engine(url)
    for i in range(PER_PROCESS):
        own = NewEvent.of(event_key(run_id, "test", worker, i), AgentTextEvent(phase="test", text=f"{worker}:{i}"))
        batch = [own]
        if i < SHARED_KEYS:
            batch.append(NewEvent.of(event_key(run_id, "shared", i), AgentTextEvent(phase="test", text=f"shared {i}")))
        append_events(engine, run_id, batch)
    engine.dispose()


def _new_run(url: str) -> str:
    engine = make_engine(url)
    migrate(engine)
    account, _ = create_account(engine, name="appender")
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                     driver="builtin", trials_config={})
    engine.dispose()
    return run.id


def test_concurrent_appends_from_processes_keep_seq_gapless(db_url: str) -> None:
    run_id = _new_run(db_url)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(db_url, run_id, w)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"appender {p.pid} exited with {p.exitcode}"

    engine = make_engine(db_url)
    events = read_events(engine, run_id, limit=100_000)
    expected = 1 + PROCESSES * PER_PROCESS + SHARED_KEYS  # RunLaunched + own keys + each shared key once
    assert [e.seq for e in events] == list(range(expected))
    texts = [e.data["text"] for e in events[1:]]
    assert len(texts) == len(set(texts))
    with Session(engine) as session:
        assert session.execute(select(Run.next_seq).where(Run.id == run_id)).scalar_one() == expected
        # each process's own events are in the order it appended them
        for w in range(PROCESSES):
            mine = [int(t.split(":")[1]) for t in texts if t.startswith(f"{w}:")]
            assert mine == list(range(PER_PROCESS))
        assert session.execute(select(EventRow).where(EventRow.run_id == run_id)).scalars().all()
    engine.dispose()


def test_append_is_idempotent_and_projects_in_the_same_transaction(db_url: str) -> None:
    from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
    from benchwright.store.runs import get_run, list_tasks, run_view

    run_id = _new_run(db_url)
    engine = make_engine(db_url)
    batch = [
        NewEvent.of(event_key(run_id, "m", 1, 0, 0), MaterializeTaskResult(
            invocation=1, index=0, trial=0, score=1.0, outcome="pass", output="42", cost_usd=0.25)),
        NewEvent.of(event_key(run_id, "m", 1, 0, "agg"), MaterializeTaskAggregated(
            invocation=1, index=0, score=1.0, outcome="pass", trial_scores=[1.0])),
    ]
    assert append_events(engine, run_id, batch) == 2
    assert append_events(engine, run_id, batch) == 0
    view = run_view(engine, get_run(engine, run_id=run_id))
    assert view.cost.model == 0.25 and view.tasks.summary.passed == 1
    assert [t.output for t in list_tasks(engine, run_id=run_id).tasks] == ["42"]
    assert [e.seq for e in read_events(engine, run_id)] == [0, 1, 2]
    engine.dispose()
