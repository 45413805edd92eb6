"""Accounts and their API keys. Keys are random, shown once, and stored only as sha256 digests (a key is 256 random
bits, so a fast hash is enough: there is nothing to guess). An account has up to ``MAX_KEYS_PER_ACCOUNT`` named
keys; rotating or revoking one takes effect at the commit (every request looks its key up)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from benchwright.errors import Conflict, InvalidInput, NotFound, Unauthorized
from benchwright.security import audit
from benchwright.store.db import reader, session_scope
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
    ``actor`` names who did it in the audit trail (default: the OS user, ``benchwright.security.audit.cli_actor``).

    Raises:
        Conflict: an account with this name exists.
    """
    account = Account(id=str(uuid.uuid4()), name=name, balance_usd=balance_usd, local_paths=local_paths,
                      admin=admin, curator=curator)
    try:
        with session_scope(engine) as session:
            session.add(account)
            session.flush()
            key = _add_key(session, account.id, "default")
            audit.record(session, actor=actor or audit.cli_actor(), action="account.create", target=f"account:{name}",
                         detail={"balance_usd": balance_usd, "local_paths": local_paths, "admin": admin,
                                 "curator": curator, "key_prefix": key[:10]})
    except IntegrityError as exc:
        raise Conflict(f"an account named {name!r} already exists", code="account_exists") from exc
    return account, key


