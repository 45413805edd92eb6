"""Halt state on the run row (§1, §9): raising and clearing the flag, each with its event, in one transaction."""

from __future__ import annotations

import uuid

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, col

from benchwright.events import PipelineFinished, RunHalted, RunResumed
from benchwright.registry.cache import Cell, cell_row, record_cell_in
from benchwright.registry.shape import stamp_terminal
from benchwright.runs.halts import HaltKind, HaltReason, limit_exceeded
from benchwright.store.db import reader, session_scope
from benchwright.store.events import (
    NewEvent,
    append_events,
    append_in_session,
    append_spending,
    appends_in_one_call,
    event_key,
    lock_run,
    results_in_one_call,
)
from benchwright.store.models import Account, Run, table_of, utcnow
from benchwright.store.settled import notify_settled

_RUNS, _ACCOUNTS = table_of(Run), table_of(Account)
# Read after every phase: a Core statement built once (through the ORM its building cost more than the read).
_SPEND = (select(_RUNS.c.cost_incurred, _RUNS.c.cost_billed, _ACCOUNTS.c.balance_usd)
          .join(_ACCOUNTS, _ACCOUNTS.c.id == _RUNS.c.account_id).where(_RUNS.c.id == bindparam("run_id_")))


def halt_run(engine: Engine, *, run_id: str, reason: str, key: str | None = None, replace: bool = False) -> bool:
    """Raise the halted flag with ``reason`` unless the run is already halted (or ``replace``: overwrite the
    reason); returns whether this call wrote it.

    ``key`` makes the call idempotent across activity retries (the workflow passes its own deterministic key).
    """
    with session_scope(engine) as session:
        return _halt_in_session(session, run_id=run_id, reason=reason, key=key, replace=replace)


def _halt_in_session(session: Session, *, run_id: str, reason: str, key: str | None, replace: bool = False) -> bool:
    run = lock_run(session, run_id)
    if run.halted and not replace:
        return False
    event = NewEvent.of(event_key(run_id, "halt", key or uuid.uuid4().hex), RunHalted(halt_reason=reason))
    if not append_in_session(session, run_id, [event], halted=True, halt_reason=reason):
        return False
    notify_settled(session, run_id)  # a halted run's long polls answer too
    return True


def append_closing(engine: Engine, run_id: str, events: list[NewEvent], *, cell: Cell | None = None,
                   run_cost_usd: float | None = None, budget_key: str | None = None) -> str | None:
    """A phase's close in one transaction: append ``events``, write the phase's cache ``cell`` (the cell lands with
    the events it names) and, with ``budget_key``, halt the run if it has now crossed its cost ceiling or its
    account's balance (``budget_halt_reason``; the halt keyed by ``budget_key``). Returns the reason when this call
    halted the run.

    The check "between phases" (§9) costs the close one read instead of a read and a transaction of its own, and a
    cost among the closing events counts.

    On Postgres a close with events is one round trip in autocommit and the halt (rare) a transaction of its own:
    one call (``append_spending``) appends the events, writes the cell and reads the spend (five round trips before
    for a cached phase: BEGIN, the append's call, the cell, the read, COMMIT; two for another phase, the call and the
    read), or, with no check asked for, appends alone. The read still follows the close's events, and a close
    retried after a crash before the halt reads again and halts then.

    Raises:
        NotFound: the run does not exist.
        ValueError: ``cell`` is another run's.
    """
    if cell is not None and cell.run_id != run_id:
        raise ValueError(f"run {run_id}'s close was given run {cell.run_id}'s cell")
    if engine.dialect.name == "postgresql" and events and appends_in_one_call(events):
        if budget_key is None and cell is None:
            append_events(engine, run_id, events)
            return None
        spend = append_spending(engine, run_id, events, cell=cell_row(cell) if cell is not None else None)
        if budget_key is None:
            return None
        reason = _reason_of(*spend, run_cost_usd=run_cost_usd)
        return reason if reason and halt_run(engine, run_id=run_id, reason=reason, key=budget_key) else None
    with session_scope(engine) as session:
        append_in_session(session, run_id, events)
        if cell is not None:
            record_cell_in(session, cell)
        if budget_key is None:
            return None
        reason = _spend_reason(session.connection(), run_id=run_id, run_cost_usd=run_cost_usd)
        return reason if reason and _halt_in_session(session, run_id=run_id, reason=reason, key=budget_key) else None


