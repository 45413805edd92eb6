"""Scheduled regression runs (issue 17): what a schedule says, how a firing replays its reference run, and how the
replay is judged.

A schedule is a Temporal Schedule (it survives restarts because it is Temporal's) whose action starts
``RegressionWorkflow``. Each firing:

1. **replays** the reference: a new run with the reference's launch body — the same dataset, model, trials and
   limits, and the *scorer bytes* of the reference (its ``task_impl`` as launched, else the file Atomize wrote in
   the run's work directory, checked against AtomizeArtifact.impl_sha256). This stands in for replay (issue 10):
   :func:`replay_launch` is the seam it will replace.
2. **compares** the replay (B) with the reference (A) task by task (``benchwright.comparison.compare``);
3. **alerts** when the drop is significant — ``A − B ≥ alert.drop`` and McNemar's ``p ≤ alert.p`` — by appending
   ``RegressionDetected`` to the replay's log and POSTing the optional webhook.

Alerts fire on the *transition*: a firing whose previous firing (Temporal's last completion result) had already
regressed records ``ongoing`` and stays quiet, so a model that stays bad raises one alert, not one per firing.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.comparison.compare import (
    Comparison,
    compare_runs,
    is_regression,
    readable_run,
    run_shape,
)
from benchwright.errors import BenchwrightError, InvalidInput
from benchwright.events import RegressionDetected
from benchwright.runs.launch import ResolvedLaunch, admit_launch, prepare_run, record_run
from benchwright.runs.pipeline import RunInput
from benchwright.runs.status import display_status
from benchwright.schemas import LaunchRequest
from benchwright.settings import Settings
from benchwright.store.accounts import get_account
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.models import Account, Run

__all__ = ["AlertRule", "Cadence", "CheckInput", "CheckResult", "PrepareInput", "RegressionInput", "RegressionResult",
           "ScheduleCreate", "admit_replay", "check_replay", "parse_cadence", "replay_body", "replay_launch",
           "start_replay"]

_EVERY = re.compile(r"^([1-9][0-9]{0,5})(s|m|h|d)$")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-?]+$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
MIN_EVERY = timedelta(seconds=1)
MAX_EVERY = timedelta(days=366)


class AlertRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drop: float = Field(default=0.03, ge=0, le=1)
    """Smallest fall in pass rate (a fraction: 0.03 = 3 points) that counts as a regression."""
    p: float = Field(default=0.05, gt=0, le=1)
    """Largest McNemar p-value that counts as significant."""


class ScheduleCreate(BaseModel):
    """Body of ``POST /v1/schedules``."""

    model_config = ConfigDict(extra="forbid")

    replay_of: str = Field(min_length=1, max_length=64)
    """The reference run (finished, readable by the caller): each firing replays it and compares."""
    every: str = Field(min_length=2, max_length=100)
    """``<n>s|m|h|d`` (``30s``, ``1d``) or a five-field cron expression (``0 6 * * *``, UTC)."""
    alert: AlertRule = Field(default_factory=AlertRule)
    webhook: Annotated[str, StringConstraints(max_length=2048)] | None = None
    """An http(s) URL POSTed the alert as JSON, through the account's host policy (never to internal addresses
    unless the operator listed the endpoint)."""

    @field_validator("webhook")
    @classmethod
    def _http_only(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("webhook must be an http:// or https:// URL")
        return v


class Cadence(BaseModel):
    interval: timedelta | None = None
    cron: str | None = None


def parse_cadence(every: str) -> Cadence:
    """``30s``/``5m``/``2h``/``1d`` as an interval, five space-separated fields as cron.

    Raises:
        InvalidInput: ``invalid_schedule``: neither form, naming what is accepted.
    """
    text = every.strip()
    match = _EVERY.match(text)
    if match:
        interval = timedelta(**{_UNITS[match[2]]: int(match[1])})
        if interval > MAX_EVERY:  # bounded like every number of a launch (issue 23): 999999d is 2,700 years
            raise InvalidInput(f"every={every!r} is longer than {MAX_EVERY.days} days; at most '{MAX_EVERY.days}d'",
                               code="invalid_schedule")
        return Cadence(interval=interval)
    fields = text.split()
    if len(fields) == 5 and all(_CRON_FIELD.match(f) for f in fields):
        return Cadence(cron=text)
    raise InvalidInput(f"every={every!r} is neither an interval like '30s', '15m', '2h', '1d' nor a five-field cron "
                       "expression like '0 6 * * *'", code="invalid_schedule")


class RegressionInput(BaseModel):
    """The argument every firing of a schedule starts ``RegressionWorkflow`` with."""

    schedule_id: str
    account_id: str
    reference_run_id: str
    alert: AlertRule
    webhook: str | None = None
    task_queue: str


Status = Literal["ok", "detected", "ongoing", "replay_failed", "incomparable", "launch_refused"]


class RegressionResult(BaseModel):
    """One firing's outcome; the next firing reads it back (Temporal's last completion result)."""

    run_id: str | None
    """The replay run; None when the firing's launch was refused (``launch_refused``: no run was made)."""
    status: Status
    regressed: bool
    """The replay is significantly below the reference (detected or ongoing); carried over by failed firings."""
    alerted: bool
    """This firing raised RegressionDetected (the transition into regression)."""
    verdict: str
    difference: float | None = None
    p_value: float | None = None
    webhook: str | None = None
    """The alert's delivery: ``sent``, or ``failed: <reason>`` (None: no alert, or no webhook)."""


