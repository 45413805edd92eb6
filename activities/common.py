"""What every phase activity shares: dependencies, the phase's event bracket, and error translation.

A phase activity is an adapter: it opens the phase (PhaseStarted), calls the domain, and closes the phase with
its artifacts and PhaseCompleted in one transaction. Every event key is derived from (phase, invocation, what),
so a Temporal retry of the same invocation appends nothing twice.

Every phase activity heartbeats while it works (``heartbeating``): a worker killed mid-phase is noticed within the
workflow's phase heartbeat timeout and another worker retries the phase, and a halt's cancellation reaches the phase
at its next await instead of after it ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from benchwright.data.blobs import BlobStore
from benchwright.errors import BenchwrightError
from benchwright.events import (
    EVENT_TYPES,
    AgentTextEvent,
    Event,
    PhaseCompleted,
    PhaseRestartRequested,
    PhaseStarted,
)
from benchwright.registry.cache import Cell
from benchwright.runs import handoff
from benchwright.runs.pipeline import NOT_CACHED_ERROR, PhaseControl, PhaseInput
from benchwright.sandbox.factory import blob_store
from benchwright.security.traces import format_trace, relative_trace
from benchwright.settings import Settings
from benchwright.store.control import append_closing
from benchwright.store.db import outage_tolerant
from benchwright.store.events import NewEvent, event_key

T = TypeVar("T")


@dataclass
class Deps:
    engine: Engine
    settings: Settings

    def run_dir(self, run_id: str) -> Path:
        return self.settings.runs_dir() / run_id

    @property
    def blobs(self) -> BlobStore:
        """Where phases hand files to each other (``benchwright.runs.handoff``) and remote snapshots live."""
        return blob_store(self.settings)

    def workdir(self, run_id: str) -> Path:
        path = self.settings.runs_dir() / run_id / "work"
        path.mkdir(parents=True, exist_ok=True)
        return path


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking store I/O off the worker's event loop, waiting out a store outage (a restarting Postgres, a full
    disk) in place for up to ``STORE_OUTAGE_S`` (``benchwright.store.db.outage_tolerant``)."""
    return await outage_tolerant(fn, *args, **kwargs)


@asynccontextmanager
async def started(aw: Awaitable[T]) -> AsyncIterator[asyncio.Future[T]]:
    """``aw`` running beside the block: a phase's first reads of the store, begun before its opening's append so
    that the two round trips overlap (each a round trip on Postgres, one after the other before). The block awaits
    the future where it needs the result; should it leave first (the opening failed, the phase was cancelled), the
    read is cancelled and waited out, its error dropped."""
    future = asyncio.ensure_future(aw)
    try:
        yield future
    finally:
        if not future.done():
            future.cancel()
        await asyncio.gather(future, return_exceptions=True)


HEARTBEAT_EVERY_S = 2.0
"""How often a phase activity heartbeats; the workflow's ``PHASE_HEARTBEAT`` (10 s) is the bound it keeps under."""


def heartbeat(*details: Any) -> None:
    """``activity.heartbeat``, except in a local activity (a quick phase run in its workflow task,
    ``benchwright.runs.pipeline.local_attempt``): Temporal keeps no heartbeat for one, and the SDK logs each
    as failed. A halt's cancellation reaches a local activity without one."""
    if not activity.info().is_local:
        activity.heartbeat(*details)


class Heartbeat:
    """The activity's heartbeat while a phase works: a background beat every ``HEARTBEAT_EVERY_S`` that resends the
    latest details given to ``send`` (a cache hit's ``{"cache_hit": ...}``, which the Temporal UI shows), so the
    beat never clobbers them."""

    def __init__(self) -> None:
        self.details: tuple[Any, ...] = ()

    def send(self, *details: Any) -> None:
        """Heartbeat now with ``details``; every later beat carries them too."""
        self.details = details
        heartbeat(*details)

    async def beat(self) -> None:
        while True:
            heartbeat(*self.details)
            await asyncio.sleep(HEARTBEAT_EVERY_S)


@asynccontextmanager
async def heartbeating() -> AsyncIterator[Heartbeat]:
    """Heartbeat in the background for as long as the block runs (blocking work goes through ``in_thread``, so
    the event loop stays free to beat). A cancellation the heartbeat brings back (a halt) lands in the block."""
    heartbeat = Heartbeat()
    task = asyncio.create_task(heartbeat.beat())
    try:
        yield heartbeat
    finally:
        task.cancel()


