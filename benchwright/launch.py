"""Launch-time checks and resolution: everything refused here is refused with a 400 before a run exists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchwright.compute import resolve_compute
from benchwright.dataset_access import LocalPathRules, check_local_path, is_url
from benchwright.drivers.llm import LlmDriverSpec
from benchwright.errors import InvalidInput
from benchwright.harness.config import bridge_trials, check_bridge_limits, check_harness
from benchwright.limits import RunLimits, resolve_limits
from benchwright.prices import check_priced
from benchwright.schemas import LaunchRequest, suggest
from benchwright.scoring.aggregators import TrialsConfig, validate_trials

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from benchwright.settings import Settings
    from benchwright.store.models import Account

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
