"""Host policy and the blocked-host log (§11), provider secrets, and the saved compute provider (§4)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from benchwright.proxy.policy import HostPolicy, HostRule
from benchwright.registry.shape import readable_run
from benchwright.sandbox.compute import COMPUTE_CHOICES, check_compute
from benchwright.schemas import COMPUTE_VALUES, HOST_PATTERN
from benchwright.store import policy as store

router = APIRouter(prefix="/v1", tags=["policy"])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DefaultModeBody(_Strict):
    default: Literal["allow", "block"]


_PATTERN_FIELD = Field(min_length=1, max_length=300, json_schema_extra={"pattern": HOST_PATTERN},
                       description="A host pattern: `pypi.org`, `*.pythonhosted.org`, `10.0.0.1`, `[::1]`, each with "
                                   "an optional `:port`. A wrong one is refused with 400 `invalid_policy` saying why.")


class RuleBody(_Strict):
    pattern: str = _PATTERN_FIELD
    action: Literal["allow", "block"]


class PolicyBody(_Strict):
    """``PUT /v1/host-policy``: the whole policy, replacing the current one."""

    default: Literal["allow", "block"]
    rules: list[RuleBody] = Field(default_factory=list, max_length=1000)


class BlockedHostView(BaseModel):
    host: str
    seen_count: int
    first_seen: datetime
    last_seen: datetime


class BlockedHostList(BaseModel):
    hosts: list[BlockedHostView]


@router.get("/host-policy", response_model=HostPolicy, responses=responses())
async def get_host_policy(account: AccountDep, state: StateDep) -> HostPolicy:
    """The account's host policy: default mode (allow on a fresh account) and rules."""
    return await run_in_threadpool(store.get_policy, state.engine, account_id=account.id)


@router.put("/host-policy", response_model=HostPolicy, responses=responses(*BODY))
async def put_host_policy(body: PolicyBody, account: AccountDep, state: StateDep) -> HostPolicy:
    """Replace the whole policy (default mode and rules) at once; a bad rule changes nothing."""
    return await run_in_threadpool(store.replace_policy, state.engine, account_id=account.id, default=body.default,
                                   rules=[(r.pattern, r.action) for r in body.rules])


@router.put("/host-policy/default", response_model=HostPolicy, responses=responses(*BODY))
async def put_default_mode(body: DefaultModeBody, account: AccountDep, state: StateDep) -> HostPolicy:
    """Set the mode for hosts no rule names: ``block`` makes the allow rules an exhaustive allowlist."""
    await run_in_threadpool(store.set_default_mode, state.engine, account_id=account.id, mode=body.default)
    return await run_in_threadpool(store.get_policy, state.engine, account_id=account.id)


@router.post("/host-policy/rules", response_model=HostRule, status_code=201, responses=responses(*BODY))
async def post_rule(body: RuleBody, account: AccountDep, state: StateDep) -> HostRule:
    """Add a rule (or change the action of the rule with the same pattern)."""
    return await run_in_threadpool(store.upsert_rule, state.engine, account_id=account.id, pattern=body.pattern,
                                   action=body.action)


@router.delete("/host-policy/rules/{pattern}", status_code=204, responses=responses(400, 404))
async def delete_rule(pattern: Annotated[str, Path(max_length=300, json_schema_extra={"pattern": HOST_PATTERN})],
                      account: AccountDep, state: StateDep) -> Response:
    """Remove the rule for a pattern."""
    await run_in_threadpool(store.delete_rule, state.engine, account_id=account.id, pattern=pattern)
    return Response(status_code=204)


@router.get("/runs/{run_id}/blocked-hosts", response_model=BlockedHostList, responses=responses(404))
async def run_blocked_hosts(run_id: Annotated[str, Path(max_length=64)], account: AccountDep,
                            state: StateDep) -> BlockedHostList:
    """Hosts the run's sandboxes were refused, with how often and when: decide which to allow, then rerun."""
    run = await run_in_threadpool(readable_run, state.engine, run_id=run_id, account_id=account.id)  # §12
    rows = await run_in_threadpool(store.blocked_hosts, state.engine, account_id=run.account_id, run_id=run.id)
    return BlockedHostList(hosts=[BlockedHostView.model_validate(r) for r in rows])


@router.get("/blocked-hosts", response_model=BlockedHostList, responses=responses())
async def account_blocked_hosts(account: AccountDep, state: StateDep) -> BlockedHostList:
    """The blocked-host log aggregated over all of the account's runs."""
    rows = await run_in_threadpool(store.blocked_hosts, state.engine, account_id=account.id)
    return BlockedHostList(hosts=[BlockedHostView.model_validate(r) for r in rows])


class SecretBody(_Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = Field(min_length=1, max_length=8192)
    host_pattern: str | None = Field(default=None, max_length=300, json_schema_extra={"pattern": HOST_PATTERN})


class SecretView(BaseModel):
    """What the API ever says about a secret: its name and host pattern, never its value."""

    name: str
    host_pattern: str | None
    created_at: datetime


class SecretList(BaseModel):
    secrets: list[SecretView]


@router.post("/secrets", response_model=SecretView, status_code=201, responses=responses(*BODY))
async def post_secret(body: SecretBody, account: AccountDep, state: StateDep) -> SecretView:
    """Store (or replace) a provider secret. Write-only; a host_pattern also allows that host in the policy."""
    row = await run_in_threadpool(store.put_secret, state.engine, account_id=account.id, name=body.name,
                                  value=body.value, host_pattern=body.host_pattern)
    return SecretView(name=row.name, host_pattern=row.host_pattern, created_at=row.created_at)


@router.get("/secrets", response_model=SecretList, responses=responses())
async def get_secrets(account: AccountDep, state: StateDep) -> SecretList:
    """Secret names and host patterns (values are never returned)."""
    rows = await run_in_threadpool(store.list_secrets, state.engine, account_id=account.id)
    return SecretList(secrets=[SecretView.model_validate(r) for r in rows])


@router.delete("/secrets/{name}", status_code=204, responses=responses(404))
async def delete_secret(name: Annotated[str, Path(max_length=128)], account: AccountDep, state: StateDep) -> Response:
    """Delete a secret."""
    await run_in_threadpool(store.delete_secret, state.engine, account_id=account.id, name=name)
    return Response(status_code=204)


class ComputeBody(_Strict):
    compute: str | None = Field(max_length=32, json_schema_extra={"enum": [*COMPUTE_VALUES, None]},
                                description=f"one of {', '.join(COMPUTE_CHOICES)}, or null for the default; a "
                                            "backend this deployment has not configured is refused with 400")


class ComputeView(BaseModel):
    compute: str | None
    effective: str


@router.put("/settings/compute", response_model=ComputeView, responses=responses(*BODY))
async def put_compute(body: ComputeBody, account: AccountDep, state: StateDep) -> ComputeView:
    """Save the account's compute provider (docs/concepts.md §4, level 2); runs that do not name one use it."""
    chosen = None if body.compute in (None, "default", "auto") else body.compute
    if chosen is not None:
        check_compute(chosen, configured=state.settings.configured_backends())
    await run_in_threadpool(store.save_compute, state.engine, account_id=account.id, compute=chosen)
    return ComputeView(compute=chosen, effective=chosen or state.settings.default_compute)


@router.get("/settings/compute", response_model=ComputeView, responses=responses())
async def get_compute(account: AccountDep, state: StateDep) -> ComputeView:
    """The account's saved compute provider and the one its runs get."""
    chosen = await run_in_threadpool(store.saved_compute, state.engine, account_id=account.id)
    return ComputeView(compute=chosen, effective=chosen or state.settings.default_compute)
