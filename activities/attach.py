"""Attach: bind the run to its model route → ModelProxyArtifact{model_id, litellm_config_yaml} (no secrets)."""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, phase
from benchwright.events import ModelProxyArtifact
from benchwright.pipeline import PhaseInput, PhaseResult
from benchwright.proxy_config import litellm_config_yaml


class AttachActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="attach")
    async def attach(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            scope.emit("artifact", ModelProxyArtifact(model_id=inp.launch.model.identifier,
                                                      litellm_config_yaml=litellm_config_yaml(inp.launch.model)))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
