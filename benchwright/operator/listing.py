"""An account's Operator sessions, newest first (``GET /v1/operator/sessions``, the dashboard's sessions list)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, or_, select

from benchwright.store.models import OperatorSession


def list_sessions(engine: Engine, *, account_id: str, limit: int,
                  before: tuple[datetime, str] | None = None) -> list[OperatorSession]:
    """The account's sessions newest first (created_at, then id), at most ``limit``, optionally only those
    before ``before`` (the last row of the previous page)."""
    query = select(OperatorSession).where(col(OperatorSession.account_id) == account_id)
    if before is not None:
        at, sid = before
        query = query.where(or_(col(OperatorSession.created_at) < at,
                                (col(OperatorSession.created_at) == at) & (col(OperatorSession.id) < sid)))
    query = query.order_by(col(OperatorSession.created_at).desc(), col(OperatorSession.id).desc()).limit(limit)
    with Session(engine) as session:
        return list(session.exec(query))
