"""Forks, replays, sweeps and the fork tree (§10): new runs seeded from a parent's snapshots and log."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from fastapi import APIRouter, Path
from pydantic_core import to_json
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col
from starlette.concurrency import run_in_threadpool
from temporalio.common import (
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from benchwright.compute import materialize_mode
from benchwright.errors import (
    InvalidInput,
    PayloadTooLarge,
    PaymentRequired,
    Unavailable,
)
from benchwright.fingerprint import derive
from benchwright.forks import (
    apply_overrides,
    check_overrides,
    cut_point,
    default_rewind,
)
from benchwright.launch import admit_launch
from benchwright.pipeline import ForkSpec, MaterializeOptions, RunInput
from benchwright.quotas import check_launch, fairness_key
from benchwright.registry.shape import READABLE_BY_ID, readable_run, set_pin
from benchwright.schemas import (
    ForkOrigin,
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
from benchwright.scoring.aggregators import TrialsConfig, validate_trials
from benchwright.store.accounts import get_account
from benchwright.store.forks import lineage_rows, read_until_phase
from benchwright.store.models import EventRow, Run
from benchwright.store.runs import create_run, finish_run, run_view
from benchwright.temporal_ui import (
    RUN_ACCOUNT,
    RUN_MODEL,
    RUN_PARENT,
    RUN_PHASE,
    RUN_STATUS,
    workflow_summary,
)
from workflows.run import RunWorkflow

router = APIRouter(prefix="/v1/runs", tags=["forks"])
RunId = Annotated[str, Path(max_length=64)]
MAX_RUN_INPUT_BYTES = 1024 * 1024
"""As ``api.routes.runs``: a workflow input Temporal would refuse is refused with 413 before anything is written."""


async def start_fork(state: StateDep, account: AccountDep, *, parent_id: str, req: ForkRequest,
                     kind: str = "fork") -> RunView:
    """Validate a fork against its parent, record the run (RunLaunched naming parent and rewind point, the fork
    tree's row) and start its workflow, whose Fork phase seeds it from the parent.

    Raises:
        NotFound: the parent is not the caller's run.
        InvalidInput: an override the rewind point comes too late for, a rewind point the parent never reached,
            or neither rewind point, overrides nor instructions.
    """
    engine, settings = state.engine, state.settings
    if req.overrides.model is not None:
        check_model_identifier(req.overrides.model.identifier)
    parent = await run_in_threadpool(readable_run, engine, run_id=parent_id, account_id=account.id)
    names = req.overrides.given()
    rewind = "materialize" if kind == "replay" else req.rewind_to or (default_rewind(names) if names else None)
    if rewind is None and not req.instructions:
        raise InvalidInput("a fork needs rewind_to, overrides or instructions", code="empty_fork")
    if rewind is not None:
        check_overrides(rewind_to=rewind, overrides=names, kind=kind)
        log = await run_in_threadpool(read_until_phase, engine, parent.id, phase=rewind)
        cut_point(log, rewind)  # refuses a rewind point the parent never reached, before anything is written
    launch = apply_overrides(LaunchRequest.model_validate(parent.launch), req.overrides)
    resolved = await run_in_threadpool(admit_launch, settings, engine, account=account, launch=launch)
    # The parent's frozen trials config is pinned (§6: keep trials constant across a sweep) unless overridden.
    trials = validate_trials(req.overrides.trials) if req.overrides.trials else \
        TrialsConfig.model_validate(parent.trials_config or {})
    current = await run_in_threadpool(get_account, engine, account_id=account.id)
    if current.balance_usd <= 0:
        raise PaymentRequired(f"the account's balance is exhausted (${current.balance_usd:.2f}); add credit first")
    await run_in_threadpool(check_launch, engine, settings, account_id=account.id)  # 429 quota_exceeded
    mode = materialize_mode(backend=resolved.backend, local_mode=settings.local_materialize_mode,
                            product_sandbox_snapshot=launch.recipe is not None)
    spec = ForkSpec(parent_run_id=parent.id, rewind_to=rewind, kind=kind, overrides=names,
                    scorer_instructions=req.overrides.scorer_instructions, instructions=req.instructions)
    inp = RunInput(run_id=str(uuid.uuid4()), account_id=account.id, launch=launch, driver=resolved.driver,
                   trials=trials, limits=resolved.limits, materialize_mode=mode, proxy_linger_s=settings.proxy_linger_s,
                   materialize=MaterializeOptions(concurrency=launch.concurrency or settings.materialize_concurrency,
                                                  batch_tasks=settings.materialize_batch_tasks,
                                                  parallel_batches=settings.materialize_parallel_batches),
                   fork=spec)
    size = len(to_json(inp))
    if size > MAX_RUN_INPUT_BYTES:
        raise PayloadTooLarge(f"the fork is {size} bytes as a workflow input; at most {MAX_RUN_INPUT_BYTES} fit")
    origin = ForkOrigin(parent_run_id=parent.id, rewind_to=rewind, kind="replay" if kind == "replay" else "fork")
    run = await run_in_threadpool(create_run, engine, account_id=account.id, launch=launch, driver=resolved.driver,
                                  trials_config=trials.model_dump(mode="json"),
                                  limits=resolved.limits.model_dump(mode="json", exclude_defaults=True),
                                  billing_markup=settings.billing_markup, backend=resolved.backend,
                                  materialize_mode=mode, run_id=inp.run_id, fork=origin)
    if kind == "replay" and parent.pinned:  # a replay of a pinned run measures the same pinned shape
        await run_in_threadpool(set_pin, engine, run_id=run.id, pinned=parent.pinned)
    source = launch.dataset or "registry"
    try:
        client = await state.temporal()
        await client.start_workflow(
            RunWorkflow.run, inp, id=run.id, task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(RUN_PHASE, "fork"), SearchAttributePair(RUN_STATUS, "running"),
                SearchAttributePair(RUN_MODEL, launch.model.identifier), SearchAttributePair(RUN_ACCOUNT, account.name),
                SearchAttributePair(RUN_PARENT, parent.id),
            ]),
            priority=Priority(fairness_key=fairness_key(account.id)),
            memo={"run_id": run.id, "account": account.name, "dataset": source, "BenchwrightParentRun": parent.id,
                  "rewind_to": rewind or "decided by the Fork phase", "kind": origin.kind},
            static_summary=f"{origin.kind} of {parent.id[:8]}: " + workflow_summary(
                model=launch.model.identifier, dataset=source),
            static_details=(f"Benchwright {origin.kind} `{run.id}`  \nparent `{parent.id}`  \n"
                            f"rewind to `{rewind or 'decided by the Fork phase'}`  \n"
                            f"model `{launch.model.identifier}`"),
        )
    except Exception as exc:
        await run_in_threadpool(finish_run, engine, run_id=run.id, status="error",
                                error=f"the workflow could not be started: {exc}")
        raise Unavailable(f"run {run.id} was recorded but its workflow could not be started: {exc}") from exc
    return await run_in_threadpool(run_view, engine, run)


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
        rows = session.execute(
            select(col(EventRow.seq), col(EventRow.type), col(EventRow.data))
            .where(col(EventRow.run_id) == run.id, col(EventRow.type).like("%Artifact"))
            .order_by(col(EventRow.seq))).all()
    return derive((seq, type_, data) for seq, type_, data in rows)[0] if rows else None
