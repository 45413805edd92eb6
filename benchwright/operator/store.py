"""Operator sessions in the store: the row, its append-only log (the run log's rules: seq from the row's counter
under its lock, idempotency keys), and the view the API returns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.errors import NotFound
from benchwright.operator.events import SessionAnswered, SessionStarted
from benchwright.operator.goals import Answer, SessionCreate, SessionView
from benchwright.store.db import session_scope
from benchwright.store.events import NewEvent
from benchwright.store.models import Account, OperatorEvent, OperatorSession, Run, table_of, utcnow

_EVENTS = table_of(OperatorEvent)
TERMINAL = ("answered", "stopped", "failed")


def session_key(session_id: str, *parts: object) -> str:
    return ":".join(["op", session_id, *(str(p) for p in parts)])


def create_session(engine: Engine, *, session_id: str, account_id: str, req: SessionCreate) -> OperatorSession:
    """Insert the session row and SessionStarted (seq 0) in one transaction."""
    goal = req.goal.model_dump(mode="json", exclude_none=True)
    limits = req.limits.model_dump(mode="json", exclude_none=True)
    row = OperatorSession(id=session_id, account_id=account_id, operator=req.operator, goal=goal, limits=limits,
                          runs=[])
    with session_scope(engine) as session:
        session.add(row)
        session.flush()
        _append(session, session_id, [NewEvent.of(session_key(session_id, "started"), SessionStarted(
            operator=req.operator, account_id=account_id, goal=goal, limits=limits))])
    return row


def get_session(engine: Engine, *, session_id: str, account_id: str) -> OperatorSession:
    """The account's session.

    Raises:
        NotFound: no such session, or another account's (never told apart).
    """
    with Session(engine) as session:
        row = session.get(OperatorSession, session_id)
    if row is None or row.account_id != account_id:
        raise NotFound(f"operator session {session_id} not found")
    return row


def append_session_events(engine: Engine, session_id: str, events: list[NewEvent], *, add_run: str | None = None,
                          **updates: Any) -> int:
    """Append to the session's log in one transaction (a repeated key writes nothing), optionally recording a
    launched run and updating the row's columns; returns how many events were new."""
    with session_scope(engine) as session:
        n = _append(session, session_id, events)
        if add_run is not None:
            runs = session.execute(select(col(OperatorSession.runs))
                                   .where(col(OperatorSession.id) == session_id)).scalar_one()
            if add_run not in runs:
                updates["runs"] = [*runs, add_run]
        if updates:
            session.execute(update(OperatorSession).where(col(OperatorSession.id) == session_id).values(**updates))
        return n


def record_llm_turn(engine: Engine, session_id: str, events: list[NewEvent], *, account_id: str,
                    charge_usd: float) -> bool:
    """Append an LLM operator's turn (its ``OperatorLlmTurn`` first) and charge its price to the account's balance,
    in one transaction; a repeated turn (same key) writes and charges nothing. Returns whether it was new."""
    with session_scope(engine) as session:
        fresh = _append(session, session_id, events) > 0
        if fresh and charge_usd > 0:
            session.execute(update(Account).where(col(Account.id) == account_id)
                            .values(balance_usd=Account.balance_usd - charge_usd))
        return fresh


def read_event(engine: Engine, *, key: str) -> OperatorEvent | None:
    with Session(engine) as session:
        return session.execute(select(OperatorEvent).where(col(OperatorEvent.idem_key) == key)).scalars().first()


def _append(session: Session, session_id: str, events: list[NewEvent]) -> int:
    locked = session.execute(update(OperatorSession).where(col(OperatorSession.id) == session_id)
                             .values(next_seq=OperatorSession.next_seq))
    if locked.rowcount == 0:  # type: ignore[attr-defined]
        raise NotFound(f"operator session {session_id} not found")
    keys = [e.key for e in events]
    seen = set(session.execute(select(col(OperatorEvent.idem_key))
                               .where(col(OperatorEvent.idem_key).in_(keys))).scalars())
    fresh = [e for e in events if e.key not in seen]
    if not fresh:
        return 0
    next_seq = session.execute(select(col(OperatorSession.next_seq))
                               .where(col(OperatorSession.id) == session_id)).scalar_one()
    now = utcnow()
    session.execute(insert(_EVENTS), [{"session_id": session_id, "seq": next_seq + i, "type": e.type,
                                       "data": e.data, "idem_key": e.key, "created_at": now}
                                      for i, e in enumerate(fresh)])
    session.execute(update(OperatorSession).where(col(OperatorSession.id) == session_id)
                    .values(next_seq=next_seq + len(fresh)))
    return len(fresh)


def finish_session(engine: Engine, *, session_id: str, status: str, answer: Answer) -> None:
    """Record the answer (SessionAnswered) and the final status; repeating it changes nothing."""
    append_session_events(engine, session_id, [NewEvent.of(session_key(session_id, "answered"), SessionAnswered(
        status=status, answer=answer.model_dump(mode="json")))], status=status,
        answer=answer.model_dump(mode="json"), finished_at=utcnow())


def set_status(engine: Engine, *, session_id: str, status: str) -> None:
    with session_scope(engine) as session:
        session.execute(update(OperatorSession).where(col(OperatorSession.id) == session_id,
                                                      col(OperatorSession.status).not_in(TERMINAL))
                        .values(status=status))


def read_session_events(engine: Engine, *, session_id: str, after: int = -1, limit: int = 500) -> list[OperatorEvent]:
    with Session(engine) as session:
        return list(session.execute(select(OperatorEvent).where(
            col(OperatorEvent.session_id) == session_id, col(OperatorEvent.seq) > after)
            .order_by(col(OperatorEvent.seq)).limit(limit)).scalars())


def session_cost(engine: Engine, run_ids: list[str]) -> float:
    """USD spent so far by the session's runs (``cost.incurred``)."""
    if not run_ids:
        return 0.0
    with Session(engine) as session:
        total = session.execute(select(func.coalesce(func.sum(Run.cost_incurred), 0.0))
                                .where(col(Run.id).in_(run_ids))).scalar_one()
    return float(total)


def session_spent(engine: Engine, row: OperatorSession) -> tuple[float, float]:
    """(USD spent in all, of which the LLM operator's own tokens)."""
    from benchwright.operator.llm import operator_cost

    own = operator_cost(engine, session_id=row.id) if row.operator != "builtin" else 0.0
    return session_cost(engine, list(row.runs)) + own, own


def session_view(engine: Engine, row: OperatorSession) -> SessionView:
    spent, own = session_spent(engine, row)
    return SessionView(id=row.id, operator=row.operator, status=row.status, goal=row.goal, limits=row.limits,
                       runs=list(row.runs), cost=spent, operator_cost=own,
                       answer=Answer.model_validate(row.answer) if row.answer else None,
                       created_at=row.created_at, finished_at=row.finished_at)
