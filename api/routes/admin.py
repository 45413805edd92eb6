"""Platform administration: the ``admin`` halt (§9), the audit trail and per-account quotas (issue 23), for
accounts the operator made admins.

For every other caller the routes do not exist: a missing key, a wrong key and a non-admin key all get the same
404 an unknown path gets, so the API does not tell a user that there is an admin surface to probe.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlmodel import Session, col
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from api.deps import StateDep, current_account
from api.routes.runs import _control
from benchwright.errors import NotFound, Unauthorized
from benchwright.runs.pipeline import StopRequest
from benchwright.schemas import RunView
from benchwright.security import audit
from benchwright.security.quotas import MAX_QUOTA, Quotas, quotas_for, set_quotas, usage
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


class QuotaBody(BaseModel):
    """Per-account quota overrides (``benchwright.security.quotas``). A number sets the quota, ``null`` puts it back to
    the deployment's default, a quota left out is kept."""

    model_config = ConfigDict(extra="forbid")
    runs: int | None = Field(default=None, ge=1, le=MAX_QUOTA)
    model_calls: int | None = Field(default=None, ge=1, le=MAX_QUOTA)
    tasks: int | None = Field(default=None, ge=1, le=MAX_QUOTA)


class QuotaView(BaseModel):
    account: str
    runs: int
    model_calls: int
    tasks: int
    overridden: list[str]
    """The quotas set for this account; the others are the deployment's defaults."""
    used_runs: int
    used_tasks: int


def _account_id(state: StateDep, name: str) -> str:
    with Session(state.engine) as session:
        account_id: str | None = session.execute(
            select(col(Account.id)).where(col(Account.name) == name)).scalar_one_or_none()
    if account_id is None:
        raise NotFound(f"no account named {name!r}")
    return account_id


def _quota_view(state: StateDep, name: str, quotas: Quotas) -> QuotaView:
    used = usage(state.engine, account_id=_account_id(state, name))
    return QuotaView(account=name, **quotas.view(), used_runs=used.runs, used_tasks=used.tasks)


AccountName = Annotated[str, Path(max_length=200)]


@router.get("/accounts/{name}/quota", response_model=QuotaView)
def admin_get_quota(name: AccountName, admin: AdminDep, state: StateDep) -> QuotaView:
    """An account's quotas (its overrides over the deployment's defaults) and what it uses now."""
    return _quota_view(state, name, quotas_for(state.engine, state.settings, account_id=_account_id(state, name)))


@router.put("/accounts/{name}/quota", response_model=QuotaView)
def admin_set_quota(name: AccountName, body: QuotaBody, admin: AdminDep, state: StateDep) -> QuotaView:
    """Set an account's quota overrides (see ``QuotaBody``); answers the quotas now in force."""
    given = body.model_fields_set
    values = {q: getattr(body, q) for q in given if getattr(body, q) is not None}
    reset = tuple(q for q in given if getattr(body, q) is None)
    quotas = set_quotas(state.engine, state.settings, account_name=name, values=values, reset=reset,
                        actor=audit.account_actor(admin))
    return _quota_view(state, name, quotas)
