"""Platform administration: the ``admin`` halt (§9), for accounts the operator made admins.

For every other caller the routes do not exist: a missing key, a wrong key and a non-admin key all get the same
404 an unknown path gets, so the API does not tell a user that there is an admin surface to probe.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from api.deps import StateDep, current_account
from api.routes.runs import _control
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
    """Halt any account's run for good (``admin: <reason>``, display_status ``killed``); torn down like a stop."""
    return await _control(state, run_id, None, "admin_halt", StopRequest(reason=body.reason), idempotency_key)
