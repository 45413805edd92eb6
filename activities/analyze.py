"""Analyze: detect rows, columns and the input/reference fields; normalize to tasks.jsonl →
AnalyzeArtifact, DatasetTasksArtifact{count}."""

from __future__ import annotations

import json

from temporalio import activity

from activities.common import Deps, in_thread, phase
from activities.phase_cache import PhaseCache, analyze_input_hash
from benchwright.datasets import analyze_dataset
from benchwright.events import AgentTextEvent, AnalyzeArtifact, DatasetTasksArtifact
from benchwright.pipeline import PhaseInput, PhaseResult


class AnalyzeActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="analyze")
    async def analyze(self, inp: PhaseInput) -> PhaseResult:
        cache = PhaseCache(self.deps, inp, await in_thread(analyze_input_hash, self.deps, inp))  # issue 9
        async with phase(self.deps, inp) as scope:
            if (hit := await cache.lookup()) is not None:  # a public run analyzed these bytes: copy its work
                count, _ = await cache.replay(scope, hit)
            else:
                cache.begin()
                workdir = self.deps.workdir(inp.run_id)
                fetched = json.loads((workdir / "fetch.json").read_text())
                analysis = await in_thread(analyze_dataset, source=workdir / fetched["path"], fmt=fetched["format"],
                                           tasks_path=workdir / "tasks.jsonl",
                                           require_fields=inp.launch.task_impl is None)
                (workdir / "analysis.json").write_text(json.dumps(analysis.__dict__))
                scope.emit("narration", AgentTextEvent(
                    phase="analyze",
                    text=f"{analysis.rows} rows of {analysis.format}; " + (
                        f"input field '{analysis.input_field}', reference field '{analysis.reference_field}'."
                        if analysis.input_field else "columns left to the launch's own scorer.")))
                scope.emit("artifact", AnalyzeArtifact(format=analysis.format, rows=analysis.rows, columns=analysis.columns,
                                                       input_field=analysis.input_field,
                                                       reference_field=analysis.reference_field))
                count = analysis.rows if inp.max_tasks is None else min(analysis.rows, inp.max_tasks)
                if count < analysis.rows:
                    scope.emit("cap", AgentTextEvent(phase="analyze", text=(
                        f"Sample capped at {count} of {analysis.rows} tasks (the narrowest of constraints.max_tasks, "
                        "metadata.limit and the harness's own limit).")))
                scope.emit("tasks", DatasetTasksArtifact(count=count))
                await cache.record(scope, tasks=count)
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, tasks=count, control=scope.control)
