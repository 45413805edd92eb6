"""Launch-time checks and resolution: everything refused here is refused with a 400 before a run exists."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_core import to_json

from benchwright.data.dataset_access import LocalPathRules, check_local_path, is_url
from benchwright.drivers.llm import LlmDriverSpec
from benchwright.errors import InvalidInput
from benchwright.harness.config import bridge_trials, check_bridge_limits, check_harness
from benchwright.llm.prices import check_priced
from benchwright.product.recipe import check_launch as check_recipe
from benchwright.runs.limits import RunLimits, resolve_limits
from benchwright.runs.pipeline import ForkSpec, MaterializeOptions, RunInput
from benchwright.sandbox.compute import resolve_compute
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
    check_recipe(launch, local_paths)  # a product-sandbox launch: its recipe, alone
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


@dataclass(frozen=True)
class PreparedRun:
    """A launch admitted and sized, its workflow input built; recorded by :func:`record_run` (or already recorded:
    ``existing``)."""

    input: RunInput
    backend: str
    existing: Run | None
    """The account's run of ``input.run_id`` when a repeated call finds it (nothing is recorded again)."""
    pinned: dict[str, Any] | None = None
    """The registry pin to set on the run (a fresh pinned launch's, or the parent's for a replay)."""


@dataclass(frozen=True)
class ForkLaunch:
    """A fork or replay validated against its parent (:func:`plan_fork`): what :func:`prepare_run` starts."""

    launch: LaunchRequest
    spec: ForkSpec
    trials: TrialsConfig
    pinned: dict[str, Any] | None


def plan_fork(engine: Engine, *, account_id: str, parent_id: str, req: ForkRequest, kind: str = "fork") -> ForkLaunch:
    """Check a fork against its parent before anything is written: the parent is the caller's (readable) run, the
    overrides fit the rewind point and the parent reached it. The parent's frozen trials config is pinned (§6:
    keep trials constant across a sweep) unless overridden; a replay of a pinned run keeps the parent's pin.
    Blocking (store reads).

    Raises:
        NotFound: the parent is not the caller's run.
        InvalidInput: an override the rewind point comes too late for, a rewind point the parent never reached,
            or neither rewind point, overrides nor instructions.
    """
    from benchwright.registry.shape import readable_run
    from benchwright.runs.forks import apply_overrides, check_overrides, cut_point, default_rewind
    from benchwright.schemas import check_model_identifier
    from benchwright.store.forks import read_until_phase

    if req.overrides.model is not None:
        check_model_identifier(req.overrides.model.identifier)
    parent = readable_run(engine, run_id=parent_id, account_id=account_id)
    names = req.overrides.given()
    rewind = "materialize" if kind == "replay" else req.rewind_to or (default_rewind(names) if names else None)
    if rewind is None and not req.instructions:
        raise InvalidInput("a fork needs rewind_to, overrides or instructions", code="empty_fork")
    if rewind is not None:
        check_overrides(rewind_to=rewind, overrides=names, kind=kind)
        cut_point(read_until_phase(engine, parent.id, phase=rewind), rewind)  # refuses a point never reached
    trials = validate_trials(req.overrides.trials) if req.overrides.trials else \
        TrialsConfig.model_validate(parent.trials_config or {})
    return ForkLaunch(launch=apply_overrides(LaunchRequest.model_validate(parent.launch), req.overrides),
                      spec=ForkSpec(parent_run_id=parent.id, rewind_to=rewind, kind=kind, overrides=names,
                                    scorer_instructions=req.overrides.scorer_instructions,
                                    instructions=req.instructions),
                      trials=trials, pinned=parent.pinned if kind == "replay" and parent.pinned else None)


