"""Atomize: write task_impl.py (the launch's verbatim, or the builtin driver's template) and check it loads →
AtomizeArtifact{invocation, impl_sha256, source}."""

from __future__ import annotations

import json

from temporalio import activity

from activities.common import Deps, phase
from benchwright.errors import InvalidInput
from benchwright.events import AgentTextEvent, AtomizeArtifact
from benchwright.pipeline import PhaseInput, PhaseResult
from benchwright.scoring.host import ScorerLoadError, check_impl
from benchwright.scoring.template import EXACT_MATCH, impl_sha256, render_exact_match


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
            impl = workdir / "task_impl.py"
            impl.write_text(source)
            try:
                await check_impl(impl_path=impl, workdir=workdir)
            except ScorerLoadError as exc:
                raise ScorerInvalid(str(exc)) from exc
            scope.emit("narration", AgentTextEvent(phase="atomize", text=note))
            scope.emit("artifact", AtomizeArtifact(invocation=inp.invocation, impl_sha256=impl_sha256(source),
                                                   source=origin))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
