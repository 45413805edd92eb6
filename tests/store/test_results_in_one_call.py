"""A batch's commit of a few results (issue 25): on Postgres one call of ``bw_append_results`` (migration 0021)
appends them with their trial and task rows and reads the run's spend, where the statements made nine round trips;
what lands is what the statements write. ``append_checking`` halts the run when that spend crosses a ceiling."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.errors import NotFound
from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.control import append_checking
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import (
    NewEvent,
    append_events,
    append_in_session,
    event_key,
    read_events,
    results_in_one_call,
)
from benchwright.store.models import TaskRow, TrialResult
from benchwright.store.runs import create_run, get_run, run_view
from tests.store.conftest import round_trips

NONE = {"extracted": False, "answer": None, "rule": None}
WRONG = {"extracted": True, "answer": "5", "rule": "final_line"}


def _result(run_id: str, index: int, trial: int, score: float | None, *, meta: dict[str, Any] | None = None,
            output: str | None = "The answer is **4**.", error: str | None = None, cost: float = 0.0) -> NewEvent:
    outcome = "err" if score is None else "pass" if score >= 1 else "fail"
    return NewEvent.of(event_key(run_id, "materialize", 1, index, trial, "result"), MaterializeTaskResult(
        invocation=1, index=index, trial=trial, score=score, outcome=outcome, output=output, meta=meta or {},
        error=error, cost_usd=cost, input="user: what is 2+2?"))


def _aggregate(run_id: str, index: int, scores: list[float | None]) -> NewEvent:
    known = [s for s in scores if s is not None]
    score = min(known) if known else None
    outcome = "err" if score is None else "pass" if score >= 1 else "fail"
    return NewEvent.of(event_key(run_id, "materialize", 1, index, "aggregated"), MaterializeTaskAggregated(
        invocation=1, index=index, score=score, outcome=outcome, trial_scores=scores))


def _appends(r: str) -> list[tuple[list[NewEvent], bool]]:
    """A batch's commits as they come, each with whether Postgres takes it in one call."""
    return [
        ([_result(r, 0, 0, 1.0, output="4 \x00 (a NUL from the endpoint)"), _aggregate(r, 0, [1.0])], True),
        ([_result(r, 1, 0, None, output=None, error="timeout after 30 s"), _aggregate(r, 1, [None])], True),
        # k = 2, both trials here: no_answer decided by this append
        ([_result(r, 2, 0, 0.0, meta=NONE), _result(r, 2, 1, 0.0, meta=NONE), _aggregate(r, 2, [0.0, 0.0])], True),
        ([_result(r, 3, 0, 0, meta=WRONG)], True),  # an int score; a trial alone
        # its no_answer needs the trial committed before (it answered, wrongly): the statements read it
        ([_result(r, 3, 1, 0.0, meta=NONE), _aggregate(r, 3, [0.0, 0.0])], False),
        # a retried commit of task 0 beside new results: the repeats project nothing, the cost is counted once
        ([_result(r, 0, 0, 1.0), _aggregate(r, 0, [1.0]), _result(r, 4, 0, 0.5, cost=0.25),
          _aggregate(r, 4, [0.5])], True),
        ([_result(r, 5, 0, 1.0), _result(r, 5, 0, 0.0), _aggregate(r, 5, [1.0])], True),  # a repeat within
    ]


def _new_run(engine: Engine, name: str, balance: float = 100.0) -> str:
    account, _ = create_account(engine, name=name, balance_usd=balance)
    return create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                      driver="builtin", trials_config={"plan": {"k": 2}}).id


def _landed(engine: Engine, run_id: str) -> tuple[Any, ...]:
    """What a run's appends left: its log, its trial and task rows, its row's seq and cost (run ids taken out)."""
    log = [(e.seq, e.type, e.idem_key.replace(run_id, "R"), e.data) for e in read_events(engine, run_id)[1:]]
    with Session(engine) as session:
        trials = [row._asdict() for row in session.execute(
            select(*[c for c in TrialResult.__table__.c if c.name != "run_id"])  # type: ignore[attr-defined]
            .where(TrialResult.run_id == run_id).order_by(TrialResult.index, TrialResult.trial))]
        tasks = [row._asdict() for row in session.execute(
            select(*[c for c in TaskRow.__table__.c if c.name != "run_id"])  # type: ignore[attr-defined]
            .where(TaskRow.run_id == run_id).order_by(TaskRow.index))]
    run = get_run(engine, run_id=run_id)
    return log, trials, tasks, run.next_seq, run.cost_incurred


