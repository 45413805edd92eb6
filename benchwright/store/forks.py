"""The fork tree in the store: seeding a fork's log from its parent's, and reading lineage (§10)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.events import PhaseStarted
from benchwright.runs.forks import LoggedEvent
from benchwright.store.db import session_scope
from benchwright.store.events import NewEvent, append_in_session, event_key
from benchwright.store.models import EventRow, Run, RunFork

_PAGE = 500


def read_until_phase(engine: Engine, run_id: str, *, phase: str) -> list[LoggedEvent]:
    """The run's events up to and including its first PhaseStarted of ``phase`` (or all of them), read in pages:
    the cut of a 10,000-task run lies in its first hundred events, before any of its results."""
    out: list[LoggedEvent] = []
    after = -1
    with Session(engine) as session:
        while True:
            rows = list(session.execute(
                select(col(EventRow.seq), col(EventRow.type), col(EventRow.data))
                .where(col(EventRow.run_id) == run_id, col(EventRow.seq) > after)
                .order_by(col(EventRow.seq)).limit(_PAGE)).all())
            for seq, type_, data in rows:
                out.append(LoggedEvent(seq=seq, type=type_, data=data))
                if type_ == PhaseStarted.type_name() and data.get("phase") == phase:
                    return out
            if len(rows) < _PAGE:
                return out
            after = rows[-1][0]


def seed_fork_log(engine: Engine, *, run_id: str, copies: list[tuple[str, str, dict[str, Any]]],
                  own: list[NewEvent], run_updates: dict[str, Any]) -> int:
    """Append the inherited copies and then the Fork phase's own events in one transaction (so the copies take
    seq 1.. right after RunLaunched), updating the run row's ``run_updates`` columns with them. Idempotent: a
    retried Fork phase appends nothing twice. Returns how many events were new."""
    events = [NewEvent(key=event_key(run_id, suffix), type=type_, data=data) for suffix, type_, data in copies]
    with session_scope(engine) as session:
        return append_in_session(session, run_id, events + own, **run_updates)


def fork_origin(engine: Engine, *, run_id: str) -> RunFork | None:
    with Session(engine) as session:
        return session.get(RunFork, run_id)


def lineage_rows(engine: Engine, *, run_id: str) -> tuple[str, list[tuple[Run, RunFork | None]]]:
    """The fork tree ``run_id`` belongs to: its root's id, and every run in it (root first, each parent before its
    children, siblings by creation time) with its fork row (None for the root)."""
    with Session(engine) as session:
        root = run_id
        seen = {root}
        while (up := session.get(RunFork, root)) is not None and up.parent_run_id not in seen:
            root = up.parent_run_id
            seen.add(root)
        out: list[tuple[Run, RunFork | None]] = []
        level, seen = [root], {root}
        while level:
            runs = {r.id: r for r in session.execute(select(Run).where(col(Run.id).in_(level))).scalars()}
            forks = {f.run_id: f for f in session.execute(select(RunFork).where(col(RunFork.run_id).in_(level)))
                     .scalars()}
            out += [(runs[i], forks.get(i)) for i in level if i in runs]
            children = list(session.execute(
                select(col(RunFork.run_id)).join(Run, col(Run.id) == col(RunFork.run_id))
                .where(col(RunFork.parent_run_id).in_(level)).order_by(col(Run.created_at))).scalars())
            level = [c for c in children if c not in seen]
            seen.update(level)
    return root, out
