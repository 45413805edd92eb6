"""Launch-time checks and resolution: everything refused here is refused with a 400 before a run exists."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic_core import to_json

from benchwright.compute import resolve_compute
from benchwright.dataset_access import LocalPathRules, check_local_path, is_url
from benchwright.drivers.llm import LlmDriverSpec
from benchwright.errors import InvalidInput
from benchwright.harness.config import bridge_trials, check_bridge_limits, check_harness
from benchwright.limits import RunLimits, resolve_limits
from benchwright.prices import check_priced
from benchwright.schemas import ForkRequest, LaunchRequest, suggest
from benchwright.scoring.aggregators import TrialsConfig, validate_trials

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from temporalio.client import Client

    from benchwright.settings import Settings
    from benchwright.store.models import Account, Run

DRIVERS = ("builtin",)
"""Drivers named by a word. ``builtin`` is the offline template driver; besides these, any ``<provider>://<model>``
string names an LLM driver (``benchwright.drivers.llm``; its provider secret is checked at launch by the API)."""


@dataclass(frozen=True)
class ResolvedLaunch:
    driver: str
    trials: TrialsConfig
    limits: RunLimits
    backend: str


def resolve_trials(launch_trials: TrialsConfig | None, subset_default: TrialsConfig | None) -> TrialsConfig:
    """§7 precedence: the launch body's ``trials``, else the subset's ``default_trials``, else k = 1 with
    ``any_pass``. Whichever wins is validated (unknown aggregator, missing parameters: 400) and frozen on the run.

    Raises:
        InvalidInput: the winning config names an unknown aggregator or lacks a parameter it needs.
    """
    return validate_trials(launch_trials or subset_default or TrialsConfig())


def resolve_launch(launch: LaunchRequest, *, default_driver: str, local_paths: LocalPathRules,
                   default_compute: str = "local", configured_backends: tuple[str, ...] = ("local",),
                   saved_compute: str | None = None,
                   subset_default_trials: TrialsConfig | None = None) -> ResolvedLaunch:
    """The driver, trials config, limits and compute backend a launch runs with.

    ``subset_default_trials`` is the launched subset's ``default_trials`` (§7) when the launch names a registry
    subset; the registry is not built yet, so the API passes none today.

    Raises:
        InvalidInput: unknown driver, an unknown or unsupported harness or a bad harness_config, bad trials config,
            an unenforceable limit, a cost limit on a model with no known price (``unpriced_model``), an unknown or
            unconfigured compute backend, or a local dataset path where the
            deployment or the account does not allow them.
        DatasetError: a local dataset path inside a protected place or outside the dataset roots
            (``dataset_blocked``). Whether the file exists is Fetch's to find out: the API and the worker need
            not share a file system, and Fetch enforces every rule again.
    """
    driver = launch.driver or default_driver
    if "://" in driver:
        LlmDriverSpec.parse(driver)
    elif driver not in DRIVERS:
        raise InvalidInput(f"unknown driver '{driver}'{suggest(driver, DRIVERS)}; available: {', '.join(DRIVERS)}, "
                           "or '<provider>://<model>' for an LLM driver",
                           code="unknown_driver")
    harness = check_harness(launch)  # a bridge launch names no dataset (checked there)
    # A pinned launch's ``registry:`` dataset was written by the API from the registry (benchwright.registry).
    if launch.dataset is not None and not launch.dataset.startswith("registry:") and not is_url(launch.dataset):
        if "://" in launch.dataset:
            raise InvalidInput(f"dataset must be an http(s) URL or a path, got {launch.dataset!r}",
                               code="invalid_dataset")
        check_local_path(launch.dataset, local_paths, must_exist=False)
    trials = resolve_trials(launch.trials, subset_default_trials)
    limits = resolve_limits(limits=launch.limits, constraints=launch.constraints, metadata=launch.metadata)
    check_priced(launch.model, limits)  # a cost limit on a model nobody can price would never fire
    if harness is not None:
        trials = bridge_trials(harness, trials, given=launch.trials is not None)
        check_bridge_limits(limits)
    backend = resolve_compute(requested=launch.compute, saved=saved_compute, default=default_compute,
                              configured=configured_backends)
    return ResolvedLaunch(driver=driver, trials=trials, limits=limits, backend=backend)


def admit_launch(settings: Settings, engine: Engine, *, account: Account, launch: LaunchRequest,
                 subset_default_trials: TrialsConfig | None = None) -> ResolvedLaunch:
    """Every check a launch body passes before a run of it exists, for whoever launches it: ``POST /v1/runs``,
    forks and replays, and a regression schedule (at create, and again at each firing, where the schedule's
    account launches the reference's body). :func:`resolve_launch` under the deployment's and the account's rules
    (local paths, drivers, trials, limits, compute), then the model's named secret and the LLM driver's secret
    must exist in the account. Blocking (store reads): call it from a thread.

    Raises:
        InvalidInput, DatasetError: as :func:`resolve_launch`; the model's secret or the driver's provider secret is
            not in the account.
    """
    from benchwright.drivers.llm import check_driver_secret
    from benchwright.store.policy import saved_compute, secret_value

    resolved = resolve_launch(launch, default_driver=settings.default_driver,
                              local_paths=LocalPathRules.from_settings(settings,
                                                                       account_local_paths=account.local_paths),
                              default_compute=settings.default_compute,
                              configured_backends=settings.configured_backends(),
                              saved_compute=saved_compute(engine, account_id=account.id),
                              subset_default_trials=subset_default_trials)
    if launch.model.secret is not None:
        secret_value(engine, account_id=account.id, name=launch.model.secret)
    check_driver_secret(engine, account_id=account.id, driver=resolved.driver)
    return resolved


MAX_RUN_INPUT_BYTES = 1024 * 1024
"""Largest serialized RunInput a launch may start a workflow with. Temporal refuses payloads over 2 MB (its
blob-size error limit; 4 MB is the gRPC message) after the run row would have been written; checking first means
a too-large launch is refused with 413 and leaves nothing behind (issue 15 item 2)."""


async def start_run(settings: Settings, engine: Engine, client: Client | Callable[[], Awaitable[Client]], *,
                    account: Account, launch: LaunchRequest, run_id: str | None = None,
                    memo: dict[str, str] | None = None) -> Run:
    """The one start path of a run (DESIGN invariant 10): resolve a registry pin, admit the launch
    (:func:`admit_launch`), check the balance and the quota, build and size-check the workflow input, record the
    run (row + RunLaunched) and start its ``RunWorkflow``. ``POST /v1/runs`` and the Operator call it.

    ``run_id`` makes the call idempotent (the Operator passes ``workflow.uuid4()``): when the account already has
    a run of that id, nothing is recorded or checked again; its workflow is started only if it is not already
    running or finished (Temporal's id, never reused), so a retried launch never starts a run twice.

    ``memo`` adds to the workflow's memo (the Operator names its session there, for the Temporal UI).

    ``client`` may be a coroutine function returning the client (the API's lazy connection): it is then only
    reached once the launch is admitted, so a refused launch is refused even while Temporal is down.

    Raises:
        InvalidInput, DatasetError, NotFound: the launch is refused (``admit_launch``, the pin).
        PaymentRequired: the account's balance is exhausted.
        QuotaExceeded: the account's quota (``check_launch``).
        PayloadTooLarge: the workflow input would not fit.
        Unavailable: the run was recorded but its workflow could not be started.
    """
    from temporalio.client import Client as TemporalClient
    from temporalio.common import (
        Priority,
        SearchAttributePair,
        TypedSearchAttributes,
        WorkflowIDConflictPolicy,
        WorkflowIDReusePolicy,
    )
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from benchwright.compute import materialize_mode
    from benchwright.errors import PayloadTooLarge, PaymentRequired, Unavailable
    from benchwright.pipeline import MaterializeOptions, RunInput
    from benchwright.quotas import check_launch, fairness_key
    from benchwright.registry.blobs import BlobStore
    from benchwright.registry.pinned import resolve_pin
    from benchwright.registry.shape import set_pin
    from benchwright.store.accounts import get_account
    from benchwright.store.runs import create_run, finish_run
    from benchwright.temporal_ui import RUN_ACCOUNT, RUN_MODEL, RUN_PHASE, RUN_STATUS, workflow_summary

    existing = await asyncio.to_thread(_own_run, engine, run_id, account.id) if run_id is not None else None
    if existing is not None and existing.status != "running":
        return existing  # recorded and already over (or refused at start): nothing to start again
    body = launch
    bridged = check_harness(body) is not None  # a harness-bridge launch names its task, no dataset or pin
    pin = None if bridged else await asyncio.to_thread(resolve_pin, engine, BlobStore.from_settings(settings),
                                                       account_id=account.id, launch=body)
    if pin is not None:  # the pinned subset snapshot is the dataset, the impl's exact source the scorer
        body = body.model_copy(update={"dataset": pin.dataset, "task_impl": pin.source, "impl": pin.impl_id})
    resolved = await asyncio.to_thread(admit_launch, settings, engine, account=account, launch=body,
                                       subset_default_trials=pin.default_trials if pin else None)
    if existing is None:
        current = await asyncio.to_thread(get_account, engine, account_id=account.id)
        if current.balance_usd <= 0:
            raise PaymentRequired(f"the account's balance is exhausted (${current.balance_usd:.2f}); add credit first")
        await asyncio.to_thread(check_launch, engine, settings, account_id=account.id)  # 429 quota_exceeded
    if not isinstance(client, TemporalClient):
        client = await client()
    mode = materialize_mode(backend=resolved.backend, local_mode=settings.local_materialize_mode,
                            harness_bridge=bridged)
    inp = RunInput(run_id=run_id or str(uuid.uuid4()), account_id=account.id, launch=body, driver=resolved.driver,
                   trials=resolved.trials, limits=resolved.limits, materialize_mode=mode,
                   proxy_linger_s=settings.proxy_linger_s,
                   materialize=MaterializeOptions(concurrency=body.concurrency or settings.materialize_concurrency,
                                                  batch_tasks=settings.materialize_batch_tasks,
                                                  parallel_batches=settings.materialize_parallel_batches))
    size = len(to_json(inp))  # bytes, as the pydantic data converter encodes the payload
    if size > MAX_RUN_INPUT_BYTES:
        raise PayloadTooLarge(f"the launch is {size} bytes as a workflow input; at most {MAX_RUN_INPUT_BYTES} fit "
                              "(send less metadata or a smaller task_impl)")
    if existing is None:
        run = await asyncio.to_thread(create_run, engine, account_id=account.id, launch=body,
                                      driver=resolved.driver, trials_config=resolved.trials.model_dump(mode="json"),
                                      limits=resolved.limits.model_dump(mode="json", exclude_defaults=True),
                                      billing_markup=settings.billing_markup, backend=resolved.backend,
                                      materialize_mode=mode, run_id=inp.run_id)
        if pin is not None:
            await asyncio.to_thread(set_pin, engine, run_id=run.id, pinned=pin.record())
    else:
        run = existing
    try:
        await client.start_workflow(
            "RunWorkflow", inp, id=run.id, task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # a repeated start (existing row) must not start a finished run's workflow again
            id_reuse_policy=(WorkflowIDReusePolicy.REJECT_DUPLICATE if existing is not None
                             else WorkflowIDReusePolicy.ALLOW_DUPLICATE),
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(RUN_PHASE, "launched"), SearchAttributePair(RUN_STATUS, "running"),
                SearchAttributePair(RUN_MODEL, body.model.identifier), SearchAttributePair(RUN_ACCOUNT, account.name),
            ]),
            priority=Priority(fairness_key=fairness_key(account.id)),  # fair share of the task queue (quotas)
            memo={"run_id": run.id, "account": account.name, "dataset": body.dataset, **(memo or {})},
            static_summary=workflow_summary(model=body.model.identifier, dataset=body.dataset),
            static_details=f"Benchwright run `{run.id}`  \nmodel `{body.model.identifier}`  \ndataset `{body.dataset}`",
        )
    except WorkflowAlreadyStartedError:
        if existing is None:
            raise
    except Exception as exc:
        await asyncio.to_thread(finish_run, engine, run_id=run.id, status="error",
                                error=f"the workflow could not be started: {exc}")
        raise Unavailable(f"run {run.id} was recorded but its workflow could not be started: {exc}") from exc
    return run


def _own_run(engine: Engine, run_id: str, account_id: str) -> Run | None:
    """The account's run of this id, or None when there is none.

    Raises:
        Conflict: the id belongs to another account's run (never touched, never revealed beyond this refusal).
    """
    from sqlmodel import Session

    from benchwright.errors import Conflict
    from benchwright.store.models import Run

    with Session(engine) as session:
        run = session.get(Run, run_id)
    if run is not None and run.account_id != account_id:
        raise Conflict(f"run id {run_id} is taken", code="run_id_taken")
    return run


async def start_fork(settings: Settings, engine: Engine, client: Client | Callable[[], Awaitable[Client]], *,
                     account: Account, parent_id: str, req: ForkRequest, kind: str = "fork",
                     run_id: str | None = None, memo: dict[str, str] | None = None) -> Run:
    """The one start path of a fork or a replay (§10; ``POST /v1/runs/{id}/fork``, ``/replay``, ``/sweep`` and the
    Operator): validate it against its parent, record the run (RunLaunched naming parent and rewind point, the fork
    tree's row) and start its workflow, whose Fork phase seeds it from the parent.

    ``run_id`` makes the call idempotent as in :func:`start_run` (a retried Operator step finds the run it made).

    Raises:
        NotFound: the parent is not readable by the account.
        InvalidInput: an override the rewind point comes too late for, a rewind point the parent never reached,
            or neither rewind point, overrides nor instructions; the launch is refused (``admit_launch``).
        PaymentRequired, QuotaExceeded, PayloadTooLarge, Unavailable: as :func:`start_run`.
    """
    from temporalio.client import Client as TemporalClient
    from temporalio.common import (
        Priority,
        SearchAttributePair,
        TypedSearchAttributes,
        WorkflowIDConflictPolicy,
        WorkflowIDReusePolicy,
    )
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from benchwright.compute import materialize_mode
    from benchwright.errors import PayloadTooLarge, PaymentRequired, Unavailable
    from benchwright.forks import apply_overrides, check_overrides, cut_point, default_rewind
    from benchwright.pipeline import ForkSpec, MaterializeOptions, RunInput
    from benchwright.quotas import check_launch, fairness_key
    from benchwright.registry.shape import readable_run, set_pin
    from benchwright.schemas import ForkOrigin, check_model_identifier
    from benchwright.scoring.aggregators import TrialsConfig
    from benchwright.store.accounts import get_account
    from benchwright.store.forks import read_until_phase
    from benchwright.store.runs import create_run, finish_run
    from benchwright.temporal_ui import RUN_ACCOUNT, RUN_MODEL, RUN_PARENT, RUN_PHASE, RUN_STATUS, workflow_summary

    existing = await asyncio.to_thread(_own_run, engine, run_id, account.id) if run_id is not None else None
    if existing is not None and existing.status != "running":
        return existing
    if req.overrides.model is not None:
        check_model_identifier(req.overrides.model.identifier)
    parent = await asyncio.to_thread(readable_run, engine, run_id=parent_id, account_id=account.id)
    names = req.overrides.given()
    rewind = "materialize" if kind == "replay" else req.rewind_to or (default_rewind(names) if names else None)
    if rewind is None and not req.instructions:
        raise InvalidInput("a fork needs rewind_to, overrides or instructions", code="empty_fork")
    if rewind is not None:
        check_overrides(rewind_to=rewind, overrides=names, kind=kind)
        log = await asyncio.to_thread(read_until_phase, engine, parent.id, phase=rewind)
        cut_point(log, rewind)  # refuses a rewind point the parent never reached, before anything is written
    launch = apply_overrides(LaunchRequest.model_validate(parent.launch), req.overrides)
    resolved = await asyncio.to_thread(admit_launch, settings, engine, account=account, launch=launch)
    # The parent's frozen trials config is pinned (§6: keep trials constant across a sweep) unless overridden.
    trials = validate_trials(req.overrides.trials) if req.overrides.trials else \
        TrialsConfig.model_validate(parent.trials_config or {})
    if existing is None:
        current = await asyncio.to_thread(get_account, engine, account_id=account.id)
        if current.balance_usd <= 0:
            raise PaymentRequired(f"the account's balance is exhausted (${current.balance_usd:.2f}); add credit first")
        await asyncio.to_thread(check_launch, engine, settings, account_id=account.id)  # 429 quota_exceeded
    mode = materialize_mode(backend=resolved.backend, local_mode=settings.local_materialize_mode)
    spec = ForkSpec(parent_run_id=parent.id, rewind_to=rewind, kind=kind, overrides=names,
                    scorer_instructions=req.overrides.scorer_instructions, instructions=req.instructions)
    inp = RunInput(run_id=run_id or str(uuid.uuid4()), account_id=account.id, launch=launch, driver=resolved.driver,
                   trials=trials, limits=resolved.limits, materialize_mode=mode, proxy_linger_s=settings.proxy_linger_s,
                   materialize=MaterializeOptions(concurrency=launch.concurrency or settings.materialize_concurrency,
                                                  batch_tasks=settings.materialize_batch_tasks,
                                                  parallel_batches=settings.materialize_parallel_batches),
                   fork=spec)
    size = len(to_json(inp))
    if size > MAX_RUN_INPUT_BYTES:
        raise PayloadTooLarge(f"the fork is {size} bytes as a workflow input; at most {MAX_RUN_INPUT_BYTES} fit")
    origin = ForkOrigin(parent_run_id=parent.id, rewind_to=rewind, kind="replay" if kind == "replay" else "fork")
    if existing is None:
        run = await asyncio.to_thread(create_run, engine, account_id=account.id, launch=launch,
                                      driver=resolved.driver, trials_config=trials.model_dump(mode="json"),
                                      limits=resolved.limits.model_dump(mode="json", exclude_defaults=True),
                                      billing_markup=settings.billing_markup, backend=resolved.backend,
                                      materialize_mode=mode, run_id=inp.run_id, fork=origin)
        if kind == "replay" and parent.pinned:  # a replay of a pinned run measures the same pinned shape
            await asyncio.to_thread(set_pin, engine, run_id=run.id, pinned=parent.pinned)
    else:
        run = existing
    source = launch.dataset or "registry"
    try:
        if not isinstance(client, TemporalClient):
            client = await client()
        await client.start_workflow(
            "RunWorkflow", inp, id=run.id, task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=(WorkflowIDReusePolicy.REJECT_DUPLICATE if existing is not None
                             else WorkflowIDReusePolicy.ALLOW_DUPLICATE),
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(RUN_PHASE, "fork"), SearchAttributePair(RUN_STATUS, "running"),
                SearchAttributePair(RUN_MODEL, launch.model.identifier), SearchAttributePair(RUN_ACCOUNT, account.name),
                SearchAttributePair(RUN_PARENT, parent.id),
            ]),
            priority=Priority(fairness_key=fairness_key(account.id)),
            memo={"run_id": run.id, "account": account.name, "dataset": source, "BenchwrightParentRun": parent.id,
                  "rewind_to": rewind or "decided by the Fork phase", "kind": origin.kind, **(memo or {})},
            static_summary=f"{origin.kind} of {parent.id[:8]}: " + workflow_summary(
                model=launch.model.identifier, dataset=source),
            static_details=(f"Benchwright {origin.kind} `{run.id}`  \nparent `{parent.id}`  \n"
                            f"rewind to `{rewind or 'decided by the Fork phase'}`  \n"
                            f"model `{launch.model.identifier}`"),
        )
    except WorkflowAlreadyStartedError:
        if existing is None:
            raise
    except Exception as exc:
        await asyncio.to_thread(finish_run, engine, run_id=run.id, status="error",
                                error=f"the workflow could not be started: {exc}")
        raise Unavailable(f"run {run.id} was recorded but its workflow could not be started: {exc}") from exc
    return run
