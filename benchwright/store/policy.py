"""Per-account host policy, the blocked-host log, provider secrets and the saved compute provider (§4, §11)."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.errors import InvalidInput, NotFound
from benchwright.proxy.policy import HostPolicy, HostRule
from benchwright.security.crypto import KEY_ENV, KEY_FILE_ENV, DeploymentKeyError, Keyring, bind, keyring_of
from benchwright.store.db import reader, session_scope
from benchwright.store.models import (
    Account,
    AccountSettings,
    BlockedHost,
    HostPolicyRow,
    HostRuleRow,
    Run,
    Secret,
    utcnow,
)


def get_policy(engine: Engine, *, account_id: str) -> HostPolicy:
    """The account's policy; a fresh account's default mode is allow."""
    with Session(reader(engine)) as session:
        row = session.get(HostPolicyRow, account_id)
        rules = session.execute(select(HostRuleRow).where(HostRuleRow.account_id == account_id)
                                .order_by(HostRuleRow.created_at)).scalars().all()
    return HostPolicy(default=row.default_mode if row else "allow",
                      rules=[HostRule(pattern=r.pattern, action=r.action) for r in rules])


class RunAccess(NamedTuple):
    """What a run may reach and where its sandboxes run (``run_access``)."""

    account: Account
    policy: HostPolicy
    backend: str
    """The backend the run's launch resolved (``benchwright.sandbox.lifecycle.run_backend``)."""


def run_access(engine: Engine, *, run_id: str) -> RunAccess:
    """The run's account and that account's host policy, as ``get_account`` of the run's ``account_id`` and
    ``get_policy`` give them, and the run's backend, in one statement: what a run's Fetch and Attach check the places
    they reach against, read fresh (policies change between runs), and where Fetch's snapshot is made. One round trip
    on Postgres instead of five (the run, the account, the policy's mode, its rules, the run again for its backend).

    Raises:
        NotFound: no such run (or its account is gone).
    """
    with Session(reader(engine)) as session:
        rows = session.execute(
            select(Account, HostPolicyRow.default_mode, HostRuleRow.pattern, HostRuleRow.action, Run.backend)
            .select_from(Run).join(Account, col(Account.id) == Run.account_id)
            .outerjoin(HostPolicyRow, col(HostPolicyRow.account_id) == Account.id)
            .outerjoin(HostRuleRow, col(HostRuleRow.account_id) == Account.id)
            .where(Run.id == run_id).order_by(col(HostRuleRow.created_at))).all()
    if not rows:
        raise NotFound(f"run {run_id} not found")
    account, mode, backend = rows[0][0], rows[0][1], rows[0][4]
    return RunAccess(account, HostPolicy(default=mode or "allow", rules=[
        HostRule(pattern=pattern, action=action) for _, _, pattern, action, _ in rows if pattern is not None]),
        backend or "local")


def set_default_mode(engine: Engine, *, account_id: str, mode: str) -> None:
    if mode not in ("allow", "block"):
        raise InvalidInput(f"default mode must be 'allow' or 'block', got {mode!r}", code="invalid_policy")
    with session_scope(engine) as session:
        row = session.get(HostPolicyRow, account_id)
        if row is None:
            session.add(HostPolicyRow(account_id=account_id, default_mode=mode))
        else:
            row.default_mode = mode


def _rule(pattern: str, action: str) -> HostRule:
    try:
        return HostRule(pattern=pattern, action=action)
    except ValueError as exc:
        raise InvalidInput(f"invalid host rule: {exc}", code="invalid_policy") from exc


def upsert_rule(engine: Engine, *, account_id: str, pattern: str, action: str) -> HostRule:
    """Add a rule, or change the action of the rule with the same (normalized) pattern."""
    rule = _rule(pattern, action)
    with session_scope(engine) as session:
        row = session.execute(select(HostRuleRow).where(HostRuleRow.account_id == account_id,
                                                        HostRuleRow.pattern == rule.pattern)).scalar_one_or_none()
        if row is None:
            session.add(HostRuleRow(id=str(uuid.uuid4()), account_id=account_id, pattern=rule.pattern,
                                    action=rule.action))
        else:
            row.action = rule.action
    return rule


