"""The calling account."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import responses
from benchwright.limits import DriverBudgets, ScorerCeilings, matrix
from benchwright.store.accounts import get_account

router = APIRouter(prefix="/v1", tags=["account"])


class AccountView(BaseModel):
    id: str
    name: str
    balance_usd: float
    """Prepaid balance; billed spend (sandbox, driver, narration with markup) is debited as it lands."""


@router.get("/account", response_model=AccountView, responses=responses())
async def account_view(account: AccountDep, state: StateDep) -> AccountView:
    """Who the API key belongs to, and the account's balance."""
    current = await run_in_threadpool(get_account, state.engine, account_id=account.id)
    return AccountView(id=current.id, name=current.name, balance_usd=current.balance_usd)


@router.get("/limits")
def limits_matrix(state: StateDep) -> dict[str, Any]:
    """The enforceable limits matrix (anything else is refused with 400), the defaults and the fixed ceilings."""
    return matrix(ScorerCeilings.of(state.settings), DriverBudgets.of(state.settings))
