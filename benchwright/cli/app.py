"""The ``benchwright`` command line. Imports stay light (no litellm, no Temporal) until a command needs them."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli.accounts import accounts_app
from benchwright.cli.demo import demo, dev_model, scripted_llm
from benchwright.cli.support import DataDir, VisibleSuggestions, console, out
from benchwright.cli.support import client_for as _client
from benchwright.cli.support import data_dir_of as _data_dir
from benchwright.cli.support import first_error as _first_error
from benchwright.cli.support import run_succeeded as _run_succeeded
from benchwright.cli.support import run_summary as _summary
from benchwright.cli.support import watch as watch_run
from benchwright.settings import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Benchwright: run a model against a benchmark as one durable workflow and get a comparable "
                       "score with the full event log behind it.")
app.add_typer(accounts_app, name="accounts")
admin_app = typer.Typer(no_args_is_help=True, help="Platform administration (admin accounts only).")
app.add_typer(admin_app, name="admin")


@app.command()
def up(data_dir: DataDir = None,
       api_port: Annotated[int, typer.Option(help="API port on 127.0.0.1.")] = 8700,
       temporal_port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
       ui_port: Annotated[int, typer.Option(help="Temporal UI port.")] = 8233,
       shutdown_timeout: Annotated[float, typer.Option(
           min=1.0, help="Seconds Ctrl-C/SIGTERM gives the worker, API and Temporal to stop (and the worker to kill "
                         "its sandboxes and model proxies) before SIGKILL.")] = 30.0,
       allow_unisolated: Annotated[bool, typer.Option(
           help="Where Linux namespaces are unavailable (not root), run scorers WITHOUT isolation instead of "
                "refusing; recorded on every run as isolation 'none'.")] = False) -> None:
    """Start the embedded stack (Temporal dev server, worker, API) until Ctrl-C; then stop all of it (model proxies
    and sandboxes included). What a killed stack left running is stopped at the next start."""
    from benchwright.stack.supervisor import StackConfig, run_up

    if allow_unisolated:
        os.environ["BENCHWRIGHT_ALLOW_UNISOLATED"] = "true"
        console.print("[yellow]warning:[/yellow] sandboxes may run without isolation on this host (--allow-unisolated)")
    cfg = StackConfig(data_dir=_data_dir(data_dir), api_port=api_port, temporal_port=temporal_port, ui_port=ui_port,
                      shutdown_timeout_s=shutdown_timeout)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    raise typer.Exit(run_up(cfg, say=lambda m: console.print(m, highlight=False)))


@app.command()
def worker(data_dir: DataDir = None) -> None:
    """Run one more worker against the stack whose data directory is given (workers scale out on one queue)."""
    import asyncio

    from worker import run_worker

    directory = _data_dir(data_dir)
    overrides: dict[str, Any] = {"data_dir": directory}
    dev = directory / "dev.json"
    if "BENCHWRIGHT_TEMPORAL_ADDRESS" not in os.environ and dev.exists():
        overrides["temporal_address"] = json.loads(dev.read_text())["temporal_address"]
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from benchwright.errors import BenchwrightError

    try:
        # asyncio's own loop, not uvloop: 12 % less CPU per task on uvloop, but a full test run with the worker on
        # it hung for good with its loop idle, unexplained (docs/performance.md, session 15).
        asyncio.run(run_worker(Settings(**overrides)))
    except KeyboardInterrupt:
        pass
    except BenchwrightError as exc:  # e.g. encrypted secrets and no deployment key: say why, no traceback
        console.print(f"[red]error:[/red] {exc.message}", highlight=False)
        raise typer.Exit(1) from None


def _control(command: str, run_id: str, data_dir: Path | None, api_url: str | None, api_key: str | None,
             **kwargs: Any) -> None:
    from benchwright.client import ApiError

    try:
        with _client(data_dir, api_url, api_key) as client:
            run = getattr(client, command)(run_id, **kwargs)
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    out.print(f"run {run['id']}: {run['display_status']}"
              + (f" ({run['halt_reason']})" if run["halt_reason"] else ""), highlight=False)


ApiUrl = Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_URL")]
ApiKey = Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_KEY")]


@app.command()
def halt(run_id: str, reason: Annotated[str | None, typer.Option(help="Why (recorded).")] = None,
         admin: Annotated[bool, typer.Option("--admin", help="Halt any account's run as a platform administrator "
                                                            "('admin: <reason>'; --reason required).")] = False,
         data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Stop a run for good (operator_kill); what it measured is kept."""
    if admin:
        admin_halt(run_id, reason=reason or "", data_dir=data_dir, api_url=api_url, api_key=api_key)
        return
    _control("stop", run_id, data_dir, api_url, api_key, reason=reason)


