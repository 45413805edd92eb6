"""Materialize: open the phase, run task batches (heartbeating, resumable), close the phase.

The workflow fans batches out and bounds how many run at once; each batch is ``benchwright.materialize.run_batch``
with this worker's SUT client. Results go to the store, never into workflow history.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from activities.common import Deps, failure, in_thread, maybe_inject_fault
from benchwright.errors import BenchwrightError
from benchwright.events import PhaseCompleted, PhaseStarted
from benchwright.materialize import run_batch
from benchwright.pipeline import (
    MaterializeBatchInput,
    MaterializeBatchResult,
    MaterializeCompleteInput,
    PhaseInput,
    PhaseResult,
)
from benchwright.prices import prices_for
from benchwright.scoring.host import ScorerLoadError
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.sut import make_sut

HEARTBEAT_EVERY_S = 1.0


class MaterializeActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="materialize_begin")
    async def begin(self, inp: PhaseInput) -> PhaseResult:
        await in_thread(append_events, self.deps.engine, inp.run_id, [
            NewEvent.of(event_key(inp.run_id, inp.phase, inp.invocation, "started"), PhaseStarted(phase=inp.phase))])
        return PhaseResult(phase=inp.phase, invocation=inp.invocation)

    @activity.defn(name="materialize_complete")
    async def complete(self, inp: MaterializeCompleteInput) -> None:
        await in_thread(append_events, self.deps.engine, inp.run_id, [
            NewEvent.of(event_key(inp.run_id, "materialize", inp.invocation, "completed"),
                        PhaseCompleted(phase="materialize", duration_ms=inp.duration_ms))])

    @activity.defn(name="materialize_batch")
    async def batch(self, inp: MaterializeBatchInput) -> MaterializeBatchResult:
        workdir = self.deps.workdir(inp.run_id)
        settings = self.deps.settings
        last: dict[str, Any] = {}

        def progress(details: dict[str, Any]) -> None:
            last.update(details)
            activity.heartbeat(details)

        async def keepalive() -> None:
            # Heartbeats carry the last committed progress; between commits they only say "still alive".
            while True:
                await asyncio.sleep(HEARTBEAT_EVERY_S)
                activity.heartbeat(last)

        sut = make_sut(inp.model, prices=prices_for(inp.model), api_key=None,
                       concurrency=inp.concurrency, timeout_s=settings.sut_timeout_s, retries=settings.sut_retries)
        ticker = asyncio.create_task(keepalive())
        try:
            result = await run_batch(engine=self.deps.engine, inp=inp, tasks_path=workdir / "tasks.jsonl",
                                     impl_path=workdir / "task_impl.py", workdir=workdir, sut=sut, progress=progress)
        except (ScorerLoadError, BenchwrightError) as exc:
            raise failure(exc) from exc
        finally:
            ticker.cancel()
            await sut.aclose()
        maybe_inject_fault(self.deps, inp.metadata, "materialize")
        return result

