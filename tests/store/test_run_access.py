"""What a run's Fetch and Attach check the places they reach against (``benchwright.store.policy.run_access``): the
run's account and its host policy, as ``get_account`` and ``get_policy`` give them, read in one statement (one round
trip on Postgres, where they were four), on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from benchwright.errors import NotFound
from benchwright.sandbox.lifecycle import run_backend
from benchwright.store.accounts import get_account
from benchwright.store.policy import get_policy, replace_policy, run_access, set_default_mode, upsert_rule
from benchwright.store.runs import get_run
from tests.store.conftest import round_trips


def _read_once(engine: Engine, run_id: str) -> tuple[Any, Any, int]:
    """``run_access``'s account and policy, and how many statements it took (its backend checked on the way)."""
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        if engine.dialect.name == "postgresql":
            with round_trips(engine) as trips:
                account, policy, backend = run_access(engine, run_id=run_id)
            assert trips == [1]
        else:
            account, policy, backend = run_access(engine, run_id=run_id)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert backend == run_backend(engine, run_id)
    return account, policy, len(statements)


def test_a_runs_account_and_policy_are_read_in_one_statement(store_run: tuple[Engine, str]) -> None:
    engine, run_id = store_run
    account_id = get_run(engine, run_id=run_id).account_id

    def expected() -> tuple[Any, Any]:
        return get_account(engine, account_id=account_id), get_policy(engine, account_id=account_id)

    # A fresh account: no policy row, no rules (allow by default)
    account, policy, statements = _read_once(engine, run_id)
    assert statements == 1
    assert (account.model_dump(), policy) == (expected()[0].model_dump(), expected()[1])
    assert policy.default == "allow" and policy.rules == []

    # Rules and no policy row (allow by default), in the order they were made
    upsert_rule(engine, account_id=account_id, pattern="pypi.org", action="allow")
    upsert_rule(engine, account_id=account_id, pattern="*.example.com", action="allow")
    upsert_rule(engine, account_id=account_id, pattern="evil.example.com:443", action="block")
    account, policy, statements = _read_once(engine, run_id)
    assert (statements, policy) == (1, expected()[1]) and policy.default == "allow"
    assert [(r.pattern, r.action) for r in policy.rules] == [
        ("pypi.org", "allow"), ("*.example.com", "allow"), ("evil.example.com:443", "block")]
    assert account.id == account_id and account.model_dump() == expected()[0].model_dump()

    # A default mode of its own; then the whole policy replaced
    set_default_mode(engine, account_id=account_id, mode="block")
    account, policy, statements = _read_once(engine, run_id)
    assert (statements, policy) == (1, expected()[1]) and policy.default == "block" and len(policy.rules) == 3
    replace_policy(engine, account_id=account_id, default="allow", rules=[("files.example.org", "block")])
    account, policy, statements = _read_once(engine, run_id)
    assert (statements, policy) == (1, expected()[1])
    assert policy.default == "allow" and [r.pattern for r in policy.rules] == ["files.example.org"]

    with pytest.raises(NotFound, match="run nope not found"):
        run_access(engine, run_id="nope")
    engine.dispose()
