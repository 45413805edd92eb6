"""The audit trail (issue 23): every admin and operator action, who did it, when, what, and to what.

The domain operations record themselves here, in the transaction that does the work (``record``): promoting an
impl (``benchwright.registry.catalog.promote``), creating an account, crediting it, issuing it a key
(``benchwright.store.accounts``). The admin halt is the one recorded by its route (``api/routes/admin.py``): the
work is a workflow update, and the route is where the admin is known. Other engineers' admin actions (key
rotation, policy changes by an admin) call ``record`` the same way.

Who: ``account:<name>`` for an admin account calling the API, ``cli:<os user>`` for the operator's command line
(``cli_actor``). Details never hold a secret or a key (the key's 10-character prefix at most).

Read by admins only: ``GET /v1/admin/audit`` (newest first, ``next_cursor`` paging like ``GET /v1/runs``) and
``benchwright admin audit``.
"""

from __future__ import annotations

import getpass
import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.errors import InvalidInput
from benchwright.store.db import session_scope
from benchwright.store.models import Account, AuditEntry

ACTIONS = ("run.admin_halt", "impl.promote", "account.create", "account.credit", "account.key_create",
           "account.key_rotate", "account.key_revoke", "account.quota", "policy.change")
"""What the trail records (``action``). ``policy.change`` is reserved: no admin operation changes a policy yet."""
AUDIT_CURSOR_PATTERN = r"^[0-9]{1,18}$"
"""``next_cursor`` of ``GET /v1/admin/audit``: the id of the last entry of the page."""


class AuditView(BaseModel):
    id: int
    at: datetime
    actor: str
    """``account:<name>`` (an admin over the API) or ``cli:<os user>`` (the operator's command line)."""
    action: str
    target: str
    """``<kind>:<id or name>``: ``run:<id>``, ``impl:<id>``, ``account:<name>``."""
    detail: dict[str, Any]


class AuditPage(BaseModel):
    entries: list[AuditView]
    next_cursor: str | None
    """Pass as ``?cursor=`` for the next (older) page; null on the last page."""


def account_actor(account: Account) -> str:
    """How an account acting over the API is named in the trail."""
    return f"account:{account.name}"


def cli_actor() -> str:
    """How the operator's command line is named in the trail: the OS user running it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container's arbitrary uid)
        user = "unknown"
    return f"cli:{user}"


def record(session: Session, *, actor: str, action: str, target: str, detail: dict[str, Any] | None = None,
           actor_account_id: str | None = None) -> None:
    """Append one entry in the caller's transaction (the action and its record commit together, or neither)."""
    assert action in ACTIONS, action
    session.add(AuditEntry(actor=actor[:300], actor_account_id=actor_account_id, action=action,
                           target=target[:300], detail=detail or {}))


def record_now(engine: Engine, **kwargs: Any) -> None:
    """``record`` in a transaction of its own (for an action whose work was not a store write)."""
    with session_scope(engine) as session:
        record(session, **kwargs)


def list_audit(engine: Engine, *, limit: int = 50, cursor: str | None = None, action: str | None = None) -> AuditPage:
    """Entries newest first; ``cursor`` is a previous page's ``next_cursor``.

    Raises:
        InvalidInput: ``invalid_cursor``: a cursor this API did not issue (an empty one included).
    """
    query = select(AuditEntry)
    if cursor is not None:
        if not re.fullmatch(AUDIT_CURSOR_PATTERN, cursor):
            raise InvalidInput("cursor is not one this API issued (pass next_cursor back as it is)",
                               code="invalid_cursor")
        query = query.where(col(AuditEntry.id) < int(cursor))
    if action is not None:
        query = query.where(col(AuditEntry.action) == action)
    with Session(engine) as session:
        rows = list(session.execute(query.order_by(col(AuditEntry.id).desc()).limit(limit + 1)).scalars())
    page, more = rows[:limit], len(rows) > limit
    return AuditPage(entries=[AuditView(id=r.id or 0, at=r.at, actor=r.actor, action=r.action, target=r.target,
                                        detail=r.detail) for r in page],
                     next_cursor=str(page[-1].id) if more and page else None)
