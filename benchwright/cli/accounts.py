"""``benchwright accounts create``, ``credit`` and ``quota`` (an operator's commands on the stack's database). The
``accounts`` group is added to the main app by ``benchwright/cli/app.py``, which also hangs the key commands on it."""

from __future__ import annotations

from typing import Annotated

import typer

from benchwright.cli.support import DataDir, console, out
from benchwright.cli.support import data_dir_of as _data_dir
from benchwright.settings import Settings

accounts_app = typer.Typer(no_args_is_help=True, help="Accounts and their API keys.")


@accounts_app.command("create")
def accounts_create(name: str, data_dir: DataDir = None,
                    local_paths: Annotated[bool, typer.Option(
                        "--local-paths", help="Let the account name dataset files on the worker's host (where the "
                        "deployment allows local paths; never the data directory or secret-holding places).")] = False,
                    admin: Annotated[bool, typer.Option(
                        "--admin", help="A platform administrator: may halt any account's run (the admin "
                        "halt, docs/concepts.md §9; 'benchwright admin halt').")] = False,
                    ) -> None:
    """Create an account and print its API key (shown only this once)."""
    from benchwright.errors import BenchwrightError
    from benchwright.store.accounts import create_account
    from benchwright.store.db import make_engine, migrate

    settings = Settings(data_dir=_data_dir(data_dir))
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    try:
        account, key = create_account(engine, name=name, balance_usd=settings.initial_balance_usd,
                                      local_paths=local_paths, admin=admin)
    except BenchwrightError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    console.print(f"created {'admin ' if admin else ''}account [bold]{account.name}[/bold] ({account.id}, balance "
                  f"${account.balance_usd:.2f}); its API key:")
    out.print(key, highlight=False)


@accounts_app.command("credit")
def accounts_credit(name: str, amount: Annotated[float, typer.Argument(help="USD to add to the balance.")],
                    data_dir: DataDir = None) -> None:
    """Add credit to an account's balance."""
    from benchwright.errors import BenchwrightError
    from benchwright.store.accounts import credit
    from benchwright.store.db import make_engine, migrate

    engine = make_engine(Settings(data_dir=_data_dir(data_dir)).resolved_database_url())
    migrate(engine)
    try:
        balance = credit(engine, account_name=name, amount_usd=amount)
    except BenchwrightError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    out.print(f"{name}: balance ${balance:.2f}", highlight=False)


@accounts_app.command("quota")
def accounts_quota(name: str, data_dir: DataDir = None,
                   runs: Annotated[int | None, typer.Option(help="Runs running at once.")] = None,
                   model_calls: Annotated[int | None, typer.Option(
                       help="Model calls in flight at once on one worker, across the account's runs.")] = None,
                   tasks: Annotated[int | None, typer.Option(help="Tasks of running runs not yet scored.")] = None,
                   reset: Annotated[list[str] | None, typer.Option(
                       help="Put a quota back to the deployment's default (runs, model-calls, tasks); repeatable.")]
                   = None) -> None:
    """Show an account's quotas, or set them (an operator's command; admins also have PUT
    /v1/admin/accounts/NAME/quota). Without options it prints the quotas in force and what the account uses."""
    from rich.table import Table
    from sqlmodel import Session, select

    from benchwright.errors import BenchwrightError, NotFound
    from benchwright.security.quotas import quotas_for, set_quotas, usage
    from benchwright.store.db import make_engine, migrate
    from benchwright.store.models import Account

    settings = Settings(data_dir=_data_dir(data_dir))
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    values: dict[str, int | None] = {k: v for k, v in (("runs", runs), ("model_calls", model_calls),
                                                       ("tasks", tasks)) if v is not None}
    try:
        if values or reset:
            set_quotas(engine, settings, account_name=name, values=values,
                       reset=tuple(r.replace("-", "_") for r in reset or ()))
        with Session(engine) as session:
            account = session.exec(select(Account).where(Account.name == name)).one_or_none()
        if account is None:
            raise NotFound(f"no account named {name!r}")
        quotas = quotas_for(engine, settings, account_id=account.id)
        used = usage(engine, account_id=account.id)
    except BenchwrightError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    table = Table("quota", "limit", "in use", "source")
    for quota, limit, now in (("runs", quotas.runs, str(used.runs)), ("model-calls", quotas.model_calls, "-"),
                              ("tasks", quotas.tasks, str(used.tasks))):
        source = "account" if quota.replace("-", "_") in quotas.overridden else "deployment default"
        table.add_row(quota, str(limit), now, source)
    out.print(f"account {name}")
    out.print(table)
