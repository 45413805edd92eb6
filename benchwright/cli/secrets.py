"""``benchwright secrets set | list | rm``: the account's provider secrets (API keys) from the command line, so a
keyed model can be run with ``run --secret NAME``. Registered on the main app by ``benchwright/cli/app.py``.

A value never travels in argv (where ``ps`` and shell history would show it) and is never printed: ``set`` reads it
from stdin (a hidden prompt on a terminal) or from an environment variable named by ``--from-env``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from benchwright.cli.answers import ApiKey, ApiUrl, DataDir, JsonOut, _call, _print
from benchwright.cli.support import console

secrets_app = typer.Typer(no_args_is_help=True, help="Provider secrets (API keys) the runs' model calls use; "
                                                     "values are write-only.")
MAX_SECRET_BYTES = 8192
"""As ``POST /v1/secrets`` admits a value."""


def _fail(message: str) -> None:

    console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(2)


def read_value(from_env: str | None) -> str:
    """The secret's value: from ``$from_env``, else a hidden prompt on a terminal, else all of stdin (one trailing
    newline dropped, as ``echo`` and ``printf '%s\\n'`` add it). Exits 2 naming what is missing; never echoes."""
    if from_env is not None:
        value = os.environ.get(from_env)
        if value is None:
            _fail(f"--from-env {from_env}: the environment has no {from_env}")
    elif sys.stdin.isatty():
        import getpass

        value = getpass.getpass("value (not echoed): ")
    else:
        value = sys.stdin.read(MAX_SECRET_BYTES + 2)
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    assert value is not None
    if not value:
        _fail("the secret's value is empty (pipe it on stdin, or name a variable with --from-env)")
    if len(value.encode()) > MAX_SECRET_BYTES:
        _fail(f"the secret's value is over {MAX_SECRET_BYTES} bytes")
    return value


@secrets_app.command("set")
def secrets_set(name: Annotated[str, typer.Argument(help="The secret's name, e.g. OPENROUTER_API_KEY.")],
                from_env: Annotated[str | None, typer.Option(
                    "--from-env", metavar="VAR", help="Read the value from this environment variable (default: "
                    "stdin, or a hidden prompt on a terminal).")] = None,
                host: Annotated[str | None, typer.Option(
                    "--host", metavar="PATTERN", help="A host pattern the secret is for (also allowed in your host "
                    "policy), e.g. openrouter.ai.")] = None,
                data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Store (or replace) a secret; the value comes from stdin or --from-env, never from the command line."""
    value = read_value(from_env)
    made = _call(lambda c: c.set_secret(name, value, host_pattern=host), data_dir, api_url, api_key)
    where = f" for {made['host_pattern']}" if made.get("host_pattern") else ""
    _print(f"stored secret {made['name']}{where}; use it with: benchwright run --secret {made['name']} ...")


@secrets_app.command("list")
def secrets_list(json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
                 api_key: ApiKey = None) -> None:
    """Your secrets' names, host patterns and creation times (values are never shown)."""
    from benchwright.cli.support import fitted_table

    found = _call(lambda c: c.secrets(), data_dir, api_url, api_key)
    if json_out:
        _print(json.dumps(found, indent=2))
    elif not found:
        _print("no secrets")
    else:
        rows = [[s["name"], s["host_pattern"] or "-", str(s["created_at"])[:19].replace("T", " ")] for s in found]
        _print(fitted_table(["name", "host", "created"], rows, whole=("name", "host"), box=None))


@secrets_app.command("rm")
def secrets_rm(name: str, data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Delete a secret (runs that name it are refused from then on)."""
    try:
        _call(lambda c: c.delete_secret(name), data_dir, api_url, api_key)
    except ValueError as exc:
        _fail(str(exc))
    _print(f"deleted secret {name}")
