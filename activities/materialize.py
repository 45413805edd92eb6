"""Materialize: open the phase, run task batches (heartbeating, resumable), close the phase.

The workflow fans batches out and bounds how many run at once; each batch is one domain call
(``benchwright.runs.placement.run_placed_batch``) with this worker's SUT client, wrapped in heartbeats, the halt watch
and error mapping. Results go to the store, never into workflow history.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.attach import live_proxy
from activities.common import Deps, failure, in_thread, maybe_inject_fault
from benchwright.aio import wait_out
from benchwright.errors import BenchwrightError
from benchwright.events import PhaseCompleted, PhaseRestartRequested, PhaseStarted
from benchwright.llm.breaker import SutBreaker
from benchwright.llm.httpclient import ConnectionShelf
from benchwright.llm.prices import prices_for
from benchwright.llm.sut import SutClient, run_sut
from benchwright.proxy.model_proxy import ProxyHandle
from benchwright.runs import handoff
from benchwright.runs.halts import HALTED_ERROR
from benchwright.runs.limits import ScorerCeilings
from benchwright.runs.materialize import RunHalted
from benchwright.runs.pipeline import (
    MaterializeBatchInput,
    MaterializeBatchResult,
    MaterializeCompleteInput,
    PhaseControl,
    PhaseInput,
    PhaseResult,
    resweep_hooks,
)
from benchwright.runs.placement import run_placed_batch
from benchwright.scoring.host import ScorerLoadError
from benchwright.security.fair_share import FairShare, GatedSut
from benchwright.security.quotas import model_call_limit
from benchwright.store.control import halt_run, halted_reasons
from benchwright.store.events import NewEvent, append_events, event_key

HEARTBEAT_EVERY_S = 1.0


HALT_POLL_S = 0.2


class HaltWatch:
    """The halted flag of every batch this worker runs, polled in one read per ``HALT_POLL_S`` (one read per batch
    per interval was a worker's largest store load beside twenty batches, and held its event loop up for every other
    account's work: ``benchwright.security.fair_share``)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._waiting: dict[str, list[asyncio.Future[str]]] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, run_id: str) -> str:
        """The run's halt reason, once it is halted."""
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(run_id, []).append(waiter)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            return await waiter
        finally:
            waiters = self._waiting.get(run_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiting.pop(run_id, None)

    async def _poll(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(HALT_POLL_S)
                if not self._waiting:
                    break
                halted = await in_thread(halted_reasons, self.deps.engine, run_ids=list(self._waiting))
                for run_id, reason in halted.items():
                    for waiter in self._waiting.get(run_id, []):
                        if not waiter.done():
                            waiter.set_result(reason)
        except Exception as exc:  # noqa: BLE001 - the store stayed out: every batch's watcher raises it, as its own poll did
            for waiters in self._waiting.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)


def sweep_started(run_id: str, invocation: int) -> NewEvent:
    """The Materialize sweep's PhaseStarted, keyed by its invocation: written by ``begin`` or by every batch of the
    sweep (``MaterializeBatchInput.opens_phase``), it lands once."""
    return NewEvent.of(event_key(run_id, "materialize", invocation, "started"), PhaseStarted(phase="materialize"))


def resweep_request(deps: Deps, metadata: dict[str, Any], invocation: int) -> PhaseControl | None:
    """The Driver asking, at the end of a sweep, for Atomize to write a new impl (§2 "Materialize v2"). The
    builtin driver never does; tests ask through ``metadata.test_hooks`` (only with ``allow_fault_injection``):
    ``{"resweep": {"times": 1, "reason": "..."}}`` asks after sweeps 1..times."""
    hooks = resweep_hooks(metadata) if deps.settings.allow_fault_injection else None
    ask = hooks.get("resweep") if hooks is not None else None
    if isinstance(ask, dict) and invocation <= int(ask.get("times", 1)):
        return PhaseControl(kind="restart", phase="atomize",
                            reason=str(ask.get("reason", "the Driver wants a new impl after this sweep")))
    return None


class MaterializeActivities:
    def __init__(self, deps: Deps, share: FairShare | None = None, connections: ConnectionShelf | None = None) -> None:
        self.deps = deps
        self.connections = connections
        """The worker's idle connections to its credential proxy, which every batch's model calls go through: a
        batch takes its warm connections from there and leaves them there (``benchwright.llm.httpclient``)."""
        self.ceilings = ScorerCeilings.of(deps.settings)
        self.halts = HaltWatch(deps)
        self.share = share or FairShare()
        """This worker's fair share between accounts: each account's model calls in flight (its ``model_calls``
        quota, and its share of the worker while other accounts have work on it)."""

    @activity.defn(name="materialize_begin")
    async def begin(self, inp: PhaseInput) -> PhaseResult:
        await in_thread(append_events, self.deps.engine, inp.run_id, [sweep_started(inp.run_id, inp.invocation)])
        return PhaseResult(phase=inp.phase, invocation=inp.invocation)

    @activity.defn(name="materialize_complete")
    async def complete(self, inp: MaterializeCompleteInput) -> PhaseResult:
        """Close the sweep; when the Driver wants a new impl, say so (PhaseRestartRequested for Atomize) and hand
        the workflow the restart, which runs Atomize and then Materialize again as the next invocation."""
        control = resweep_request(self.deps, inp.metadata, inp.invocation)
        events = [NewEvent.of(event_key(inp.run_id, "materialize", inp.invocation, "completed"),
                              PhaseCompleted(phase="materialize", duration_ms=inp.duration_ms))]
        if control is not None:
            events.append(NewEvent.of(event_key(inp.run_id, "materialize", inp.invocation, "restart"),
                                      PhaseRestartRequested(phase=str(control.phase), reason=control.reason)))
        await in_thread(append_events, self.deps.engine, inp.run_id, events)
        return PhaseResult(phase="materialize", invocation=inp.invocation, control=control)

    def _sut(self, inp: MaterializeBatchInput, proxy: ProxyHandle | None, account_id: str, quota: int) -> SutClient:
        """The run's model route (the one Attach probed), through the account's model-call gate (its fair share of
        this worker), behind the breaker that halts the run ``sut_unavailable`` when its calls keep failing fatally
        (the halt watcher below then stops the batch)."""
        settings = self.deps.settings
        sut: SutClient = run_sut(inp.model, prices=prices_for(inp.model), proxy=proxy, concurrency=inp.concurrency,
                                 timeout_s=settings.sut_timeout_s, retries=settings.sut_retries,
                                 budget_s=inp.task_limits.attempt_duration_s, shelf=self.connections)
        self.share.set_quota(account_id, quota)
        sut = GatedSut(sut, share=self.share, account=account_id, concurrency=inp.concurrency)

        async def halt(reason: str) -> None:
            await in_thread(halt_run, self.deps.engine, run_id=inp.run_id, reason=reason,
                            key=f"materialize-{inp.invocation}-{inp.start}-sut")

        return SutBreaker(sut, spec=inp.model, threshold=settings.sut_breaker_threshold, on_trip=halt)

    @activity.defn(name="materialize_batch")
    async def batch(self, inp: MaterializeBatchInput) -> MaterializeBatchResult:
        workdir = self.deps.workdir(inp.run_id)
        # The sweep's PhaseStarted before the batch's sandbox events and results (the same event from every batch),
        # and the work files its restore goes by read with it.
        files = await in_thread(handoff.append_reading_files, self.deps.engine, inp.run_id,
                                [sweep_started(inp.run_id, inp.invocation)]) if inp.opens_phase else None
        await handoff.restore(engine=self.deps.engine, blobs=self.deps.blobs, run_id=inp.run_id, workdir=workdir,
                              files=files)
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
            return await self.halts.wait(inp.run_id)

        # Read once per batch; started again if it died with the worker that started it.
        proxy = await live_proxy(self.deps, run_id=inp.run_id, spec=inp.model)
        run, quota = await in_thread(model_call_limit, self.deps.engine, self.deps.settings, run_id=inp.run_id)
        sut = self._sut(inp, proxy, run.account_id, quota)
        # Connections to the model open while the batch's sandbox and scorer runtime start.
        warming = asyncio.create_task(sut.warm((inp.stop - inp.start) * inp.trials.plan.k))
        ticker = asyncio.create_task(keepalive())
        watcher = asyncio.create_task(watch_halt())
        # benchwright.runs.placement: the harness process, a product run's agents, or the scorer in its sandboxes
        work = asyncio.create_task(run_placed_batch(
            engine=self.deps.engine, settings=self.deps.settings, inp=inp, sut=sut, proxy=proxy, workdir=workdir,
            progress=progress, ceilings=self.ceilings, attempt=activity.info().attempt, run=run))
        try:
            await asyncio.wait([work, watcher], return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                raise RunHalted(watcher.result())
            result = work.result()
        except RunHalted as exc:
            raise ApplicationError(str(exc), exc.reason, type=HALTED_ERROR, non_retryable=True) from exc
        except (ScorerLoadError, BenchwrightError) as exc:
            raise failure(exc) from exc
        finally:
            for task in (warming, ticker, watcher, work):
                task.cancel()
            # Even when Temporal cancels this activity, the batch's sandboxes end (SandboxKilled) before it does:
            # the workflow writes the run's end once the activity has ended.
            await wait_out(work)
            await sut.aclose()
        maybe_inject_fault(self.deps, inp.metadata, "materialize")
        return result

