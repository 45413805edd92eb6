"""``benchwright keys`` (the deployment key: list, rotate, retire, generate) and the API-key commands of
``benchwright accounts`` (keys, add-key, rotate-key, revoke-key). Operator commands: they open the store directly."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from benchwright.settings import Settings, default_data_dir

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)
keys_app = typer.Typer(no_args_is_help=True, help="The deployment key that encrypts provider secrets and Temporal "
                                                  "payloads (docs/security.md).")

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ~/.benchwright, or "
                                                                    "$BENCHWRIGHT_DATA_DIR).")]
KeyName = Annotated[str, typer.Option("--key-name", help="The API key's name (see `benchwright accounts keys`).")]


def _settings(data_dir: Path | None) -> Settings:
    directory = (data_dir or Path(os.environ.get("BENCHWRIGHT_DATA_DIR", default_data_dir()))).expanduser().resolve()
    return Settings(data_dir=directory)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(1)


def _store(settings: Settings, *, secrets: bool = False) -> Any:
    """The migrated store; with ``secrets``, its secrets bound to the deployment keys (and plaintext encrypted)."""
    from benchwright.security.crypto import load_keyring
    from benchwright.store.db import make_engine, migrate
    from benchwright.store.policy import prepare_secrets

    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    if secrets:
        prepare_secrets(engine, load_keyring(settings))
    return engine


# -- deployment keys -------------------------------------------------------------------------------------------------


@keys_app.command("generate")
def keys_generate() -> None:
    """Print a fresh deployment key (base64 of 32 random bytes), for BENCHWRIGHT_DEPLOYMENT_KEY or a key file."""
    from benchwright.security.crypto import generate_key

    out.print(generate_key(), highlight=False)


@keys_app.command("list")
def keys_list(data_dir: DataDir = None) -> None:
    """The configured deployment keys (ids only, never the keys) and how many secrets each encrypts."""
    from benchwright.errors import BenchwrightError
    from benchwright.security.crypto import load_keyring
    from benchwright.store.policy import secret_keys_in_use

    settings = _settings(data_dir)
    try:
        keyring = load_keyring(settings)
        usage = secret_keys_in_use(_store(settings))
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    table = Table("key id", "role", "secrets")
    ids = keyring.ids if keyring else []
    for i, kid in enumerate(ids):
        table.add_row(kid, "encrypts" if i == 0 else "decrypts only", str(usage.get(kid, 0)))
    for used, n in usage.items():
        if used not in ids:
            table.add_row(used or "(plaintext)", "[red]not configured[/red]" if used else "-", str(n))
    out.print(table)
    console.print(f"keys from {keyring.source}" if keyring else "no deployment key is configured")


@keys_app.command("rotate")
def keys_rotate(data_dir: DataDir = None) -> None:
    """Re-encrypt every secret under a new deployment key.

    With a key file (the data directory's deployment.key, or BENCHWRIGHT_DEPLOYMENT_KEY_FILE): a new key is put
    first in the file, the old ones stay listed (running processes re-read the file and keep decrypting), and every
    secret is re-encrypted under the new one. With BENCHWRIGHT_DEPLOYMENT_KEY: put the new key first there on every
    process (old keys after a comma), restart them, then run this to re-encrypt. Retire an old key (`keys retire`)
    only once no secret uses it and Temporal histories written under it are past retention.
    """
    from benchwright.errors import BenchwrightError
    from benchwright.security.crypto import (
        bind,
        generate_key,
        key_file_of,
        key_id,
        load_keyring,
        read_key_file,
        write_key_file,
    )
    from benchwright.store.policy import reencrypt_secrets, secret_keys_in_use

    settings = _settings(data_dir)
    try:
        engine = _store(settings, secrets=True)  # also refuses when rows need a key that is not configured
        path = key_file_of(settings)
        if path is not None:
            new = base64.b64decode(generate_key())
            write_key_file(path, [new, *read_key_file(path)])
            console.print(f"new deployment key {key_id(new)} written first in {path}; the old keys stay listed")
            bind(engine, load_keyring(settings))
        elif settings.deployment_key is None:
            raise _fail("no deployment key is configured: `benchwright up` makes one, or set "
                        "BENCHWRIGHT_DEPLOYMENT_KEY / BENCHWRIGHT_DEPLOYMENT_KEY_FILE")
        changed = reencrypt_secrets(engine)
        usage = secret_keys_in_use(engine)
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    keyring = load_keyring(settings)
    assert keyring is not None
    console.print(f"re-encrypted {changed} secret(s) under {keyring.primary_id}; secrets per key: "
                  + ", ".join(f"{k or 'plaintext'}={n}" for k, n in usage.items()))
    if path is None and changed == 0:
        console.print("nothing to re-encrypt: every secret is under the first key of BENCHWRIGHT_DEPLOYMENT_KEY. To "
                      "rotate, put a new key (`benchwright keys generate`) first there on every process, restart "
                      "them, and run this again.")


@keys_app.command("retire")
def keys_retire(key: Annotated[str, typer.Argument(help="The key id to remove from the key file.")],
                data_dir: DataDir = None,
                yes: Annotated[bool, typer.Option(
                    "--yes", help="Confirm that Temporal histories written under this key are past retention (a "
                                  "running workflow's history must stay decodable).")] = False) -> None:
    """Remove an old key from the key file, once no secret is encrypted under it."""
    from benchwright.errors import BenchwrightError
    from benchwright.security.crypto import key_file_of, key_id, read_key_file, write_key_file
    from benchwright.store.policy import secret_keys_in_use

    settings = _settings(data_dir)
    try:
        path = key_file_of(settings)
        if path is None:
            raise _fail("the deployment keys come from BENCHWRIGHT_DEPLOYMENT_KEY: remove the key there")
        keys = read_key_file(path)
        ids = [key_id(k) for k in keys]
        if key not in ids:
            raise _fail(f"{path} has no key {key} (it has {', '.join(ids)})")
        if ids[0] == key:
            raise _fail(f"{key} is the key that encrypts: rotate first (`benchwright keys rotate`)")
        used = secret_keys_in_use(_store(settings)).get(key, 0)
        if used:
            raise _fail(f"{used} secret(s) are still encrypted under {key}: run `benchwright keys rotate` first")
        if not yes:
            raise _fail("Temporal histories written before the rotation are encrypted under this key; once they are "
                        "past the namespace's retention, run again with --yes")
        write_key_file(path, [k for k, kid in zip(keys, ids, strict=True) if kid != key])
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    console.print(f"removed deployment key {key} from {path}")


# -- API keys (registered on `benchwright accounts`) ------------------------------------------------------------------


def _print_new(account: str, info: Any, key: str) -> None:
    console.print(f"account [bold]{account}[/bold]: API key [bold]{info.name}[/bold] ({info.prefix}…); the key, "
                  "shown only this once:")
    out.print(key, highlight=False)


def accounts_keys(name: str, data_dir: DataDir = None) -> None:
    """An account's API keys: names, prefixes, when made and last used (never the keys)."""
    from benchwright.errors import BenchwrightError
    from benchwright.store.accounts import list_keys

    try:
        rows = list_keys(_store(_settings(data_dir)), account_name=name)
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    table = Table("name", "prefix", "created", "last used")
    for r in rows:
        table.add_row(r.name, r.prefix, f"{r.created_at:%Y-%m-%d %H:%M}",
                      f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "never")
    out.print(table)


def accounts_add_key(name: str, key_name: Annotated[str | None, typer.Option(
                         "--key-name", help="Name of the new key (default: its prefix).")] = None,
                     data_dir: DataDir = None) -> None:
    """Issue another API key for an account and print it (shown only this once)."""
    from benchwright.errors import BenchwrightError
    from benchwright.store.accounts import add_key

    try:
        info, key = add_key(_store(_settings(data_dir)), account_name=name, name=key_name)
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    _print_new(name, info, key)


def accounts_rotate_key(name: str, key_name: KeyName = "default", data_dir: DataDir = None) -> None:
    """Replace an API key by a fresh one of the same name; the old key answers 401 at once."""
    from benchwright.errors import BenchwrightError
    from benchwright.store.accounts import rotate_key

    try:
        info, key = rotate_key(_store(_settings(data_dir)), account_name=name, name=key_name)
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    _print_new(name, info, key)


def accounts_revoke_key(name: str, key_name: KeyName, data_dir: DataDir = None) -> None:
    """Revoke an API key; it answers 401 at once (an account keeps at least one key)."""
    from benchwright.errors import BenchwrightError
    from benchwright.store.accounts import revoke_key

    try:
        revoke_key(_store(_settings(data_dir)), account_name=name, name=key_name)
    except BenchwrightError as exc:
        raise _fail(exc.message) from None
    console.print(f"revoked API key {key_name!r} of account {name}")
