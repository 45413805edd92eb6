"""Scheduled regression runs (issue 17): Temporal Schedules that replay a reference run and compare each replay.

A schedule is Temporal's (so it survives restarts of the API, the workers and — on a cluster — the server); no
store row is kept. Ownership is the schedule's memo (``account_id``): another account's schedule is "not found".
The list reads every Benchwright schedule of the namespace and keeps the caller's; Temporal's schedule list is
eventually consistent, so a schedule just created may take a moment to appear there (``GET /v1/schedules/{id}``
sees it at once).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    WorkflowFailureError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from benchwright.comparison.regression import (
    AlertRule,
    RegressionInput,
    RegressionResult,
    ScheduleCreate,
    admit_replay,
    parse_cadence,
)
from benchwright.comparison.webhook import check_webhook
from benchwright.errors import InvalidInput, NotFound
from benchwright.proxy.addresses import parse_endpoints
from benchwright.stack.temporal_ui import RUN_ACCOUNT
from benchwright.store.models import Account
from benchwright.store.policy import get_policy
from workflows.regression import RegressionWorkflow

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
ScheduleId = Annotated[str, Path(max_length=80)]
PREFIX = "bw-schedule-"


class Firing(BaseModel):
    """One firing of the schedule (Temporal keeps the 10 most recent)."""

    workflow_id: str
    started_at: datetime
    status: str
    """The RegressionWorkflow's status: RUNNING, COMPLETED, FAILED, ..."""
    outcome: str
    """``running``; once completed the result's status (ok, detected, ongoing, replay_failed, incomparable,
    launch_refused); ``failed`` when the firing itself failed (``reason`` says why)."""
    reason: str | None = None
    """Why, in words: the verdict, the refusal of the launch, or the failure (the alert's delivery is appended)."""
    result: RegressionResult | None = None
    """Once completed: the replay run, its outcome and verdict, and the webhook's delivery."""


class ScheduleView(BaseModel):
    id: str
    replay_of: str
    every: str
    alert: AlertRule
    webhook: str | None
    paused: bool
    created_at: datetime | None
    """None in the list (Temporal's listing does not carry it)."""
    next_runs: list[datetime]
    firings: list[Firing] = []
    skipped: int = 0
    """Firings skipped because the previous one was still running (the overlap policy), over the schedule's life."""


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class SchedulePatch(BaseModel):
    """``PATCH /v1/schedules/{id}``: pause or resume firings."""

    model_config = ConfigDict(extra="forbid")
    paused: bool


def _view(schedule_id: str, memo: dict[str, Any], *, paused: bool, created_at: datetime | None,
          next_runs: list[datetime],
          firings: list[Firing] | None = None, skipped: int = 0) -> ScheduleView:
    return ScheduleView(id=schedule_id, replay_of=memo["replay_of"], every=memo["every"],
                        alert=AlertRule.model_validate(memo["alert"]), webhook=memo.get("webhook"), paused=paused,
                        created_at=created_at, next_runs=next_runs[:3], firings=firings or [], skipped=skipped)


async def _owned(client: Client, schedule_id: str, account: Account) -> tuple[ScheduleHandle, ScheduleDescription,
                                                                               dict[str, Any]]:
    handle = client.get_schedule_handle(schedule_id)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NotFound(f"schedule {schedule_id} not found") from exc
        raise
    memo = dict(await desc.memo())
    if not schedule_id.startswith(PREFIX) or memo.get("account_id") != account.id:
        raise NotFound(f"schedule {schedule_id} not found")
    return handle, desc, memo


async def _firings(client: Client, desc: ScheduleDescription) -> list[Firing]:
    out = []
    for action in desc.info.recent_actions:
        workflow_id = getattr(action.action, "workflow_id", "")
        handle = client.get_workflow_handle(workflow_id, result_type=RegressionResult,
                                            run_id=getattr(action.action, "first_execution_run_id", None))
        info = await handle.describe()
        status = info.status.name if info.status else "UNKNOWN"
        result, reason = None, None
        if status == "COMPLETED":
            result = await handle.result()
            reason = result.verdict + (f"; webhook {result.webhook}" if result.webhook else "")
            outcome = result.status
        elif status == "RUNNING":
            outcome = "running"
        else:  # failed, timed out, terminated: the reason Temporal holds, in the failure's own words
            outcome = "failed"
            try:
                await handle.result()
            except WorkflowFailureError as exc:
                reason = _failure_words(exc)
        out.append(Firing(workflow_id=workflow_id, started_at=action.started_at, status=status, outcome=outcome,
                          reason=reason, result=result))
    return out


def _failure_words(exc: BaseException) -> str:
    """The innermost failure's message (an activity's ApplicationError under the workflow's), else the outermost."""
    words = str(exc)
    cause: BaseException | None = exc
    while cause is not None:
        message = getattr(cause, "message", None) or str(cause)
        if message:
            words = message
        cause = cause.__cause__ or getattr(cause, "cause", None)
    return words


