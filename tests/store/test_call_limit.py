"""The model-call limit a batch reads as it starts (``benchwright.security.quotas.model_call_limit``): the run's
row and its account's ``model_calls`` quota as ``quotas_for`` gives it (the deployment's default, or the admin's
override), in one statement, on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.security.quotas import model_call_limit, quotas_for, set_quotas
from benchwright.settings import Settings
from benchwright.store.models import Account
from benchwright.store.runs import get_run


def test_a_batch_reads_its_runs_account_and_call_limit_in_one_statement(store_run: tuple[Engine, str],
                                                                         tmp_path: Any) -> None:
    engine, run_id = store_run
    settings = Settings(data_dir=tmp_path)
    account_id = get_run(engine, run_id=run_id).account_id
    with Session(engine) as session:
        name = session.get(Account, account_id).name  # type: ignore[union-attr]
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    default = settings.quota_model_calls
    for values, reset, expected in (({}, (), default), ({"model_calls": 7}, (), 7),
                                    ({"runs": 3}, ("model_calls",), default)):
        set_quotas(engine, settings, account_name=name, values=values, reset=reset, actor="test")
        statements.clear()
        event.listen(engine, "before_cursor_execute", count)
        try:
            limit = model_call_limit(engine, settings, run_id=run_id)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        assert len(statements) == 1, statements
        run, calls = limit
        assert (run.id, run.account_id) == (run_id, account_id)
        assert calls == expected == quotas_for(engine, settings, account_id=account_id).model_calls
    engine.dispose()
