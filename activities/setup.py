"""Setup: install the scorer's Python requirements into the work sandbox through the egress proxy (so pip's hosts
meet the account's host policy and land in the blocked-host log), snapshot → SetupArtifact, SnapshotCreated.

Setup's input hash is model-free (the post-Fetch snapshot, the requirements, the Python version), so a public run's
identical install is a cache hit (``benchwright.phase_cache``): its snapshot is reused and nothing is installed."""

from __future__ import annotations

import platform

from temporalio import activity

from activities.common import Deps, phase
from activities.product import product_setup
from benchwright.errors import InvalidInput
from benchwright.events import SetupArtifact
from benchwright.phase_cache import PhaseCache, setup_input_hash
from benchwright.runs.pipeline import PhaseInput, PhaseResult
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.lifecycle import DEPS_DIR, latest_snapshot, open_sandbox, record_snapshot, take_snapshot

PIP_TIMEOUT_S = 600


class RequirementsFailed(InvalidInput):
    code = "requirements_failed"


class SetupActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="setup")
    async def setup(self, inp: PhaseInput) -> PhaseResult:
        if inp.launch.recipe is not None:  # a product-sandbox run: probe, setup commands, generated impl
            return await product_setup(self.deps, inp)
        requirements = list(inp.launch.requirements)
        python = platform.python_version()
        detail: dict[str, object] = {}
        async with phase(self.deps, inp) as scope:
            before = latest_snapshot(self.deps.engine, inp.run_id, before="setup")
            cache = PhaseCache(engine=self.deps.engine, settings=self.deps.settings,
                               workdir=self.deps.workdir(inp.run_id), inp=inp,
                               input_hash=setup_input_hash(before=before, requirements=requirements, python=python))
            # Never skipped by a pin (§2): a public run's identical install is copied, or the install runs.
            if (hit := await cache.lookup()) is not None:
                _, detail = await cache.replay(scope, hit)
            else:
                cache.begin()
                if requirements or before is None:
                    await self._install(inp, requirements, before)
                else:
                    # Nothing to install: the filesystem is the post-Fetch one, and keeps its content-addressed id.
                    await record_snapshot(engine=self.deps.engine, run_id=inp.run_id, phase="setup",
                                          invocation=inp.invocation, snapshot_id=before)
                scope.emit("artifact", SetupArtifact(python=python, requirements=requirements))
                await cache.record(scope)
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control, detail=detail)

    async def _install(self, inp: PhaseInput, requirements: list[str], before: str | None) -> None:
        async with open_sandbox(engine=self.deps.engine, settings=self.deps.settings, run_id=inp.run_id, role="work",
                                key=("setup", inp.invocation), restore=before) as box:
            if requirements:
                index = self.deps.settings.pip_index_url
                env = box.scorer_env({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
                                      **({"PIP_INDEX_URL": index} if index else {})})
                result = await box.backend.exec(
                    box.info.sandbox_id,
                    [box.python, "-m", "pip", "install", "--no-cache-dir", "--target", DEPS_DIR, *requirements],
                    env=env, timeout_s=PIP_TIMEOUT_S,
                    limits=ExecLimits(cpu_seconds=PIP_TIMEOUT_S, memory_mb=2048, wall_seconds=PIP_TIMEOUT_S,
                                      cpu_cores=2.0))
                if result.returncode != 0:
                    tail = (result.stderr or result.stdout).decode(errors="replace").strip()[-1500:]
                    raise RequirementsFailed(
                        f"installing {', '.join(requirements)} failed (exit {result.returncode}"
                        f"{', ' + result.killed_reason if result.killed_reason else ''}): {tail}")
            await take_snapshot(engine=self.deps.engine, settings=self.deps.settings, box=box, run_id=inp.run_id,
                                phase="setup", invocation=inp.invocation)