@admin_app.command("halt")
def admin_halt(run_id: str, reason: Annotated[str, typer.Option(help="Why (recorded as 'admin: <reason>').")],
               data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Halt any account's run for good (the admin halt, docs/concepts.md §9; display_status killed); needs an admin
    account's key."""
    if not reason.strip():
        console.print("[red]error:[/red] an admin halt needs --reason (it is recorded as 'admin: <reason>')")
        raise typer.Exit(2)
    _control("admin_halt", run_id, data_dir, api_url, api_key, reason=reason)


@admin_app.command("audit")
def admin_audit(limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many entries, newest first.")
                                 ] = 50,
                action: Annotated[str | None, typer.Option(help="Only this action, e.g. run.admin_halt, "
                                                           "impl.promote, account.credit.")] = None,
                json_out: Annotated[bool, typer.Option("--json", help="Print the entries as a JSON array.")] = False,
                data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """The audit trail of admin and operator actions: when, who, what, on what (needs an admin account's key)."""
    from rich.markup import escape
    from rich.table import Table

    from benchwright.client import ApiError

    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    try:
        with _client(data_dir, api_url, api_key) as client:
            while len(entries) < limit:
                page = client.admin_audit(limit=min(200, limit - len(entries)), cursor=cursor, action=action)
                entries += page["entries"]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if json_out:
        out.print(json.dumps(entries, indent=2), highlight=False, markup=False)
        return
    if not entries:
        console.print("no audit entries")
        return
    table = Table("when (UTC)", "who", "action", "target", "detail")
    for e in entries:
        table.add_row(e["at"][:19].replace("T", " "), escape(e["actor"]), e["action"], escape(e["target"]),
                      escape(", ".join(f"{k}={v}" for k, v in e["detail"].items())))
    out.print(table)


@app.command()
def pause(run_id: str, data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Pause a run (operator_pause)."""
    _control("pause", run_id, data_dir, api_url, api_key)


@app.command()
def resume(run_id: str, data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Resume a paused run."""
    _control("resume", run_id, data_dir, api_url, api_key)


@app.command()
def review(run_id: str, resolution: Annotated[str, typer.Argument(help="Your guidance for the Driver, in prose.")],
           data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Resolve a run waiting for human review; the text becomes the Driver's instructions."""
    _control("resolve_review", run_id, data_dir, api_url, api_key, resolution=resolution)


@app.command("runs")
def runs_cmd(status: Annotated[str | None, typer.Option(
                 help="Only runs whose display_status (or status) is this: running, ok, error, halted, killed, "
                      "waiting, paused.")] = None,
             model: Annotated[str | None, typer.Option(help="Only runs whose model identifier contains this.")
                              ] = None,
             limit: Annotated[int, typer.Option(min=1, help="At most this many runs (newest first).")] = 20,
             json_out: Annotated[bool, typer.Option("--json", help="Print the runs as a JSON array.")] = False,
             data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List your runs, newest first."""
    from itertools import islice

    from benchwright.cli.support import model_name, runs_table
    from benchwright.client import ApiError

    try:
        with _client(data_dir, api_url, api_key) as client:
            found = list(islice((r for r in client.iter_runs()
                                 if (status is None or status in (r["display_status"], r["status"]))
                                 and (model is None or model in model_name(r))), limit))
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if json_out:
        out.print(json.dumps(found, indent=2), highlight=False, markup=False)
    elif found:
        out.print(runs_table(found))
    else:
        console.print("no runs")


@app.command()
def events(run_id: str,
           follow: Annotated[bool, typer.Option(
               "--follow", "-f", help="Stream new events live (SSE; resumes after a dropped connection) until the "
               "run ends.")] = False,
           after: Annotated[int, typer.Option(min=-1, help="Start after this seq (-1: from the start).")] = -1,
           json_out: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
           data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Print a run's event log, one line per event (seq, time, type, data)."""
    from collections.abc import Iterator

    from benchwright.cli.support import event_line
    from benchwright.client import ApiError

    def logged(client: Any) -> Iterator[dict[str, Any]]:
        cursor = after
        while True:
            page = client.events(run_id, after=cursor)
            yield from page["events"]
            if not page["events"]:
                return
            cursor = page["next_after"]

    try:
        with _client(data_dir, api_url, api_key) as client:
            run_id = client.resolve_run_id(run_id)
            for event in (client.stream_events(run_id, after=after) if follow else logged(client)):
                out.print(json.dumps(event) if json_out else event_line(event), highlight=False, markup=False,
                          soft_wrap=True)
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


@app.command()
def tasks(run_id: str,
          json_out: Annotated[bool, typer.Option("--json", help="Print the rows as a JSON array.")] = False,
          data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Print a run's settled tasks: index, outcome, score and an excerpt of the output (all pages)."""
    from benchwright.cli.support import tasks_table
    from benchwright.client import ApiError

    try:
        with _client(data_dir, api_url, api_key) as client:
            rows = list(client.iter_tasks(run_id))
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if json_out:
        out.print(json.dumps(rows, indent=2), highlight=False, markup=False)
    else:
        out.print(tasks_table(rows))
        console.print(f"{len(rows)} tasks settled")


app.command("dev-model")(dev_model)
app.command("scripted-llm")(scripted_llm)


@app.command(cls=VisibleSuggestions)
def run(model: Annotated[str, typer.Option(help="LiteLLM model string provider/model, e.g. openai/gpt-4o-mini (an "
                                                "OpenAI-compatible endpoint at --api-base: openai/<its model name>).")],
        dataset: Annotated[str | None, typer.Option(help="Dataset URL, or a local path on the stack's host.")
                           ] = None,
        recipe: Annotated[str | None, typer.Option(
            help="A product-sandbox run (docs/agents.md): a bundled recipe (terminal-basics) or a recipe YAML path "
                 "on the stack's host.")] = None,
        prompt: Annotated[str | None, typer.Option(
            help="A natural-language launch: what to evaluate ('gsm8k, the first 50'); Find resolves it against the "
                 "catalog when no --dataset is given, and Analyze reads its scoping phrase.")] = None,
        benchmark: Annotated[str | None, typer.Option(help="Pinned launch: a registry benchmark (id or name).")
                             ] = None,
        subset: Annotated[str | None, typer.Option(help="Pinned launch: the benchmark's subset (id or name).")
                          ] = None,
        impl: Annotated[str | None, typer.Option(help="Pinned launch: an impl id or latest:official (default).")
                        ] = None,
        api_base: Annotated[str | None, typer.Option(help="Base URL of an OpenAI-compatible endpoint.")] = None,
        secret: Annotated[str | None, typer.Option(
            help="The name of your secret holding the model's API key ('benchwright secrets set NAME').")] = None,
        input_cost_per_token: Annotated[float | None, typer.Option(
            min=0, max=1, help="The model's price per input token in USD, for a model LiteLLM's cost map does not "
            "price (needed with a cost limit).")] = None,
        output_cost_per_token: Annotated[float | None, typer.Option(
            min=0, max=1, help="The model's price per output token in USD.")] = None,
        driver: Annotated[str | None, typer.Option(help="The Driver (default: the deployment's).")] = None,
        trials: Annotated[int | None, typer.Option(help="Trials per task (k, 1-100).")] = None,
        aggregator: Annotated[str | None, typer.Option(
            help="Trial aggregator: any_pass, all_pass, mean, majority_on, weighted_mean, min_above.")] = None,
        aggregator_param: Annotated[list[str] | None, typer.Option(
            "--aggregator-param", metavar="KEY=VALUE", help="An aggregator parameter (repeatable): field=answer, "
            "weight=w, threshold=0.8.")] = None,
        concurrency: Annotated[int | None, typer.Option(help="SUT calls in flight during Materialize.")] = None,
        max_tasks: Annotated[int | None, typer.Option(
            "--max-tasks", "-n", min=1, help="Evaluate at most N tasks (the sample count; lm-eval's and inspect's "
            "--limit N): constraints.max_tasks.")] = None,
        limit: Annotated[list[str] | None, typer.Option(
            "--limit", metavar="LEVEL.QUANTITY=N", help="A ceiling (repeatable, docs/concepts.md §9): run.cost=5, "
            "run.duration=600, task.attempts=2, attempt.duration=60 ... ('GET /v1/limits' lists them).")] = None,
        constraints: Annotated[list[str] | None, typer.Option(
            "--constraints", metavar="KEY=N", help="The older ceilings (repeatable): max_cost_cents, "
            "max_duration_ms, max_tasks.")] = None,
        compute: Annotated[str | None, typer.Option(
            help="Compute backend: local, sandbox0, e2b, default or auto (default: your saved choice).")] = None,
        visibility: Annotated[str | None, typer.Option(help="private (default), unlisted or public.")] = None,
        task_impl: Annotated[Path | None, typer.Option(
            "--task-impl", exists=True, dir_okay=False, readable=True,
            help="A task_impl.py to use verbatim instead of the one Atomize writes.")] = None,
        requirement: Annotated[list[str] | None, typer.Option(
            "--requirement", metavar="SPEC", help="A package the scorer needs, e.g. sympy>=1.12 (repeatable).")] = None,
        metadata: Annotated[list[str] | None, typer.Option(
            "--metadata", metavar="KEY=VALUE", help="A label kept on the run (repeatable; KEY:=JSON for a typed "
            "value, e.g. limit:=20).")] = None,
        harness: Annotated[str | None, typer.Option(
            help="How the evaluation runs: benchwright (default), or a harness bridge: inspect, lmeval.")] = None,
        harness_config: Annotated[str | None, typer.Option(
            "--harness-config", metavar="JSON", help="The bridge's harness_config as JSON, or @file.json.")] = None,
        harness_task: Annotated[Path | None, typer.Option(
            "--harness-task", exists=True, dir_okay=False, readable=True,
            help="The bridge's task file (an inspect @task .py, an lm-eval task .yaml): harness_config.task_file.")
                                ] = None,
        harness_file: Annotated[list[Path] | None, typer.Option(
            "--harness-file", exists=True, dir_okay=False, readable=True,
            help="A data file the task reads, put beside it under its own name (repeatable).")] = None,
        group_by: Annotated[str | None, typer.Option(
            help="The dataset column results are grouped by by default (show --by, the run page).")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the run as JSON (the final run with --watch).")
                            ] = False,
        watch: Annotated[bool, typer.Option("--watch/--no-watch", help="Show live progress until it ends.")] = False,
        operator: Annotated[str | None, typer.Option(hidden=True)] = None,
        agent: Annotated[str | None, typer.Option(hidden=True)] = None,
        data_dir: DataDir = None,
        api_url: Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_URL")] = None,
        api_key: Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_KEY")] = None) -> None:
    """Launch a run through the REST API (and optionally watch it). Every key of the launch body has a flag."""
    from benchwright.cli.support import BadFlag, flat, nested, trials_block, with_max_tasks
    from benchwright.client import ApiError
    from benchwright.harness.cli import harness_body

    for retired, value in (("--operator", operator), ("--agent", agent)):
        if value is not None:  # §8: the flag exists only to name its new spelling
            console.print(f"[red]error:[/red] {retired} was renamed --driver (see docs/concepts.md §8): "
                          f"pass --driver {value}")
            raise typer.Exit(2)
    if dataset and not dataset.startswith(("http://", "https://")) and Path(dataset).exists():
        dataset = str(Path(dataset).resolve())
    if recipe and Path(recipe).is_file():  # a path: as the stack's host sees it (a bundled name stays a name)
        recipe = str(Path(recipe).resolve())
    model_spec: dict[str, Any] = {"identifier": model}
    if api_base:
        model_spec["api_base"] = api_base
    if secret:
        model_spec["secret"] = secret
    for price, per_token in (("input_cost_per_token", input_cost_per_token),
                             ("output_cost_per_token", output_cost_per_token)):
        if per_token is not None:
            model_spec[price] = per_token
    try:
        constraints_body = with_max_tasks(flat("--constraints", constraints, numbers=True) if constraints else None,
                                          max_tasks)
        body: dict[str, Any] = {
            "trials": trials_block(k=trials, aggregator=aggregator, params=aggregator_param or []),
            "limits": nested("--limit", limit) if limit else None,
            "constraints": constraints_body,
            "metadata": flat("--metadata", metadata, numbers=False) if metadata else None,
            "task_impl": task_impl.read_text() if task_impl else None, "requirements": requirement or None,
            "concurrency": concurrency, "compute": compute, "visibility": visibility,
            **{k: v for k, v in (("benchmark", benchmark), ("subset", subset), ("impl", impl), ("prompt", prompt),
                                 ("group_by", group_by), ("recipe", recipe)) if v is not None},
            **harness_body(harness, harness_config, harness_task, harness_file or [])}
    except (BadFlag, UnicodeDecodeError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        with _client(data_dir, api_url, api_key) as client:
            launched = client.launch(dataset=dataset, model=model_spec, driver=driver, **body)
            console.print(f"launched run [bold]{launched['id']}[/bold]")
            if benchmark and launched.get("off_leaderboard"):  # a pinned launch: say plainly if it is not listed
                console.print(f"note: this run will not appear on a leaderboard: {launched['off_leaderboard']}",
                              highlight=False, markup=False)
            if watch and prompt and not (dataset or benchmark or harness):  # Find resolves it: say to what, and why
                from benchwright.cli.find import find_resolution, resolution_lines

                found = find_resolution(client, launched["id"])
                for line in resolution_lines(found) if found else []:
                    console.print(line, highlight=False, markup=False)
            if not watch:
                out.print(json.dumps(launched, indent=2) if json_out else launched["id"], highlight=False,
                          markup=False)
                return
            final = watch_run(client, launched["id"])
            first_error = _first_error(client, final)
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if json_out:
        out.print(json.dumps(final, indent=2), highlight=False, markup=False)
    else:
        out.print(_summary(final, first_error), highlight=False, markup=False)
        if final.get("benchmark_id") and final.get("off_leaderboard"):  # filed under a benchmark, yet not listed
            out.print(f"  not on a leaderboard: {final['off_leaderboard']}", highlight=False, markup=False)
    raise typer.Exit(0 if _run_succeeded(final) else 1)


app.command()(demo)


from benchwright.cli.answers import compare_cmd, frontier_cmd, schedule_app, show_cmd  # noqa: E402

app.command("show")(show_cmd)
app.command("compare")(compare_cmd)
app.command("frontier")(frontier_cmd)

from benchwright.cli.forks import fork_cmd, lineage_cmd, sweep_cmd  # noqa: E402

app.command("fork")(fork_cmd)
app.command("sweep")(sweep_cmd)
app.command("lineage")(lineage_cmd)
app.add_typer(schedule_app, name="schedule")

from benchwright.cli.registry import registry_app  # noqa: E402
from benchwright.cli.report import report_cmd  # noqa: E402

app.command("report")(report_cmd)

app.add_typer(registry_app, name="registry")

from benchwright.cli.operator import ask_cmd  # noqa: E402

app.command("ask")(ask_cmd)

from benchwright.cli.sessions import session_app  # noqa: E402

app.add_typer(session_app, name="session")

from benchwright.cli.secrets import secrets_app  # noqa: E402

app.add_typer(secrets_app, name="secrets")

from benchwright.harness.cli import harness_app  # noqa: E402

app.add_typer(harness_app, name="harness")

from benchwright.cli.keys import (  # noqa: E402
    accounts_add_key,
    accounts_keys,
    accounts_revoke_key,
    accounts_rotate_key,
    keys_app,
)

app.add_typer(keys_app, name="keys")
accounts_app.command("keys")(accounts_keys)
accounts_app.command("add-key")(accounts_add_key)
accounts_app.command("rotate-key")(accounts_rotate_key)
accounts_app.command("revoke-key")(accounts_revoke_key)


def main() -> None:
    """Entry point. Exits through ``os._exit`` after flushing, so temporalio's occasional abort at interpreter exit
    (sdk-python issue 300) cannot turn the command's real status into a crash code."""
    try:
        app()  # standalone mode: click prints usage errors (exit 2) and turns typer.Exit into SystemExit
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

