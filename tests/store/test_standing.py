"""An account's standing as a launch is admitted (``benchwright.security.quotas.standing``): its balance, its quotas and
what it holds of them, equal to ``get_account``, ``quotas_for`` and ``usage`` read apart, in one statement when it
has no running run and two when it has (their scored tasks), on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from benchwright.errors import NotFound
from benchwright.events import MaterializeTaskAggregated
from benchwright.schemas import LaunchRequest
from benchwright.security.quotas import Standing, quotas_for, set_quotas, standing, usage
from benchwright.settings import Settings
from benchwright.store.accounts import create_account, credit, get_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import create_run, finish_run


def _counted(engine: Engine, settings: Settings, account_id: str) -> tuple[Standing, int]:
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        now = standing(engine, settings, account_id=account_id)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return now, len(statements)


def test_a_launchs_standing_is_the_balance_the_quotas_and_the_usage_in_one_read(db_url: str, tmp_path: Any) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    settings = Settings(data_dir=tmp_path)
    try:
        account, _ = create_account(engine, name="stand", balance_usd=2.5)

        def apart() -> Standing:
            return Standing(balance_usd=get_account(engine, account_id=account.id).balance_usd,
                            quotas=quotas_for(engine, settings, account_id=account.id),
                            usage=usage(engine, account_id=account.id))

        now, statements = _counted(engine, settings, account.id)  # no quota row, no run
        assert now == apart() and statements == 1
        assert now.balance_usd == 2.5 and now.usage.runs == now.usage.tasks == 0

        set_quotas(engine, settings, account_name="stand", values={"runs": 4, "tasks": 900}, actor="test")
        credit(engine, account_name="stand", amount_usd=1.0, actor="test")
        runs = [create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                           launch=LaunchRequest(dataset="x.jsonl", model="openai/x")) for _ in range(3)]
        for run, total in zip(runs, (10, 20, 30), strict=True):
            append_events(engine, run.id, [], tasks_total=total)
        # the first run scored 4 tasks in its first sweep and 6 in its second; the third finished
        append_events(engine, runs[0].id, [NewEvent.of(event_key(runs[0].id, "agg", sweep, i),
                                                       MaterializeTaskAggregated(
            invocation=sweep, index=i, score=1.0, outcome="pass", trial_scores=[1.0]))
            for sweep, n in ((1, 4), (2, 6)) for i in range(n)])
        finish_run(engine, run_id=runs[2].id, status="ok")

        now, statements = _counted(engine, settings, account.id)
        assert now == apart() and statements == 2
        assert now.balance_usd == 3.5
        assert (now.quotas.runs, now.quotas.tasks, now.quotas.model_calls) == (4, 900, settings.quota_model_calls)
        assert now.quotas.overridden == ("runs", "tasks")
        assert (now.usage.runs, now.usage.tasks) == (2, (10 - 6) + 20)

        with pytest.raises(NotFound):
            standing(engine, settings, account_id="no-such-account")
    finally:
        engine.dispose()
