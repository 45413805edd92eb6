"""Analyze: detect rows, columns and splits and normalize to tasks.jsonl; the Driver picks the scorer shape and the
subset the prompt scopes (§7, §13) → [SyntheticSubsetCreated], AnalyzeArtifact{template, fields},
DatasetTasksArtifact{count}. Which work file is the dataset, and its format, come from the run's FetchArtifact."""

from __future__ import annotations

from pathlib import Path

from temporalio import activity

from activities.common import Deps, PhaseScope, in_thread, phase, started
from activities.driving import driver_context, no_decision, require_event, take_request
from activities.find import with_found_scorer
from benchwright.data.datasets import (
    analyze_dataset,
    iter_task_rows,
    keep_rows,
    read_task_rows,
)
from benchwright.drivers import DatasetSchema, driver_for
from benchwright.drivers.base import SAMPLE_ROWS
from benchwright.events import (
    AgentTextEvent,
    AnalyzeArtifact,
    DatasetTasksArtifact,
    FetchArtifact,
    SyntheticSubsetCreated,
)
from benchwright.registry.cache import Cell
from benchwright.runs import handoff
from benchwright.runs.phase_cache import PhaseCache, analyze_input_hash
from benchwright.runs.pipeline import PhaseInput, PhaseResult


class AnalyzeActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="analyze")
    async def analyze(self, inp: PhaseInput) -> PhaseResult:
        inp = await with_found_scorer(self.deps, inp)  # a prompt Find pinned to an official impl scores with it

        async def looked_up() -> tuple[PhaseCache, Cell | None]:
            cache = PhaseCache(engine=self.deps.engine, settings=self.deps.settings,
                               workdir=self.deps.workdir(inp.run_id), inp=inp,
                               input_hash=await in_thread(analyze_input_hash, self.deps.engine, inp))  # issue 9
            return cache, await cache.lookup()

        # The cache's lookup and Fetch's artifact are read beside the phase's opening.
        async with (started(looked_up()) as lookup,
                    started(require_event(self.deps, inp.run_id, FetchArtifact, needed_by="Analyze")) as fetching,
                    phase(self.deps, inp) as scope):
            cache, hit = await lookup
            if hit is not None:  # a public run analyzed these bytes: copy its work
                count, _ = await cache.replay(scope, hit)
            else:
                cache.begin()
                workdir = self.deps.workdir(inp.run_id)
                fetched = await fetching
                name = handoff.dataset_file(fetched, scope.files)
                count = await self._analyze(inp, scope, source=workdir / name, fmt=fetched["format"],
                                            tasks=workdir / "tasks.jsonl")
                if count is not None:  # None: the Driver asked for a restart or a review
                    await cache.record(scope, tasks=count)
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, tasks=count, control=scope.control)

    async def _analyze(self, inp: PhaseInput, scope: PhaseScope, *, source: Path, fmt: str, tasks: Path) -> int | None:
        """Normalize the rows, let the Driver decide, apply its subset; the task count (None: it asked for help)."""
        analysis = await in_thread(analyze_dataset, source=source, fmt=fmt, tasks_path=tasks)
        schema = DatasetSchema(format=analysis.format, rows=analysis.rows, columns=analysis.columns,
                               splits=analysis.splits)
        sample = await in_thread(read_task_rows, tasks, 0, SAMPLE_ROWS)
        ctx = driver_context(scope, inp, "analyze", schema=schema, sample_rows=sample,
                             all_rows=lambda: iter_task_rows(tasks))
        decision = await driver_for(inp.driver).analyze(ctx)
        if take_request(ctx, scope):
            return None
        if decision is None:
            raise no_decision("analyze")
        rows = analysis.rows
        if decision.subset is not None:
            subset = decision.subset
            await in_thread(keep_rows, tasks, subset.indices)
            rows = len(subset.indices)
            scope.emit("subset", SyntheticSubsetCreated(name=subset.name, recipe=subset.recipe, count=rows,
                                                        source_rows=subset.indices, synthetic=subset.synthetic))
        plan = decision.plan
        scope.emit("narration", AgentTextEvent(phase="analyze", text=(
            f"{analysis.rows} rows of {analysis.format}; columns {', '.join(analysis.columns)}"
            + ("; the scorer comes with the launch (task_impl)." if plan is None else "."))))
        scope.emit("artifact", AnalyzeArtifact(
            format=analysis.format, rows=analysis.rows, columns=analysis.columns,
            input_field=plan.fields.get("input") if plan else None,
            reference_field=plan.fields.get("reference") if plan else None,
            template=plan.template if plan else None, fields=dict(plan.fields) if plan else {},
            splits=analysis.splits))
        count = rows if inp.max_tasks is None else min(rows, inp.max_tasks)
        if count < rows:
            scope.emit("cap", AgentTextEvent(phase="analyze", text=(
                f"Sample capped at {count} of {rows} tasks (the narrowest of constraints.max_tasks, "
                "metadata.limit and the harness's own limit).")))
        scope.emit("tasks", DatasetTasksArtifact(count=count))
        return count