@dataclass
class PhaseScope:
    inp: PhaseInput
    artifacts: list[tuple[str, Event]] = field(default_factory=list)
    control: PhaseControl | None = None
    """Set when the phase asks the workflow for a restart, a review, or (a ceiling crossed) a halt."""
    heartbeat: Heartbeat = field(default_factory=Heartbeat)
    """The activity's heartbeat: ``scope.heartbeat.send(details)`` for details the phase wants shown."""
    files: dict[str, str] = field(default_factory=dict)
    """The run's work files as recorded when the phase opened (path -> blob id, ``handoff.latest_files``), read as it
    opened (``handoff.append_reading_files``): what the work directory was restored to."""
    cell: Cell | None = None
    """The phase's cache cell, written with its closing events (``keep_cell``)."""

    def emit(self, what: str, event: Event) -> None:
        """Queue an event to land with PhaseCompleted (artifacts, driver narration, a snapshot taken without a
        sandbox)."""
        self.artifacts.append((what, event))

    def keep_cell(self, cell: Cell) -> None:
        """Write ``cell`` with the phase's closing events (nothing if the phase fails); a later call replaces it."""
        self.cell = cell


def failure(exc: BaseException) -> ApplicationError:
    """A permanent failure as Temporal should carry it: our error type's name, message and stack trace."""
    # Relative paths, no local values (benchwright.security.traces): the trace reaches the run's owner as PhaseFailed.
    return ApplicationError(str(exc), {"stack_trace": format_trace(exc)}, type=type(exc).__name__,
                            non_retryable=True)


def not_cached(inp: PhaseInput) -> ApplicationError:
    """A ``cached_only`` local attempt giving way on a cache miss, before the phase opens: retryable, so the workflow
    runs the ordinary activity, and benign, so the worker does not log it as a failure."""
    return ApplicationError(f"{inp.phase} v{inp.invocation}: no cross-run cache hit; the phase runs as its activity",
                            type=NOT_CACHED_ERROR, category=ApplicationErrorCategory.BENIGN)


def _shown(data: dict[str, Any]) -> dict[str, Any]:
    """An event's data as accounts may read it: a failure's stack trace without the server's paths (the workflow
    passes Temporal's own trace through when the cause was not ours)."""
    if isinstance(data.get("stack_trace"), str):
        return {**data, "stack_trace": relative_trace(data["stack_trace"])}
    return data


def workflow_events(run_id: str, items: list[dict[str, Any]]) -> list[NewEvent]:
    """Events the workflow decided on (``EventsInput.events``, a phase's ``preface``) as the log stores them: each
    keyed by the workflow's own key, so whichever activity writes one first, it lands once."""
    return [NewEvent.of(event_key(run_id, e["key"]), EVENT_TYPES[e["type"]].model_validate(_shown(e["data"])))
            for e in items]


@asynccontextmanager
async def phase(deps: Deps, inp: PhaseInput) -> AsyncIterator[PhaseScope]:
    """Bracket one phase invocation with PhaseStarted / artifacts + PhaseCompleted.

    Domain errors (``BenchwrightError``) are permanent: they fail the activity without retry. Anything else is
    treated as transient and retried by the workflow's RetryPolicy.
    """
    async with heartbeating() as heartbeat, _bracket(deps, inp, heartbeat) as scope:
        yield scope


