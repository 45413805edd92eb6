"""Accounts and their API keys. Keys are random, shown once, and stored only as sha256 digests."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from benchwright import audit
from benchwright.errors import Conflict, InvalidInput, NotFound, Unauthorized
from benchwright.store.db import session_scope
from benchwright.store.models import Account, ApiKey

KEY_PREFIX = "bw_"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_account(engine: Engine, *, name: str, balance_usd: float = 0.0,
                   local_paths: bool = False, admin: bool = False, curator: bool = False,
                   actor: str | None = None) -> tuple[Account, str]:
    """Create an account with one API key; returns the account and the key (the only time it is visible).

    ``local_paths`` lets the account name dataset files on the worker's host (where the deployment allows local
    paths at all). Off unless the operator says so: an account added to a running stack must not read its files.
    ``admin`` makes a platform administrator, who may halt any account's run (the §9 ``admin`` halt).
    ``curator`` lets the account promote impls on its own private benchmarks (the embedded stack's own account).
    ``actor`` names who did it in the audit trail (default: the OS user, ``benchwright.audit.cli_actor``).

    Raises:
        Conflict: an account with this name exists.
    """
    account = Account(id=str(uuid.uuid4()), name=name, balance_usd=balance_usd, local_paths=local_paths,
                      admin=admin, curator=curator)
    try:
        with session_scope(engine) as session:
            session.add(account)
            session.flush()
            key = _add_key(session, account.id)
            audit.record(session, actor=actor or audit.cli_actor(), action="account.create", target=f"account:{name}",
                         detail={"balance_usd": balance_usd, "local_paths": local_paths, "admin": admin,
                                 "key_prefix": key[:10]})
    except IntegrityError as exc:
        raise Conflict(f"an account named {name!r} already exists", code="account_exists") from exc
    return account, key


def create_key(engine: Engine, *, account_name: str, actor: str | None = None) -> str:
    """Issue another API key for an existing account (recorded in the audit trail, by its prefix only)."""
    with session_scope(engine) as session:
        account = session.execute(select(Account).where(Account.name == account_name)).scalar_one_or_none()
        if account is None:
            raise NotFound(f"no account named {account_name!r}")
        key = _add_key(session, account.id)
        audit.record(session, actor=actor or audit.cli_actor(), action="account.key_create",
                     target=f"account:{account_name}", detail={"key_prefix": key[:10]})
        return key


def _add_key(session: Session, account_id: str) -> str:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(id=str(uuid.uuid4()), account_id=account_id, key_hash=_digest(key), prefix=key[:10]))
    return key


def authenticate(engine: Engine, key: str | None) -> Account:
    """The account owning ``key``.

    Raises:
        Unauthorized: no key, or not a known key.
    """
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    with Session(engine) as session:
        account: Account | None = session.execute(
            select(Account).join(ApiKey, ApiKey.account_id == Account.id).where(ApiKey.key_hash == _digest(key))
        ).scalar_one_or_none()
    if account is None:
        raise Unauthorized("invalid API key")
    return account


def credit(engine: Engine, *, account_name: str, amount_usd: float, actor: str | None = None) -> float:
    """Add ``amount_usd`` to the account's balance (in the database, so concurrent debits are not lost);
    returns the new balance.

    Raises:
        NotFound: no such account.
        InvalidInput: the amount is not a positive number.
    """
    if not amount_usd > 0:
        raise InvalidInput(f"credit amount must be positive, got {amount_usd}")
    with session_scope(engine) as session:
        updated = session.execute(
            update(Account).where(Account.name == account_name)
            .values(balance_usd=Account.balance_usd + amount_usd).returning(Account.balance_usd)
        ).scalar_one_or_none()
        if updated is None:
            raise NotFound(f"no account named {account_name!r}")
        audit.record(session, actor=actor or audit.cli_actor(), action="account.credit",
                     target=f"account:{account_name}", detail={"amount_usd": amount_usd, "balance_usd": float(updated)})
    return float(updated)


def get_account(engine: Engine, *, account_id: str) -> Account:
    with Session(engine) as session:
        account = session.get(Account, account_id)
    if account is None:
        raise NotFound(f"account {account_id} not found")
    return account