KEY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_KEYS_PER_ACCOUNT = 20
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""``last_used_at`` is written at most this often per key, so authenticating is not a write per request."""


@dataclass(frozen=True)
class ApiKeyInfo:
    """What is ever said about a key: never the key, nor its hash."""

    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    current: bool = False
    """The key this request was made with (``GET /v1/account/keys``)."""


def _info(row: ApiKey) -> ApiKeyInfo:
    return ApiKeyInfo(name=row.name, prefix=row.prefix, created_at=_aware(row.created_at),
                      last_used_at=_aware(row.last_used_at) if row.last_used_at else None)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _account(session: Session, account_name: str | None, account_id: str | None) -> Account:
    account: Account | None
    if account_name is not None:
        account = cast("Account | None", session.execute(select(Account).where(Account.name == account_name))
                       .scalar_one_or_none())
        if account is None:
            raise NotFound(f"no account named {account_name!r}")
        return account
    account = session.get(Account, account_id) if account_id else None
    if account is None:
        raise NotFound(f"account {account_id} not found")
    return account


def _check_name(name: str) -> str:
    if not re.fullmatch(KEY_NAME_PATTERN, name):
        raise InvalidInput("a key name is 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit); "
                           f"got {name[:80]!r}", code="invalid_key_name")
    return name


def _add_key(session: Session, account_id: str, name: str | None = None) -> str:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(id=str(uuid.uuid4()), account_id=account_id, key_hash=_digest(key), prefix=key[:10],
                       name=name or key[:10]))
    return key


def _key_info(session: Session, key: str) -> ApiKeyInfo:
    session.flush()
    return _info(session.execute(select(ApiKey).where(ApiKey.key_hash == _digest(key))).scalar_one())


def create_key(engine: Engine, *, account_name: str, actor: str | None = None) -> str:
    """Issue another API key (named after its prefix) for an existing account; returns the key."""
    return add_key(engine, account_name=account_name, actor=actor)[1]


def add_key(engine: Engine, *, account_name: str | None = None, account_id: str | None = None,
            name: str | None = None, actor: str | None = None) -> tuple[ApiKeyInfo, str]:
    """Issue another API key for an existing account (by name or id); returns the key's description and the key
    (the only time it is visible). Without a name the key is named after its prefix.

    Raises:
        NotFound: no such account.
        InvalidInput: a malformed name.
        Conflict: the account has a key of that name, or ``MAX_KEYS_PER_ACCOUNT`` keys.
    """
    if name is not None:
        _check_name(name)
    try:
        with session_scope(engine) as session:
            account = _account(session, account_name, account_id)
            count = session.execute(select(func.count()).select_from(ApiKey)
                                    .where(ApiKey.account_id == account.id)).scalar_one()
            if count >= MAX_KEYS_PER_ACCOUNT:
                raise Conflict(f"the account has {count} API keys, the most it may hold; revoke one first",
                               code="too_many_keys")
            key = _add_key(session, account.id, name)
            info = _key_info(session, key)
            audit.record(session, actor=actor or audit.cli_actor(), action="account.key_create",
                         target=f"account:{account.name}", detail={"key_name": info.name, "key_prefix": key[:10]})
    except IntegrityError as exc:
        raise Conflict(f"the account already has a key named {name!r}", code="key_exists") from exc
    return info, key


def list_keys(engine: Engine, *, account_id: str | None = None, account_name: str | None = None,
              current: str | None = None) -> list[ApiKeyInfo]:
    """The account's keys, oldest first; the one that is ``current`` (the caller's own key) says so."""
    with Session(engine) as session:
        account = _account(session, account_name, account_id)
        rows = session.execute(select(ApiKey).where(ApiKey.account_id == account.id)
                               .order_by(ApiKey.created_at, ApiKey.name)).scalars().all()
        mine = _digest(current) if current else None
        return [dataclasses.replace(_info(r), current=r.key_hash == mine) for r in rows]


def rotate_key(engine: Engine, *, name: str, account_id: str | None = None, account_name: str | None = None,
               actor: str | None = None) -> tuple[ApiKeyInfo, str]:
    """Replace the key named ``name`` by a fresh one of the same name, in one transaction: from the commit on, the
    old key answers 401. Returns the new key's description and the key (shown this once).

    Raises:
        NotFound: no such account, or no key of that name.
    """
    with session_scope(engine) as session:
        account = _account(session, account_name, account_id)
        gone = session.execute(delete(ApiKey).where(ApiKey.account_id == account.id, ApiKey.name == name))
        if gone.rowcount != 1:  # type: ignore[attr-defined]
            raise NotFound(f"the account has no API key named {name!r}")
        key = _add_key(session, account.id, name)
        try:
            info = _key_info(session, key)
        except IntegrityError as exc:  # a concurrent rotation of the same key won
            raise Conflict(f"the key {name!r} was rotated meanwhile; list the keys and try again",
                           code="key_exists") from exc
        audit.record(session, actor=actor or audit.cli_actor(), action="account.key_rotate",
                     target=f"account:{account.name}", detail={"key_name": name, "key_prefix": key[:10]})
    return info, key


def revoke_key(engine: Engine, *, name: str, account_id: str | None = None, account_name: str | None = None,
               actor: str | None = None) -> None:
    """Delete the key named ``name``: it answers 401 from the commit on. An account keeps at least one key.

    Raises:
        NotFound: no such account, or no key of that name.
        Conflict: it is the account's last key (issue another first).
    """
    with session_scope(engine) as session:
        account = _account(session, account_name, account_id)
        names = session.execute(select(ApiKey.name).where(ApiKey.account_id == account.id)).scalars().all()
        if name not in names:
            raise NotFound(f"the account has no API key named {name!r}")
        if len(names) == 1:
            raise Conflict(f"{name!r} is the account's only API key: create another before revoking it",
                           code="last_key")
        session.execute(delete(ApiKey).where(ApiKey.account_id == account.id, ApiKey.name == name))
        audit.record(session, actor=actor or audit.cli_actor(), action="account.key_revoke",
                     target=f"account:{account.name}", detail={"key_name": name})


def authenticate(engine: Engine, key: str | None) -> Account:
    """The account owning ``key``; notes when the key was used (at most once a minute per key).

    Raises:
        Unauthorized: no key, or not a known key.
    """
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    with Session(reader(engine)) as session:
        found = session.execute(
            select(Account, ApiKey.id, ApiKey.last_used_at).join(ApiKey, ApiKey.account_id == Account.id)
            .where(ApiKey.key_hash == _digest(key))
        ).one_or_none()
    if found is None:
        raise Unauthorized("invalid API key")
    account, row_id, last_used = found
    now = datetime.now(UTC)
    if last_used is None or now - _aware(last_used) >= LAST_USED_RESOLUTION:
        with session_scope(engine) as session:
            session.execute(update(ApiKey).where(ApiKey.id == row_id).values(last_used_at=now))
    return account  # type: ignore[no-any-return]


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
    with Session(reader(engine)) as session:
        account = session.get(Account, account_id)
    if account is None:
        raise NotFound(f"account {account_id} not found")
    return account
