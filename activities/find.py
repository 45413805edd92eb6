"""Find (§2): resolve a natural-language launch's prompt to a dataset of the deployment's catalog →
DatasetResolved{name, source, why}. Runs only when the launch names no dataset (``plan_phases``).

The Driver chooses; Fetch reads the choice from the log and fetches it under the catalog's rules
(``benchwright.drivers.catalog``): the prompt never becomes a path or a URL by itself.
"""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, in_thread, phase
from activities.driving import catalog_of, driver_context, no_decision, take_request
from benchwright.drivers import driver_for
from benchwright.events import DatasetResolved
from benchwright.pipeline import PhaseInput, PhaseResult


class FindActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="find")
    async def find(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            catalog = await in_thread(catalog_of, self.deps.settings)
            ctx = driver_context(scope, inp, "find", catalog=catalog)
            decision = await driver_for(inp.driver).find(ctx)
            if not take_request(ctx, scope):
                if decision is None:
                    raise no_decision("find")
                entry = decision.entry
                scope.emit("resolved", DatasetResolved(prompt=inp.launch.prompt or "", name=entry.name,
                                                       source=entry.source, format=entry.format,
                                                       license=entry.license, why=decision.why))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)