def delete_rule(engine: Engine, *, account_id: str, pattern: str) -> None:
    normalized = _rule(pattern, "allow").pattern
    with session_scope(engine) as session:
        row = session.execute(select(HostRuleRow).where(HostRuleRow.account_id == account_id,
                                                        HostRuleRow.pattern == normalized)).scalar_one_or_none()
        if row is None:
            raise NotFound(f"no host rule for {pattern!r}")
        session.delete(row)


def replace_policy(engine: Engine, *, account_id: str, default: str, rules: list[tuple[str, str]]) -> HostPolicy:
    """Replace the whole policy (default mode and every rule) in one transaction; rules are validated first, so
    a bad one changes nothing. Two rules with the same normalized pattern: the last one wins.

    Raises:
        InvalidInput: an invalid pattern or action, or a default other than allow/block.
    """
    if default not in ("allow", "block"):
        raise InvalidInput(f"default mode must be 'allow' or 'block', got {default!r}", code="invalid_policy")
    parsed = {rule.pattern: rule for rule in (_rule(pattern, action) for pattern, action in rules)}
    with session_scope(engine) as session:
        row = session.get(HostPolicyRow, account_id)
        if row is None:
            session.add(HostPolicyRow(account_id=account_id, default_mode=default))
        else:
            row.default_mode = default
        for old in session.execute(select(HostRuleRow).where(HostRuleRow.account_id == account_id)).scalars():
            session.delete(old)
        session.flush()
        for rule in parsed.values():
            session.add(HostRuleRow(id=str(uuid.uuid4()), account_id=account_id, pattern=rule.pattern,
                                    action=rule.action))
    return get_policy(engine, account_id=account_id)


def record_blocked(engine: Engine, *, run_id: str, account_id: str, host: str) -> None:
    """Count one refusal of ``host`` for the run (an atomic upsert: concurrent refusals all count)."""
    now = utcnow()
    values = {"run_id": run_id, "host": host, "account_id": account_id, "seen_count": 1, "first_seen": now,
              "last_seen": now}
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    stmt = insert(BlockedHost).values(**values)
    stmt = stmt.on_conflict_do_update(index_elements=["run_id", "host"], set_={
        "seen_count": BlockedHost.seen_count + 1, "last_seen": now})
    with session_scope(engine) as session:
        session.execute(stmt)


def blocked_hosts(engine: Engine, *, account_id: str, run_id: str | None = None) -> list[dict[str, object]]:
    """``{host, seen_count, first_seen, last_seen}`` for one run, or aggregated over the account's runs."""
    with Session(engine) as session:
        if run_id is not None:
            rows = session.execute(select(BlockedHost).where(BlockedHost.run_id == run_id,
                                                             BlockedHost.account_id == account_id)
                                   .order_by(BlockedHost.host)).scalars().all()
            return [{"host": r.host, "seen_count": r.seen_count, "first_seen": r.first_seen,
                     "last_seen": r.last_seen} for r in rows]
        grouped = session.execute(
            select(BlockedHost.host, func.sum(BlockedHost.seen_count), func.min(BlockedHost.first_seen),
                   func.max(BlockedHost.last_seen), func.count())
            .where(BlockedHost.account_id == account_id).group_by(BlockedHost.host).order_by(BlockedHost.host)
        ).all()
    return [{"host": h, "seen_count": int(n), "first_seen": _aware(f), "last_seen": _aware(last), "runs": int(runs)}
            for h, n, f, last, runs in grouped]


def _aware(value: datetime) -> datetime:

    return value if value.tzinfo else value.replace(tzinfo=UTC)


# -- secrets ---------------------------------------------------------------------------------------------------


def _encrypt(engine: Engine, row_id: str, value: str) -> tuple[str, str]:
    keyring = keyring_of(engine)
    if keyring is None:
        raise DeploymentKeyError("secrets cannot be stored: no deployment key is configured (set "
                                 f"{KEY_ENV} or {KEY_FILE_ENV}; `benchwright up` makes one)", code="no_deployment_key")
    kid, blob = keyring.encrypt(value.encode(), aad=_aad(row_id))
    return kid, base64.b64encode(blob).decode()


