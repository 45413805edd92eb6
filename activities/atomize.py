"""Atomize: task_impl.py into the work sandbox (the launch's verbatim, or the Driver's), load-checked there,
snapshot → AtomizeArtifact{invocation, impl_sha256, source}, SnapshotCreated(atomize).

The Driver (``benchwright.drivers``) writes the scorer from what Analyze chose (the AnalyzeArtifact in the log),
and may try candidates on sample rows through the Workbench, ask for a restart or a human review. Driver-authored
code never runs in the worker: the load check and the samples run in the scorer runtime inside the sandbox.
"""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, in_thread, phase
from activities.driving import (
    SandboxWorkbench,
    driver_context,
    no_decision,
    require_event,
    take_request,
)
from activities.find import with_found_scorer
from benchwright.data.datasets import read_task_rows
from benchwright.drivers import DatasetSchema, ScorerPlan, driver_for
from benchwright.drivers.base import SAMPLE_ROWS
from benchwright.drivers.templates import impl_sha256
from benchwright.errors import InvalidInput
from benchwright.events import AgentTextEvent, AnalyzeArtifact, AtomizeArtifact
from benchwright.runs.pipeline import PhaseInput, PhaseResult
from benchwright.sandbox.lifecycle import latest_snapshot, open_sandbox, take_snapshot


class ScorerInvalid(InvalidInput):
    code = "scorer_invalid"


class AtomizeActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="atomize")
    async def atomize(self, inp: PhaseInput) -> PhaseResult:
        inp = await with_found_scorer(self.deps, inp)  # a prompt Find pinned to an official impl scores with it
        async with phase(self.deps, inp) as scope:
            workdir = self.deps.workdir(inp.run_id)
            async with open_sandbox(engine=self.deps.engine, settings=self.deps.settings, run_id=inp.run_id,
                                    role="work", key=("atomize", inp.invocation),
                                    restore=latest_snapshot(self.deps.engine, inp.run_id, before="atomize")) as box:
                bench = SandboxWorkbench(self.deps, box, inp)
                if inp.launch.task_impl is not None:
                    source, origin = inp.launch.task_impl, "launch"
                    note = "Using the task_impl.py supplied at launch, verbatim."
                else:
                    analysis = await require_event(self.deps, inp.run_id, AnalyzeArtifact, needed_by="Atomize")
                    plan = ScorerPlan(template=analysis["template"], fields=analysis["fields"], why="") \
                        if analysis.get("template") else None
                    ctx = driver_context(
                        scope, inp, "atomize", plan=plan, workbench=bench,
                        schema=DatasetSchema(format=analysis["format"], rows=analysis["rows"],
                                             columns=analysis["columns"], splits=analysis.get("splits") or {}),
                        sample_rows=await in_thread(read_task_rows, workdir / "tasks.jsonl", 0, SAMPLE_ROWS))
                    decision = await driver_for(inp.driver).atomize(ctx)
                    if take_request(ctx, scope):
                        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
                    if decision is None:
                        raise no_decision("atomize")
                    source, origin, note = decision.source, decision.origin, decision.note
                error = await bench.check(source)
                if error is not None:
                    raise ScorerInvalid(error)
                (workdir / "task_impl.py").write_text(source)
                await take_snapshot(engine=self.deps.engine, settings=self.deps.settings, box=box, run_id=inp.run_id,
                                    phase="atomize", invocation=inp.invocation)
            scope.emit("narration", AgentTextEvent(phase="atomize", text=note))
            scope.emit("artifact", AtomizeArtifact(invocation=inp.invocation, impl_sha256=impl_sha256(source),
                                                   source=origin))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
