"""Platform administration: the ``admin`` halt (§9) and the audit trail (issue 23), for accounts the operator made
admins.

For every other caller the routes do not exist: a missing key, a wrong key and a non-admin key all get the same
404 an unknown path gets, so the API does not tell a user that there is an admin surface to probe.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from api.deps import StateDep, current_account
from api.routes.runs import _control
from benchwright import audit
from benchwright.errors import Unauthorized
from benchwright.pipeline import StopRequest
from benchwright.schemas import RunView
from benchwright.store.models import Account

router = APIRouter(prefix="/v1/admin", tags=["admin"], include_in_schema=False)


async def admin_account(request: Request, state: StateDep) -> Account:
    """The calling account if it is an admin; otherwise the 404 of a path that does not exist."""
    try:
        account = await current_account(request, state)
    except Unauthorized:
        account = None
    if account is None or not account.admin:
        raise HTTPException(status_code=404, detail="Not Found")  # byte for byte what an unknown path answers
    return account


AdminDep = Annotated[Account, Depends(admin_account)]


class AdminHaltBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=500)
    """Why; recorded as ``halt_reason = "admin: <reason>"`` and shown to the run's owner."""


@router.post("/runs/{run_id}/halt", response_model=RunView)
async def admin_halt(run_id: Annotated[str, Path(max_length=64)], body: AdminHaltBody, admin: AdminDep, state: StateDep,
                     idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
    """Halt any account's run for good (``admin: <reason>``, display_status ``killed``); torn down like a stop.
    Recorded in the audit trail once the workflow accepted it (the admin is known here, not in the workflow)."""
    view = await _control(state, run_id, None, "admin_halt", StopRequest(reason=body.reason), idempotency_key)
    await run_in_threadpool(audit.record_now, state.engine, actor=audit.account_actor(admin),
                            actor_account_id=admin.id, action="run.admin_halt", target=f"run:{run_id}",
                            detail={"reason": body.reason, "halt_reason": view.halt_reason})
    return view


@router.get("/audit", response_model=audit.AuditPage)
async def audit_log(admin: AdminDep, state: StateDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
                    cursor: Annotated[str | None, Query(max_length=20, description=(
                        "A ``next_cursor`` from the previous page."))] = None,
                    action: Annotated[str | None, Query(max_length=64, description=(
                        "Only entries of this action (``run.admin_halt``, ``impl.promote``, ``account.create``…)."
                    ))] = None) -> audit.AuditPage:
    """The audit trail, newest first: who did what to what, and when (admins only; everyone else: 404)."""
    return await run_in_threadpool(audit.list_audit, state.engine, limit=limit, cursor=cursor, action=action)