def _aad(row_id: str) -> bytes:
    return f"benchwright-secret:{row_id}".encode()


def put_secret(engine: Engine, *, account_id: str, name: str, value: str, host_pattern: str | None) -> Secret:
    """Create or replace a secret, encrypted under the deployment key; a host_pattern also upserts an allow rule so
    the proxy can reach it.

    Raises:
        DeploymentKeyError: no deployment key is configured (a secret is never stored in clear).
    """
    if host_pattern is not None:
        host_pattern = _rule(host_pattern, "allow").pattern
    with session_scope(engine) as session:
        row = session.execute(select(Secret).where(Secret.account_id == account_id, Secret.name == name)
                              ).scalar_one_or_none()
        if row is None:
            row = Secret(id=str(uuid.uuid4()), account_id=account_id, name=name, host_pattern=host_pattern)
            session.add(row)
        else:
            row.host_pattern = host_pattern
        row.key_id, row.ciphertext = _encrypt(engine, row.id, value)
        row.value = ""
        session.flush()
        public = Secret(id=row.id, account_id=account_id, name=name, value="", host_pattern=host_pattern,
                        created_at=row.created_at)
    if host_pattern is not None:
        upsert_rule(engine, account_id=account_id, pattern=host_pattern, action="allow")
    return public


def list_secrets(engine: Engine, *, account_id: str) -> list[dict[str, object]]:
    """Names and host patterns only: values never leave the store through here."""
    with Session(engine) as session:
        rows = session.execute(select(Secret.name, Secret.host_pattern, Secret.created_at)
                               .where(Secret.account_id == account_id).order_by(Secret.name)).all()
    return [{"name": n, "host_pattern": h, "created_at": c} for n, h, c in rows]


def delete_secret(engine: Engine, *, account_id: str, name: str) -> None:
    with session_scope(engine) as session:
        row = session.execute(select(Secret).where(Secret.account_id == account_id, Secret.name == name)
                              ).scalar_one_or_none()
        if row is None:
            raise NotFound(f"no secret named {name!r}")
        session.delete(row)


def secret_value(engine: Engine, *, account_id: str, name: str) -> str:
    """The value, decrypted, for the model proxy's environment only.

    Raises:
        InvalidInput: the account has no such secret (a launch naming it is refused).
        DeploymentKeyError: the value is encrypted under a key this process does not hold.
    """
    with Session(engine) as session:
        row = session.execute(select(Secret.id, Secret.value, Secret.key_id, Secret.ciphertext)
                              .where(Secret.account_id == account_id, Secret.name == name)).one_or_none()
    if row is None:
        raise InvalidInput(f"the model names secret {name!r}, which this account does not have", code="unknown_secret")
    row_id, value, kid, ciphertext = row
    if kid is None:
        return str(value)  # a row from before migration 0011 on a deployment without a key yet
    return _decrypt(engine, row_id, kid, ciphertext)


def _decrypt(engine: Engine, row_id: str, kid: str, ciphertext: str) -> str:
    keyring = keyring_of(engine)
    if keyring is None:
        raise DeploymentKeyError(f"secrets are encrypted under deployment key {kid}, and no key is configured "
                                 f"(set {KEY_ENV} or {KEY_FILE_ENV})", code="no_deployment_key")
    return keyring.decrypt(kid, base64.b64decode(ciphertext), aad=_aad(row_id)).decode()


def secret_keys_in_use(engine: Engine) -> dict[str | None, int]:
    """How many secrets each deployment key encrypts (``None``: rows still in plaintext)."""
    with Session(engine) as session:
        rows = session.execute(select(Secret.key_id, func.count()).group_by(Secret.key_id)).all()
    return {kid: int(n) for kid, n in rows}


