"""NarrationUsage in the store (issue 26), SQLite and Postgres: the 0002 cost trigger puts its cost into
cost.narration and, with the markup, cost.billed (debiting the balance); migration 0013's trigger keeps the call and
token counts beside it; a retried append counts nothing twice."""

from __future__ import annotations

import pytest

from benchwright.events import NarrationUsage, RunNarrated
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account, get_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import create_run, get_run, run_view


def test_narration_usage_moves_cost_billed_and_the_counts(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="narrated", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={}, billing_markup=1.5)
    usage = [NewEvent.of(event_key(run.id, "report", "narration", i), NarrationUsage(
        model="openai/narrator", calls=1, prompt_tokens=1000 * (i + 1), completion_tokens=100, cost_usd=0.01))
        for i in range(2)]
    narrated = NewEvent.of(event_key(run.id, "report", "narration"), RunNarrated(text="t", narrator="openai/narrator"))
    append_events(engine, run.id, [*usage, narrated])
    append_events(engine, run.id, [*usage, narrated])  # a retried append: nothing lands twice

    view = run_view(engine, get_run(engine, run_id=run.id))
    assert view.cost.narration == pytest.approx(0.02)
    assert view.cost.incurred == pytest.approx(0.02)
    assert view.cost.billed == pytest.approx(0.03)
    assert view.cost.narration_usage.model_dump() == {"calls": 2, "prompt_tokens": 3000, "completion_tokens": 200}
    assert get_account(engine, account_id=account.id).balance_usd == pytest.approx(0.97)
    engine.dispose()
