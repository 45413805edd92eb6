"""The calling account."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from api.deps import AccountDep

router = APIRouter(prefix="/v1", tags=["account"])


class AccountView(BaseModel):
    id: str
    name: str


@router.get("/account", response_model=AccountView)
def get_account(account: AccountDep) -> AccountView:
    """Who the API key belongs to."""
    return AccountView(id=account.id, name=account.name)
