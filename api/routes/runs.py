"""Runs: launch, read, list, events (polling and SSE), task rows."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from starlette.concurrency import run_in_threadpool
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from api.sse import resume_point
from benchwright.errors import InvalidInput, Unavailable
from benchwright.registry.shape import readable_run
from benchwright.report.facts import run_narration
from benchwright.runs.control import ControlUpdate, control_run
from benchwright.runs.launch import start_run
from benchwright.runs.pipeline import ReviewResolution, StopRequest
from benchwright.schemas import (
    MAX_INDEX,
    EventPage,
    EventView,
    LaunchBody,
    RunList,
    RunView,
    TaskDetail,
    TaskList,
    Visibility,
    check_model_identifier,
)
from benchwright.store.events import read_events
from benchwright.store.models import EventRow, Run
from benchwright.store.results import fill_references
from benchwright.store.runs import (
    CURSOR_PATTERN,
    ID_PREFIX_PATTERN,
    get_run,
    list_runs,
    list_tasks,
    run_view,
    set_visibility,
    task_detail,
)

router = APIRouter(prefix="/v1/runs", tags=["runs"])
RunId = Annotated[str, Path(max_length=64)]
TaskIndex = Annotated[int, Path(ge=0, le=MAX_INDEX)]
After = Annotated[int, Query(ge=-1, le=MAX_INDEX,
                             description="Return what follows this seq/index (-1: from the start).")]


@router.post("", status_code=201, response_model=RunView, responses=responses(*BODY, 402, 409, 429, 503))
async def launch_run(body: LaunchBody, account: AccountDep, state: StateDep) -> RunView:
    """Launch a run: records RunLaunched (seq 0) and starts its workflow. ``{"replay_of", "model"}`` launches a
    replay of that run (``POST /v1/runs/{id}/replay``)."""
    check_model_identifier(body.model.identifier)
    if body.replay_of is not None:
        from api.routes.forks import replay_launch

        return await replay_launch(body, account, state)
    run = await start_run(state.settings, state.engine, state.temporal, account=account, launch=body)
    return await run_in_threadpool(run_view, state.engine, run, fresh=True)  # the row as recorded, its pin with it


@router.get("", response_model=RunList, responses=responses(400))
def get_runs(account: AccountDep, state: StateDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
             cursor: Annotated[str | None, Query(max_length=64, json_schema_extra={"pattern": CURSOR_PATTERN},
                                                 description="A ``next_cursor`` from the previous page.")] = None,
             id_prefix: Annotated[str | None, Query(
                 pattern=ID_PREFIX_PATTERN, description="Only the caller's runs whose id starts with this (at least 4 "
                 "characters): how the CLI and SDK resolve the 8-character ids tables show. Other accounts' runs "
                 "never match, public ones included.")] = None,
             ) -> RunList:
    """The caller's runs as summaries (no launch body), newest first; follow ``next_cursor`` for older ones."""
    return list_runs(state.engine, account_id=account.id, limit=limit, cursor=cursor, id_prefix=id_prefix)


WAIT_HALT_CHECK_S = 0.25


def _settled(run: RunView | Run) -> bool:
    """The run stopped running: it finished, or it is halted (stopped, paused, waiting for a review)."""
    return run.status != "running" or run.halted


