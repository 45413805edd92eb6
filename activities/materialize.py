"""Materialize: open the phase, run task batches (heartbeating, resumable), close the phase.

The workflow fans batches out and bounds how many run at once; each batch is ``benchwright.materialize.run_batch``
with this worker's SUT client. Results go to the store, never into workflow history.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.common import Deps, failure, in_thread, maybe_inject_fault
from benchwright.errors import BenchwrightError
from benchwright.events import PhaseCompleted, PhaseStarted
from benchwright.materialize import RunHalted, run_batch
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
from benchwright.store.control import halted_reason
from benchwright.sut import make_sut

HEARTBEAT_EVERY_S = 1.0
HALT_POLL_S = 0.2


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

        async def watch_halt() -> str:
            # §9: the pipeline polls the run's halted flag. Temporal's cancellation rides on (throttled)
            # heartbeats; the flag is quicker, so a stop lands within a poll interval.
            while True:
                await asyncio.sleep(HALT_POLL_S)
                reason = await in_thread(halted_reason, self.deps.engine, run_id=inp.run_id)
                if reason is not None:
                    return reason

        sut = make_sut(inp.model, prices=prices_for(inp.model), api_key=None,
                       concurrency=inp.concurrency, timeout_s=settings.sut_timeout_s, retries=settings.sut_retries)
        ticker = asyncio.create_task(keepalive())
        watcher = asyncio.create_task(watch_halt())
        work = asyncio.create_task(run_batch(engine=self.deps.engine, inp=inp, tasks_path=workdir / "tasks.jsonl",
                                             impl_path=workdir / "task_impl.py", workdir=workdir, sut=sut,
                                             progress=progress))
        try:
            await asyncio.wait([work, watcher], return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                raise RunHalted(watcher.result())
            result = work.result()
        except RunHalted as exc:
            raise ApplicationError(str(exc), exc.reason, type="RunHalted", non_retryable=True) from exc
        except (ScorerLoadError, BenchwrightError) as exc:
            raise failure(exc) from exc
        finally:
            for task in (ticker, watcher, work):
                task.cancel()
            await sut.aclose()
        maybe_inject_fault(self.deps, inp.metadata, "materialize")
        return result

