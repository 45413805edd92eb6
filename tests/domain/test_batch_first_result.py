"""A Materialize batch commits its first result at once, while the scorer is still at work: the log's first result
(what the run page shows first, and what the re-run bench reads as the first SUT call) is not held back until a
flush interval passes or the batch ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from benchwright.events import MaterializeTaskResult
from benchwright.runs.materialize import run_batch
from benchwright.runs.pipeline import MaterializeBatchInput
from benchwright.schemas import LaunchRequest, ModelSpec
from benchwright.scoring.aggregators import TrialsConfig
from benchwright.scoring.host import TrialItem, TrialLimits, TrialRecord
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.models import EventRow, Run
from benchwright.store.runs import create_run


def _batch_store(tmp_path: Path, n: int) -> tuple[Engine, Run, Path]:
    """A store with one run, and its ``n`` tasks' file."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    account, _ = create_account(engine, name="a", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"input": f"{i}+{i}", "reference": str(2 * i)}) + "\n" for i in range(n)))
    return engine, run, tasks


async def test_the_first_result_is_committed_while_the_batch_still_runs(tmp_path: Path) -> None:
    engine, run, tasks = _batch_store(tmp_path, 3)
    committed = asyncio.Event()
    seen_mid_batch: list[int] = []

    def results_in_store() -> list[int]:
        with Session(engine) as session:
            rows = session.exec(select(EventRow).where(EventRow.run_id == run.id,
                                                       EventRow.type == MaterializeTaskResult.type_name())
                                .order_by(col(EventRow.seq))).all()
        return [int(r.data["index"]) for r in rows]

    async def execute(items: list[TrialItem], on_record: Callable[[TrialRecord], Awaitable[None]],
                      limits: TrialLimits) -> None:
        first, *rest = items
        await on_record(TrialRecord(index=first.index, trial=0, outcome="pass", score=1.0, output="ok"))
        await asyncio.wait_for(committed.wait(), 10)  # the commit's heartbeat, long before any flush interval
        seen_mid_batch.extend(await asyncio.to_thread(results_in_store))
        for item in rest:
            await on_record(TrialRecord(index=item.index, trial=0, outcome="pass", score=1.0, output="ok"))

    def progress(details: dict[str, Any]) -> None:
        if details["trials_recorded"]:
            committed.set()

    result = await run_batch(engine=engine, inp=MaterializeBatchInput(
        run_id=run.id, invocation=1, start=0, stop=3, model=ModelSpec(identifier="openai/x"), trials=TrialsConfig(),
        concurrency=1), tasks_path=tasks, execute=execute, progress=progress)
    assert seen_mid_batch == [0]
    assert result.trials_recorded == 3 and sorted(results_in_store()) == [0, 1, 2]


async def test_the_last_result_is_committed_while_the_scorer_is_torn_down(tmp_path: Path) -> None:
    """The batch's last results are committed as soon as the last trial settles, not after the scorer runtime and
    its sandbox are torn down (~10 ms at every batch's end): ``execute`` here stays in its teardown until they are."""
    engine, run, tasks = _batch_store(tmp_path, 5)
    first_committed, all_committed = asyncio.Event(), asyncio.Event()

    async def execute(items: list[TrialItem], on_record: Callable[[TrialRecord], Awaitable[None]],
                      limits: TrialLimits) -> None:
        first, *rest = items
        await on_record(TrialRecord(index=first.index, trial=0, outcome="pass", score=1.0, output="ok"))
        await asyncio.wait_for(first_committed.wait(), 10)  # committed at once (the test above)
        for item in rest:  # then the rest, none of them reaching FLUSH_EVERY or FLUSH_INTERVAL_S
            await on_record(TrialRecord(index=item.index, trial=0, outcome="pass", score=1.0, output="ok"))
        await asyncio.wait_for(all_committed.wait(), 5)  # the teardown: the last commit goes on beside it

    def progress(details: dict[str, Any]) -> None:
        if details["trials_recorded"] >= 1:
            first_committed.set()
        if details["trials_recorded"] == 5:
            all_committed.set()

    result = await run_batch(engine=engine, inp=MaterializeBatchInput(
        run_id=run.id, invocation=1, start=0, stop=5, model=ModelSpec(identifier="openai/x"), trials=TrialsConfig(),
        concurrency=5), tasks_path=tasks, execute=execute, progress=progress)
    assert result.trials_recorded == 5 and result.passed == 5
    with Session(engine) as session:
        results = session.exec(select(EventRow).where(EventRow.run_id == run.id,
                                                      EventRow.type == MaterializeTaskResult.type_name())).all()
    assert sorted(int(r.data["index"]) for r in results) == [0, 1, 2, 3, 4]  # each once
