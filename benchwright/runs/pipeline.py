"""The run's plan and the payloads that cross into Temporal (workflow and activity inputs and results).

``plan_phases`` is the skip logic of §2 as a plain function: which phases run for a launch, and why the others
do not. The workflow executes the plan; it never decides skips itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from benchwright.data.dataset_access import is_url
from benchwright.harness.config import is_bridge
from benchwright.runs.limits import RunLimits, TaskLimits
from benchwright.schemas import PHASES, LaunchRequest, ModelSpec
from benchwright.scoring.aggregators import TrialsConfig

BRIDGE_SKIPS = {
    "find": "harness-bridge run ({harness}): the harness's task is the benchmark's identity",
    "fetch": "harness-bridge run ({harness}): the harness supplies its own dataset",
    "analyze": "harness-bridge run ({harness}): the harness supplies its own dataset and scorer",
    "atomize": "harness-bridge run ({harness}): the harness supplies its own scorer",
}
"""§2 hard skips by run kind; Setup (the task's requirements), Attach and Materialize run."""
PRODUCT_SKIPS = {
    "find": "product-sandbox run: the recipe ({recipe}) is the benchmark",
    "fetch": "product-sandbox run: the recipe ({recipe}) brings its base and tasks",
    "analyze": "product-sandbox run: the recipe ({recipe}) lists its tasks",
    "atomize": "product-sandbox run: task_impl.py is generated from the recipe ({recipe}) at Setup",
}
"""§2 hard skips of a product-sandbox run; Setup (probe, setup commands, snapshot), Attach and Materialize run."""


QUICK_PHASES = frozenset({"fetch", "analyze", "setup", "attach", "atomize"})
"""Phases that take tens of milliseconds on a plain run, or on a cross-run cache hit: run inside the workflow task as
local activities (``local_attempt``), they skip the ~35 ms hop through Temporal's queues that an activity costs
each."""
NOT_CACHED_ERROR = "PhaseNotCached"
"""The error type with which a ``cached_only`` local attempt gives way on a cache miss, before it writes anything;
the ordinary activity of the same invocation then does the work."""


@dataclass(frozen=True)
class LocalAttempt:
    """How a phase is tried as a local activity before its ordinary activity (``local_attempt``)."""

    cached_only: bool
    """Only on a cross-run cache hit (``PhaseInput.cached_only``): a URL's download or a requirements install can
    take minutes, a hit takes milliseconds."""
    since_cached_phases: bool
    """Added with the workflow patch ``cached-phases-local``; the others came with ``quick-phases-local``."""


def local_attempt(phase: str, launch: LaunchRequest, driver: str, backend: str | None) -> LocalAttempt | None:
    """Whether ``phase`` is first tried as a local activity in the run's workflow task (issue 25), within a short
    budget, before the ordinary activity of the same invocation; None when it goes straight to its activity.

    Only where the phase is quick and local for sure: the builtin driver (an LLM driver's calls take seconds), the
    local backend (no remote sandboxes), no harness bridge or product recipe (each starts sandboxes of its own), a
    dataset named at launch (not Find's), and Atomize only with the generated scorer (a launch's own ``task_impl`` is
    load-checked in a sandbox). A downloaded dataset's Fetch and a requirements install's Setup are tried locally
    only on a cache hit (``cached_only``): what a re-run of a known benchmark meets."""
    if phase not in QUICK_PHASES or driver != "builtin" or is_bridge(launch) or launch.recipe is not None:
        return None
    if backend != "local" or (phase == "fetch" and not launch.dataset):
        return None
    if phase == "atomize" and launch.task_impl is not None:
        return None
    downloads = phase == "fetch" and is_url(launch.dataset or "")
    cached_only = downloads or (phase == "setup" and bool(launch.requirements))
    return LocalAttempt(cached_only=cached_only, since_cached_phases=cached_only or bool(launch.requirements))


class PlannedPhase(BaseModel):
    phase: str
    skip_reason: str | None = None


def plan_phases(launch: LaunchRequest, *, fork: ForkDecision | None = None) -> list[PlannedPhase]:
    """Every phase of §2 in order, each with the reason it is skipped (None when it runs).

    Find resolves a benchmark name to a dataset; a dataset launch has nothing left to find. A forked launch
    (``fork``, the Fork phase's decision) starts with the ``fork`` phase, which has run by the time the plan is
    made, and skips every phase it inherited from the parent (§10: nothing upstream of the rewind point reruns).
    """
    plan: list[PlannedPhase] = [PlannedPhase(phase="fork")] if fork is not None else []
    for phase in PHASES:
        reason = None
        if fork is not None and phase in fork.inherited:
            reason = f"inherited from {fork.parent_run_id} (fork at {fork.rewind_to})"
        elif phase == "find" and launch.dataset:
            reason = "dataset given at launch"
        elif phase in BRIDGE_SKIPS and is_bridge(launch):
            reason = BRIDGE_SKIPS[phase].format(harness=launch.harness)
        elif phase in PRODUCT_SKIPS and launch.recipe is not None:
            reason = PRODUCT_SKIPS[phase].format(recipe=launch.recipe)
        plan.append(PlannedPhase(phase=phase, skip_reason=reason))
    return plan


class ForkSpec(BaseModel):
    """What the API hands a forked run's workflow (``RunInput.fork``): the request as given. The launch in
    ``RunInput.launch`` already carries the structured overrides; the Fork phase adds what prose asks for."""

    parent_run_id: str
    rewind_to: str | None
    kind: str = "fork"
    """``fork`` or ``replay`` (rewind to materialize, the model rebound)."""
    overrides: list[str] = Field(default_factory=list)
    """Names of the structured overrides applied to the launch (for the decision's record)."""
    scorer_instructions: str | None = None
    instructions: str | None = None


class ForkPhaseInput(BaseModel):
    run_id: str
    invocation: int
    launch: LaunchRequest
    driver: str
    fork: ForkSpec


class ForkDecision(BaseModel):
    """The Fork phase's result: where the run starts over and what it runs with (ForkDecided has the same)."""

    parent_run_id: str
    rewind_to: str
    inherited: list[str]
    """The phases inherited from the parent, in pipeline order (none of them runs)."""
    launch: LaunchRequest
    """The launch after every override, structured and interpreted."""
    tasks_total: int | None = None
    """The parent's sample size when Analyze is inherited."""
    model_proxy: bool = False
    """A model proxy may be started for this run (a keyed model): stop it after the run."""
    instructions: dict[str, str] = Field(default_factory=dict)
    """Phase -> instructions for its Driver (``scorer_instructions`` go to atomize)."""


class MaterializeOptions(BaseModel):
    concurrency: int = Field(default=128, ge=1, le=4096)
    batch_tasks: int = Field(default=2500, ge=1)
    parallel_batches: int = Field(default=4, ge=1, le=64)


class RunInput(BaseModel):
    """The argument of ``RunWorkflow.run``."""

    run_id: str
    account_id: str
    launch: LaunchRequest
    driver: str
    trials: TrialsConfig
    materialize: MaterializeOptions = Field(default_factory=MaterializeOptions)
    limits: RunLimits = Field(default_factory=RunLimits)
    materialize_mode: str = "sequential"
    """``sequential`` (tasks in the work sandbox) or ``fanout`` (a task sandbox each), chosen from infrastructure."""
    backend: str | None = None
    """The compute backend the run was resolved to at launch (``local``, ``sandbox0``, ``e2b``); None in inputs from
    before it was carried, whose phases are all scheduled as activities."""
    proxy_linger_s: float = 0.0
    fork: ForkSpec | None = None
    """Set on forked launches (§10): the Fork phase runs first and seeds the run from the parent."""


class RunResult(BaseModel):
    run_id: str
    status: str
    error: str | None = None


class PhaseInput(BaseModel):
    run_id: str
    phase: str
    invocation: int
    launch: LaunchRequest
    driver: str
    instructions: str | None = None
    """A reviewer's resolution text, handed to the Driver for this invocation."""
    run_cost_usd: float | None = None
    """The run.cost ceiling, checked when the phase closes."""
    max_tasks: int | None = None
    preface: list[dict[str, Any]] = Field(default_factory=list)
    """Events the workflow decided on that land just before this phase's PhaseStarted, in the same transaction
    (``EventsInput.events``' shape): the first phase carries PipelineStarted and the plan's skips (patch
    ``pipeline-started-by-first-phase``), instead of an activity of their own."""
    fairness_key: str | None = None
    """The run's account as Temporal's fairness key, for a phase run as a local activity (``local_attempt``):
    Temporal gives a local activity no priority, and the worker's fair share (``activities.fair_share``) reads whose
    work it is from here instead."""
    cached_only: bool = False
    """A local attempt that does the phase only from a cross-run cache hit (``LocalAttempt.cached_only``); on a miss
    it raises ``NOT_CACHED_ERROR`` before the phase opens."""


class PhaseControl(BaseModel):
    """What a phase asks of the workflow instead of moving on."""

    kind: Literal["restart", "review", "halt", "interrupted"]
    """``restart`` (the Driver wants this phase to start over), ``review`` (requestHumanReview), ``halt``
    (a ceiling was crossed; the row is already halted) or ``interrupted`` (the workflow's own: the phase was cut
    short by a halt, pause or ceiling, and runs again as the same invocation after a resume)."""
    reason: str
    phase: str | None = None
    """For ``restart``: the phase to start over from when it is not the asking one (Materialize asking for a new
    impl restarts Atomize, and Materialize then runs again as its next invocation)."""


class PhaseResult(BaseModel):
    phase: str
    invocation: int
    tasks: int | None = None
    """Analyze: how many tasks the run will materialize (after max_tasks)."""
    detail: dict[str, Any] = Field(default_factory=dict)
    control: PhaseControl | None = None


def chains(attempt: LocalAttempt | None) -> bool:
    """Whether a phase so tried locally may run in a chain of quick phases (``PhaseChainInput``): a plain local
    attempt (not ``cached_only``, not one that came with ``cached-phases-local``)."""
    return attempt is not None and not attempt.cached_only and not attempt.since_cached_phases


class PhaseChainInput(BaseModel):
    """A plain run's quick phases, one after the other in one local activity (``quick_phases``, patch
    ``quick-phases-chained``): each phase exactly as its own local activity would run it, the chain stopping after
    the first that asks the workflow for something (``PhaseResult.control``) or fails. One local activity instead
    of one a phase: the workflow's activation, the payloads' encoding and the markers of four fewer."""

    phases: list[PhaseInput]
    fairness_key: str | None = None
    """The run's account (``PhaseInput.fairness_key``): the chain takes one phase share for all its phases."""


class PhaseChainFailure(BaseModel):
    """How a phase of a chain failed, as the ``ApplicationError`` its own activity would have raised."""

    phase: str
    invocation: int
    type: str
    message: str
    non_retryable: bool
    details: list[Any] = Field(default_factory=list)


class PhaseChainResult(BaseModel):
    results: list[PhaseResult]
    """The phases that completed, in order; the ones after them did not start."""
    failure: PhaseChainFailure | None = None
    """The phase after the last result, when it failed."""


class EventsInput(BaseModel):
    """Events the workflow itself decides on (pipeline markers, skips, phase failures)."""

    run_id: str
    events: list[dict[str, Any]]
    """Each ``{"key": <idempotency key suffix>, "type": <event type>, "data": {...}}``."""


class FinishInput(BaseModel):
    run_id: str
    status: str
    error: str | None = None
    preface: list[dict[str, Any]] = Field(default_factory=list)
    """Events the workflow decided on that no activity has written yet (``EventsInput.events``' shape: the
    pipeline's start, the last sweep's close), written first, in the terminal event's transaction."""
    revoke_route: bool = False
    """Revoke the run's model route (and record its ledger entries) before the terminal event."""
    fault_injection: dict[str, Any] | None = None
    """Tests only (``allow_fault_injection``): the launch's ``metadata.fault_injection`` when it names the phase
    ``finish``, so a local attempt at the run's end can be stalled past its budget
    (``activities.common.maybe_stall_local``)."""


class MaterializeBatchInput(BaseModel):
    run_id: str
    invocation: int
    start: int
    stop: int
    """Task indices ``start <= index < stop``; every trial of a task stays in one batch."""
    model: ModelSpec
    metadata: dict[str, Any] = Field(default_factory=dict)
    trials: TrialsConfig
    concurrency: int
    task_limits: TaskLimits = Field(default_factory=TaskLimits)
    run_cost_usd: float | None = None
    mode: str = "sequential"
    opens_phase: bool = False
    """The batch writes the sweep's PhaseStarted before anything else (idempotent: the first batch's lands, the
    others' are the same event): the workflow starts no activity just for it (patch ``materialize-opened-by-batches``).
    False in histories from before, whose ``materialize_begin`` activity wrote it."""


class MaterializeBatchResult(BaseModel):
    start: int
    stop: int
    trials_recorded: int
    """Trial results this attempt wrote (a resumed attempt skips what an earlier one committed)."""
    passed: int
    failed: int
    errored: int


class MaterializeCompleteInput(BaseModel):
    run_id: str
    invocation: int
    duration_ms: int
    """Measured by the workflow on its deterministic clock, from PhaseStarted to the last batch."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The launch's metadata (the Driver's restart test hook is read from it)."""


def resweep_hooks(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The launch's test hooks for another Materialize sweep (``metadata.test_hooks``), the only way a Driver asks
    for one today; None when the launch has none. The workflow closes a sweep without asking when there are none
    (``run-closed-by-finish``); ``activities.materialize.resweep_request`` reads them (with fault injection on)."""
    hooks = metadata.get("test_hooks")
    return hooks if isinstance(hooks, dict) and hooks else None


def batch_bounds(total: int, batch_tasks: int) -> list[tuple[int, int]]:
    """Split task indices ``0..total-1`` into ``[start, stop)`` ranges of at most ``batch_tasks``."""
    return [(start, min(start + batch_tasks, total)) for start in range(0, total, batch_tasks)]


def plan_batches(total: int, batch_tasks: int, parallel: int) -> tuple[list[tuple[int, int]], int]:
    """The Materialize batches of ``total`` tasks, and how many of them run at once.

    Each batch pays a fixed cost (a sandbox restored from the post-Atomize snapshot and a scorer runtime started
    in it: ~0.1 s of CPU, ~0.15 s before its first model call), and while a finished batch's successor starts, its
    share of the call slots idles. So batches are as large as ``batch_tasks`` allows rather than split up to fill
    ``parallel``: 1,000 tasks are one batch with the whole concurrency, not four with a quarter each. Beyond
    ``parallel`` batches, their number is rounded up to a multiple of ``parallel`` and the tasks spread evenly,
    so the last round of batches in flight is as full as the others (the run's concurrency is split evenly between
    the batches in flight). Measured at C=128 against a 50 ms endpoint: 10,000 tasks as 12 batches of ~834 took
    6.1 s, as 4 batches of 2,500 5.1 s (the physical limit is 3.9 s). ``batch_tasks`` bounds a batch's rows in
    memory (the worker's and its scorer runtime's).

    Returns:
        ``[start, stop)`` index ranges covering every task once, in order, and the number in flight (>= 1).
    """
    if total <= 0:
        return [], 1
    count = -(-total // max(batch_tasks, 1))
    parallel = max(parallel, 1)
    if count > parallel:
        count = -(-count // parallel) * parallel
    size, extra = divmod(total, count)
    bounds, start = [], 0
    for i in range(count):
        stop = start + size + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds, min(parallel, count)


class HaltInput(BaseModel):
    run_id: str
    reason: str
    key: str
    """Deterministic idempotency key from the workflow (a retried activity writes the halt once)."""
    replace: bool = False
    """Replace a resumable halt already up (a stop or a ceiling while paused or waiting)."""


class ResumeInput(BaseModel):
    run_id: str
    key: str
    resolution: str | None = None


class StopRequest(BaseModel):
    reason: str | None = None


class ReviewResolution(BaseModel):
    resolution: str


class ControlResult(BaseModel):
    halted: bool
    halt_reason: str | None


RESTART_CAP = 2
"""Phase restarts allowed per run (§10); a third request parks the run for a human."""