@asynccontextmanager
async def _bracket(deps: Deps, inp: PhaseInput, heartbeat: Heartbeat) -> AsyncIterator[PhaseScope]:
    started = time.monotonic()
    key = (inp.phase, inp.invocation)
    opening = [*workflow_events(inp.run_id, inp.preface),  # the pipeline's start, on the first phase
               NewEvent.of(event_key(inp.run_id, *key, "started"), PhaseStarted(phase=inp.phase))]
    if inp.instructions:
        opening.append(NewEvent.of(event_key(inp.run_id, *key, "instructions"), AgentTextEvent(
            phase=inp.phase, text=f"Following the reviewer's instructions: {inp.instructions}")))
    files = await in_thread(handoff.append_reading_files, deps.engine, inp.run_id, opening)
    # The work directory is a cache of the run's handed-off files (benchwright.runs.handoff): any worker holds any
    # phase.
    await handoff.restore(engine=deps.engine, blobs=deps.blobs, run_id=inp.run_id, workdir=deps.workdir(inp.run_id),
                          files=files)
    scope = PhaseScope(inp, heartbeat=heartbeat, files=files)
    try:
        yield scope
    except BenchwrightError as exc:
        raise failure(exc) from exc
    closing = [NewEvent.of(event_key(inp.run_id, *key, what), ev) for what, ev in scope.artifacts]
    closing.append(NewEvent.of(event_key(inp.run_id, *key, "work-files"), await handoff.publish(
        engine=deps.engine, blobs=deps.blobs, run_id=inp.run_id, phase=inp.phase, invocation=inp.invocation,
        workdir=deps.workdir(inp.run_id), known=files)))
    scope.control = scope.control or _driver_request(deps, inp)  # the Driver's own request (activities.driving)
    if scope.control is not None and scope.control.kind == "restart":
        closing.append(NewEvent.of(event_key(inp.run_id, *key, "restart"),
                                   PhaseRestartRequested(phase=inp.phase, reason=scope.control.reason)))
    else:
        closing.append(NewEvent.of(event_key(inp.run_id, *key, "completed"), PhaseCompleted(
            phase=inp.phase, duration_ms=int((time.monotonic() - started) * 1000))))
    # "The pipeline polls that flag between phases" (§9): a crossed ceiling halts before the next phase, checked in
    # the closing transaction (unless the phase asks for something else already).
    budget_key = f"{inp.phase}-{inp.invocation}-budget" if scope.control is None else None
    if reason := await in_thread(append_closing, deps.engine, inp.run_id, closing, cell=scope.cell,
                                 run_cost_usd=inp.run_cost_usd, budget_key=budget_key):
        scope.control = PhaseControl(kind="halt", reason=reason)
    await maybe_stall_local(deps, inp.launch.metadata, inp.phase)
    maybe_inject_fault(deps, inp.launch.metadata, inp.phase)


def _driver_request(deps: Deps, inp: PhaseInput) -> PhaseControl | None:
    """What the Driver asks at the end of this invocation. The builtin driver never asks on its own; tests drive
    the Driver's two tools through ``metadata.test_hooks`` (honoured only with ``allow_fault_injection``):

        {"restart": {"phase": "atomize", "times": 3, "reason": "..."}}   ask to restart on invocations 1..times
        {"review": {"phase": "analyze", "reason": "..."}}                 requestHumanReview on invocation 1
    """
    hooks = inp.launch.metadata.get("test_hooks") if deps.settings.allow_fault_injection else None
    if not isinstance(hooks, dict):
        return None
    restart, review = hooks.get("restart"), hooks.get("review")
    if (isinstance(restart, dict) and restart.get("phase") == inp.phase
            and inp.invocation <= int(restart.get("times", 1))):
        return PhaseControl(kind="restart", reason=str(restart.get("reason", "the Driver asked to start over")))
    if isinstance(review, dict) and review.get("phase") == inp.phase and inp.invocation == 1:
        return PhaseControl(kind="review", reason=str(review.get("reason", "the Driver needs a decision")))
    return None


async def maybe_stall_local(deps: Deps, metadata: dict[str, Any], phase_name: str) -> None:
    """Tests only (``allow_fault_injection``): a phase run as a local activity stalls ``local_stall_s`` after its
    events are committed, past the workflow's local budget, so the ordinary activity must run the same invocation
    again and the log must still hold each event once: ``{"fault_injection": {"phase": ..., "local_stall_s": 8}}``."""
    fault = metadata.get("fault_injection") if deps.settings.allow_fault_injection else None
    stall = fault.get("local_stall_s") if isinstance(fault, dict) and fault.get("phase") == phase_name else None
    if isinstance(stall, int | float) and math.isfinite(stall) and activity.info().is_local:
        await asyncio.sleep(min(max(float(stall), 0.0), 60.0))


def maybe_inject_fault(deps: Deps, metadata: dict[str, Any], phase_name: str) -> None:
    """Tests only (``allow_fault_injection``): fail the first attempt of a phase after its events are committed,
    so the retry must append the same events again and the log must still hold each once."""
    fault = metadata.get("fault_injection") if deps.settings.allow_fault_injection else None
    if (isinstance(fault, dict) and fault.get("phase") == phase_name and "local_stall_s" not in fault
            and activity.info().attempt == 1):
        raise RuntimeError(f"injected fault after {phase_name} committed its events (attempt 1)")
