"""Materialize for a product-sandbox run (``launch.recipe``; docs/agents.md): every task in its own task sandbox
restored from the post-Setup snapshot and killed when the task ends, the builtin product runner driving the model
through the batch's ``SutClient`` (the run's credential proxy). A retried batch skips the tasks an earlier attempt
recorded in full. Setup (the recipe frozen into ``recipe.json``, the post-Setup snapshot) is
``benchwright.product.setup``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from benchwright.events import Event, MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.llm.sut import SutClient
from benchwright.product.recipe import Recipe
from benchwright.product.runner import Workspace, clip, run_task
from benchwright.runs.materialize import RunHalted, _recorded
from benchwright.runs.pipeline import MaterializeBatchInput, MaterializeBatchResult
from benchwright.sandbox.lifecycle import open_sandbox, snapshot_of
from benchwright.settings import Settings
from benchwright.store.control import append_checking
from benchwright.store.db import outage_tolerant as in_thread
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import get_run

RECIPE_FILE = "recipe.json"
"""The run's frozen recipe, a work file Setup writes."""


async def is_product_run(engine: Engine, run_id: str) -> bool:
    """Whether the run is a product-sandbox run (its launch names a recipe)."""
    run = await in_thread(get_run, engine, run_id=run_id)
    return bool((run.launch or {}).get("recipe"))


async def product_batch(*, engine: Engine, settings: Settings, workdir: Path, inp: MaterializeBatchInput,
                        sut: SutClient, progress: Callable[[dict[str, Any]], None],
                        attempt: int = 1) -> MaterializeBatchResult:
    """Run the batch's tasks, each in its own task sandbox (see the module docstring). ``attempt``: the batch
    activity's attempt, which keys the agents' narration events (a retry narrates afresh).

    Raises:
        RunHalted: a task's commit crossed run.cost (the row is halted first).
    """
    run_id, invocation = inp.run_id, inp.invocation
    recipe = Recipe.model_validate(json.loads((workdir / RECIPE_FILE).read_text()))
    by_task, aggregated = await in_thread(_recorded, engine, inp)
    snapshot = await in_thread(snapshot_of, engine, run_id, "setup")
    gate = asyncio.Semaphore(max(1, min(inp.concurrency, settings.fanout_sandboxes)))
    counts = {"pass": 0, "fail": 0, "err": 0}
    written = 0

    async def one(index: int) -> None:
        nonlocal written
        task = recipe.tasks[index]
        async with gate, open_sandbox(engine=engine, settings=settings, run_id=run_id, role="task",
                                      key=("materialize", invocation, index), restore=snapshot,
                                      metadata={"task_index": index, "task_id": task.id}) as box:
            ws = Workspace(backend=box.backend, sandbox_id=box.info.sandbox_id, home=box.home, env=box.scorer_env(),
                           limits=recipe.limits)

            async def emit(what: str, event: Event) -> None:
                await in_thread(append_events, engine, run_id, [NewEvent.of(
                    event_key(run_id, "materialize", invocation, index, "agent", attempt, what), event)])

            ended = await run_task(sut=sut, ws=ws, task=task, system_prompt=recipe.system_prompt, index=index,
                                   invocation=invocation, emit=emit)
        meta = {"product": recipe.name, **ended.meta}
        reason = await in_thread(append_checking, engine, run_id, [
            NewEvent.of(event_key(run_id, "materialize", invocation, index, 0, "result"), MaterializeTaskResult(
                invocation=invocation, index=index, trial=0, score=ended.score, outcome=ended.outcome,
                output=clip(ended.output, 4096) if ended.output else None, meta=meta, error=ended.error,
                usage=ended.usage, cost_usd=ended.cost_usd, input=task.instruction)),
            NewEvent.of(event_key(run_id, "materialize", invocation, index, "aggregated"), MaterializeTaskAggregated(
                invocation=invocation, index=index, score=ended.score, outcome=ended.outcome,
                trial_scores=[ended.score]))], invocation=invocation, run_cost_usd=inp.run_cost_usd)
        counts[ended.outcome] += 1
        written += 1
        progress({"product": recipe.name, "trials_recorded": written})
        if reason:
            raise RunHalted(reason)

    todo = [i for i in range(inp.start, min(inp.stop, len(recipe.tasks))) if i not in aggregated]
    for i in range(inp.start, inp.stop):
        if i in aggregated and i in by_task:
            t = by_task[i].get(0)
            counts["err" if t is None or t.errored else "pass" if (t.score or 0) >= 1.0 else "fail"] += 1
    try:
        async with asyncio.TaskGroup() as group:  # one failure (a halt) cancels the siblings
            for index in todo:
                group.create_task(one(index))
    except BaseExceptionGroup as failed:  # the batch activity translates a RunHalted or a domain error
        raise failed.exceptions[0] from None
    return MaterializeBatchResult(start=inp.start, stop=inp.stop, trials_recorded=written, passed=counts["pass"],
                                  failed=counts["fail"], errored=counts["err"])
