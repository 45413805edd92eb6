"""Fair sharing between accounts (issue 23): per-account quotas, and the worker's per-account model-call gate.

Three quotas, each a deployment default (``Settings.quota_*``) an admin may override per account
(``account_quotas``; ``benchwright accounts quota NAME ...`` or ``PUT /v1/admin/accounts/{name}/quota``):

* ``runs``: the account's runs running at once (not finished: paused and halted-for-review included, they hold a
  workflow; a stopped run counts until its teardown has finished). A launch at the limit is refused 429
  ``quota_exceeded``.
* ``tasks``: tasks queued, i.e. the tasks of the account's running runs not yet scored. A launch while the account
  is at or over the limit is refused 429 (a run's task count is known once Analyze has read its dataset, so a
  launch is measured against what the running runs already hold).
* ``model_calls``: the account's model calls in flight at once on one worker, across all of its runs and batches.
  Enforced by ``ModelCallGates`` in the worker: a call over it waits for one of the account's own calls to end (no
  error: the run is slowed, never failed), so one account's 20 runs at C=128 cannot take every call slot, every
  scorer thread and every CPU second of the worker from another account's run.

The other half of the fair share is Temporal's: every run's workflow is started with the account as its
``fairness_key`` (``fairness_key``), which its activities inherit, so a task queue holding thousands of one
account's batch activities hands the next free worker slot to another account's waiting activity in turn instead
of first-in-first-out (the server needs ``matching.enableFairness``; ``benchwright up`` turns it on).

A 429 answers ``{"error": {"code": "quota_exceeded", "message": ...}}`` naming the quota, the use and the limit,
with ``Retry-After`` (``Settings.quota_retry_after_s``): runs end on their own schedule, so it is a hint.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright import audit
from benchwright.errors import InvalidInput, NotFound, QuotaExceeded
from benchwright.store.db import session_scope
from benchwright.store.models import Account, AccountQuota, Run, TaskRow, utcnow

if TYPE_CHECKING:
    from benchwright.settings import Settings
    from benchwright.sut import SutClient, SutReply

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
    base = defaults(settings)
    with Session(engine) as session:
        row = session.get(AccountQuota, account_id)
    if row is None:
        return base
    values = {q: getattr(row, q) for q in QUOTAS}
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


def usage(engine: Engine, *, account_id: str) -> Usage:
    """What the account holds now: its running runs and their tasks not yet scored (latest sweep of each run)."""
    with Session(engine) as session:
        running = session.execute(
            select(col(Run.id), col(Run.tasks_total)).where(col(Run.account_id) == account_id,
                                                            col(Run.status) == "running",
                                                            col(Run.finished_at).is_(None))).all()
        if not running:
            return Usage(runs=0, tasks=0)
        ids = [r.id for r in running]
        scored: dict[str, int] = {}
        for run_id, _invocation, n in session.execute(
                select(col(TaskRow.run_id), col(TaskRow.invocation), func.count())
                .where(col(TaskRow.run_id).in_(ids)).group_by(col(TaskRow.run_id), col(TaskRow.invocation))):
            scored[run_id] = max(scored.get(run_id, 0), int(n))
    tasks = sum(max(0, total - scored.get(run_id, 0)) for run_id, total in running)
    return Usage(runs=len(running), tasks=tasks)


def _exceeded(quota: str, used: int, limit: int, settings: Settings, hint: str) -> QuotaExceeded:
    return QuotaExceeded(
        f"quota {quota} exceeded: the account has {used} {_WORDS[quota]} of its limit of {limit}; {hint} "
        f"(retry after {settings.quota_retry_after_s} s, or ask an admin to raise it: "
        f"benchwright accounts quota NAME --{quota.replace('_', '-')} N)",
        retry_after_s=settings.quota_retry_after_s, quota=quota, used=used, limit=limit)


def check_launch(engine: Engine, settings: Settings, *, account_id: str) -> None:
    """Refuse a launch the account's quotas do not leave room for.

    Raises:
        QuotaExceeded: the account is at its ``runs`` limit, or at or over its ``tasks`` limit.
    """
    quotas = quotas_for(engine, settings, account_id=account_id)
    used = usage(engine, account_id=account_id)
    if used.runs >= quotas.runs:
        raise _exceeded("runs", used.runs, quotas.runs, settings, "wait for one to finish or stop one")
    if used.tasks >= quotas.tasks:
        raise _exceeded("tasks", used.tasks, quotas.tasks, settings, "wait for its runs to score them")


class ModelCallGates:
    """The worker's per-account bound on model calls in flight (the ``model_calls`` quota), one gate per account
    shared by every batch of that account's runs this worker process executes.

    A gate is made on the account's first batch with the account's quota at that moment, and resized when a later
    batch reads a different one. One ``asyncio.Semaphore`` acquire per call (~1 µs); calls are admitted in the order
    they asked.
    """

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}

    def gate(self, account_id: str, limit: int) -> _Gate:
        gate = self._gates.get(account_id)
        if gate is None:
            gate = self._gates[account_id] = _Gate(limit)
        elif gate.limit != limit:
            gate.resize(limit)
        return gate


class _Gate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.peak = 0
        self._sem = asyncio.Semaphore(limit)
        self._absorbing: set[asyncio.Task[None]] = set()

    def resize(self, limit: int) -> None:
        """Grow at once; shrink as calls end (the surplus permits are taken as they come back)."""
        delta = limit - self.limit
        self.limit = limit
        if delta > 0:
            for _ in range(delta):
                self._sem.release()
        else:
            task = asyncio.get_running_loop().create_task(self._absorb(-delta))
            self._absorbing.add(task)  # held until done (the loop keeps only a weak reference)
            task.add_done_callback(self._absorbing.discard)

    async def _absorb(self, n: int) -> None:
        for _ in range(n):
            await self._sem.acquire()

    async def __aenter__(self) -> None:
        await self._sem.acquire()
        self.in_flight += 1
        if self.in_flight > self.peak:
            self.peak = self.in_flight

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight -= 1
        self._sem.release()


class GatedSut:
    """A batch's ``SutClient`` whose calls also pass the account's gate (``ModelCallGates``).

    The batch's own bound (``concurrency``) is taken first, then the account's: a call waiting for its batch's slot
    holds none of the account's, so the account's permits all go to calls that can be sent.
    """

    def __init__(self, inner: SutClient, *, gate: _Gate, concurrency: int) -> None:
        self._inner = inner
        self._gate = gate
        self._batch = asyncio.Semaphore(max(1, concurrency))

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        async with self._batch, self._gate:
            return await self._inner.complete(messages, params)

    async def warm(self, calls: int) -> None:
        await self._inner.warm(min(calls, self._gate.limit))

    async def aclose(self) -> None:
        await self._inner.aclose()


def model_call_limit(engine: Engine, settings: Settings, *, run_id: str) -> tuple[str, int]:
    """The run's account and its ``model_calls`` quota (read once per batch by the worker)."""
    with Session(engine) as session:
        account_id = session.execute(select(col(Run.account_id)).where(col(Run.id) == run_id)).scalar_one()
    return account_id, quotas_for(engine, settings, account_id=account_id).model_calls