def prepare_secrets(engine: Engine, keyring: Keyring | None) -> int:
    """At the start of the API, a worker or the CLI: bind ``keyring`` to ``engine`` for the secrets code, refuse to
    go on when stored secrets need a key this process does not hold, and encrypt rows still in plaintext (from
    before migration 0011). Returns how many rows it encrypted.

    Raises:
        DeploymentKeyError: encrypted rows and no key, or rows under a key that is not configured.
    """
    bind(engine, keyring)
    usage = secret_keys_in_use(engine)
    encrypted = {kid: n for kid, n in usage.items() if kid is not None}
    if encrypted and keyring is None:
        raise DeploymentKeyError(
            f"refusing to start: the store holds {sum(encrypted.values())} encrypted secret(s) and no deployment key "
            f"is configured. Set {KEY_ENV} (base64) or {KEY_FILE_ENV} (a file of keys) to the key they were "
            f"encrypted under (key id {', '.join(sorted(encrypted))}), or restore <data dir>/deployment.key.",
            code="no_deployment_key")
    if keyring is not None:
        unknown = sorted(set(encrypted) - set(keyring.ids))
        if unknown:
            raise DeploymentKeyError(
                f"refusing to start: {sum(encrypted[k] for k in unknown)} secret(s) are encrypted under deployment "
                f"key(s) {', '.join(unknown)}, which are not among the configured keys ({', '.join(keyring.ids)} "
                f"from {keyring.source}). Configure the old key too (second line of the key file, or after a comma "
                f"in {KEY_ENV}) and run `benchwright keys rotate`.", code="unknown_deployment_key")
    if keyring is None or not usage.get(None):
        return 0
    changed = reencrypt_secrets(engine, only_plaintext=True)
    if changed and engine.dialect.name == "sqlite":
        _scrub_sqlite(engine)
    return changed


def _scrub_sqlite(engine: Engine) -> None:
    """Rewrite the SQLite file (and empty its WAL) so the plaintext the rows held leaves the disk, not only the
    rows: a deleted value otherwise lingers in free pages and WAL frames. Once, when plaintext rows were encrypted."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.exec_driver_sql("VACUUM")
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def reencrypt_secrets(engine: Engine, *, only_plaintext: bool = False) -> int:
    """Re-encrypt every secret not under the primary deployment key (or, with ``only_plaintext``, every plaintext
    one); returns how many rows changed. Row by row, each update conditional on the row being unchanged since it
    was read, so a secret replaced meanwhile (or a second process doing the same) is never overwritten."""
    keyring = keyring_of(engine)
    if keyring is None:
        raise DeploymentKeyError(f"no deployment key is configured (set {KEY_ENV} or {KEY_FILE_ENV})",
                                 code="no_deployment_key")
    primary = keyring.primary_id
    with Session(engine) as session:
        stale = select(Secret.id, Secret.value, Secret.key_id, Secret.ciphertext)
        stale = stale.where(Secret.key_id.is_(None)) if only_plaintext else stale.where(  # type: ignore[union-attr]
            (Secret.key_id.is_(None)) | (Secret.key_id != primary))  # type: ignore[union-attr]
        rows = session.execute(stale).all()
    changed = 0
    for row_id, value, kid, ciphertext in rows:
        plain = str(value) if kid is None else _decrypt(engine, row_id, kid, ciphertext)
        new_kid, new_blob = _encrypt(engine, row_id, plain)
        with session_scope(engine) as session:
            same = (Secret.key_id.is_(None) if kid is None  # type: ignore[union-attr]
                    else (Secret.key_id == kid) & (Secret.ciphertext == ciphertext))
            done = session.execute(update(Secret).where(Secret.id == row_id, same)
                                   .values(key_id=new_kid, ciphertext=new_blob, value=""))
            changed += done.rowcount  # type: ignore[attr-defined]
    return changed


# -- compute -------------------------------------------------------------------------------------------------


def saved_compute(engine: Engine, *, account_id: str) -> str | None:
    """The compute provider the account saved (``PUT /v1/settings/compute``), read at every launch."""
    with Session(reader(engine)) as session:
        row = session.get(AccountSettings, account_id)
    return row.compute if row else None


def save_compute(engine: Engine, *, account_id: str, compute: str | None) -> None:
    with session_scope(engine) as session:
        row = session.get(AccountSettings, account_id)
        if row is None:
            session.add(AccountSettings(account_id=account_id, compute=compute))
        else:
            row.compute = compute