def prepare_run(settings: Settings, engine: Engine, *, account: Account, launch: LaunchRequest,
                run_id: str | None = None, fork: ForkLaunch | None = None, from_run: bool = False,
                check_quota: bool = True, exhausted_hint: str = "add credit first") -> PreparedRun:
    """Everything before a run is recorded, for every launch kind: resolve a fresh launch's registry pin, admit the
    launch (:func:`admit_launch`), check the balance and the quota, build the workflow input and check its size.
    Blocking (store reads): call it from a thread.

    ``fork`` starts the planned fork or replay (:func:`plan_fork`; its ``launch`` is the body); ``from_run`` marks a
    launch copied from a recorded run (a scheduled replay), whose registry pin was resolved when that run launched.
    ``check_quota`` False skips the account's quota (a schedule's firing; its creation was admitted).
    When the account already has a run of ``run_id``, the balance and the quota are not checked again.

    Raises:
        InvalidInput, DatasetError, NotFound: the launch is refused (``admit_launch``, the pin).
        Conflict: ``run_id`` is another account's run.
        PaymentRequired: the account's balance is exhausted.
        QuotaExceeded: the account's quota (``check_launch``).
        PayloadTooLarge: the workflow input would not fit.
    """
    from benchwright.errors import PayloadTooLarge, PaymentRequired
    from benchwright.registry.blobs import BlobStore
    from benchwright.registry.pinned import resolve_pin
    from benchwright.sandbox.compute import materialize_mode
    from benchwright.security.quotas import check_launch, standing

    existing = _own_run(engine, run_id, account.id) if run_id is not None else None
    body = fork.launch if fork is not None else launch
    bridged = check_harness(body) is not None  # a harness-bridge launch names its task, no dataset or pin
    unpinned = bridged or body.recipe is not None  # a product-sandbox launch names its recipe, no dataset or pin
    fresh = fork is None and not from_run
    pin = resolve_pin(engine, BlobStore.from_settings(settings), account_id=account.id, launch=body) \
        if fresh and not unpinned else None
    if pin is not None:  # the pinned subset snapshot is the dataset, the impl's exact source the scorer
        body = body.model_copy(update={"dataset": pin.dataset, "task_impl": pin.source, "impl": pin.impl_id})
    resolved = admit_launch(settings, engine, account=account, launch=body,
                            subset_default_trials=pin.default_trials if pin else None)
    if existing is None:
        now = standing(engine, settings, account_id=account.id)  # balance, quotas and usage in one read
        if now.balance_usd <= 0:
            raise PaymentRequired(f"the account's balance is exhausted (${now.balance_usd:.2f}); {exhausted_hint}")
        if check_quota:
            check_launch(engine, settings, account_id=account.id, now=now)  # 429 quota_exceeded
    mode = materialize_mode(backend=resolved.backend, local_mode=settings.local_materialize_mode,
                            harness_bridge=bridged, product_sandbox_snapshot=body.recipe is not None)
    inp = RunInput(run_id=run_id or str(uuid.uuid4()), account_id=account.id, launch=body, driver=resolved.driver,
                   trials=fork.trials if fork is not None else resolved.trials, limits=resolved.limits,
                   materialize_mode=mode, backend=resolved.backend, proxy_linger_s=settings.proxy_linger_s,
                   materialize=MaterializeOptions(concurrency=body.concurrency or settings.materialize_concurrency,
                                                  batch_tasks=settings.materialize_batch_tasks,
                                                  parallel_batches=settings.materialize_parallel_batches),
                   fork=fork.spec if fork is not None else None)
    size = len(to_json(inp))  # bytes, as the pydantic data converter encodes the payload
    if size > MAX_RUN_INPUT_BYTES:
        raise PayloadTooLarge(f"the fork is {size} bytes as a workflow input; at most {MAX_RUN_INPUT_BYTES} fit"
                              if fork is not None else
                              f"the launch is {size} bytes as a workflow input; at most {MAX_RUN_INPUT_BYTES} fit "
                              "(send less metadata or a smaller task_impl)")
    return PreparedRun(input=inp, backend=resolved.backend, existing=existing,
                       pinned=pin.record() if pin is not None else fork.pinned if fork is not None else None)


def record_run(engine: Engine, prepared: PreparedRun, *, settings: Settings) -> Run:
    """Record a prepared run (row + RunLaunched, the fork tree's row, its pin); the existing row when there is one.
    Blocking."""
    from sqlalchemy.orm.attributes import set_committed_value

    from benchwright.registry.shape import set_pin
    from benchwright.schemas import ForkOrigin
    from benchwright.store.runs import create_run

    if prepared.existing is not None:
        return prepared.existing
    inp, spec = prepared.input, prepared.input.fork
    origin = None if spec is None else ForkOrigin(parent_run_id=spec.parent_run_id, rewind_to=spec.rewind_to,
                                                  kind="replay" if spec.kind == "replay" else "fork")
    run = create_run(engine, account_id=inp.account_id, launch=inp.launch, driver=inp.driver,
                     trials_config=inp.trials.model_dump(mode="json"),
                     limits=inp.limits.model_dump(mode="json", exclude_defaults=True),
                     billing_markup=settings.billing_markup, backend=prepared.backend,
                     materialize_mode=inp.materialize_mode, run_id=inp.run_id, fork=origin)
    if prepared.pinned is not None:
        set_pin(engine, run_id=run.id, pinned=prepared.pinned)
        set_committed_value(run, "pinned", prepared.pinned)  # the row as stored now: its view need not read it again
    return run


