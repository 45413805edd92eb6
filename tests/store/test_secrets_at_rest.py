"""Provider secrets rest encrypted under the deployment key, on SQLite and Postgres (issue 23): a dump of the store
holds no secret value; plaintext rows from before migration 0011 are encrypted at the first start with a key; a
start without the key they need is refused; a rotation re-encrypts every row under the new key."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from sqlalchemy import insert, inspect, text

from benchwright.security.crypto import DeploymentKeyError, Keyring, bind
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.models import Secret
from benchwright.store.policy import (
    prepare_secrets,
    put_secret,
    reencrypt_secrets,
    secret_keys_in_use,
    secret_value,
)


def _ring(*keys: bytes) -> Keyring:
    return Keyring(list(keys), source="test")


def _dump(url: str, engine) -> bytes:  # type: ignore[no-untyped-def]
    """Everything the store holds, as an attacker with a backup would read it: the SQLite files' bytes, or
    ``pg_dump`` of the Postgres schema (every row of every table, when pg_dump is not installed)."""
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return b"".join(p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    schema = unquote(url.split("search_path%3D", 1)[1])
    parsed = urlparse(url.split("?", 1)[0].replace("+psycopg", ""))
    if shutil.which("pg_dump"):
        env = {**os.environ, **({"PGPASSWORD": parsed.password} if parsed.password else {})}
        return subprocess.run(["pg_dump", "-h", parsed.hostname or "127.0.0.1", "-p", str(parsed.port or 5432),
                               "-U", parsed.username or "postgres", "-n", schema, "--data-only",
                               parsed.path.lstrip("/")], env=env, capture_output=True, check=True, timeout=60).stdout
    with engine.connect() as conn:  # pragma: no cover - the image has pg_dump
        return b"".join(repr(conn.execute(text(f'SELECT * FROM "{t}"')).all()).encode()
                        for t in inspect(engine).get_table_names())


def _secret() -> str:
    return f"sk-live-{uuid.uuid4().hex}"


def test_a_dump_of_the_store_holds_no_secret_value(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    prepare_secrets(engine, _ring(os.urandom(32)))
    account, _ = create_account(engine, name="a")
    values = [_secret() for _ in range(3)]
    for i, value in enumerate(values):
        put_secret(engine, account_id=account.id, name=f"K{i}", value=value, host_pattern=None)
    put_secret(engine, account_id=account.id, name="K0", value=values[0], host_pattern=None)  # a replace, too
    assert [secret_value(engine, account_id=account.id, name=f"K{i}") for i in range(3)] == values
    dump = _dump(db_url, engine)
    assert b"K1" in dump or db_url.startswith("sqlite"), "the dump is of the right store"
    for value in values:
        assert value.encode() not in dump
    engine.dispose()


def test_plaintext_rows_are_encrypted_at_the_first_start_with_a_key(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="a")
    value = _secret()
    with engine.begin() as conn:  # a row as it was stored before migration 0011
        conn.execute(insert(Secret).values(id=str(uuid.uuid4()), account_id=account.id, name="OLD", value=value))
    prepare_secrets(engine, None)  # no key yet: the legacy row stays readable, nothing refuses
    assert secret_value(engine, account_id=account.id, name="OLD") == value
    ring = _ring(os.urandom(32))
    assert prepare_secrets(engine, ring) == 1
    assert secret_keys_in_use(engine) == {ring.primary_id: 1}
    assert secret_value(engine, account_id=account.id, name="OLD") == value
    assert value.encode() not in _dump(db_url, engine), "not in a row, nor in SQLite's free pages or WAL"
    assert prepare_secrets(engine, ring) == 0, "idempotent"
    engine.dispose()


def test_a_start_without_the_key_is_refused_and_says_what_to_set(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="a")
    ring = _ring(os.urandom(32))
    prepare_secrets(engine, ring)
    put_secret(engine, account_id=account.id, name="K", value=_secret(), host_pattern=None)
    with pytest.raises(DeploymentKeyError) as missing:
        prepare_secrets(engine, None)
    assert "BENCHWRIGHT_DEPLOYMENT_KEY" in missing.value.message and ring.primary_id in missing.value.message
    with pytest.raises(DeploymentKeyError) as wrong:
        prepare_secrets(engine, _ring(os.urandom(32)))
    assert ring.primary_id in wrong.value.message and "keys rotate" in wrong.value.message
    bind(engine, None)
    with pytest.raises(DeploymentKeyError):  # and no secret is ever stored in clear
        put_secret(engine, account_id=account.id, name="K2", value="x", host_pattern=None)
    engine.dispose()


def test_rotation_re_encrypts_every_secret_under_the_new_key(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    old, new = os.urandom(32), os.urandom(32)
    prepare_secrets(engine, _ring(old))
    accounts = [create_account(engine, name=n)[0] for n in ("a", "b")]
    values = {(a.id, i): _secret() for a in accounts for i in range(3)}
    for (account_id, i), value in values.items():
        put_secret(engine, account_id=account_id, name=f"K{i}", value=value, host_pattern=None)
    during = _ring(new, old)  # the old key stays listed while the rotation runs
    prepare_secrets(engine, during)
    assert reencrypt_secrets(engine) == 6 and reencrypt_secrets(engine) == 0
    assert secret_keys_in_use(engine) == {during.primary_id: 6}
    prepare_secrets(engine, _ring(new))  # the old key can go now
    assert {k: secret_value(engine, account_id=k[0], name=f"K{k[1]}") for k in values} == values
    with pytest.raises(DeploymentKeyError):
        prepare_secrets(engine, _ring(old))
    engine.dispose()
