"""The cost trigger (SQLite and Postgres): running totals by source, incurred vs billed, balance debits."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from benchwright.events import Event, MaterializeTaskResult
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account, credit, get_account
from benchwright.store.control import budget_halt_reason, clear_halt, halt_run, halted_reason, halted_reasons
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.models import Run
from benchwright.store.runs import create_run, get_run, run_view


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
