"""Operator sessions (issue 26): ask a question, get an answer. A session is its own ``OperatorWorkflow`` (id
``operator-<session id>``) with its own log; it acts as the caller's account and reads only what that account may.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from api.sse import resume_point
from benchwright.errors import Conflict, InvalidInput, NotFound, Unavailable
from benchwright.operator.goals import OPERATORS, SessionCreate, SessionView
from benchwright.operator.llm import OperatorLlm
from benchwright.operator.steps import OperatorInput
from benchwright.operator.store import (
    TERMINAL,
    create_session,
    get_session,
    read_session_events,
    session_view,
    set_status,
)
from benchwright.schemas import MAX_INDEX, EventPage, EventView, check_model_identifier, suggest
from benchwright.stack.temporal_ui import OPERATOR_SESSION, RUN_ACCOUNT

router = APIRouter(prefix="/v1/operator/sessions", tags=["operator"])
SessionId = Annotated[str, Path(max_length=64)]


def workflow_id(session_id: str) -> str:
    return f"operator-{session_id}"


class SteerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, max_length=2000)


@router.post("", status_code=201, response_model=SessionView, responses=responses(*BODY, 404, 409, 503))
async def create(body: SessionCreate, account: AccountDep, state: StateDep) -> SessionView:
    """Start a session: the operator plans the runs that answer the goal, launches them as the caller (within
    ``limits.session`` and the account's balance), reads them and answers."""
    if body.operator not in OPERATORS and "://" not in body.operator:
        raise InvalidInput(f"unknown operator '{body.operator}'{suggest(body.operator, OPERATORS)}; available: "
                           f"{', '.join(OPERATORS)}, or '<provider>://<model>' for an LLM operator",
                           code="unknown_operator")
    import uuid

    llm = await run_in_threadpool(_admit, state, account, body)
    session_id = str(uuid.uuid4())
    client = await state.temporal()
    row = await run_in_threadpool(create_session, state.engine, session_id=session_id, account_id=account.id,
                                  req=body)
    inp = OperatorInput(session_id=session_id, account_id=account.id, operator=body.operator, goal=row.goal,
                        limits=body.limits, llm=llm)
    try:
        await client.start_workflow(
            "OperatorWorkflow", inp, id=workflow_id(session_id), task_queue=state.settings.task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(RUN_ACCOUNT, account.name),
                                                     SearchAttributePair(OPERATOR_SESSION, session_id)]),
            memo={"session_id": session_id, "account": account.name},
            static_summary=f"Operator session: {body.goal.question} ({body.operator})",
            static_details=f"Benchwright operator session `{session_id}` ({body.operator})  \n"
                           f"its runs: `{OPERATOR_SESSION.name} = '{session_id}'`")
    except Exception as exc:
        await run_in_threadpool(set_status, state.engine, session_id=session_id, status="failed")
        raise Unavailable(f"session {session_id} was recorded but its workflow could not be started: {exc}") from exc
    return await run_in_threadpool(session_view, state.engine, row)


def _admit(state: StateDep, account: AccountDep, body: SessionCreate) -> OperatorLlm | None:
    """Refuse at once (400/404/409) a goal whose plan could not be launched: the reference is not readable or not
    finished, or a planned launch fails the checks of ``POST /v1/runs`` (``admit_launch``). Each launch is checked
    again when the session makes it (the balance, the quota and the account's rules may change meanwhile).
    An LLM operator's own checks (``admit_operator``: its secret, its ``api_base``, its price); it plans as it goes,
    and each of its launches is checked when it makes it."""
    from benchwright.operator.builtin import plan
    from benchwright.operator.llm import admit_operator
    from benchwright.runs.launch import admit_launch

    llm = admit_operator(state.settings, state.engine, account=account, req=body)
    if llm is not None:
        return llm

    for planned in plan(state.settings, state.engine, account_id=account.id, goal=body.goal):
        check_model_identifier(planned.launch.model.identifier)
        admit_launch(state.settings, state.engine, account=account, launch=planned.launch)
    return None


class SessionList(BaseModel):
    sessions: list[SessionView]
    next_cursor: str | None
    """Pass as ``cursor`` for the next (older) page; null on the last page."""


@router.get("", response_model=SessionList, responses=responses(400))
def list_all(account: AccountDep, state: StateDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
             cursor: Annotated[str | None, Query(max_length=64, pattern=r"^[0-9A-Za-z-]+$", description=(
                 "The ``next_cursor`` of the previous page (a session id of this account)."))] = None,
             ) -> SessionList:
    """The account's sessions, newest first."""
    from benchwright.operator.listing import list_sessions

    before = None
    if cursor is not None:
        try:
            last = get_session(state.engine, session_id=cursor, account_id=account.id)
        except NotFound:
            raise InvalidInput(f"cursor {cursor!r} is not a session of this account", code="invalid_cursor") from None
        before = (last.created_at, last.id)
    rows = list_sessions(state.engine, account_id=account.id, limit=limit + 1, before=before)
    return SessionList(sessions=[session_view(state.engine, r) for r in rows[:limit]],
                       next_cursor=rows[limit - 1].id if len(rows) > limit else None)


