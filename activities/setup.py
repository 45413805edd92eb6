"""Setup: a product-sandbox run's probe, setup commands and generated impl (``benchwright.product.setup``), or the
scorer's Python requirements installed into the work sandbox and snapshotted (``benchwright.scoring.requirements``)
→ SetupArtifact, SnapshotCreated.

Setup's input hash is model-free (the post-Fetch snapshot, the requirements, the Python version), so a public run's
identical install is a cache hit (``benchwright.runs.phase_cache``): its snapshot is reused and nothing is installed."""

from __future__ import annotations

import platform
from typing import Any

from temporalio import activity

from activities.common import Deps, in_thread, not_cached, phase, started
from benchwright.events import SetupArtifact
from benchwright.product.setup import setup_product
from benchwright.registry.cache import Cell
from benchwright.runs.phase_cache import PhaseCache, setup_input_hash
from benchwright.runs.pipeline import PhaseInput, PhaseResult
from benchwright.sandbox.lifecycle import latest_snapshot
from benchwright.scoring.requirements import setup_requirements


class SetupActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="setup")
    async def setup(self, inp: PhaseInput) -> PhaseResult:
        if inp.launch.recipe is not None:  # a product-sandbox run: probe, setup commands, generated impl
            return await self._product(inp, inp.launch.recipe)
        requirements = list(inp.launch.requirements)
        python = platform.python_version()
        detail: dict[str, Any] = {}

        async def looked_up() -> tuple[str | None, PhaseCache, Cell | None]:
            before = await in_thread(latest_snapshot, self.deps.engine, inp.run_id, before="setup")
            cache = PhaseCache(engine=self.deps.engine, settings=self.deps.settings,
                               workdir=self.deps.workdir(inp.run_id), inp=inp,
                               input_hash=setup_input_hash(before=before, requirements=requirements, python=python))
            return before, cache, await cache.lookup()

        async with started(looked_up()) as lookup:
            # A cached-only attempt opens the phase only on a hit; any other looks up beside the opening.
            if inp.cached_only and (await lookup)[2] is None:
                raise not_cached(inp)
            async with phase(self.deps, inp) as scope:
                before, cache, hit = await lookup
                # Never skipped by a pin (§2): a public run's identical install is copied, or the install runs.
                if hit is not None:
                    _, detail = await cache.replay(scope, hit)
                else:
                    cache.begin()
                    await setup_requirements(engine=self.deps.engine, settings=self.deps.settings,
                                             run_id=inp.run_id, invocation=inp.invocation, requirements=requirements,
                                             before=before, emit=scope.emit)
                    scope.emit("artifact", SetupArtifact(python=python, requirements=requirements))
                    await cache.record(scope)
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control, detail=detail)

    async def _product(self, inp: PhaseInput, recipe: str) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            total = await setup_product(engine=self.deps.engine, settings=self.deps.settings,
                                        workdir=self.deps.workdir(inp.run_id), run_id=inp.run_id,
                                        invocation=inp.invocation, recipe_ref=recipe, max_tasks=inp.max_tasks,
                                        emit=scope.emit)
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, tasks=total, control=scope.control)