@router.get("/{run_id}", response_model=RunView, responses=responses(404))
async def get_one(run_id: RunId, account: AccountDep, state: StateDep,
                  wait_s: Annotated[float, Query(ge=0, le=60, description=(
                      "Long poll: hold the answer until the run stops running (it finished, or halted: stopped, "
                      "paused, waiting for a review) or this many seconds passed; the run is returned either "
                      "way."))] = 0) -> RunView:
    """One run: status, halt fields, display_status, phase, cost and the task summary."""
    def view_of(run: Run) -> RunView:
        # A terminal view is narrated in the same thread hop, from the same row (the long poll's answer waits for it).
        view = run_view(state.engine, run, fresh=True)  # the row was read in this same thread hop
        if view.terminal:
            view.narration = run_narration(state.engine, run, view)
        return view

    def read() -> RunView:
        return view_of(readable_run(state.engine, run_id=run_id, account_id=account.id))

    def read_if_settled() -> RunView | None:
        # The row alone (one read by key) while the run is live: the whole view counts the run's task rows, ~5-15 ms
        # at 1,000 tasks, and every wake-up would pay that on the cores its worker is using.
        run = readable_run(state.engine, run_id=run_id, account_id=account.id)
        return view_of(run) if _settled(run) else None

    changed = asyncio.Event()
    # The store says when the row settles (benchwright.store.settled): listened for before the first read, so a
    # settle after that read is not missed.
    with state.settling(run_id, changed) if wait_s > 0 else contextlib.nullcontext():
        view = await run_in_threadpool(read)
        if wait_s <= 0 or _settled(view):
            return view
        # Each activity the workflow completes wakes us at once too: the terminal row is written by its last (local)
        # activity, and a halt's by the halt's, so the answer leaves when the row turns, not when the workflow closes
        # after the report (issue 25: 0-250 ms of every launch-and-wait). The row is also re-read every
        # WAIT_HALT_CHECK_S, and alone at that pace without Temporal (unreachable, or the workflow gone). The whole
        # view is read once the row has turned (or the wait is over).
        try:
            watch: asyncio.Task[None] | None = asyncio.create_task(
                _watch_activities((await state.temporal()).get_workflow_handle(run_id), changed))
        except Unavailable:
            watch = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        try:
            while (left := deadline - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=min(WAIT_HALT_CHECK_S, left))
                changed.clear()
                if (settled := await run_in_threadpool(read_if_settled)) is not None:
                    return settled
            view = await run_in_threadpool(read)
        finally:
            if watch is not None:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)  # a workflow gone or failed: the row tells
    return view


_ROW_WRITES = frozenset({
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
    EventType.EVENT_TYPE_MARKER_RECORDED,  # a local activity's end (the quick phases, the run's end)
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED})
"""History events after which the run's row may read differently: what its activities wrote, or the workflow's end."""


async def _watch_activities(handle: WorkflowHandle[Any, Any], changed: asyncio.Event) -> None:
    """Set ``changed`` on each history event after which the row may read differently, until the workflow closes
    (Temporal's history long poll: one call per burst of new events, none while nothing happens)."""
    async for event in handle.fetch_history_events(wait_new_event=True):
        if event.event_type in _ROW_WRITES:
            changed.set()


def _event_view(row: EventRow) -> EventView:
    return EventView(seq=row.seq, type=row.type, data=row.data, created_at=row.created_at)


@router.get("/{run_id}/events", response_model=EventPage, responses={
    **responses(404), 200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                            "description": "The page of events, or with `Accept: text/event-stream` the live stream"}})
