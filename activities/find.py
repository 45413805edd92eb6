"""Find (§2): resolve a natural-language launch's prompt to a registered benchmark the caller can see, or to a
dataset of the deployment's catalog → DatasetResolved{name, source, why, benchmark_id, subset_id, impl_id}. Runs
only when the launch names no dataset (``plan_phases``).

The Driver chooses among both (``Catalog.with_registry``: the registry's entries first); Fetch reads the choice
from the log and fetches it under the catalog's rules (``benchwright.drivers.catalog``), or copies the registered
subset's snapshot: the prompt never becomes a path or a URL by itself. A registered choice with an official impl
is pinned like a pinned launch (``benchwright.registry.find``), and Analyze and Atomize score with that impl's
exact bytes (``with_found_scorer``).
"""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, in_thread, phase
from activities.driving import catalog_of, driver_context, no_decision, take_request
from benchwright.drivers import driver_for
from benchwright.drivers.catalog import CatalogEntry
from benchwright.drivers.scoping import parse_scope
from benchwright.events import DatasetResolved
from benchwright.registry.blobs import BlobStore
from benchwright.registry.find import found_scorer, registry_entries
from benchwright.registry.shape import set_pin
from benchwright.runs.pipeline import PhaseInput, PhaseResult
from benchwright.store.runs import get_run


class FindActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="find")
    async def find(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            account_id = (await in_thread(get_run, self.deps.engine, run_id=inp.run_id)).account_id
            registered = await in_thread(registry_entries, self.deps.engine, account_id=account_id)
            catalog = (await in_thread(catalog_of, self.deps.settings)).with_registry(registered)
            ctx = driver_context(scope, inp, "find", catalog=catalog)
            decision = await driver_for(inp.driver).find(ctx)
            if not take_request(ctx, scope):
                if decision is None:
                    raise no_decision("find")
                entry = decision.entry
                why = decision.why
                if entry.registry is not None:
                    pinned = await self._pin(inp, entry)
                    why = f"{why}; {pinned}"
                    ctx.narrate(f"{pinned[0].upper()}{pinned[1:]}.")
                ref = entry.registry
                scope.emit("resolved", DatasetResolved(
                    prompt=inp.launch.prompt or "", name=entry.name, source=entry.source, format=entry.format,
                    license=entry.license, why=why, benchmark_id=ref.benchmark_id if ref else None,
                    subset_id=ref.subset_id if ref else None,
                    impl_id=ref.impl_id if ref and self._pinnable(inp) else None))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)

    @staticmethod
    def _pinnable(inp: PhaseInput) -> bool:
        """A registered choice is pinned to its impl unless the launch brings its own scorer or the prompt scopes
        a synthetic subset (then the run's tasks are not the subset's, and it must not be filed under it)."""
        return inp.launch.task_impl is None and parse_scope(inp.launch.prompt).empty

    async def _pin(self, inp: PhaseInput, entry: CatalogEntry) -> str:
        """Pin the run to the registered subset's official impl when it may be; says what the run scores with."""
        ref = entry.registry
        assert ref is not None
        if ref.impl_id is None:
            return "the subset has no official impl yet, so the Driver writes the scorer and the run is not filed " \
                   "under the benchmark (publish it to file it)"
        if not self._pinnable(inp):
            return f"the launch's own scorer or the prompt's scoping phrase keeps the run off official impl " \
                   f"{ref.impl_id}, so it is not filed under the benchmark"
        await in_thread(set_pin, self.deps.engine, run_id=inp.run_id, pinned=ref.pin())
        return f"scored with the subset's official impl {ref.impl_id} (latest:official), as a pinned launch"


async def with_found_scorer(deps: Deps, inp: PhaseInput) -> PhaseInput:
    """``inp`` with the official impl Find pinned as the launch's task_impl.py (exactly its bytes), so Analyze
    and Atomize treat it as the launch's own scorer; ``inp`` unchanged for any other launch."""
    if inp.launch.dataset is not None or inp.launch.task_impl is not None:
        return inp
    source = await in_thread(found_scorer, deps.engine, BlobStore.from_settings(deps.settings), run_id=inp.run_id)
    if source is None:
        return inp
    return inp.model_copy(update={"launch": inp.launch.model_copy(update={"task_impl": source})})