@router.get("/{session_id}", response_model=SessionView, responses=responses(404))
async def get_one(session_id: SessionId, account: AccountDep, state: StateDep,
                  wait_s: Annotated[float, Query(ge=0, le=60, description=(
                      "Long poll: hold the answer until the session ends or this many seconds passed."))] = 0,
                  ) -> SessionView:
    """The session: status, answer, the runs it launched and their cost."""
    row = await run_in_threadpool(get_session, state.engine, session_id=session_id, account_id=account.id)
    if wait_s > 0 and row.status not in TERMINAL:
        handle = (await state.temporal()).get_workflow_handle(workflow_id(session_id))
        try:
            await asyncio.wait_for(handle.result(), timeout=wait_s)
        except (TimeoutError, WorkflowFailureError, RPCError):
            pass  # timed out, or the workflow failed: the row says where the session is either way
        row = await run_in_threadpool(get_session, state.engine, session_id=session_id, account_id=account.id)
    return await run_in_threadpool(session_view, state.engine, row)


@router.get("/{session_id}/events", response_model=EventPage, responses={
    **responses(404), 200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                            "description": "The page of events, or with `Accept: text/event-stream` the live stream"}})
async def get_events(session_id: SessionId, request: Request, account: AccountDep, state: StateDep,
                     after: Annotated[int, Query(ge=-1, le=MAX_INDEX)] = -1,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 500,
                     last_event_id: Annotated[str | None, Header()] = None) -> EventPage | StreamingResponse:
    """The session's log: every decision with its reason and the evidence it read (``terminal`` once answered).
    With ``Accept: text/event-stream``, a live SSE stream (id = seq) as a run's: it resumes from ``Last-Event-ID``
    and closes after SessionAnswered."""
    row = await run_in_threadpool(get_session, state.engine, session_id=session_id, account_id=account.id)
    if "text/event-stream" in request.headers.get("accept", ""):
        start = resume_point(last_event_id=last_event_id, after=after, last_seq=row.next_seq - 1,
                             noun="operator session")
        return StreamingResponse(state.session_sse.stream(log_id=row.id, after=start,
                                                          finished=row.status in TERMINAL),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await run_in_threadpool(_event_page, state, account, session_id, after, limit)


def _event_page(state: StateDep, account: AccountDep, session_id: str, after: int, limit: int) -> EventPage:
    rows = read_session_events(state.engine, session_id=session_id, after=after, limit=limit)
    return EventPage(events=[EventView(seq=r.seq, type=r.type, data=r.data, created_at=r.created_at) for r in rows],
                     next_after=rows[-1].seq if rows else after,
                     terminal=any(r.type == "SessionAnswered" for r in rows) or (
                         not rows and get_session(state.engine, session_id=session_id,
                                                  account_id=account.id).status in TERMINAL))


async def _signal(state: StateDep, account: AccountDep, session_id: str, name: str, *args: str) -> SessionView:
    row = await run_in_threadpool(get_session, state.engine, session_id=session_id, account_id=account.id)
    if row.status in TERMINAL:
        raise Conflict(f"operator session {session_id} has ended ({row.status})", code="session_ended")
    handle = (await state.temporal()).get_workflow_handle(workflow_id(session_id))
    await handle.signal(name, *args)
    return await run_in_threadpool(session_view, state.engine, row)


@router.post("/{session_id}/stop", status_code=202, response_model=SessionView, responses=responses(404, 409))
async def stop(session_id: SessionId, account: AccountDep, state: StateDep) -> SessionView:
    """Stop the session: it answers from what it read (its running runs go on; stop them by their ids)."""
    return await _signal(state, account, session_id, "stop")


@router.post("/{session_id}/pause", status_code=202, response_model=SessionView, responses=responses(404, 409))
async def pause(session_id: SessionId, account: AccountDep, state: StateDep) -> SessionView:
    """Hold the session's next launch until resumed."""
    return await _signal(state, account, session_id, "pause")


@router.post("/{session_id}/resume", status_code=202, response_model=SessionView, responses=responses(404, 409))
async def resume(session_id: SessionId, account: AccountDep, state: StateDep) -> SessionView:
    return await _signal(state, account, session_id, "resume")


@router.post("/{session_id}/steer", status_code=202, response_model=SessionView,
             responses=responses(*BODY, 404, 409))
async def steer(session_id: SessionId, body: SteerRequest, account: AccountDep, state: StateDep) -> SessionView:
    """Send the operator a message; it is recorded in the log. An LLM operator reads it as a user message before
    its next model call; the builtin operator keeps to its plan."""
    return await _signal(state, account, session_id, "steer", body.message)