async def get_events(
    run_id: RunId, request: Request, account: AccountDep, state: StateDep,
    after: After = -1, limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventPage | StreamingResponse:
    """The run's event log from ``after``; with ``Accept: text/event-stream``, a live SSE stream (id = seq) that
    resumes from ``Last-Event-ID`` (an id it sent: -1 up to the run's last seq, else 422) and closes after the
    terminal event."""
    run = await run_in_threadpool(readable_run, state.engine, run_id=run_id, account_id=account.id)
    if "text/event-stream" in request.headers.get("accept", ""):
        start = resume_point(last_event_id=last_event_id, after=after, last_seq=run.next_seq - 1)
        return StreamingResponse(state.sse.stream(log_id=run.id, after=start, finished=run.finished_at is not None),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    # One rule with the SSE stream, which closes after PipelineFinished: the run row is read first, and
    # finished_at is set in the transaction that appends PipelineFinished, so a run seen finished here has its
    # terminal event in the page read next (unless the page is full).
    current = await run_in_threadpool(get_run, state.engine, run_id=run.id)
    rows = await run_in_threadpool(read_events, state.engine, run.id, after=after, limit=limit)
    terminal = current.finished_at is not None and len(rows) < limit
    return EventPage(events=[_event_view(r) for r in rows], next_after=rows[-1].seq if rows else after,
                     terminal=terminal)


@router.get("/{run_id}/tasks", response_model=TaskList, responses=responses(404))
def get_tasks(run_id: RunId, account: AccountDep, state: StateDep, after: After = -1,
              limit: Annotated[int, Query(ge=1, le=5000)] = 500,
              invocation: Annotated[int | None, Query(ge=1, le=MAX_INDEX, description=(
                  "The Materialize invocation (sweep, docs/concepts.md §2) to list; "
                  "default the latest."))] = None) -> TaskList:
    """Settled task rows (outcome, score, output, per-trial scores; input, reference, extracted answer and rule,
    no_answer), by index; page with ``after``."""
    from benchwright.sandbox.factory import blob_store  # the deployment's blob store, made on first use

    run = readable_run(state.engine, run_id=run_id, account_id=account.id)
    page = list_tasks(state.engine, run_id=run.id, after=after, limit=limit, invocation=invocation)
    fill_references(state.engine, blob_store(state.settings), run_id=run.id, tasks=page.tasks)
    return page


@router.get("/{run_id}/tasks/{index}", response_model=TaskDetail, responses=responses(404))
def get_task(run_id: RunId, index: TaskIndex, account: AccountDep, state: StateDep) -> TaskDetail:
    """One task with each trial's score, meta and output."""
    from benchwright.sandbox.factory import blob_store

    run = readable_run(state.engine, run_id=run_id, account_id=account.id)
    detail = task_detail(state.engine, run_id=run.id, index=index)
    fill_references(state.engine, blob_store(state.settings), run_id=run.id, tasks=[detail])
    return detail


class StopBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=500)


class RunPatch(BaseModel):
    """``PATCH /v1/runs/{id}``: resolve a human review, and/or change visibility; at least one of the two (an
    empty patch is refused with 400 ``empty_patch``, and the schema says so with ``minProperties``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    review_resolution: Annotated[str, Field(min_length=1, max_length=20_000)] | SkipJsonSchema[None] = None
    """Your guidance in prose; it becomes the Driver's instructions when the run picks up."""
    visibility: Visibility | SkipJsonSchema[None] = None


CONTROL_RESPONSES = responses(404, 409, 503)


async def _control(state: StateDep, run_id: str, account_id: str | None, update: ControlUpdate, arg: Any = None,
                   request_id: str | None = None) -> RunView:
    """Send a control update to the run's workflow (``benchwright.runs.control``); its refusal, or the run finishing
    first, is a 409. ``account_id`` None reaches any account's run (the admin halt, ``api/routes/admin.py``)."""
    await control_run(state.temporal, state.engine, run_id=run_id, account_id=account_id, update=update, arg=arg,
                      request_id=request_id)
    fresh = await run_in_threadpool(get_run, state.engine, run_id=run_id)
    return await run_in_threadpool(run_view, state.engine, fresh)


@router.post("/{run_id}/stop", response_model=RunView, responses=responses(*BODY, 404, 409, 503))
async def stop_run(run_id: RunId, account: AccountDep, state: StateDep, body: StopBody | None = None,
                   idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
    """Halt the run for good (``operator_kill``): in-flight work is cancelled, partial results are kept."""
    return await _control(state, run_id, account.id, "stop", StopRequest(reason=body.reason if body else None),
                          idempotency_key)


@router.post("/{run_id}/pause", response_model=RunView, responses=CONTROL_RESPONSES)
async def pause_run(run_id: RunId, account: AccountDep, state: StateDep,
                    idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
    """Pause the run (``operator_pause``): in-flight work stops and picks up where it was on resume."""
    return await _control(state, run_id, account.id, "pause", None, idempotency_key)


@router.post("/{run_id}/resume", response_model=RunView, responses=CONTROL_RESPONSES)
async def resume_run(run_id: RunId, account: AccountDep, state: StateDep,
                     idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
    """Resume a paused run. Anything but an ``operator_pause`` halt answers 409 ``not_paused``."""
    return await _control(state, run_id, account.id, "resume", None, idempotency_key)


@router.patch("/{run_id}", response_model=RunView, responses=responses(*BODY, 404, 409, 503))
async def patch_run(run_id: RunId, body: RunPatch, account: AccountDep, state: StateDep) -> RunView:
    """Resolve a human review (``review_resolution``), which clears the halt and wakes the run; or change
    visibility."""
    if body.review_resolution is None and body.visibility is None:
        raise InvalidInput("nothing to change: send review_resolution and/or visibility", code="empty_patch")
    if body.visibility is not None:
        await run_in_threadpool(set_visibility, state.engine, run_id=run_id, account_id=account.id,
                                visibility=body.visibility)
    if body.review_resolution is not None:
        return await _control(state, run_id, account.id, "resolve_review",
                              ReviewResolution(resolution=body.review_resolution))
    return await run_in_threadpool(run_view, state.engine, get_run(state.engine, run_id=run_id))
