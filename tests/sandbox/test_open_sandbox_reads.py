"""A Materialize batch reads its run's row once (with its call limit, ``model_call_limit``) and opens its sandbox
with it: ``open_sandbox`` given the row reads no other, and given none (or another run's) reads the run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from benchwright.sandbox.lifecycle import open_sandbox
from benchwright.schemas import LaunchRequest
from benchwright.security.quotas import model_call_limit
from benchwright.settings import Settings
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.runs import create_run

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_sandbox_opened_with_the_runs_row_reads_no_other(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    settings = Settings(data_dir=tmp_path / "data")
    account, _ = create_account(engine, name="reads")
    run_ids = [create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                          launch=LaunchRequest(dataset="x.jsonl", model="openai/x")).id for _ in range(2)]
    run, _ = model_call_limit(engine, settings, run_id=run_ids[0])
    other, _ = model_call_limit(engine, settings, run_id=run_ids[1])
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM runs" in statement:
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        for n, (given, expected) in enumerate(((run, 0), (None, 1), (other, 1))):
            reads.clear()
            async with open_sandbox(engine=engine, settings=settings, run_id=run.id, role="work", key=("t", n),
                                    restore=None, run=given) as box:
                assert box.info.metadata["account"] == run.account_id
            assert len(reads) == expected, reads
    finally:
        event.remove(engine, "before_cursor_execute", count)
        engine.dispose()