async def start_run(settings: Settings, engine: Engine, client: Client | Callable[[], Awaitable[Client]], *,
                    account: Account, launch: LaunchRequest, run_id: str | None = None,
                    memo: dict[str, str] | None = None, fork: ForkLaunch | None = None) -> Run:
    """The one start path of a run (DESIGN invariant 10): :func:`prepare_run` (pin, admission, balance, quota,
    workflow input and its size), :func:`record_run` (row + RunLaunched) and the start of its ``RunWorkflow``.
    ``POST /v1/runs``, forks, replays and sweeps (``fork``, from :func:`plan_fork`) and the Operator call it; a
    schedule's firing prepares and records its replay the same way and starts it as a child workflow.

    ``run_id`` makes the call idempotent (the Operator passes ``workflow.uuid4()``): when the account already has
    a run of that id, nothing is recorded or checked again; its workflow is started only if it is not already
    running or finished (Temporal's id, never reused), so a retried launch never starts a run twice.

    ``memo`` adds to the workflow's memo (the Operator names its session there, for the Temporal UI); its
    ``operator_session`` is also set as the ``BenchwrightOperatorSession`` search attribute
    (``temporal_ui.session_attributes``), so the Temporal UI lists a session's runs with it.

    ``client`` may be a coroutine function returning the client (the API's lazy connection): it is then only
    reached once the launch is admitted, so a refused launch is refused even while Temporal is down.

    Raises:
        InvalidInput, DatasetError, NotFound: the launch is refused (``admit_launch``, the pin, the fork's plan).
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

    from benchwright.errors import Unavailable
    from benchwright.security.quotas import fairness_key
    from benchwright.stack.temporal_ui import (
        RUN_ACCOUNT,
        RUN_MODEL,
        RUN_PARENT,
        RUN_PHASE,
        RUN_STATUS,
        session_attributes,
        workflow_summary,
    )
    from benchwright.store.runs import finish_run

    existing = await asyncio.to_thread(_own_run, engine, run_id, account.id) if run_id is not None else None
    if existing is not None and existing.status != "running":
        return existing  # recorded and already over (or refused at start): nothing to start again
    prepared = await asyncio.to_thread(prepare_run, settings, engine, account=account, launch=launch, run_id=run_id,
                                       fork=fork)
    if not isinstance(client, TemporalClient):
        client = await client()
    run = await asyncio.to_thread(record_run, engine, prepared, settings=settings)
    body, spec, model = prepared.input.launch, prepared.input.fork, prepared.input.launch.model.identifier
    attributes = [SearchAttributePair(RUN_PHASE, "launched" if spec is None else "fork"),
                  SearchAttributePair(RUN_STATUS, "running"), SearchAttributePair(RUN_MODEL, model),
                  SearchAttributePair(RUN_ACCOUNT, account.name), *session_attributes(memo)]
    if spec is None:
        decoration: dict[str, Any] = dict(
            memo={"run_id": run.id, "account": account.name, "dataset": body.dataset, **(memo or {})},
            static_summary=workflow_summary(model=model, dataset=body.dataset),
            static_details=f"Benchwright run `{run.id}`  \nmodel `{model}`  \ndataset `{body.dataset}`")
    else:
        kind, source = "replay" if spec.kind == "replay" else "fork", body.dataset or "registry"
        rewind = spec.rewind_to or "decided by the Fork phase"
        attributes.append(SearchAttributePair(RUN_PARENT, spec.parent_run_id))
        decoration = dict(
            memo={"run_id": run.id, "account": account.name, "dataset": source,
                  "BenchwrightParentRun": spec.parent_run_id, "rewind_to": rewind, "kind": kind, **(memo or {})},
            static_summary=f"{kind} of {spec.parent_run_id[:8]}: " + workflow_summary(model=model, dataset=source),
            static_details=(f"Benchwright {kind} `{run.id}`  \nparent `{spec.parent_run_id}`  \n"
                            f"rewind to `{rewind}`  \nmodel `{model}`"))
    try:
        await client.start_workflow(
            "RunWorkflow", prepared.input, id=run.id, task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # a repeated start (existing row) must not start a finished run's workflow again
            id_reuse_policy=(WorkflowIDReusePolicy.REJECT_DUPLICATE if existing is not None
                             else WorkflowIDReusePolicy.ALLOW_DUPLICATE),
            search_attributes=TypedSearchAttributes(attributes),
            priority=Priority(fairness_key=fairness_key(account.id)),  # fair share of the task queue (quotas)
            **decoration,
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
