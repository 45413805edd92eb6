"""Controlling a live run: the one path that sends a run's workflow a control update (``stop``, ``pause``,
``resume``, ``resolve_review``, ``admin_halt``; handlers in ``workflows/run.py``) and says what its refusal means.
The API's control routes and the Operator's halts both come here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from benchwright.errors import Conflict, NotFound, Unavailable
from benchwright.store.runs import get_run

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from temporalio.client import Client, WorkflowUpdateFailedError

ControlUpdate = Literal["stop", "pause", "resume", "resolve_review", "admin_halt"]

UPDATE_OUTLIVED_RUN = "AcceptedUpdateCompletedWorkflow"
"""The failure type the Temporal server gives an accepted update whose workflow completed before the handler
returned (a stop racing the run's own PipelineFinished). It is a 409 like any call on a finished run."""

UPDATE_RPC_TIMEOUT = timedelta(seconds=30)

FINISHED_CODES: dict[str, str] = {"resume": "not_paused", "resolve_review": "not_waiting"}
"""The 409 code of a control call on a run that has finished (or finishes first); ``already_finished`` otherwise."""


async def control_run(client: Client | Callable[[], Awaitable[Client]], engine: Engine, *, run_id: str,
                      account_id: str | None, update: ControlUpdate, arg: object = None,
                      request_id: str | None = None) -> None:
    """Send the run's workflow ``update`` (with ``arg``), keyed ``request_id`` so a retry is one call.
    ``account_id`` None reaches any account's run (the admin halt). ``client`` may be a coroutine function returning
    the client (the API's lazy connection): it is only called once the run is known to be live.

    Raises:
        NotFound: no such run for this account, or no live workflow for it.
        Conflict: the run has finished, finishes first, or its workflow refused the update (the validator's code).
        Unavailable: no worker answered in time.
    """
    from temporalio.client import Client as TemporalClient
    from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
    from temporalio.service import RPCError, RPCStatusCode

    run = await asyncio.to_thread(get_run, engine, run_id=run_id, account_id=account_id)
    finished_code = FINISHED_CODES.get(update, "already_finished")
    if run.finished_at is not None:
        raise Conflict(f"the run has finished ({run.status}{f', halted: {run.halt_reason}' if run.halted else ''})",
                       code=finished_code)
    if not isinstance(client, TemporalClient):
        client = await client()
    args = [arg] if arg is not None else []
    try:
        await client.get_workflow_handle(run_id).execute_update(update, *args, id=request_id,
                                                                rpc_timeout=UPDATE_RPC_TIMEOUT)
    except WorkflowUpdateFailedError as exc:
        raise update_refusal(exc, update=update, finished_code=finished_code) from exc
    except WorkflowUpdateRPCTimeoutOrCancelledError as exc:
        raise Unavailable("no worker answered the control call in time; is a worker running?") from exc
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            # The server says NOT_FOUND ("workflow execution already completed") to an update that reaches a
            # workflow that has just returned: the same race as UPDATE_OUTLIVED_RUN, one step earlier.
            if (await asyncio.to_thread(get_run, engine, run_id=run_id)).finished_at is not None:
                raise Conflict(f"the run finished before the {update} reached it", code=finished_code) from exc
            raise NotFound(f"run {run_id} has no live workflow") from exc
        raise


def update_refusal(exc: WorkflowUpdateFailedError, *, update: str, finished_code: str) -> Exception:
    """What a failed control update means to the caller: a validator's refusal or the run finishing first are
    Conflicts (with the validator's code, or ``finished_code``); anything else stays the SDK's error."""
    from temporalio.exceptions import ApplicationError

    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.type == "Conflict":
        details = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
        return Conflict(cause.message, code=str(details.get("code", "conflict")))
    if isinstance(cause, ApplicationError) and cause.type == UPDATE_OUTLIVED_RUN:
        return Conflict(f"the run finished while the {update} was being applied", code=finished_code)
    return exc
