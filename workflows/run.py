"""RunWorkflow: one run of the pipeline (§2). Orchestration only; every effect is an activity.

Queries:
    state: the current phase, per-phase invocation counters, tasks settled / total, status.

Workflow id = run id. The plan (which phases run, which are skipped and why) comes from
``benchwright.pipeline.plan_phases``; this class only executes it, counts invocations, and turns a phase that failed
for good into PhaseFailed + status error.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from benchwright.events import Event, PhaseFailed, PhaseSkipped, PipelineStarted
    from benchwright.pipeline import (
        EventsInput,
        FinishInput,
        MaterializeBatchInput,
        MaterializeBatchResult,
        MaterializeCompleteInput,
        PhaseInput,
        PhaseResult,
        RunInput,
        RunResult,
        batch_bounds,
        plan_phases,
    )
    from benchwright.temporal_ui import RUN_PHASE, RUN_STATUS

PHASE_TIMEOUT = timedelta(minutes=30)
PHASE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10),
                          maximum_attempts=4)
BATCH_TIMEOUT = timedelta(hours=12)
BATCH_HEARTBEAT = timedelta(seconds=5)
"""How long a killed worker's batch waits before another worker retries it (it resumes from the store)."""
BATCH_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10),
                          maximum_attempts=20)
LOG_TIMEOUT = timedelta(minutes=2)


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    def __init__(self) -> None:
        self._phase: str | None = None
        self._invocations: dict[str, int] = {}
        self._status = "running"
        self._tasks_total = 0
        self._tasks_settled = 0

    @workflow.query
    def state(self) -> dict[str, Any]:
        return {"phase": self._phase, "invocations": dict(self._invocations), "status": self._status,
                "tasks_total": self._tasks_total, "tasks_settled": self._tasks_settled}

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        plan = plan_phases(inp.launch)
        markers: list[tuple[str, Event]] = [
            ("pipeline:started", PipelineStarted(workflow_id=workflow.info().workflow_id,
                                                 phases=[p.model_dump() for p in plan]))]
        markers += [(f"{p.phase}:skipped", PhaseSkipped(phase=p.phase, reason=p.skip_reason))
                    for p in plan if p.skip_reason]
        await self._record(inp.run_id, markers)
        try:
            for step in plan:
                if step.skip_reason is None:
                    await self._run_phase(inp, step.phase)
        except ActivityError as err:
            return await self._fail(inp, err)
        await self._finish(inp.run_id, "ok")
        return RunResult(run_id=inp.run_id, status="ok")

    async def _run_phase(self, inp: RunInput, phase: str) -> None:
        invocation = self._invocations[phase] = self._invocations.get(phase, 0) + 1
        self._phase = phase
        workflow.upsert_search_attributes([RUN_PHASE.value_set(phase)])
        self._details()
        phase_inp = PhaseInput(run_id=inp.run_id, phase=phase, invocation=invocation, launch=inp.launch,
                               driver=inp.driver)
        if phase == "materialize":
            await self._materialize(inp, phase_inp)
            return
        result: PhaseResult = await workflow.execute_activity(
            phase, phase_inp, result_type=PhaseResult, start_to_close_timeout=PHASE_TIMEOUT, retry_policy=PHASE_RETRY,
            summary=f"{phase} v{invocation}")
        if result.tasks is not None:
            self._tasks_total = result.tasks

    async def _materialize(self, inp: RunInput, phase_inp: PhaseInput) -> None:
        started = workflow.now()
        invocation = phase_inp.invocation
        await workflow.execute_activity("materialize_begin", phase_inp, result_type=PhaseResult,
                                        start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY,
                                        summary=f"materialize v{invocation}: start")
        opts = inp.materialize
        bounds = batch_bounds(self._tasks_total, opts.batch_tasks)
        in_flight = max(1, min(opts.parallel_batches, len(bounds)))
        limiter = asyncio.Semaphore(in_flight)
        concurrency = max(1, opts.concurrency // in_flight)

        async def one(start: int, stop: int) -> None:
            async with limiter:
                batch = MaterializeBatchInput(run_id=inp.run_id, invocation=invocation, start=start, stop=stop,
                                              model=inp.launch.model, metadata=inp.launch.metadata,
                                              trials=inp.trials, concurrency=concurrency)
                await workflow.execute_activity(
                    "materialize_batch", batch, result_type=MaterializeBatchResult,
                    activity_id=f"materialize-{invocation}-{start}", start_to_close_timeout=BATCH_TIMEOUT,
                    heartbeat_timeout=BATCH_HEARTBEAT, retry_policy=BATCH_RETRY,
                    summary=f"materialize v{invocation}: tasks {start}..{stop - 1}")
                self._tasks_settled += stop - start
                self._details()

        batches = [asyncio.create_task(one(start, stop)) for start, stop in bounds]
        try:
            await asyncio.gather(*batches)
        except BaseException:
            for b in batches:
                b.cancel()
            raise
        duration_ms = int((workflow.now() - started).total_seconds() * 1000)
        await workflow.execute_activity(
            "materialize_complete", MaterializeCompleteInput(run_id=inp.run_id, invocation=invocation,
                                                             duration_ms=duration_ms),
            start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY, summary=f"materialize v{invocation}: done")

    async def _fail(self, inp: RunInput, err: ActivityError) -> RunResult:
        phase = self._phase or "unknown"
        cause = err.cause
        error_type = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
        detail = str(cause) if cause is not None else str(err)
        trace = ""
        if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
            trace = str(cause.details[0].get("stack_trace", ""))
        if not trace and cause is not None and getattr(cause, "failure", None) is not None:
            trace = cause.failure.stack_trace  # type: ignore[union-attr]
        invocation = self._invocations.get(phase, 1)
        await self._record(inp.run_id, [(f"{phase}:{invocation}:failed", PhaseFailed(
            phase=phase, error_type=error_type, detail=detail, stack_trace=trace))])
        error = f"{phase} failed: {error_type}: {detail}"
        await self._finish(inp.run_id, "error", error)
        return RunResult(run_id=inp.run_id, status="error", error=error)

    async def _record(self, run_id: str, events: list[tuple[str, Event]]) -> None:
        payload = [{"key": key, "type": ev.type_name(), "data": ev.model_dump(mode="json")} for key, ev in events]
        await workflow.execute_activity("record_events", EventsInput(run_id=run_id, events=payload),
                                        start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY,
                                        summary="record " + ", ".join(ev.type_name() for _, ev in events)[:200])

    async def _finish(self, run_id: str, status: str, error: str | None = None) -> None:
        await workflow.execute_activity("finish_run", FinishInput(run_id=run_id, status=status, error=error),
                                        start_to_close_timeout=LOG_TIMEOUT, retry_policy=PHASE_RETRY,
                                        summary=f"finish: {status}")
        self._status = status
        workflow.upsert_search_attributes([RUN_STATUS.value_set(status)])
        self._details()

    def _details(self) -> None:
        lines = [f"**status** {self._status}", f"**phase** {self._phase or '-'}"]
        if self._tasks_total:
            lines.append(f"**tasks** {self._tasks_settled}/{self._tasks_total} settled (by batch)")
        lines.append("**invocations** " + ", ".join(f"{p} v{n}" for p, n in self._invocations.items()))
        workflow.set_current_details("  \n".join(lines))