@router.post("", status_code=201, response_model=ScheduleView, responses=responses(*BODY, 404, 409, 503))
async def create_schedule(body: ScheduleCreate, account: AccountDep, state: StateDep) -> ScheduleView:
    """Replay a finished run on a cadence (``every``: ``30s``/``1d`` or cron) and alert on a significant drop."""
    cadence = parse_cadence(body.every)
    schedule_id = f"{PREFIX}{uuid.uuid4()}"
    # exactly the launch each firing will make, admitted as each firing admits it (and as POST /replay would)
    reference, _, _ = await run_in_threadpool(admit_replay, state.settings, state.engine, account=account,
                                              reference_run_id=body.replay_of, schedule_id=schedule_id)
    if body.webhook is not None:  # exactly the rules delivery applies: a webhook it would refuse is refused now
        policy = await run_in_threadpool(get_policy, state.engine, account_id=account.id)
        try:
            await check_webhook(url=body.webhook, policy=policy,
                                internal_allowed=parse_endpoints(state.settings.egress_internal_allowed))
        except (OSError, UnicodeError) as exc:
            raise InvalidInput(f"the webhook host of {body.webhook} does not resolve ({exc}); alerts could not be "
                               "delivered", code="invalid_webhook") from None
    inp = RegressionInput(schedule_id=schedule_id, account_id=account.id, reference_run_id=reference.id,
                          alert=body.alert, webhook=body.webhook, task_queue=state.settings.task_queue)
    spec = ScheduleSpec(intervals=[ScheduleIntervalSpec(every=cadence.interval)] if cadence.interval else [],
                        cron_expressions=[cadence.cron] if cadence.cron else [])
    memo = {"account_id": account.id, "replay_of": reference.id, "every": body.every,
            "alert": body.alert.model_dump(), **({"webhook": body.webhook} if body.webhook else {})}
    client = await state.temporal()
    try:
        handle = await client.create_schedule(schedule_id, Schedule(
            action=ScheduleActionStartWorkflow(
                RegressionWorkflow.run, inp, id=f"{schedule_id}-firing", task_queue=state.settings.task_queue,
                static_summary=f"regression check of {reference.id}"[:400]),
            spec=spec, policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(note=f"replays run {reference.id} every {body.every}")),
            memo=memo, search_attributes=TypedSearchAttributes([SearchAttributePair(RUN_ACCOUNT, account.name)]))
    except RPCError as exc:
        if exc.status == RPCStatusCode.INVALID_ARGUMENT:
            raise InvalidInput(f"Temporal refused the schedule: {exc.message}", code="invalid_schedule") from exc
        raise
    desc = await handle.describe()
    return _view(schedule_id, memo, paused=desc.schedule.state.paused, created_at=desc.info.created_at,
                 next_runs=list(desc.info.next_action_times))


@router.get("", response_model=ScheduleList, responses=responses(503))
async def list_schedules(account: AccountDep, state: StateDep) -> ScheduleList:
    """The caller's schedules (Temporal's list is eventually consistent: a new one shows up within moments)."""
    client = await state.temporal()
    out = []
    async for entry in await client.list_schedules(page_size=1000):
        if not entry.id.startswith(PREFIX):
            continue
        memo = dict(await entry.memo())
        if memo.get("account_id") != account.id:
            continue
        info = entry.info
        out.append(_view(entry.id, memo, paused=bool(entry.schedule and entry.schedule.state.paused),
                          created_at=None,
                          next_runs=list(info.next_action_times) if info else []))
    return ScheduleList(schedules=out)


@router.get("/{schedule_id}", response_model=ScheduleView, responses=responses(404, 503))
async def get_schedule(schedule_id: ScheduleId, account: AccountDep, state: StateDep) -> ScheduleView:
    """One schedule with its recent firings: each replay run, its status and verdict."""
    client = await state.temporal()
    _, desc, memo = await _owned(client, schedule_id, account)
    return _view(schedule_id, memo, paused=desc.schedule.state.paused, created_at=desc.info.created_at,
                 next_runs=list(desc.info.next_action_times), firings=await _firings(client, desc),
                 skipped=desc.info.num_actions_skipped_overlap)


@router.patch("/{schedule_id}", response_model=ScheduleView, responses=responses(*BODY, 404, 503))
async def patch_schedule(schedule_id: ScheduleId, body: SchedulePatch, account: AccountDep,
                         state: StateDep) -> ScheduleView:
    """Pause (``{"paused": true}``) or resume firings; a firing in progress finishes."""
    client = await state.temporal()
    handle, _, memo = await _owned(client, schedule_id, account)
    if body.paused:
        await handle.pause(note=f"paused by {account.name}")
    else:
        await handle.unpause(note=f"resumed by {account.name}")
    desc = await handle.describe()
    return _view(schedule_id, memo, paused=desc.schedule.state.paused, created_at=desc.info.created_at,
                 next_runs=list(desc.info.next_action_times))


@router.delete("/{schedule_id}", status_code=204, response_class=Response, responses=responses(404, 503))
async def delete_schedule(schedule_id: ScheduleId, account: AccountDep, state: StateDep) -> Response:
    """Delete the schedule: no more firings (a firing in progress and the runs it made stay)."""
    client = await state.temporal()
    handle, _, _ = await _owned(client, schedule_id, account)
    await handle.delete()
    return Response(status_code=204)