def append_checking(engine: Engine, run_id: str, events: list[NewEvent], *, invocation: int,
                    run_cost_usd: float | None) -> str | None:
    """A Materialize batch's commit of results (§9): append ``events`` and read the run's spend after them in one
    transaction and, if the run has crossed its cost ceiling or its account's balance (``budget_halt_reason``), halt
    it (keyed by the invocation: one halt whichever of its batches sees it first). Returns that reason whether this
    call or an earlier one halted the run, so that a batch stops either way; None when the spend calls for no halt.

    On Postgres a few results (``results_in_one_call``) are one round trip in autocommit, the append's and the read's
    (nine before: the append's transaction of seven statements, then the read); more go by the statements, ``COPY``
    among them, with the read inside their transaction.

    Raises:
        NotFound: the run does not exist.
    """
    if engine.dialect.name == "postgresql" and (results_in_one_call(events)
                                                or (bool(events) and appends_in_one_call(events))):
        reason = _reason_of(*append_spending(engine, run_id, events), run_cost_usd=run_cost_usd)
    else:
        with session_scope(engine) as session:
            append_in_session(session, run_id, events)
            reason = _spend_reason(session.connection(), run_id=run_id, run_cost_usd=run_cost_usd)
    if reason:
        halt_run(engine, run_id=run_id, reason=reason, key=f"materialize-{invocation}-budget")
    return reason


def clear_halt(engine: Engine, *, run_id: str, key: str, resolution: str | None = None) -> bool:
    """Clear halted and halt_reason in one row update (with RunResumed); returns whether a halt was cleared."""
    with session_scope(engine) as session:
        run = lock_run(session, run_id)
        if not run.halted:
            return False
        event = NewEvent.of(event_key(run_id, "resume", key),
                            RunResumed(previous_reason=run.halt_reason or "", review_resolution=resolution))
        return bool(append_in_session(session, run_id, [event], halted=False, halt_reason=None))


def finish_halted(engine: Engine, *, run_id: str) -> None:
    """Close a torn-down run: status keeps its value, halted stays up, PipelineFinished ends the log."""
    with session_scope(engine) as session:
        run = lock_run(session, run_id)
        event = NewEvent.of(event_key(run_id, "pipeline", "finished"),
                            PipelineFinished(status=run.status, halted=True, halt_reason=run.halt_reason))
        if append_in_session(session, run_id, [event]):
            run.finished_at = utcnow()
            stamp_terminal(session, run)


def budget_halt_reason(engine: Engine, *, run_id: str, run_cost_usd: float | None) -> str | None:
    """``limit_exceeded:run.cost`` or ``balance_exhausted`` if the run has crossed one, else None."""
    with reader(engine).connect() as conn:
        return _spend_reason(conn, run_id=run_id, run_cost_usd=run_cost_usd)


def _spend_reason(conn: Connection, *, run_id: str, run_cost_usd: float | None) -> str | None:
    incurred, billed, balance = conn.execute(_SPEND, {"run_id_": run_id}).one()
    return _reason_of(incurred, billed, balance, run_cost_usd=run_cost_usd)


def _reason_of(incurred: float, billed: float, balance: float, *, run_cost_usd: float | None) -> str | None:
    """The halt a run's spend calls for (``budget_halt_reason``), from its incurred and billed cost and its
    account's balance."""
    if run_cost_usd is not None and incurred > run_cost_usd:
        return limit_exceeded("run.cost")
    if billed > 0 and balance <= 0:
        return HaltReason(HaltKind.BALANCE_EXHAUSTED).wire()
    return None


_HALTED = select(Run.id, Run.halt_reason).where(col(Run.id).in_(bindparam("run_ids_", expanding=True)),
                                                col(Run.halted).is_(True))
"""``halted_reasons``' read, built once: the halt watches of every activity under way poll it."""


def halted_reasons(engine: Engine, *, run_ids: list[str]) -> dict[str, str]:
    """``halted_reason`` of many runs in one read: the halted ones among ``run_ids`` and why."""
    with reader(engine).connect() as conn:
        rows = conn.execute(_HALTED, {"run_ids_": list(run_ids)}).all()
    return {row.id: row.halt_reason or "halted" for row in rows}


def halted_reason(engine: Engine, *, run_id: str) -> str | None:
    """The run's halt_reason while halted, else None (a cheap read for loops that poll the flag)."""
    with Session(reader(engine)) as session:
        row = session.execute(select(Run.halted, Run.halt_reason).where(Run.id == run_id)).one()
    return (row.halt_reason or "halted") if row.halted else None