class PrepareInput(BaseModel):
    regression: RegressionInput
    run_id: str
    """Chosen by the workflow (``workflow.uuid4()``), so a retried activity finds the run it already made."""


class PreparedReplay(BaseModel):
    run: RunInput
    account_name: str


class CheckInput(BaseModel):
    regression: RegressionInput
    run_id: str
    previously_regressed: bool


class CheckResult(BaseModel):
    result: RegressionResult
    event: RegressionDetected | None = None
    """Set when this firing raised the alert (the webhook's payload)."""


def replay_launch(settings: Settings, engine: Engine, reference: Run) -> LaunchRequest:
    """The reference's launch body with its scorer bytes pinned: the stand-in for replay (issue 10).

    A launch without ``task_impl`` gets the one Atomize wrote, read from the run's work directory and used only
    if its sha256 is the one AtomizeArtifact recorded; where it is gone (another host's disk), the Driver writes
    it again and the comparison's shape rule refuses the replay if the bytes came out different.
    """
    launch = LaunchRequest.model_validate(reference.launch)
    if launch.task_impl is None:
        written = settings.runs_dir() / reference.id / "work" / "task_impl.py"
        source = written.read_text() if Path(written).is_file() else None
        # sha256 of the source's UTF-8 bytes: the digest Atomize records as impl_sha256 (its helper moves between
        # modules as the drivers land, so the one-line rule is spelled out here)
        if source is not None and hashlib.sha256(source.encode()).hexdigest() == run_shape(engine, reference).impl_id:
            launch = launch.model_copy(update={"task_impl": source})
    return launch


def replay_body(settings: Settings, engine: Engine, *, account: Account, reference_run_id: str,
                schedule_id: str) -> tuple[Run, LaunchRequest]:
    """The reference and the launch a firing of the schedule makes (its body marked ``replay_of``/``schedule``).

    Raises:
        NotFound: the reference is not readable by the account.
    """
    reference = readable_run(engine, run_id=reference_run_id, account_id=account.id)
    launch = replay_launch(settings, engine, reference)
    return reference, launch.model_copy(update={"metadata": {**launch.metadata, "replay_of": reference.id,
                                                             "schedule": schedule_id}})


