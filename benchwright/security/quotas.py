"""Fair sharing between accounts (issue 23): per-account quotas and what a launch is admitted against; the worker's
per-account model-call gate and share of its work are ``benchwright.security.fair_share``'s.

Three quotas, each a deployment default (``Settings.quota_*``) an admin may override per account
(``account_quotas``; ``benchwright accounts quota NAME ...`` or ``PUT /v1/admin/accounts/{name}/quota``):

* ``runs``: the account's runs running at once (not finished: paused and halted-for-review included, they hold a
  workflow; a stopped run counts until its teardown has finished). A launch at the limit is refused 429
  ``quota_exceeded``.
* ``tasks``: tasks queued, i.e. the tasks of the account's running runs not yet scored. A launch while the account
  is at or over the limit is refused 429 (a run's task count is known once Analyze has read its dataset, so a
  launch is measured against what the running runs already hold).
* ``model_calls``: the account's model calls in flight at once on one worker, across all of its runs and batches.
  Enforced by ``fair_share.FairShare`` in the worker: a call over it waits for one of the account's own calls to end (no
  error: the run is slowed, never failed). While other accounts have work on the same worker, ``FairShare`` also
  holds each account to an equal share of what the worker can serve (its model calls, and its pipeline phases),
  so one account's 20 runs at C=128 cannot take the worker's event loop and cores from another account's run.

The other half of the fair share is Temporal's: every run's workflow is started with the account as its
``fairness_key`` (``fairness_key``), which its activities inherit, so a task queue holding thousands of one
account's batch activities hands the next free worker slot to another account's waiting activity in turn instead
of first-in-first-out (the server needs ``matching.enableFairness``; ``benchwright up`` turns it on).

A 429 answers ``{"error": {"code": "quota_exceeded", "message": ...}}`` naming the quota, the use and the limit,
with ``Retry-After`` (``Settings.quota_retry_after_s``): runs end on their own schedule, so it is a hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, literal_column, select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.errors import InvalidInput, NotFound, QuotaExceeded
from benchwright.security import audit
from benchwright.store.db import reader, session_scope
from benchwright.store.models import Account, AccountQuota, Run, TaskRow, table_of, utcnow

if TYPE_CHECKING:
    from benchwright.settings import Settings

QUOTAS = ("runs", "model_calls", "tasks")
MAX_QUOTA = 10_000_000
"""Largest value a quota may be set to (a bound on what an admin types, not a recommendation)."""
_WORDS = {"runs": "concurrent runs", "model_calls": "model calls in flight", "tasks": "tasks queued"}


@dataclass(frozen=True)
class Quotas:
    runs: int
    model_calls: int
    tasks: int
    overridden: tuple[str, ...] = ()
    """Which of them an admin set for this account (the rest are the deployment's defaults)."""

    def view(self) -> dict[str, Any]:
        return {"runs": self.runs, "model_calls": self.model_calls, "tasks": self.tasks,
                "overridden": list(self.overridden)}


def fairness_key(account_id: str) -> str:
    """The Temporal fairness key of an account's runs (and so of all their activities)."""
    return account_id


def defaults(settings: Settings) -> Quotas:
    return Quotas(runs=settings.quota_runs, model_calls=settings.quota_model_calls, tasks=settings.quota_tasks)


def quotas_for(engine: Engine, settings: Settings, *, account_id: str) -> Quotas:
    """The account's quotas: the admin's overrides over the deployment's defaults."""
    with Session(reader(engine)) as session:
        row = session.get(AccountQuota, account_id)
    return _quotas(settings, None if row is None else {q: getattr(row, q) for q in QUOTAS})


def _quotas(settings: Settings, values: dict[str, int | None] | None) -> Quotas:
    """The quotas an account's overrides (``values``; None: no row) make of the deployment's defaults."""
    base = defaults(settings)
    if values is None:
        return base
    return Quotas(**{q: v if v is not None else getattr(base, q) for q, v in values.items()},
                  overridden=tuple(q for q, v in values.items() if v is not None))


def check_value(name: str, value: int | None) -> None:
    """Raises InvalidInput: ``value`` is not a whole number in 1..MAX_QUOTA (None: back to the default)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUOTA:
        raise InvalidInput(f"quota {name} must be a whole number from 1 to {MAX_QUOTA}, got {value!r}",
                           code="invalid_quota")


def set_quotas(engine: Engine, settings: Settings, *, account_name: str, values: dict[str, int | None],
               reset: tuple[str, ...] = (), actor: str | None = None) -> Quotas:
    """Set the account's overrides given in ``values`` (others kept), clear those in ``reset``; returns the result.
    Recorded in the audit trail (``actor``: who; default the operator's command line).

    Raises:
        NotFound: no such account.
        InvalidInput: a value outside 1..MAX_QUOTA, or an unknown quota name.
    """
    for name, value in values.items():
        if name not in QUOTAS:
            raise InvalidInput(f"unknown quota {name!r}; quotas: {', '.join(QUOTAS)}", code="invalid_quota")
        check_value(name, value)
    for name in reset:
        if name not in QUOTAS:
            raise InvalidInput(f"unknown quota {name!r}; quotas: {', '.join(QUOTAS)}", code="invalid_quota")
    with session_scope(engine) as session:
        account = session.execute(select(Account).where(col(Account.name) == account_name)).scalar_one_or_none()
        if account is None:
            raise NotFound(f"no account named {account_name!r}")
        row = session.get(AccountQuota, account.id) or AccountQuota(account_id=account.id)
        for name, value in values.items():
            if value is not None:
                setattr(row, name, value)
        for name in reset:
            setattr(row, name, None)
        row.updated_at = utcnow()
        session.add(row)
        audit.record(session, actor=actor or audit.cli_actor(), action="account.quota",
                     target=f"account:{account_name}",
                     detail={"set": {k: v for k, v in values.items() if v is not None}, "reset": list(reset)})
        account_id = account.id
    return quotas_for(engine, settings, account_id=account_id)


@dataclass(frozen=True)
class Usage:
    runs: int
    tasks: int


_RUNS = table_of(Run)
RUNNING = and_(_RUNS.c.status == literal_column("'running'"), _RUNS.c.finished_at.is_(None))
"""A run still running: the condition of the partial index ``ix_runs_running_account`` (migration 0015), named as
literals so that Postgres's generic plan of a prepared statement can use the index (a bound parameter would not)."""


def usage(engine: Engine, *, account_id: str) -> Usage:
    """What the account holds now: its running runs and their tasks not yet scored (latest sweep of each run)."""
    with Session(reader(engine)) as session:  # each read its own snapshot, as in a READ COMMITTED transaction
        running = session.execute(
            select(_RUNS.c.id, _RUNS.c.tasks_total).where(_RUNS.c.account_id == account_id, RUNNING)).all()
        return _usage_of(session, [(run_id, total) for run_id, total in running])


def _usage_of(session: Session, running: list[tuple[str, int]]) -> Usage:
    """``usage`` of the running runs ``running`` (id, tasks_total): their scored tasks read in one statement."""
    if not running:
        return Usage(runs=0, tasks=0)
    scored: dict[str, int] = {}
    for run_id, _invocation, n in session.execute(
            select(col(TaskRow.run_id), col(TaskRow.invocation), func.count())
            .where(col(TaskRow.run_id).in_([run_id for run_id, _ in running]))
            .group_by(col(TaskRow.run_id), col(TaskRow.invocation))):
        scored[run_id] = max(scored.get(run_id, 0), int(n))
    tasks = sum(max(0, total - scored.get(run_id, 0)) for run_id, total in running)
    return Usage(runs=len(running), tasks=tasks)


@dataclass(frozen=True)
class Standing:
    """Where an account stands as a launch is admitted: its balance, its quotas and what it holds of them."""

    balance_usd: float
    quotas: Quotas
    usage: Usage


def standing(engine: Engine, settings: Settings, *, account_id: str) -> Standing:
    """The account's balance, quotas (``quotas_for``) and usage (``usage``) in one statement, the account's row
    outer-joined with its quota overrides and its running runs; a second one for those runs' scored tasks when it
    has any. A launch's admission read the three in four statements, each a round trip on Postgres.

    Raises:
        NotFound: no such account.
    """
    quota, accounts = table_of(AccountQuota), table_of(Account)
    with Session(reader(engine)) as session:
        rows = session.execute(
            select(accounts.c.balance_usd, quota.c.account_id, *(quota.c[q] for q in QUOTAS), _RUNS.c.id,
                   _RUNS.c.tasks_total)
            .select_from(accounts)
            .outerjoin(quota, quota.c.account_id == accounts.c.id)
            .outerjoin(_RUNS, and_(_RUNS.c.account_id == accounts.c.id, RUNNING))
            .where(accounts.c.id == account_id)).all()
        if not rows:
            raise NotFound(f"no account with id {account_id!r}")
        first = rows[0]
        overrides = None if first[1] is None else dict(zip(QUOTAS, first[2:2 + len(QUOTAS)], strict=True))
        used = _usage_of(session, [(row[-2], int(row[-1])) for row in rows if row[-2] is not None])
    return Standing(balance_usd=float(first[0]), quotas=_quotas(settings, overrides), usage=used)


def _exceeded(quota: str, used: int, limit: int, settings: Settings, hint: str) -> QuotaExceeded:
    return QuotaExceeded(
        f"quota {quota} exceeded: the account has {used} {_WORDS[quota]} of its limit of {limit}; {hint} "
        f"(retry after {settings.quota_retry_after_s} s, or ask an admin to raise it: "
        f"benchwright accounts quota NAME --{quota.replace('_', '-')} N)",
        retry_after_s=settings.quota_retry_after_s, quota=quota, used=used, limit=limit)


def check_launch(engine: Engine, settings: Settings, *, account_id: str, now: Standing | None = None) -> None:
    """Refuse a launch the account's quotas do not leave room for (``now``: the account's standing, when the caller
    read it already).

    Raises:
        QuotaExceeded: the account is at its ``runs`` limit, or at or over its ``tasks`` limit.
    """
    now = now or standing(engine, settings, account_id=account_id)
    quotas, used = now.quotas, now.usage
    if used.runs >= quotas.runs:
        raise _exceeded("runs", used.runs, quotas.runs, settings, "wait for one to finish or stop one")
    if used.tasks >= quotas.tasks:
        raise _exceeded("tasks", used.tasks, quotas.tasks, settings, "wait for its runs to score them")


def model_call_limit(engine: Engine, settings: Settings, *, run_id: str) -> tuple[Run, int]:
    """The run's row and its account's ``model_calls`` quota as ``quotas_for`` gives it (read once per batch by the
    worker, in one statement: the row and the account's override together; the batch opens its sandbox with the
    row, ``benchwright.sandbox.lifecycle.open_sandbox``).

    Raises:
        NoResultFound: no such run.
    """
    with Session(reader(engine)) as session:
        run, override = session.execute(
            select(Run, col(AccountQuota.model_calls))
            .outerjoin(AccountQuota, col(AccountQuota.account_id) == Run.account_id)
            .where(col(Run.id) == run_id)).one()
    return run, override if override is not None else defaults(settings).model_calls
