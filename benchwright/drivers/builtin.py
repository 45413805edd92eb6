"""The builtin driver: offline, deterministic, no LLM (the embedded stack's default, §8).

Find: the registered benchmark or catalog entry the prompt names (name or alias as whole words; on a tie the
registry's), else the one sharing the most keywords (at least ``MIN_KEYWORDS``, and strictly more than any other);
otherwise Find fails with the three nearest entries. Analyze: the scorer template that fits the columns and sample
rows (``benchwright.drivers.templates``) and the subset the prompt's scoping phrase asks for
(``benchwright.drivers.scoping``). Atomize: the template rendered, then loaded in the work sandbox before it is
accepted.
"""

from __future__ import annotations

import asyncio

from benchwright.drivers.base import (
    AnalyzeDecision,
    AtomizeDecision,
    DriverContext,
    DriverFailed,
    FindDecision,
    register_driver,
)
from benchwright.drivers.catalog import MIN_KEYWORDS
from benchwright.drivers.scoping import parse_scope, select_rows
from benchwright.drivers.templates import render_plan, select_template


class BuiltinDriver:
    name = "builtin"

    async def find(self, ctx: DriverContext) -> FindDecision | None:
        if ctx.catalog is None or not ctx.launch.prompt:
            raise DriverFailed("Find needs a prompt and a dataset catalog")
        ranked = ctx.catalog.rank(ctx.launch.prompt)
        if not ranked:
            raise DriverFailed("the dataset catalog is empty", code="dataset_not_found")
        best = ranked[0]
        runner_up = ranked[1].score if len(ranked) > 1 else 0.0
        if best.score >= 10 or (best.score >= MIN_KEYWORDS and best.score > runner_up):
            kind = "registered subset" if best.entry.registry is not None else "catalog dataset"
            ctx.narrate(f"Resolved the prompt to {kind} '{best.entry.name}': {best.why}.")
            return FindDecision(entry=best.entry, why=best.why)
        nearest = ", ".join(f"'{m.entry.name}' ({m.entry.description or 'no description'})" for m in ranked[:3])
        raise DriverFailed(f"no catalog dataset matches the prompt {ctx.launch.prompt!r}; the nearest are: "
                           f"{nearest}. Name one of them, or launch with a dataset URL", code="dataset_not_found")

    async def analyze(self, ctx: DriverContext) -> AnalyzeDecision | None:
        if ctx.schema is None:
            raise DriverFailed("Analyze needs the dataset's schema")
        plan = None
        if ctx.launch.task_impl is None:
            plan = select_template(columns=ctx.schema.columns, rows=ctx.sample_rows)
            ctx.narrate(f"Scorer: the {plan.template} template, because {plan.why}.")
        subset = None
        scope = parse_scope(ctx.launch.prompt)
        if not scope.empty and ctx.all_rows is not None:
            # A scan of every row (a 2 GB dataset takes seconds): off the worker's event loop.
            subset = await asyncio.to_thread(select_rows, scope, columns=ctx.schema.columns, rows=ctx.all_rows())
            if subset is not None:
                ctx.narrate(f"The prompt scopes the run ({'; '.join(scope.said)}): {len(subset.indices)} of "
                            f"{ctx.schema.rows} rows, {subset.recipe}.")
        if ctx.schema.splits:
            ctx.narrate("The dataset ships splits, each a subset (docs/concepts.md §13): " + ", ".join(
                f"{name} ({count} rows)" for name, count in ctx.schema.splits.items())
                + ("." if subset is not None else "; no split was named, so every row is evaluated."))
        return AnalyzeDecision(plan=plan, subset=subset)

    async def atomize(self, ctx: DriverContext) -> AtomizeDecision | None:
        if ctx.plan is None:
            raise DriverFailed("Analyze chose no scorer template (and the launch brought no task_impl.py)")
        source = render_plan(ctx.plan)  # Atomize load-checks it in the work sandbox before accepting it
        fields = ", ".join(f"{role} '{col}'" for role, col in ctx.plan.fields.items())
        return AtomizeDecision(source=source, origin=f"template:{ctx.plan.template}",
                               note=f"Wrote task_impl.py from the {ctx.plan.template} template ({fields}).")


register_driver("builtin", lambda name: BuiltinDriver())
