"""Atomize: task_impl.py into the work sandbox (the launch's verbatim, or the Driver's), load-checked there,
snapshot → AtomizeArtifact{invocation, impl_sha256, source}, SnapshotCreated(atomize).

The Driver (``benchwright.drivers``) writes the scorer from what Analyze chose (the AnalyzeArtifact in the log),
and may try candidates on sample rows through the Workbench, ask for a restart or a human review. Driver-authored
code never runs in the worker: the load check and the samples run in the scorer runtime inside the sandbox.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import AsyncExitStack

from temporalio import activity

from activities.common import Deps, in_thread, phase, started
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
from benchwright.sandbox.lifecycle import (
    Sandbox,
    latest_snapshot,
    open_sandbox,
    runtime_files,
    snapshot_files,
    take_snapshot,
)
from benchwright.scoring.load_checks import RUNNER_SHA256, LoadChecks, load_check_key
from benchwright.store.models import Run
from benchwright.store.runs import get_run


class ScorerInvalid(InvalidInput):
    code = "scorer_invalid"


class AtomizeActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.load_checks = LoadChecks()

    @activity.defn(name="atomize")
    async def atomize(self, inp: PhaseInput) -> PhaseResult:
        inp = await with_found_scorer(self.deps, inp)  # a prompt Find pinned to an official impl scores with it
        engine, settings = self.deps.engine, self.deps.settings
        # Three reads of the store at once, beside the phase's opening (a round trip each on Postgres): the snapshot
        # the phases before left, the run (its backend and account, for the load check's key) and Analyze's choice.
        reads = asyncio.gather(
            in_thread(latest_snapshot, engine, inp.run_id, before="atomize"),
            in_thread(get_run, engine, run_id=inp.run_id),
            require_event(self.deps, inp.run_id, AnalyzeArtifact, needed_by="Atomize")
            if inp.launch.task_impl is None else _nothing())
        async with started(reads) as reading, phase(self.deps, inp) as scope, AsyncExitStack() as boxes:
            workdir = self.deps.workdir(inp.run_id)
            before, run, analysis = await reading

            async def open_box() -> Sandbox:
                return await boxes.enter_async_context(open_sandbox(
                    engine=engine, settings=settings, run_id=inp.run_id, role="work", key=("atomize", inp.invocation),
                    restore=before))

            bench = SandboxWorkbench(self.deps, open_box, inp)
            if inp.launch.task_impl is not None:
                source, origin = inp.launch.task_impl, "launch"
                note = "Using the task_impl.py supplied at launch, verbatim."
            else:
                assert analysis is not None
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
            key, backend = _check_key(run, before, source)
            if bench.box is None and key is not None and self.load_checks.passed(key):
                # Loaded on this filesystem before: the snapshot from files, as the sandbox would have left it.
                await snapshot_files(engine=engine, settings=settings, files=runtime_files(source), run_id=inp.run_id,
                                     phase="atomize", invocation=inp.invocation, base=before, emit=scope.emit,
                                     backend=backend)
            else:
                error = await bench.check(source)
                if error is not None:
                    raise ScorerInvalid(error)
                if key is not None:
                    self.load_checks.remember(key)
                await take_snapshot(engine=engine, settings=settings, box=await bench.sandbox(), run_id=inp.run_id,
                                    phase="atomize", invocation=inp.invocation)
            (workdir / "task_impl.py").write_text(source)
            await boxes.aclose()  # the sandbox (if one was opened) ends before the phase's artifacts are written
            scope.emit("narration", AgentTextEvent(phase="atomize", text=note))
            scope.emit("artifact", AtomizeArtifact(invocation=inp.invocation, impl_sha256=impl_sha256(source),
                                                   source=origin))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control)


def _check_key(run: Run, before: str | None, source: str) -> tuple[str | None, str]:
    """The load check's key (``benchwright.scoring.load_checks``) on the local backend, None elsewhere (a remote
    backend's image or template is part of what a check depends on: checked every time); and the run's backend
    (``run_backend``)."""
    backend = run.backend or "local"
    if backend != "local":
        return None, backend
    return load_check_key(account_id=run.account_id, backend="local", python=sys.executable, base_snapshot=before,
                          runner_sha256=RUNNER_SHA256, impl_sha256=impl_sha256(source)), backend


async def _nothing() -> None:
    return None
