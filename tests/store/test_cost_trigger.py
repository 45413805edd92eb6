"""The cost trigger (SQLite and Postgres): running totals by source, incurred vs billed, balance debits."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text
from sqlmodel import Session

from benchwright.errors import NotFound
from benchwright.events import Event, MaterializeTaskResult, PhaseStarted
from benchwright.schemas import LaunchRequest
from benchwright.store import events as events_module
from benchwright.store.accounts import create_account, credit, get_account
from benchwright.store.control import (
    append_checking,
    append_closing,
    budget_halt_reason,
    clear_halt,
    halt_run,
    halted_reason,
    halted_reasons,
)
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.models import Run
from benchwright.store.runs import create_run, get_run, run_view
from tests.store.conftest import round_trips


class SandboxKilled(Event):  # the shape the sandbox runtime emits; only type and cost_usd matter to the trigger
    sandbox_id: str
    cost_usd: float


def test_trigger_accumulates_by_source_and_debits_the_balance(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="payer", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={}, billing_markup=2.0)
    events = [NewEvent.of(event_key(run.id, "r", i), MaterializeTaskResult(
        invocation=1, index=i, trial=0, score=1.0, outcome="pass", output="x", cost_usd=0.01)) for i in range(3)]
    events.append(NewEvent.of(event_key(run.id, "s"), SandboxKilled(sandbox_id="sb", cost_usd=0.2)))
    append_events(engine, run.id, events)
    append_events(engine, run.id, events)  # a retried append adds nothing, so the trigger does not fire again

    view = run_view(engine, get_run(engine, run_id=run.id))
    assert view.cost.model == pytest.approx(0.03) and view.cost.sandbox == pytest.approx(0.2)
    assert view.cost.incurred == pytest.approx(0.23) and view.cost.billed == pytest.approx(0.4)
    assert get_account(engine, account_id=account.id).balance_usd == pytest.approx(0.6)
    assert budget_halt_reason(engine, run_id=run.id, run_cost_usd=0.2) == "limit_exceeded:run.cost"
    assert budget_halt_reason(engine, run_id=run.id, run_cost_usd=None) is None

    append_events(engine, run.id,
                  [NewEvent.of(event_key(run.id, "s2"), SandboxKilled(sandbox_id="sb2", cost_usd=0.35))])
    assert get_account(engine, account_id=account.id).balance_usd == pytest.approx(-0.1)
    assert budget_halt_reason(engine, run_id=run.id, run_cost_usd=None) == "balance_exhausted"
    assert credit(engine, account_name="payer", amount_usd=5) == pytest.approx(4.9)
    engine.dispose()


def test_a_phase_close_that_crosses_the_ceiling_halts_the_run(db_url: str) -> None:
    """A phase's closing append checks the run's spend after its own events counted (their cost included) and halts
    the run: the RunHalted follows the closing events; a retried close adds nothing. On Postgres a close without
    writes of its own is one round trip."""
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="closer", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})

    def close(what: str, cost: float) -> str | None:
        return append_closing(engine, run.id, [NewEvent.of(event_key(run.id, what), SandboxKilled(
            sandbox_id=what, cost_usd=cost))], run_cost_usd=0.2, budget_key=f"{what}-budget")

    if engine.dialect.name == "postgresql":  # the append and the spend's read in one call (bw_append_spend)
        with round_trips(engine) as trips:
            assert close("fetch", 0.1) is None
        assert trips == [1]
    else:
        assert close("fetch", 0.1) is None
    assert not get_run(engine, run_id=run.id).halted
    assert close("atomize", 0.15) == "limit_exceeded:run.cost"  # 0.25 > 0.2, counted from this close's own event
    row = get_run(engine, run_id=run.id)
    assert row.halted and row.halt_reason == "limit_exceeded:run.cost"
    log = read_events(engine, run.id)
    assert [e.type for e in log[-2:]] == ["SandboxKilled", "RunHalted"]
    assert log[-1].idem_key == event_key(run.id, "halt", "atomize-budget")
    assert close("atomize", 0.15) is None, "a retry: the run is halted already, and nothing lands twice"
    assert len(read_events(engine, run.id)) == len(log)
    with pytest.raises(NotFound):
        append_closing(engine, "no-such-run", [], budget_key="x")
    engine.dispose()


def test_halt_and_clear_are_one_row_update_each_with_their_event(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="h")
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})
    assert halt_run(engine, run_id=run.id, reason="agent_review: why", key="1")
    assert not halt_run(engine, run_id=run.id, reason="operator_pause", key="2"), "already halted"
    assert halted_reason(engine, run_id=run.id) == "agent_review: why"
    assert halted_reasons(engine, run_ids=[run.id, "no-such-run"]) == {run.id: "agent_review: why"}
    assert clear_halt(engine, run_id=run.id, key="3", resolution="go")
    with Session(engine) as session:
        row = session.get(Run, run.id)
        assert row is not None and row.halted is False and row.halt_reason is None
    assert halted_reason(engine, run_id=run.id) is None
    assert halted_reasons(engine, run_ids=[run.id]) == {}
    engine.dispose()


def test_costs_land_by_every_way_an_append_goes(db_url: str) -> None:
    """A result's cost reaches the run however its append goes: a few results by one call (``append_checking``;
    ``bw_append_results`` on Postgres), a batch's flush by ``COPY`` (``_COPY_FROM`` rows or more), other events by
    ``bw_append_events``; results that cost nothing and events of other types add nothing."""
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="ways", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})

    def results(first: int, n: int, cost: float) -> list[NewEvent]:
        return [NewEvent.of(event_key(run.id, "r", i), MaterializeTaskResult(
            invocation=1, index=i, trial=0, score=1.0, outcome="pass", output="x", cost_usd=cost))
            for i in range(first, first + n)]

    assert append_checking(engine, run.id, results(0, 2, 0.01), invocation=1, run_cost_usd=None) is None
    append_events(engine, run.id, results(2, 2 * events_module._COPY_FROM, 0.001))  # by COPY on Postgres
    append_events(engine, run.id, results(100, 3, 0.0))
    append_events(engine, run.id, [NewEvent.of(event_key(run.id, "started"), PhaseStarted(phase="fetch"))])
    append_events(engine, run.id, [NewEvent.of(event_key(run.id, "s"), SandboxKilled(sandbox_id="sb", cost_usd=0.1))])
    view = run_view(engine, get_run(engine, run_id=run.id))
    assert view.cost.model == pytest.approx(0.02 + 2 * events_module._COPY_FROM * 0.001)
    assert view.cost.sandbox == pytest.approx(0.1) and view.cost.billed == pytest.approx(0.1)
    assert get_account(engine, account_id=account.id).balance_usd == pytest.approx(0.9)
    engine.dispose()


def test_on_postgres_only_the_events_a_trigger_acts_on_call_it(postgres_url: str) -> None:
    """Migration 0025: each trigger's condition is evaluated as the row lands, so an event of another type, or a
    result that cost nothing, calls no trigger function (each called once per row before, and returned)."""
    engine = make_engine(postgres_url)
    migrate(engine)
    account, _ = create_account(engine, name="calls", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})
    insert = text("INSERT INTO events (run_id, seq, type, data, idem_key, created_at) "
                  "VALUES (:run, :seq, :type, CAST(:data AS json), :key, now())")
    calls = text("SELECT coalesce(pg_stat_get_xact_function_calls('bw_events_cost'::regproc), 0), "
                 "coalesce(pg_stat_get_xact_function_calls('bw_events_narration_usage'::regproc), 0)")
    rows = [("PhaseStarted", {"phase": "fetch"}), ("MaterializeTaskResult", {"cost_usd": 0.0}),
            ("MaterializeTaskResult", {}), ("MaterializeTaskAggregated", {"cost_usd": 0.5}),
            ("MaterializeTaskResult", {"cost_usd": 0.25}), ("NarrationUsage", {"calls": 1, "cost_usd": 0.0})]
    seen = []
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL track_functions = 'pl'"))
        for seq, (kind, data) in enumerate(rows, start=100):
            conn.execute(insert, {"run": run.id, "seq": seq, "type": kind, "data": json.dumps(data),
                                  "key": f"{run.id}:{seq}"})
            seen.append(tuple(conn.execute(calls).one()))
    assert seen == [(0, 0), (0, 0), (0, 0), (0, 0), (1, 0), (1, 1)]
    view = run_view(engine, get_run(engine, run_id=run.id))
    assert view.cost.model == pytest.approx(0.25) and view.cost.narration_usage.calls == 1
    engine.dispose()
