"""RunWorkflow: one run of the pipeline (§2). Orchestration only; every effect is an activity.

Updates (answered synchronously; a refusal raises ``ApplicationError(type="Conflict")`` with a code and leaves no
trace in history):
    stop(StopRequest)              halt with ``operator_kill[: reason]`` and tear down; refused once finished.
    admin_halt(StopRequest)        as stop, raised by a platform administrator: ``admin: <reason>`` (§9).
    pause()                        halt with ``operator_pause``; in-flight work is cancelled and re-run on resume.
    resume()                       clear an ``operator_pause``; anything else answers ``not_paused``.
    resolve_review(ReviewResolution)
                                   clear ``agent_review`` / ``restart_cap_exceeded``; the text becomes the Driver's
                                   instructions for the re-run of the phase that asked.
Signals (the Temporal UI's "Send a Signal", ``temporal workflow signal``; same semantics and bookkeeping as the
updates, one code path behind both; a signal the update would refuse is ignored and leaves ``ControlRefused``):
    stop(StopRequest | None)       as the stop update; ``{"reason": "..."}`` is optional.
    pause(), resume()              as the updates.
    review_resolution(str)         as resolve_review, with the text as the resolution.
Queries:
    state                          phase, invocation counters, restarts used, halt, tasks settled / total.

Every handler works from the workflow's first moment: ``@workflow.init`` gives the instance its input before any
signal or update is delivered (a stop sent 0 ms after launch used to find no input and fail the workflow task).

The plan comes from ``benchwright.runs.pipeline.plan_phases``. Each phase invocation runs as a task the workflow can
interrupt: a halt (from an update, a ceiling timer, or an activity that saw the budget crossed) cancels it at once.
Resumable halts (pause, review, restart cap) wait in ``_gate``; every other halt tears the run down: status keeps
its value, halted stays up, PipelineFinished closes the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError, RetryState
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities.analyze import AnalyzeActivities
    from activities.atomize import AtomizeActivities
    from activities.attach import AttachActivities
    from activities.chain import PhaseChainActivities
    from activities.fetch import FetchActivities
    from activities.find import FindActivities
    from activities.fork import ForkActivities
    from activities.materialize import MaterializeActivities
    from activities.report import ReportActivities
    from activities.run_log import ControlActivities, RunLogActivities
    from activities.setup import SetupActivities
    from benchwright.events import (
        ControlRefused,
        Event,
        HumanReviewRequested,
        PhaseCompleted,
        PhaseFailed,
        PhaseSkipped,
        PipelineStarted,
    )
    from benchwright.harness.config import is_bridge
    from benchwright.report import ReportInput
    from benchwright.runs.halts import HALTED_ERROR, HaltKind, HaltReason, halt_kind, is_resumable, limit_exceeded
    from benchwright.runs.limits import unusable
    from benchwright.runs.pipeline import (
        RESTART_CAP,
        ControlResult,
        EventsInput,
        FinishInput,
        ForkDecision,
        ForkPhaseInput,
        HaltInput,
        MaterializeBatchInput,
        MaterializeCompleteInput,
        PhaseChainFailure,
        PhaseChainInput,
        PhaseChainResult,
        PhaseControl,
        PhaseInput,
        PhaseResult,
        ResumeInput,
        ReviewResolution,
        RunInput,
        RunResult,
        StopRequest,
        batch_bounds,
        chains,
        local_attempt,
        plan_batches,
        plan_phases,
        resweep_hooks,
    )
    from benchwright.stack.temporal_ui import RUN_MODEL, RUN_PHASE, RUN_STATUS

T = TypeVar("T")
R = TypeVar("R")
PHASE_TIMEOUT = timedelta(minutes=30)
PHASE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10),
                          maximum_attempts=4)
PHASE_HEARTBEAT = timedelta(seconds=10)
"""How long a killed worker's phase activity waits before another worker retries it (``patched("phase-heartbeat")``;
the phases beat every 2 s, ``activities.common.heartbeating``). It is also how a halt's cancellation reaches a phase
mid-way: an activity learns of it only by heartbeating."""
BATCH_TIMEOUT = timedelta(hours=12)
BATCH_HEARTBEAT = timedelta(seconds=10)
"""How long a killed worker's batch waits before another worker retries it (it resumes from the store). The SDK
sends heartbeats at most every 0.8 x this: at 5 s a heartbeat delayed by more than a second (a busy worker or
Temporal server) timed a live batch out and ran it twice (a harbor bridge run in the full suite, twice in a row);
10 s leaves two, as phases have. Stops do not wait for it: a batch polls its run's halt flag. Only the activity's
timeout changes, which replay does not compare, so no patch is needed."""
BATCH_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10),
                          maximum_attempts=20, non_retryable_error_types=[HALTED_ERROR])
LOG_TIMEOUT = timedelta(minutes=2)
RUN_CLOSED_BY_FINISH = "run-closed-by-finish"
"""The patch under which the last sweep's close and the model route's revocation ride on ``finish_run``."""
REPORT_TIMEOUT = timedelta(minutes=10)
"""Bound on one attempt of the run's report (the LLM narrator inside it has its own, ``narrator_timeout_s``)."""
REPORT_HEARTBEAT = timedelta(seconds=10)
"""How long a killed worker's report waits before another worker retries it."""
REPORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10),
                           maximum_attempts=3)
