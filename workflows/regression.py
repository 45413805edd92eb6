"""RegressionWorkflow: one firing of a regression schedule (issue 17). Orchestration only.

Started by a Temporal Schedule (``api/routes/schedules.py``), never by hand. It replays the reference run as a
child ``RunWorkflow`` (the run is an ordinary run: its own id, log, API view and Temporal UI entry), judges the
replay against the reference, and on the transition into regression posts the webhook. The outcome is its result
(the next firing reads it back as the last completion result), the ``BenchwrightRegression`` search attribute and
the workflow's current details in the Temporal UI.

No signals, updates or queries: pause or delete the schedule to stop firings; stop a replay through its run.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.regression import AlertInput, RegressionActivities
    from benchwright.comparison.regression import (
        CheckInput,
        PrepareInput,
        RegressionInput,
        RegressionResult,
    )
    from benchwright.stack.temporal_ui import (
        REGRESSION,
        RUN_ACCOUNT,
        RUN_MODEL,
        RUN_PHASE,
        RUN_STATUS,
        workflow_summary,
    )
    from workflows.run import RunWorkflow

STEP_TIMEOUT = timedelta(minutes=5)
STEP_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10),
                         maximum_attempts=4)
WEBHOOK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                            maximum_attempts=5)
OUTCOMES_PATCH = "regression-outcomes"
"""Issue 22/23: a refused launch or an undeliverable alert is the firing's recorded outcome (its result, shown by
``GET /v1/schedules/{id}``), not a failed workflow whose reason only Temporal's history holds."""


def _reason(exc: ActivityError) -> str:
    """What went wrong, in the activity's own words (its ApplicationError), not the wrapper's."""
    cause = exc.cause
    return cause.message if isinstance(cause, ApplicationError) else str(cause or exc)


@workflow.defn
class RegressionWorkflow:
    @workflow.run
    async def run(self, inp: RegressionInput) -> RegressionResult:
        previous = workflow.get_last_completion_result(RegressionResult) if workflow.has_last_completion_result() \
            else None
        run_id = str(workflow.uuid4())
        outcomes = workflow.patched(OUTCOMES_PATCH)
        try:
            prepared = await workflow.execute_activity_method(
                RegressionActivities.start_replay, PrepareInput(regression=inp, run_id=run_id),
                start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY, summary="record the replay run")
        except ActivityError as exc:
            if not outcomes:
                raise
            return self._finish(RegressionResult(
                run_id=None, status="launch_refused", regressed=bool(previous and previous.regressed), alerted=False,
                verdict=f"the scheduled replay was not launched: {_reason(exc)}"))
        model, dataset = prepared.run.launch.model.identifier, prepared.run.launch.dataset or ""
        try:
            await workflow.execute_child_workflow(
                RunWorkflow.run, prepared.run, id=run_id, task_queue=inp.task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(RUN_PHASE, "launched"), SearchAttributePair(RUN_STATUS, "running"),
                    SearchAttributePair(RUN_MODEL, model), SearchAttributePair(RUN_ACCOUNT, prepared.account_name)]),
                memo={"run_id": run_id, "account": prepared.account_name, "dataset": dataset,
                      "replay_of": inp.reference_run_id, "schedule": inp.schedule_id},
                static_summary=workflow_summary(model=model, dataset=dataset),
                static_details=f"Scheduled replay of `{inp.reference_run_id}` (schedule `{inp.schedule_id}`)")
        except ChildWorkflowError:
            pass  # the run's row says how it ended; check_replay reads it
        check = CheckInput(regression=inp, run_id=run_id, previously_regressed=bool(previous and previous.regressed))
        checked = await workflow.execute_activity_method(
            RegressionActivities.check_replay, check,
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY, summary="compare with the reference")
        result, event = checked.result, checked.event
        if event is not None and inp.webhook:
            try:
                await workflow.execute_activity_method(
                    RegressionActivities.post_alert, AlertInput(**check.model_dump(), event=event),
                    start_to_close_timeout=STEP_TIMEOUT, retry_policy=WEBHOOK_RETRY,
                    summary="post the alert to the webhook")
                if outcomes:
                    result = result.model_copy(update={"webhook": "sent"})
            except ActivityError as exc:
                if not outcomes:
                    raise
                result = result.model_copy(update={"webhook": f"failed: {_reason(exc)}"})
        return self._finish(result)

    @staticmethod
    def _finish(result: RegressionResult) -> RegressionResult:
        workflow.upsert_search_attributes([REGRESSION.value_set(result.status)])
        replay = f"replay `{result.run_id}`" if result.run_id else "no replay"
        webhook = f"  \nwebhook: {result.webhook}" if result.webhook else ""
        workflow.set_current_details(f"**{result.status}** — {replay}  \n{result.verdict}{webhook}")
        return result