def admit_replay(settings: Settings, engine: Engine, *, account: Account, reference_run_id: str,
                 schedule_id: str) -> tuple[Run, LaunchRequest, ResolvedLaunch]:
    """The launch a firing of the schedule makes, admitted exactly as any launch is (``admit_launch``: the checks
    of ``POST /v1/runs``, ``/replay`` and ``/fork``, under the schedule account's rules). Called when the schedule is
    created; each firing admits it again on the one start path (``start_replay``), so a schedule can never launch
    what its account could not launch by hand.

    Raises:
        NotFound: the reference is not readable by the account.
        InvalidInput, DatasetError: the launch is refused (a local dataset path the account may not read, a
            missing secret, a backend unconfigured since ...).
    """
    reference, launch = replay_body(settings, engine, account=account, reference_run_id=reference_run_id,
                                    schedule_id=schedule_id)
    return reference, launch, admit_launch(settings, engine, account=account, launch=launch)


def start_replay(settings: Settings, engine: Engine, inp: PrepareInput) -> PreparedReplay:
    """Prepare and record the replay run (row + RunLaunched) on the one start path (``benchwright.runs.launch``:
    ``prepare_run`` + ``record_run``); the workflow starts it as its child. The schedule's creation was checked
    against the quota; a firing is not.

    Idempotent on ``inp.run_id``: a retry returns the input of the run already recorded.

    Raises:
        NotFound: the reference is gone or no longer readable by the schedule's account.
        PaymentRequired: the account's balance is exhausted.
        InvalidInput: the reference's launch is refused now (``admit_launch``).
    """
    reg = inp.regression
    account = get_account(engine, account_id=reg.account_id)
    _, launch = replay_body(settings, engine, account=account, reference_run_id=reg.reference_run_id,
                            schedule_id=reg.schedule_id)
    prepared = prepare_run(settings, engine, account=account, launch=launch, run_id=inp.run_id, from_run=True,
                           check_quota=False, exhausted_hint="the scheduled replay was not launched")
    record_run(engine, prepared, settings=settings)
    return PreparedReplay(run=prepared.input, account_name=account.name)


def _judged(comparison: Comparison, inp: CheckInput) -> RegressionResult:
    regressed = is_regression(comparison, drop=inp.regression.alert.drop, p=inp.regression.alert.p)
    status: Status = ("ongoing" if inp.previously_regressed else "detected") if regressed else "ok"
    return RegressionResult(run_id=inp.run_id, status=status, regressed=regressed, alerted=status == "detected",
                            verdict=comparison.verdict, difference=comparison.difference,
                            p_value=comparison.p_value)


def check_replay(engine: Engine, inp: CheckInput) -> CheckResult:
    """Judge a finished replay against its reference; on the transition into regression append RegressionDetected
    to the replay's log (idempotent) and return it for the webhook."""
    reg = inp.regression
    with Session(engine) as session:
        replay = session.get(Run, inp.run_id)
    if replay is None or replay.status != "ok" or replay.halted:
        shown = display_status(status=replay.status, halted=replay.halted, halt_reason=replay.halt_reason) \
            if replay else "missing"
        return CheckResult(result=RegressionResult(
            run_id=inp.run_id, status="replay_failed", regressed=inp.previously_regressed, alerted=False,
            verdict=f"the replay ended {shown}: {replay.error if replay else ''}"))
    try:
        reference = readable_run(engine, run_id=reg.reference_run_id, account_id=reg.account_id)
        comparison = compare_runs(engine, a=reference, b=replay)
    except BenchwrightError as exc:  # a different shape (the dataset's bytes changed), nothing scored
        return CheckResult(result=RegressionResult(run_id=inp.run_id, status="incomparable",
                                                   regressed=inp.previously_regressed, alerted=False,
                                                   verdict=exc.message))
    result = _judged(comparison, inp)
    if not result.alerted:
        return CheckResult(result=result)
    event = RegressionDetected(schedule_id=reg.schedule_id, reference_run_id=reference.id,
                               difference=comparison.difference, difference_ci=comparison.difference_ci,
                               p_value=comparison.p_value, lost=len(comparison.lost), gained=len(comparison.gained),
                               alert_drop=reg.alert.drop, alert_p=reg.alert.p, verdict=comparison.verdict)
    append_events(engine, inp.run_id, [NewEvent.of(event_key(inp.run_id, "regression", "detected"), event)])
    return CheckResult(result=result, event=event)
