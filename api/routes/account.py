"""The calling account."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from benchwright.runs.limits import DriverBudgets, ScorerCeilings, matrix
from benchwright.security import audit
from benchwright.store import accounts as keys
from benchwright.store.accounts import KEY_NAME_PATTERN, get_account

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


class ApiKeyView(BaseModel):
    """An API key as the API ever shows it: its name, its first characters, when it was made and last used."""

    name: str
    prefix: str
    """The key's first 10 characters, to tell keys apart."""
    created_at: datetime
    last_used_at: datetime | None
    """When the key last authenticated a request (to the minute); null if never."""
    current: bool = False
    """This request's own key (rotating or revoking it ends this key)."""


class ApiKeyList(BaseModel):
    keys: list[ApiKeyView]


class NewApiKey(ApiKeyView):
    key: str
    """The key itself: shown this once, stored only as a digest."""


class NewKeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=KEY_NAME_PATTERN)
    """Unique within the account; default: the key's prefix."""


KeyName = Annotated[str, Path(min_length=1, max_length=64)]


def _new(info: keys.ApiKeyInfo, key: str) -> NewApiKey:
    return NewApiKey(name=info.name, prefix=info.prefix, created_at=info.created_at, last_used_at=info.last_used_at,
                     key=key)


@router.get("/account/keys", response_model=ApiKeyList, responses=responses())
async def list_api_keys(account: AccountDep, state: StateDep, request: Request) -> ApiKeyList:
    """The account's API keys (never the keys themselves); ``current`` marks the one this request used."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    rows = await run_in_threadpool(keys.list_keys, state.engine, account_id=account.id,
                                   current=token.strip() if scheme.lower() == "bearer" else None)
    return ApiKeyList(keys=[ApiKeyView(**vars(r)) for r in rows])


@router.post("/account/keys", response_model=NewApiKey, status_code=201, responses=responses(409, *BODY))
async def create_api_key(body: NewKeyBody, account: AccountDep, state: StateDep) -> NewApiKey:
    """Issue another key for the account (at most 20); the answer is the only time the key is shown."""
    info, key = await run_in_threadpool(keys.add_key, state.engine, account_id=account.id, name=body.name,
                                        actor=audit.account_actor(account))
    return _new(info, key)


@router.post("/account/keys/{name}/rotate", response_model=NewApiKey, status_code=201, responses=responses(404, 409))
async def rotate_api_key(name: KeyName, account: AccountDep, state: StateDep) -> NewApiKey:
    """Replace the named key by a fresh one of the same name: the old key answers 401 from now on."""
    info, key = await run_in_threadpool(keys.rotate_key, state.engine, account_id=account.id, name=name,
                                        actor=audit.account_actor(account))
    return _new(info, key)


@router.delete("/account/keys/{name}", status_code=204, responses=responses(404, 409))
async def revoke_api_key(name: KeyName, account: AccountDep, state: StateDep) -> Response:
    """Revoke the named key: it answers 401 from now on. The account's last key cannot be revoked (409)."""
    await run_in_threadpool(keys.revoke_key, state.engine, account_id=account.id, name=name,
                            actor=audit.account_actor(account))
    return Response(status_code=204)