def test_a_few_results_land_in_one_call_as_the_statements_would_write_them(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    migrate(engine)
    by_call, by_statements = _new_run(engine, "one-call"), _new_run(engine, "statements")
    for (events, one_call), (same, _) in zip(_appends(by_call), _appends(by_statements), strict=True):
        assert results_in_one_call(events) is one_call
        with round_trips(engine) as trips:
            append_events(engine, by_call, events)
        assert (trips == [1]) if one_call else (trips[0] > 1)
        with Session(engine) as session, session.begin():
            append_in_session(session, by_statements, same)  # a transaction's own: always the statements
    landed = _landed(engine, by_call)
    assert landed == _landed(engine, by_statements)
    log, trials, tasks, next_seq, cost = landed
    assert next_seq == len(log) + 1 == 15  # RunLaunched and 14 new events
    assert cost == pytest.approx(0.25)
    assert [(t["index"], t["no_answer"]) for t in tasks] == [(0, False), (1, False), (2, True), (3, False),
                                                             (4, False), (5, False)]
    assert trials[0]["output"] == "4 \ufffd (a NUL from the endpoint)"
    assert [t["score"] for t in trials if t["index"] == 3] == [0.0, 0.0]
    assert [t["score"] for t in trials if t["index"] == 5] == [1.0]  # the first of the repeated key
    summary = run_view(engine, get_run(engine, run_id=by_call)).tasks.summary
    assert (summary.passed, summary.failed, summary.errored, summary.no_answer) == (2, 3, 1, 1)
    many = [_result(by_call, 10 + i, 0, 1.0) for i in range(8)]
    assert not results_in_one_call(many)  # as many as COPY takes: the statements
    with pytest.raises(NotFound):
        append_events(engine, "no-such-run", _appends("no-such-run")[0][0])
    engine.dispose()


def test_a_batchs_commit_reads_the_spend_with_it_and_halts_the_run_past_its_ceiling(db_url: str) -> None:
    """``append_checking``: the results and the spend in one round trip on Postgres (nine before), in one
    transaction on SQLite; past the run's ceiling the run halts once, and every batch that commits after it is told
    why (so that each stops), with no second RunHalted."""
    engine = make_engine(db_url)
    migrate(engine)
    run_id = _new_run(engine, "payer", balance=5.0)

    def commit(index: int, cost: float) -> str | None:
        return append_checking(engine, run_id, [_result(run_id, index, 0, 1.0, cost=cost),
                                                _aggregate(run_id, index, [1.0])], invocation=1, run_cost_usd=0.5)

    if engine.dialect.name == "postgresql":
        with round_trips(engine) as trips:
            assert commit(0, 0.2) is None
        assert trips == [1]
    else:
        assert commit(0, 0.2) is None
    assert commit(0, 0.2) is None  # retried: nothing new, the same spend
    assert commit(1, 0.4) == "limit_exceeded:run.cost"  # 0.6 > 0.5
    log = read_events(engine, run_id)
    assert [e.type for e in log[-3:]] == ["MaterializeTaskResult", "MaterializeTaskAggregated", "RunHalted"]
    assert [e.seq for e in log] == list(range(len(log)))
    run = get_run(engine, run_id=run_id)
    assert (run.halted, run.halt_reason) == (True, "limit_exceeded:run.cost")
    assert commit(2, 0.0) == "limit_exceeded:run.cost", "another batch commits after the halt: told to stop too"
    assert [e.type for e in read_events(engine, run_id)].count("RunHalted") == 1
    with pytest.raises(NotFound):
        append_checking(engine, "no-such-run", [_result("no-such-run", 0, 0, 1.0)], invocation=1, run_cost_usd=None)
    engine.dispose()
