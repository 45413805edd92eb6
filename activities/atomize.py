"""Atomize: write task_impl.py (the launch's verbatim, or the builtin driver's template) into the work sandbox,
check it loads there, snapshot → AtomizeArtifact{invocation, impl_sha256, source}, SnapshotCreated(atomize).

Driver-authored code never runs in the worker: the load check is the scorer runtime inside the sandbox.
"""

from __future__ import annotations

import json

from temporalio import activity

from activities.common import Deps, phase
from activities.sandboxes import latest_snapshot, put_runtime, sandbox, take_snapshot
from benchwright.errors import InvalidInput
from benchwright.events import AgentTextEvent, AtomizeArtifact
from benchwright.pipeline import PhaseInput, PhaseResult
from benchwright.sandbox import ExecLimits
from benchwright.scoring.host import ScorerLoadError, check_impl
from benchwright.scoring.template import EXACT_MATCH, impl_sha256, render_exact_match

CHECK_LIMITS = ExecLimits(cpu_seconds=60, memory_mb=1024, wall_seconds=120, max_processes=64)


class ScorerInvalid(InvalidInput):
    code = "scorer_invalid"


class AtomizeActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="atomize")
    async def atomize(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            workdir = self.deps.workdir(inp.run_id)
            if inp.launch.task_impl is not None:
                source, origin = inp.launch.task_impl, "launch"
                note = "Using the task_impl.py supplied at launch, verbatim."
            else:
                analysis = json.loads((workdir / "analysis.json").read_text())
                source = render_exact_match(input_field=analysis["input_field"],
                                            reference_field=analysis["reference_field"])
                origin = EXACT_MATCH
                note = (f"Wrote task_impl.py: normalized exact match of the reply to '{analysis['reference_field']}', "
                        f"prompting with '{analysis['input_field']}'.")
            (workdir / "task_impl.py").write_text(source)
            async with sandbox(self.deps, run_id=inp.run_id, role="work", key=("atomize", inp.invocation),
                               restore=latest_snapshot(self.deps, inp.run_id, before="atomize")) as box:
                await put_runtime(box, source)
                try:
                    await check_impl(spawn=box.spawn(box.scorer_env(), CHECK_LIMITS))
                except ScorerLoadError as exc:
                    raise ScorerInvalid(str(exc)) from exc
                await take_snapshot(self.deps, box, run_id=inp.run_id, phase="atomize", invocation=inp.invocation)
            scope.emit("narration", AgentTextEvent(phase="atomize", text=note))
            scope.emit("artifact", AtomizeArtifact(invocation=inp.invocation, impl_sha256=impl_sha256(source),
                                                   source=origin))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
