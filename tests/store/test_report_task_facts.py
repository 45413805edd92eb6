"""The report's per-task facts (``benchwright.report.facts._tasks``), on SQLite and Postgres: each task of the sweep
with its outcome, its slowest trial's latency and its trials' summed spend, read from the result events' fields
(extracted by the database since issue 25); results of another sweep, or without a task index, count for nothing."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.report.facts import _tasks
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import create_run


def _trial(run_id: str, invocation: int, index: int, trial: int, **extra: Any) -> NewEvent:
    return NewEvent.of(event_key(run_id, "m", invocation, index, trial, "result"), MaterializeTaskResult(
        invocation=invocation, index=index, trial=trial, score=1.0, outcome="pass", output="a long reply " * 50,
        **extra))


def _aggregate(run_id: str, invocation: int, index: int, outcome: str) -> NewEvent:
    return NewEvent.of(event_key(run_id, "m", invocation, index, "aggregated"), MaterializeTaskAggregated(
        invocation=invocation, index=index, score=1.0 if outcome == "pass" else 0.0, outcome=outcome,
        trial_scores=[1.0]))


def test_task_facts_sum_cost_and_keep_the_slowest_trial(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="report")
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                     driver="builtin", trials_config={"plan": {"k": 2}})
    r = run.id
    append_events(engine, r, [
        _trial(r, 1, 0, 0, duration_ms=120, cost_usd=0.25), _trial(r, 1, 0, 1, duration_ms=80, cost_usd=0.5),
        _trial(r, 1, 1, 0, cost_usd=0.125),  # no latency recorded
        _trial(r, 2, 0, 0, duration_ms=999, cost_usd=9.0),  # another sweep's
        _aggregate(r, 1, 0, "pass"), _aggregate(r, 1, 1, "fail"), _aggregate(r, 2, 0, "pass"),
    ])
    with Session(engine) as session:
        facts = [t.model_dump() for t in _tasks(session, r, 1)]
    assert facts == [
        {"index": 0, "outcome": "pass", "score": 1.0, "no_answer": False, "latency_ms": 120, "cost_usd": 0.75},
        {"index": 1, "outcome": "fail", "score": 0.0, "no_answer": False, "latency_ms": None, "cost_usd": 0.125},
    ]
    engine.dispose()