CANCEL = ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
QUICK_PHASES_LOCAL = "quick-phases-local"
"""The patch under which a plain run's quick phases run as local activities first (``_try_local``)."""
CACHED_PHASES_LOCAL = "cached-phases-local"
"""The patch under which a downloaded dataset's Fetch and a requirements install's Setup are tried as local activities
that only replay a cross-run cache hit, and a run with requirements runs its other quick phases locally too."""
LOCAL_BUDGET = timedelta(seconds=5)
"""How long a phase may run as a local activity before the workflow gives it up and schedules the phase as its
ordinary activity (same invocation; its events dedupe). A halt sent while local activities hold the workflow task
open is delivered when it ends, so this also bounds how late a halt reaches a stalled one. 2 s was too short under
load: of 20 runs launched at once, 5-7 of their 100 quick phases ran past it and were run again as activities
(``bench/materialize.py --burst 20``); at 5 s none did, in three bursts. One attempt: a retry is the ordinary
activity's business."""
LOCAL_RETRY = RetryPolicy(maximum_attempts=1)
RUN_FINISHED_LOCALLY = "run-finished-locally"
"""The patch under which a run's end (``finish_run``) is first tried as a local activity in the workflow task that
decided it, one attempt within ``LOCAL_BUDGET``, then run as its ordinary activity if that attempt failed or ran past
it: what the local attempt committed dedupes (``benchwright.store.runs.finish_run``)."""
QUICK_PHASES_CHAINED = "quick-phases-chained"
"""The patch under which a plain run's quick phases run in one local activity (``_chained``), not one each."""
PHASE_ACTIVITIES: dict[str, Callable[[Any, PhaseInput], Awaitable[PhaseResult]]] = {
    "find": FindActivities.find, "fetch": FetchActivities.fetch, "analyze": AnalyzeActivities.analyze,
    "setup": SetupActivities.setup, "attach": AttachActivities.attach, "atomize": AtomizeActivities.atomize,
}
"""The activity of each phase the workflow runs as one activity (fork and materialize have their own steps)."""


class _Teardown(Exception):
    """A halt that does not come back: stop the pipeline and close the run."""


def _local_failure(message: str, activity_type: str, retry_state: RetryState) -> ActivityError:
    """The ``ActivityError`` an ordinary activity would have ended with, for a local one whose end reached the
    workflow bare (a replayed marker) or only as a result (a chain's failure): raise it ``from`` the cause."""
    return ActivityError(message, scheduled_event_id=0, started_event_id=0, identity="", activity_type=activity_type,
                         activity_id="", retry_state=retry_state)


