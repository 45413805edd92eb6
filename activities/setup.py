"""Setup: prepare the scorer's runtime → SetupArtifact{python, requirements}.

The builtin scorer needs the standard library only; installing declared dependencies into an isolated work
sandbox arrives with the sandbox backends.
"""

from __future__ import annotations

import platform

from temporalio import activity

from activities.common import Deps, phase
from benchwright.events import SetupArtifact
from benchwright.pipeline import PhaseInput, PhaseResult


class SetupActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="setup")
    async def setup(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            scope.emit("artifact", SetupArtifact(python=platform.python_version(), requirements=[]))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
