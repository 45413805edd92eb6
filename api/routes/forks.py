"""Forks, replays, sweeps and the fork tree (§10): new runs seeded from a parent's snapshots and log."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from benchwright.errors import InvalidInput
from benchwright.fingerprint import derive
from benchwright.registry.shape import READABLE_BY_ID, readable_run, run_events
from benchwright.runs.launch import plan_fork, start_run
from benchwright.schemas import (
    ForkOverrides,
    ForkRequest,
    LaunchRequest,
    LineageNode,
    LineageView,
    ReplayRequest,
    RunView,
    SweepRequest,
    SweepResult,
    check_model_identifier,
)
from benchwright.store.forks import lineage_rows
from benchwright.store.models import Run
from benchwright.store.runs import run_view

router = APIRouter(prefix="/v1/runs", tags=["forks"])
RunId = Annotated[str, Path(max_length=64)]


async def start_fork(state: StateDep, account: AccountDep, *, parent_id: str, req: ForkRequest,
                     kind: str = "fork") -> RunView:
    """Check a fork against its parent (``plan_fork``) and start it on the one start path (``start_run``): the
    run's RunLaunched names parent and rewind point, and its workflow's Fork phase seeds it from the parent.

    Raises:
        NotFound: the parent is not the caller's run.
        InvalidInput: an override the rewind point comes too late for, a rewind point the parent never reached,
            or neither rewind point, overrides nor instructions.
    """
    fork = await run_in_threadpool(plan_fork, state.engine, account_id=account.id, parent_id=parent_id, req=req,
                                   kind=kind)
    run = await start_run(state.settings, state.engine, state.temporal, account=account, launch=fork.launch,
                          fork=fork)
    return await run_in_threadpool(run_view, state.engine, run)


@router.post("/{run_id}/fork", status_code=201, response_model=RunView, responses=responses(*BODY, 402, 404, 503))
async def fork_run(run_id: RunId, body: ForkRequest, account: AccountDep, state: StateDep) -> RunView:
    """Fork a run: a new run that inherits the parent's phases before ``rewind_to`` and continues with overrides."""
    return await start_fork(state, account, parent_id=run_id, req=body)


@router.post("/{run_id}/replay", status_code=201, response_model=RunView, responses=responses(*BODY, 402, 404, 503))
async def replay_run(run_id: RunId, body: ReplayRequest, account: AccountDep, state: StateDep) -> RunView:
    """Replay a run against a model: its benchmark, sample, impl and trials pinned; only the model changes."""
    return await replay(state, account, reference=run_id, model=body)


async def replay(state: StateDep, account: AccountDep, *, reference: str, model: ReplayRequest) -> RunView:
    """One replay of ``reference`` (the function scheduled regression runs call)."""
    return await start_fork(state, account, parent_id=reference, kind="replay",
                            req=ForkRequest(rewind_to="materialize", overrides=ForkOverrides(model=model.model)))


async def replay_launch(body: LaunchRequest, account: AccountDep, state: StateDep) -> RunView:
    """``POST /v1/runs {"replay_of", "model"}``: the launch form of a replay; anything else set is refused."""
    extra = sorted(body.model_fields_set - {"replay_of", "model"})
    if extra:
        raise InvalidInput(f"a replay launch takes only replay_of and model (the rest is pinned to the reference); "
                           f"got {', '.join(extra)}", code="replay_override")
    assert body.replay_of is not None
    return await replay(state, account, reference=body.replay_of, model=ReplayRequest(model=body.model))


@router.post("/{run_id}/sweep", status_code=201, response_model=SweepResult,
             responses=responses(*BODY, 402, 404, 503))
async def sweep_run(run_id: RunId, body: SweepRequest, account: AccountDep, state: StateDep) -> SweepResult:
    """One replay of the run per model, all running at once; the replays in the order of ``models``."""
    for m in body.models:  # every model is checked before any replay starts: a sweep starts whole or not at all
        check_model_identifier(m.identifier)
    await run_in_threadpool(readable_run, state.engine, run_id=run_id, account_id=account.id)
    runs = await asyncio.gather(*(replay(state, account, reference=run_id, model=ReplayRequest(model=m))
                                  for m in body.models))
    return SweepResult(reference=run_id, runs=list(runs))


@router.get("/{run_id}/lineage", response_model=LineageView, responses=responses(404))
def get_lineage(run_id: RunId, account: AccountDep, state: StateDep) -> LineageView:
    """The fork tree the run belongs to: parents, children, rewind points, models, scores, fingerprints."""
    engine = state.engine
    readable_run(engine, run_id=run_id, account_id=account.id)
    root, rows = lineage_rows(engine, run_id=run_id)
    nodes = []
    for run, fork in rows:
        if run.account_id != account.id and run.visibility not in READABLE_BY_ID:
            continue
        view = run_view(engine, run)
        nodes.append(LineageNode(
            id=run.id, parent_run_id=fork.parent_run_id if fork else None, rewind_to=fork.rewind_to if fork else None,
            kind=fork.kind if fork else "root", model=str(run.model.get("identifier", "")),
            status=view.status, display_status=view.display_status, pass_rate=view.tasks.summary.pass_rate,
            fingerprint=run.fingerprint or _fingerprint(engine, run), created_at=run.created_at))
    return LineageView(run_id=run_id, root=root, runs=nodes)


def _fingerprint(engine: Engine, run: Run) -> str | None:
    """The run fingerprint recomputed from the log's Artifact events (before the registry stores it)."""
    with Session(engine) as session:
        events = run_events(session, run.id)
    return derive(events)[0] if events else None