def _conflict(message: str, code: str) -> ApplicationError:
    # details are positional (TEMPORAL-NOTES): ApplicationError(message, {"code": ...}, type=...)
    return ApplicationError(message, {"code": code}, type="Conflict", non_retryable=True)


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        self._inp = inp
        self._launch = inp.launch
        """The launch in force: the input's, or on a fork the Fork phase's decision (prose may change it)."""
        self._fork: ForkDecision | None = None
        self._phase: str | None = None
        self._invocations: dict[str, int] = {}
        self._restarts = 0
        self._instructions: dict[str, str] = {}
        self._halt: str | None = None
        self._halts = 0
        self._finished = False
        self._status = "running"
        self._tasks_total = 0
        self._tasks_settled = 0
        self._model_proxy = False
        self._route_revoked = False
        """The run's credential-proxy route was revoked before its terminal event (issue 12)."""
        self._halt_writes = 0
        """Halt/clear writes in flight: teardown waits for them so RunHalted never lands after PipelineFinished."""
        self._refusals = 0
        self._cache_hits: dict[str, str] = {}
        """Phase → the run whose cached artifact and snapshot it reused."""
        self._preface: list[dict[str, Any]] = []
        """PipelineStarted and the plan's skips while no activity has written them (``_write_preface``)."""
        self._plan: list[str] = []
        """The phases the run runs, in order (``_run_plan``)."""
        self._chain_tried = False
        """Whether the run's quick phases were tried as one chain (once a run: ``_chained``)."""
        self._chain_outcomes: dict[tuple[str, int], PhaseResult | PhaseChainFailure] = {}
        """What the chain did for each (phase, invocation) the workflow has not reached yet."""

    # -- queries and updates -------------------------------------------------------------------------------------

    @workflow.query
    def state(self) -> dict[str, Any]:
        return {"phase": self._phase, "invocations": dict(self._invocations), "restarts": self._restarts,
                "halted": self._halt is not None, "halt_reason": self._halt, "status": self._status,
                "finished": self._finished, "tasks_total": self._tasks_total, "tasks_settled": self._tasks_settled}

    @workflow.update
    async def stop(self, req: StopRequest) -> ControlResult:
        await self._do_stop(req)
        return self._control()

    @stop.validator
    def _validate_stop(self, req: StopRequest) -> None:
        self._refuse_if_finished()
        if self._halt is not None and not is_resumable(self._halt):
            raise _conflict(f"the run is already halted ({self._halt})", "already_halted")

    @workflow.update
    async def admin_halt(self, req: StopRequest) -> ControlResult:
        await self._raise_halt(HaltReason(HaltKind.ADMIN, req.reason).wire(), override=True)
        return self._control()

    @admin_halt.validator
    def _validate_admin_halt(self, req: StopRequest) -> None:
        self._validate_stop(req)
        if not (req.reason or "").strip():
            raise _conflict("an admin halt needs a reason (it is recorded as 'admin: <reason>')", "empty_reason")

    @workflow.update
    async def pause(self) -> ControlResult:
        await self._raise_halt(HaltReason(HaltKind.OPERATOR_PAUSE).wire())
        return self._control()

    @pause.validator
    def _validate_pause(self) -> None:
        self._refuse_if_finished()
        if self._halt is not None:
            raise _conflict(f"the run is already halted ({self._halt})", "already_halted")

    @workflow.update
    async def resume(self) -> ControlResult:
        await self._clear_halt(None)
        return self._control()

    @resume.validator
    def _validate_resume(self) -> None:
        if halt_kind(self._halt) is not HaltKind.OPERATOR_PAUSE:
            raise _conflict("the run is not paused" + (f" (halt_reason: {self._halt})" if self._halt else ""),
                            "not_paused")

    @workflow.update
    async def resolve_review(self, req: ReviewResolution) -> ControlResult:
        await self._do_resolve(req)
        return self._control()

    @resolve_review.validator
    def _validate_review(self, req: ReviewResolution) -> None:
        if halt_kind(self._halt) not in (HaltKind.AGENT_REVIEW, HaltKind.RESTART_CAP_EXCEEDED):
            raise _conflict("the run is not waiting for a review"
                            + (f" (halt_reason: {self._halt})" if self._halt else ""), "not_waiting")
        if not req.resolution.strip():
            raise _conflict("review_resolution must not be empty", "empty_resolution")

    # Signals: the validators above decide; a refusal is logged instead of answered.

    @workflow.signal(name="stop")
    async def stop_signal(self, req: StopRequest | None = None) -> None:
        req = req or StopRequest()
        if await self._accepts("stop", lambda: self._validate_stop(req)):
            await self._do_stop(req)

    @workflow.signal(name="pause")
    async def pause_signal(self) -> None:
        if await self._accepts("pause", self._validate_pause):
            await self._raise_halt(HaltReason(HaltKind.OPERATOR_PAUSE).wire())

    @workflow.signal(name="resume")
    async def resume_signal(self) -> None:
        if await self._accepts("resume", self._validate_resume):
            await self._clear_halt(None)

    @workflow.signal(name="review_resolution")
    async def review_signal(self, text: str) -> None:
        req = ReviewResolution(resolution=text if isinstance(text, str) else "")
        if await self._accepts("review_resolution", lambda: self._validate_review(req)):
            await self._do_resolve(req)

    async def _accepts(self, control: str, validate: Callable[[], None]) -> bool:
        """Run an update's validator for a signal; on refusal write ControlRefused and answer False."""
        try:
            validate()
        except ApplicationError as refusal:
            details = refusal.details[0] if refusal.details and isinstance(refusal.details[0], dict) else {}
            self._refusals += 1
            await self._record([(f"refused:{self._refusals}", ControlRefused(
                control=control, code=str(details.get("code", "conflict")), reason=refusal.message))])
            return False
        return True

    async def _do_stop(self, req: StopRequest) -> None:
        await self._raise_halt(HaltReason(HaltKind.OPERATOR_KILL, req.reason or None).wire(), override=True)

    async def _do_resolve(self, req: ReviewResolution) -> None:
        if self._phase is not None:
            self._instructions[self._phase] = req.resolution
        await self._clear_halt(req.resolution)

    def _refuse_if_finished(self) -> None:
        if self._finished:
            raise _conflict(f"the run has finished ({self._status})", "already_finished")

    def _control(self) -> ControlResult:
        return ControlResult(halted=self._halt is not None, halt_reason=self._halt)

    # -- the pipeline --------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        clock: asyncio.Task[None] | None = None
        if workflow.patched("unusable-input-ends-run"):
            # No user input may fail a workflow task (issue 23): a number the API should have refused but did not
            # (a launch made another way, an older API) ends the run ``error`` with the reason, before any timer
            # is built from it.
            problem = unusable(inp.limits)
            if problem is not None:
                refused = await self._unusable("launch", problem)
                await workflow.wait_condition(workflow.all_handlers_finished)
                return refused
        try:
            if inp.fork is not None:
                # A forked launch: the Fork phase seeds the run from its parent before the pipeline starts, so the
                # inherited events follow RunLaunched and the plan knows which phases are inherited. Deprecated patch
                # (docs/architecture.md, "Workflow versioning"): no RunInput from before it carried a fork.
                workflow.deprecate_patch("fork-phase")
                clock = asyncio.create_task(self._run_clock(inp.limits.run_duration_s))
                await self._phase_loop("fork")
            plan = plan_phases(self._launch, fork=self._fork)
            markers: list[tuple[str, Event]] = [
                ("pipeline:started", PipelineStarted(workflow_id=workflow.info().workflow_id,
                                                     phases=[p.model_dump() for p in plan]))]
            markers += [(f"{p.phase}:skipped", PhaseSkipped(phase=p.phase, reason=p.skip_reason))
                        for p in plan if p.skip_reason]
            to_run = [p.phase for p in plan if p.skip_reason is None and p.phase != "fork"]
            if to_run and to_run[0] in PHASE_ACTIVITIES and workflow.patched("pipeline-started-by-first-phase"):
                # The first phase writes them with its PhaseStarted (issue 25: one activity and one workflow task
                # fewer before the first model call); anything the workflow writes before that writes them first.
                self._preface = self._payload(markers)
            else:
                await self._record(markers)
            if clock is None:
                clock = asyncio.create_task(self._run_clock(inp.limits.run_duration_s))
            await self._run_plan(to_run)
        except _Teardown:
            result = await self._teardown()
        except ActivityError as err:
            result = await self._fail(err)
        except (ArithmeticError, ValueError, TypeError) as exc:
            # What the workflow could not act on (a value it could not turn into a timer or a batch plan) ends the
            # run with the reason instead of failing the task forever; histories from before never reached here.
            if not workflow.patched("unusable-input-ends-run"):
                raise
            result = await self._unusable(self._phase or "launch", f"{type(exc).__name__}: {exc}")
        else:
            await self._finish("ok")
            result = RunResult(run_id=inp.run_id, status="ok")
        finally:
            if clock is not None:
                clock.cancel()
        if workflow.patched("run-report"):
            await self._report()
        await self._linger_then_stop_proxy()
        # Signal handlers may still be writing (a refusal's event); let them land before the workflow closes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    async def _report(self) -> None:
        """The run's narration and report (issue 26), once its terminal event is in: output events only. It never
        blocks or fails the run: a report that cannot be written (its attempts spent) leaves the result as it is."""
        try:
            await workflow.execute_activity_method(
                ReportActivities.report, ReportInput(run_id=self._inp.run_id), start_to_close_timeout=REPORT_TIMEOUT,
                heartbeat_timeout=REPORT_HEARTBEAT, retry_policy=REPORT_RETRY, summary="narration and report")
        except ActivityError:
            workflow.logger.warning("run %s: its report could not be written", self._inp.run_id)

    async def _linger_then_stop_proxy(self) -> None:
        """The model proxy stays up for the linger window after the run ends (metered apart), then stops."""
        if not self._model_proxy:
            return
        if self._route_revoked:
            return
        # Histories recorded between the two issue-12 patches revoked right after the terminal event, unslept.
        if not workflow.patched("revoke-model-route-at-end") and self._inp.proxy_linger_s > 0:
            await workflow.sleep(timedelta(seconds=self._inp.proxy_linger_s))
        await self._execute_log(AttachActivities.stop_proxy, FinishInput(run_id=self._inp.run_id, status=self._status),
                                summary="stop the model proxy")

    async def _run_clock(self, limit_s: float | None) -> None:
        if limit_s is None:
            return
        await workflow.sleep(timedelta(seconds=limit_s))
        if not self._finished and (self._halt is None or is_resumable(self._halt)):
            await self._raise_halt(limit_exceeded("run.duration"), override=True)

    async def _run_plan(self, phases: list[str]) -> None:
        """Run the phases in order; a phase that asks for an earlier one to start over (Materialize wanting a new
        impl from Atomize) sends the run back there, and every phase after it runs again as its next invocation
        (Materialize v2 is the second sweep, §2)."""
        self._plan = phases
        i = 0
        while i < len(phases):
            back = await self._phase_loop(phases[i])
            i = phases.index(back) if back in phases else i + 1

    async def _phase_loop(self, phase: str) -> str | None:
        """Invocations of one phase until it completes: restarts, reviews and pauses re-enter here. Returns the
        earlier phase to go back to when the phase asked for one to start over, else None."""
        new_invocation = True
        while True:
            await self._gate()
            if new_invocation:
                self._invocations[phase] = self._invocations.get(phase, 0) + 1
                new_invocation = False
            control = await self._attempt(phase, self._invocations[phase])
            if control is None:
                self._instructions.pop(phase, None)
                return None
            if control.kind == "interrupted":
                continue  # paused mid-phase: the same invocation runs again after resume (its events dedupe)
            new_invocation = True
            if control.kind == "restart" and control.phase not in (None, phase):
                # The cap counts restarts across all phases (§10); past it the run waits for a human, whose
                # resolution becomes the instructions of the phase it goes back to.
                if self._restarts < RESTART_CAP:
                    self._restarts += 1
                else:
                    await self._raise_halt(HaltReason(HaltKind.RESTART_CAP_EXCEEDED, control.reason).wire())
                    await self._gate()
                    if phase in self._instructions:
                        self._instructions[control.phase] = self._instructions.pop(phase)
                return control.phase
            if control.kind == "restart" and self._restarts < RESTART_CAP:
                self._restarts += 1
            elif control.kind == "restart":
                await self._raise_halt(HaltReason(HaltKind.RESTART_CAP_EXCEEDED, control.reason).wire())
            elif control.kind == "review":
                await self._record([(f"{phase}:{self._invocations[phase]}:review",
                                     HumanReviewRequested(phase=phase, reason=control.reason))])
                await self._raise_halt(HaltReason(HaltKind.AGENT_REVIEW, control.reason).wire())
            elif control.kind == "halt":
                self._halt = control.reason  # the activity already wrote the row
                self._halts += 1

    async def _gate(self) -> None:
        """Wait while the run is paused or waiting for a human; a non-resumable halt tears the run down."""
        await workflow.wait_condition(lambda: self._halt is None or not is_resumable(self._halt))
        if self._halt is not None:
            raise _Teardown(self._halt)

    async def _attempt(self, phase: str, invocation: int) -> PhaseControl | None:
        """Run one phase invocation, interruptible by a halt or its duration ceiling."""
        self._phase = phase
        workflow.upsert_search_attributes([RUN_PHASE.value_set(phase)])
        self._details()
        halts_before = self._halts
        work = asyncio.create_task(self._execute_phase(phase, invocation))
        ceiling = self._inp.limits.phase_limit(phase)
        try:
            await workflow.wait_condition(lambda: work.done() or self._halts != halts_before,
                                          timeout=timedelta(seconds=ceiling[0]) if ceiling else None)
        except TimeoutError:
            assert ceiling is not None
            await self._raise_halt(limit_exceeded(ceiling[1]), override=True)
        if work.done() and self._halts == halts_before:
            try:
                return work.result()
            except ActivityError as err:
                halted = self._halt_from(err)
                if halted is None:
                    raise
                self._halt, self._halts = halted, self._halts + 1
                return PhaseControl(kind="interrupted", reason=halted)
        work.cancel()
        try:
            await work
        except (ActivityError, asyncio.CancelledError):
            # The work was abandoned because of the halt: however it ended (cancelled, halted, or timed out
            # because its worker died mid-cancel), it re-runs from the store if the run resumes.
            pass
        return PhaseControl(kind="interrupted", reason=self._halt or "")

    @staticmethod
    def _halt_from(err: ActivityError) -> str | None:
        """The halt reason when an activity stopped because the run was halted (its row is already written)."""
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == HALTED_ERROR:
            return str(cause.details[0]) if cause.details else cause.message
        return None

    async def _execute_phase(self, phase: str, invocation: int) -> PhaseControl | None:
        inp = self._inp
        if phase == "fork":
            await self._fork_phase(invocation)
            return None
        phase_inp = PhaseInput(run_id=inp.run_id, phase=phase, invocation=invocation, launch=self._launch,
                               driver=inp.driver, instructions=self._instructions.get(phase),
                               run_cost_usd=inp.limits.run_cost_usd, max_tasks=inp.limits.max_tasks)
        if phase == "materialize":
            return await self._materialize(phase_inp)
        phase_inp.preface = self._preface
        result = await self._phase_activity(phase_inp)
        if phase_inp.preface:
            self._preface = []  # the phase opened with them
        if result.tasks is not None:
            self._tasks_total = result.tasks
        if result.detail.get("model_proxy"):
            self._model_proxy = True
        hit = result.detail.get("cache_hit")
        if isinstance(hit, dict):  # a cross-run cache hit (§2): shown in the Temporal UI's details
            self._cache_hits[phase] = str(hit.get("source_run_id", "?"))
            self._details()
        return result.control

    async def _phase_activity(self, phase_inp: PhaseInput) -> PhaseResult:
        """One phase invocation as its activity; a quick phase of a plain run tries a local activity first (issue 25:
        no hop through Temporal's queues between the phases before Materialize)."""
        activity, summary = PHASE_ACTIVITIES[phase_inp.phase], f"{phase_inp.phase} v{phase_inp.invocation}"
        attempt = local_attempt(phase_inp.phase, phase_inp.launch, phase_inp.driver, self._inp.backend)
        if attempt is not None and (workflow.patched(CACHED_PHASES_LOCAL) if attempt.since_cached_phases
                                    else workflow.patched(QUICK_PHASES_LOCAL)):
            chained = await self._chained(phase_inp) if chains(attempt) else None
            if isinstance(chained, PhaseResult):
                return chained
            if chained is None:  # not in a chain, or the chain gave out before it: the phase's own local attempt
                local = await self._try_local(
                    activity, phase_inp.model_copy(update={"cached_only": attempt.cached_only}), summary)
                if local is not None:
                    return local
            # else a failure in the chain a retry may mend: the ordinary activity, as after a local attempt's
        return await workflow.execute_activity_method(
            activity, phase_inp, start_to_close_timeout=PHASE_TIMEOUT, retry_policy=PHASE_RETRY,
            heartbeat_timeout=self._phase_heartbeat(), cancellation_type=CANCEL, summary=summary)

    async def _chained(self, phase_inp: PhaseInput) -> PhaseResult | PhaseChainFailure | None:
        """The phase's outcome from the run's chain of quick phases (issue 25, patch ``quick-phases-chained``): at the
        first quick phase, this one and those after it that chain too run in one local activity; each then takes its
        result here when the workflow reaches it. A permanent failure in the chain is raised as the phase's own
        activity's would be; a failure a retry may mend is returned (its ordinary activity runs it again). None: the
        phase was not run in the chain (the run tried its chain already, or it ran past its budget)."""
        key = (phase_inp.phase, phase_inp.invocation)
        if key not in self._chain_outcomes and not self._chain_tried and workflow.patched(QUICK_PHASES_CHAINED):
            self._chain_tried = True
            chain = self._chain_from(phase_inp)
            outcome = await self._try_chain(chain) if len(chain) > 1 else None
            if outcome is not None:
                self._chain_outcomes.update({(r.phase, r.invocation): r for r in outcome.results})
                if outcome.failure is not None:
                    self._chain_outcomes[(outcome.failure.phase, outcome.failure.invocation)] = outcome.failure
        found = self._chain_outcomes.pop(key, None)
        if isinstance(found, PhaseChainFailure) and (found.non_retryable or found.type == HALTED_ERROR):
            raise _local_failure(f"{phase_inp.phase} v{phase_inp.invocation} failed", phase_inp.phase,
                                 RetryState.NON_RETRYABLE_FAILURE) from ApplicationError(
                found.message, *found.details, type=found.type, non_retryable=True)
        return found

    def _chain_from(self, phase_inp: PhaseInput) -> list[PhaseInput]:
        """``phase_inp`` and the plan's phases after it that chain (``benchwright.runs.pipeline.chains``), up to the
        first that does not: each at its next invocation as the workflow would give it, none that ran already, has a
        reviewer's instructions or a ceiling of its own (a ceiling is the workflow's timer around its one phase)."""
        chain: list[PhaseInput] = []
        plan = self._plan if phase_inp.phase in self._plan else [phase_inp.phase]
        for phase in plan[plan.index(phase_inp.phase):]:
            first = phase == phase_inp.phase
            if (phase not in PHASE_ACTIVITIES or self._inp.limits.phase_limit(phase) is not None
                    or not chains(local_attempt(phase, self._launch, self._inp.driver, self._inp.backend))
                    or (not first and (phase in self._invocations or phase in self._instructions))):
                break
            chain.append(phase_inp if first else phase_inp.model_copy(update={
                "phase": phase, "invocation": 1, "instructions": None, "preface": []}))
        return chain

    async def _try_chain(self, chain: list[PhaseInput]) -> PhaseChainResult | None:
        """The chain as one local activity within ``LOCAL_BUDGET``; None when it ran past it (each phase then goes
        on as its own local attempt: what it already committed dedupes)."""
        priority = workflow.info().priority
        try:
            return await workflow.execute_local_activity_method(
                PhaseChainActivities.quick_phases,
                PhaseChainInput(phases=chain, fairness_key=priority.fairness_key if priority else None),
                start_to_close_timeout=LOCAL_BUDGET, retry_policy=LOCAL_RETRY, cancellation_type=CANCEL,
                summary=f"quick phases {chain[0].phase}..{chain[-1].phase} (local)")
        except FailureError as err:
            failed = err.cause if isinstance(err, ActivityError) else err
            if isinstance(failed, CancelledError):  # a halt cancelled it: as a local phase's (``_try_local``)
                if isinstance(err, ActivityError):
                    raise
                raise _local_failure("quick phases cancelled", "quick_phases", RetryState.CANCEL_REQUESTED) from failed
            workflow.logger.info("run %s: the quick phases go on one by one (%s)", self._inp.run_id, failed)
            return None

    async def _try_local(self, activity: Callable[[Any, PhaseInput], Awaitable[PhaseResult]], phase_inp: PhaseInput,
                         summary: str) -> PhaseResult | None:
        """The phase as a local activity within ``LOCAL_BUDGET``; None when it ran past that or failed in a way a
        retry may mend (the ordinary activity runs it again). A permanent failure (a domain error, a halt) is the
        phase's: it is raised as the ``ActivityError`` the ordinary activity would have ended with, not run again."""
        priority = workflow.info().priority
        local_inp = phase_inp.model_copy(update={"fairness_key": priority.fairness_key if priority else None})
        try:
            return await workflow.execute_local_activity_method(
                activity, local_inp, start_to_close_timeout=LOCAL_BUDGET, retry_policy=LOCAL_RETRY,
                cancellation_type=CANCEL, summary=f"{summary} (local)")
        except FailureError as err:
            # A local activity's end reaches the workflow wrapped in an ActivityError or bare, by how it ended and
            # whether it is live or replayed from its marker (SDK 1.35: a timeout is wrapped live, bare on replay).
            # Both take the same path here, or a replay would not match its history.
            failed = err.cause if isinstance(err, ActivityError) else err
            cancelled = isinstance(failed, CancelledError)  # a halt cancelled it
            if cancelled or (isinstance(failed, ApplicationError)
                             and (failed.non_retryable or failed.type == HALTED_ERROR)):
                if isinstance(err, ActivityError):
                    raise
                raise _local_failure(f"{summary} failed", phase_inp.phase, RetryState.CANCEL_REQUESTED if cancelled
                                     else RetryState.NON_RETRYABLE_FAILURE) from failed
        workflow.logger.info("run %s: %s goes on as an activity (%s)", self._inp.run_id, summary, failed)
        return None

    @staticmethod
    def _phase_heartbeat() -> timedelta | None:
        """Phase activities heartbeat (issue 23: a killed worker's phase waited out its 30-minute bound); histories
        from before scheduled them without a heartbeat timeout."""
        return PHASE_HEARTBEAT if workflow.patched("phase-heartbeat") else None

    async def _fork_phase(self, invocation: int) -> None:
        inp = self._inp
        assert inp.fork is not None
        decision = await workflow.execute_activity_method(
            ForkActivities.fork, ForkPhaseInput(run_id=inp.run_id, invocation=invocation, launch=inp.launch,
                                                driver=inp.driver, fork=inp.fork),
            start_to_close_timeout=PHASE_TIMEOUT, retry_policy=PHASE_RETRY,
            heartbeat_timeout=self._phase_heartbeat(), cancellation_type=CANCEL,
            summary=f"fork of {inp.fork.parent_run_id} at {inp.fork.rewind_to or '?'}")
        self._fork, self._launch = decision, decision.launch
        if decision.tasks_total is not None:
            self._tasks_total = decision.tasks_total
        self._model_proxy = self._model_proxy or decision.model_proxy
        self._instructions.update(decision.instructions)
        if decision.launch.model.identifier != inp.launch.model.identifier:
            workflow.upsert_search_attributes([RUN_MODEL.value_set(decision.launch.model.identifier)])

    async def _begin_materialize(self, phase_inp: PhaseInput) -> None:
        await workflow.execute_activity_method(MaterializeActivities.begin, phase_inp,
                                               start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY,
                                               summary=f"materialize v{phase_inp.invocation}: start")

    async def _materialize(self, phase_inp: PhaseInput) -> PhaseControl | None:
        inp = self._inp
        started = workflow.now()
        invocation = phase_inp.invocation
        # Each batch writes the sweep's PhaseStarted first (issue 25: one activity and one workflow task fewer before
        # the first model call); histories from before started the sweep with an activity of its own.
        opened_by_batches = workflow.patched("materialize-opened-by-batches")
        if not opened_by_batches:
            await self._begin_materialize(phase_inp)
        opts = inp.materialize
        bridged = is_bridge(self._launch)
        if bridged:  # §4: a harness-bridge run is one harness process in the work sandbox, sequential
            workflow.deprecate_patch("harness-bridge")  # no launch from before it could name a harness
            bounds, in_flight = [(0, 1)], 1
        elif workflow.patched("balanced-batches"):
            bounds, in_flight = plan_batches(self._tasks_total, opts.batch_tasks, opts.parallel_batches)
        else:  # histories recorded before batches were balanced replay with the plan they were made with
            bounds = batch_bounds(self._tasks_total, opts.batch_tasks)
            in_flight = max(1, min(opts.parallel_batches, len(bounds)))
        if opened_by_batches and not bounds:  # no batch to open it (a sweep with nothing to score)
            await self._begin_materialize(phase_inp)
        limiter = asyncio.Semaphore(in_flight)
        concurrency = max(1, opts.concurrency // in_flight)
        self._tasks_settled = 0

        async def one(start: int, stop: int) -> None:
            async with limiter:
                batch = MaterializeBatchInput(run_id=inp.run_id, invocation=invocation, start=start, stop=stop,
                                              model=self._launch.model, metadata=self._launch.metadata,
                                              trials=inp.trials, concurrency=concurrency,
                                              task_limits=inp.limits.task, run_cost_usd=inp.limits.run_cost_usd,
                                              mode="bridge" if bridged else inp.materialize_mode,
                                              opens_phase=opened_by_batches)
                await workflow.execute_activity_method(
                    MaterializeActivities.batch, batch,
                    activity_id=f"materialize-{invocation}-{start}-{self._halts}", start_to_close_timeout=BATCH_TIMEOUT,
                    heartbeat_timeout=BATCH_HEARTBEAT, retry_policy=BATCH_RETRY, cancellation_type=CANCEL,
                    summary=f"materialize v{invocation}: tasks {start}..{stop - 1}")
                self._tasks_settled += stop - start
                self._details()

        batches = [asyncio.create_task(one(start, stop)) for start, stop in bounds]
        try:
            await asyncio.gather(*batches)
        except BaseException:
            for b in batches:
                b.cancel()
            await asyncio.gather(*batches, return_exceptions=True)
            raise
        duration_ms = int((workflow.now() - started).total_seconds() * 1000)
        if resweep_hooks(self._launch.metadata) is None and workflow.patched(RUN_CLOSED_BY_FINISH):
            # Without test hooks no Driver asks for another sweep (activities.materialize.resweep_request): the
            # sweep's close is written by the run's next write, its terminal one in a run that goes on to finish
            # (issue 25: an activity and a workflow task fewer after the last result).
            self._preface += self._payload([(f"materialize:{invocation}:completed",
                                             PhaseCompleted(phase="materialize", duration_ms=duration_ms))])
            return None
        if workflow.patched("materialize-restart"):
            # The sweep's close says whether the Driver wants another: a restart of an earlier phase (a new impl
            # from Atomize) makes this invocation the first of several sweeps.
            closed = await workflow.execute_activity_method(
                MaterializeActivities.complete, MaterializeCompleteInput(run_id=inp.run_id, invocation=invocation,
                                                                         duration_ms=duration_ms,
                                                                         metadata=self._launch.metadata),
                start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY,
                summary=f"materialize v{invocation}: done")
            return closed.control
        # By name, its result left undecoded: histories recorded before the patch closed with what the activity
        # then returned, which need not read as the PhaseResult the reference would decode it as.
        await workflow.execute_activity(
            "materialize_complete", MaterializeCompleteInput(run_id=inp.run_id, invocation=invocation,
                                                             duration_ms=duration_ms),
            start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY, summary=f"materialize v{invocation}: done")
        return None

    # -- halts, failure, finish ------------------------------------------------------------------------------

    async def _raise_halt(self, reason: str, *, override: bool = False) -> None:
        """Record the halt on the row (via an activity) and wake the main loop, which cancels in-flight work.

        ``override`` lets a ceiling replace a resumable halt (a run that hits its duration while paused is torn
        down, not left paused).
        """
        if self._halt is not None and not override:
            return
        self._halts += 1
        replace = self._halt is not None
        self._halt = reason
        self._details()
        self._halt_writes += 1
        try:
            await self._write_preface()
            await self._execute_log(ControlActivities.halt, HaltInput(run_id=self._inp.run_id, reason=reason,
                                                                      key=f"{self._halts}", replace=replace),
                                    summary="halt_run")
        finally:
            self._halt_writes -= 1

    async def _clear_halt(self, resolution: str | None) -> None:
        self._halts += 1
        await self._write_preface()
        await self._execute_log(ControlActivities.clear, ResumeInput(run_id=self._inp.run_id, key=f"{self._halts}",
                                                                     resolution=resolution), summary="clear_halt")
        self._halt = None
        self._details()

    async def _teardown(self) -> RunResult:
        if workflow.patched("halt-written-before-teardown"):
            # A halt raised in the workflow's first milliseconds may still be writing its row: close the log after it.
            await workflow.wait_condition(lambda: self._halt_writes == 0)
        await self._write_preface()
        await self._revoke_model_route(self._status)
        await self._execute_log(ControlActivities.finish_halted, FinishInput(run_id=self._inp.run_id,
                                                                             status=self._status),
                                summary="finish_halted")
        self._finished = True
        workflow.upsert_search_attributes([RUN_STATUS.value_set("halted")])
        self._details()
        return RunResult(run_id=self._inp.run_id, status=self._status, error=self._halt)

    async def _fail(self, err: ActivityError) -> RunResult:
        phase = self._phase or "unknown"
        cause = err.cause
        error_type = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
        # str(ApplicationError) prefixes its type, which error_type already carries ("Unavailable: Unavailable: ...")
        detail = cause.message if isinstance(cause, ApplicationError) else str(cause) if cause is not None else str(err)
        trace = ""
        if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
            trace = str(cause.details[0].get("stack_trace", ""))
        failure = getattr(cause, "failure", None)  # a FailureError's proto, when the cause carries one
        if not trace and failure is not None:
            trace = failure.stack_trace
        invocation = self._invocations.get(phase, 1)
        await self._record([(f"{phase}:{invocation}:failed", PhaseFailed(
            phase=phase, error_type=error_type, detail=detail, stack_trace=trace))])
        error = f"{phase} failed: {error_type}: {detail}"
        await self._finish("error", error)
        return RunResult(run_id=self._inp.run_id, status="error", error=error)

    async def _unusable(self, phase: str, reason: str) -> RunResult:
        """End the run ``error`` because the workflow cannot act on its input (PhaseFailed says why)."""
        invocation = self._invocations.get(phase, 1)
        await self._record([(f"{phase}:{invocation}:failed", PhaseFailed(
            phase=phase, error_type="UnusableInput", detail=reason, stack_trace=""))])
        error = f"the run cannot proceed: {reason}"
        await self._finish("error", error)
        return RunResult(run_id=self._inp.run_id, status="error", error=error)

    async def _record(self, events: list[tuple[str, Event]]) -> None:
        # The pipeline's start, if its first phase has not written it yet, comes before anything written here.
        payload, self._preface = [*self._preface, *self._payload(events)], []
        await self._execute_log(RunLogActivities.record_events, EventsInput(run_id=self._inp.run_id, events=payload),
                                summary="record " + ", ".join(str(e["type"]) for e in payload)[:200])

    @staticmethod
    def _payload(events: list[tuple[str, Event]]) -> list[dict[str, Any]]:
        return [{"key": key, "type": ev.type_name(), "data": ev.model_dump(mode="json")} for key, ev in events]

    async def _write_preface(self) -> None:
        """What the workflow decided and no activity wrote yet, before it writes anything else: the pipeline's start
        (a halt or end before the first phase opened; runs started with ``pipeline-started-by-first-phase``) or the
        last sweep's close (a halt between it and the run's end; runs started with ``run-closed-by-finish``)."""
        if self._preface:
            await self._record([])

    async def _revoke_model_route(self, status: str) -> None:
        """Revoke the run's route at the credential proxy before the terminal event (issue 12): the run's key is
        dead once the run is, and the route's events land before PipelineFinished. The proxy process keeps itself
        warm (the linger) on its own, so nothing is left for after the run."""
        if self._model_proxy and not self._route_revoked and workflow.patched("revoke-model-route-before-finish"):
            await self._execute_log(AttachActivities.stop_proxy, FinishInput(run_id=self._inp.run_id, status=status),
                                    summary="revoke the run's model route")
            self._route_revoked = True

    async def _finish(self, status: str, error: str | None = None) -> None:
        if workflow.patched(RUN_CLOSED_BY_FINISH):
            # One activity, one transaction: what is still pending (the last sweep's close), the model route's
            # revocation and the terminal event (issue 25: two activities and two workflow tasks fewer).
            revoke = self._model_proxy and not self._route_revoked
            fault = self._launch.metadata.get("fault_injection")  # tests only: a fault meant for the run's end
            finish = FinishInput(run_id=self._inp.run_id, status=status, error=error, preface=self._preface,
                                 revoke_route=revoke, fault_injection=fault if isinstance(fault, dict)
                                 and fault.get("phase") == "finish" else None)
            # In the workflow task that decided it first (issue 25: a hop through Temporal's queue fewer between the
            # last result and the terminal event).
            if not (workflow.patched(RUN_FINISHED_LOCALLY) and await self._finished_locally(finish)):
                await self._execute_log(RunLogActivities.finish, finish, summary=f"finish: {status}")
            self._preface = []
            self._route_revoked = self._route_revoked or revoke
        else:
            await self._write_preface()
            await self._revoke_model_route(status)
            await self._execute_log(RunLogActivities.finish,
                                    FinishInput(run_id=self._inp.run_id, status=status, error=error),
                                    summary=f"finish: {status}")
        self._status = status
        self._finished = True
        workflow.upsert_search_attributes([RUN_STATUS.value_set(status)])
        self._details()

    async def _finished_locally(self, finish: FinishInput) -> bool:
        """One local attempt at ``finish_run`` within ``LOCAL_BUDGET``: whether it ended the run. Any failure leaves
        the run to the ordinary activity, live and on replay alike (a local activity's failure reaches the workflow
        wrapped or bare by how it ended and whether it is replayed, ``_try_local``)."""
        try:
            await workflow.execute_local_activity_method(
                RunLogActivities.finish, finish, start_to_close_timeout=LOCAL_BUDGET, retry_policy=LOCAL_RETRY,
                summary=f"finish: {finish.status} (local)")
        except FailureError as err:
            workflow.logger.info("run %s: its end goes on as an activity (%s)", self._inp.run_id, err)
            return False
        return True

    async def _execute_log(self, activity: Callable[[Any, T], Awaitable[R]], arg: T, *, summary: str) -> R:
        """One bookkeeping activity (the run's log and row), by reference."""
        return await workflow.execute_activity_method(activity, arg, start_to_close_timeout=LOG_TIMEOUT,
                                                      retry_policy=PHASE_RETRY, summary=summary)

    def _details(self) -> None:
        lines = [f"**status** {self._status}", f"**phase** {self._phase or '-'}"]
        if self._halt:
            lines.append(f"**halted** {self._halt}")
        if self._cache_hits:
            lines.append("**cache hits** " + ", ".join(f"{p} from `{r}`" for p, r in self._cache_hits.items()))
        if self._tasks_total:
            lines.append(f"**tasks** {self._tasks_settled}/{self._tasks_total} settled (by batch)")
        lines.append("**invocations** " + ", ".join(f"{p} v{n}" for p, n in self._invocations.items()))
        workflow.set_current_details("  \n".join(lines))
