"""CLI commands for the registry (§7, issue 9): ``registry publish | promote | benchmarks | leaderboard``.

Registered on the main app by ``benchwright/cli/app.py``; they use its client (imported when a command runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from benchwright.cli.support import client_for, fitted_table

registry_app = typer.Typer(no_args_is_help=True, help="The registry: publish runs, promote impls, leaderboards.")
DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ~/.benchwright).")]
ApiUrl = Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_URL")]
ApiKey = Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_KEY")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]
console = Console()


def _call(method: str, path: str, data_dir: Path | None, api_url: str | None, api_key: str | None,
          body: dict[str, Any] | None = None) -> Any:
    """One API call; an API or set-up error is printed in plain words and exits 1. A ``run_id`` in the body may
    be a unique prefix of one of the caller's runs (``Client.resolve_run_id``)."""
    from benchwright.client import ApiError

    try:
        with client_for(data_dir, api_url, api_key) as client:
            if body is not None and "run_id" in body:
                body = {**body, "run_id": client.resolve_run_id(body["run_id"])}
            return client._call(method, path, json=body) if body is not None else client._call(method, path)
    except (ApiError, OSError, KeyError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


@registry_app.command("publish")
def publish(run_id: str, benchmark: Annotated[str, typer.Option(help="Benchmark id or name (new: created).")],
            subset: Annotated[str, typer.Option(help="Subset id or name (new: created).")],
            visibility: Annotated[str, typer.Option(help="private, unlisted or public.")] = "private",
            rolling: Annotated[bool, typer.Option("--rolling", help="A new subset may grow by appending.")] = False,
            data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """File a finished run under (benchmark, subset) with its impl."""
    out = _call("POST", "/v1/registry/publish", data_dir, api_url, api_key, body={
        "run_id": run_id, "benchmark": benchmark, "subset": subset, "visibility": visibility, "rolling": rolling})
    console.print(f"published run {out['run_id']}: benchmark {out['benchmark_id']}, subset {out['subset_id']} "
                  f"v{out['subset_version']}, impl {out['impl_id']} ({out['visibility']})", highlight=False)


@registry_app.command("promote")
def promote(impl_id: str, data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Mark an impl official (admin accounts only): ``--impl latest:official`` launches use it from now on."""
    out = _call("POST", f"/v1/registry/impls/{impl_id}/promote", data_dir, api_url, api_key)
    console.print(f"impl {out['id']} is official", highlight=False)


@registry_app.command("benchmarks")
def benchmarks(json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
               api_key: ApiKey = None) -> None:
    """Benchmarks you own and public ones."""
    out = _call("GET", "/v1/registry/benchmarks", data_dir, api_url, api_key)
    if json_out:
        print(json.dumps(out, indent=2))
        return
    rows = [[b["id"], b["name"], b["visibility"], "yes" if b["owned"] else ""] for b in out["benchmarks"]]
    console.print(fitted_table(["id", "name", "visibility", "yours"], rows, whole=("id", "name"), drop=("yours",)),
                  crop=False)


@registry_app.command("leaderboard")
def leaderboard(subset: Annotated[str, typer.Argument(
                    metavar="SUBSET", help="A subset id, BENCHMARK/SUBSET names, a subset name, or a benchmark name "
                    "(when it has one subset); an ambiguous name lists the matches.")],
                json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
                api_key: ApiKey = None) -> None:
    """Best score per model over the subset's public runs."""
    from urllib.parse import quote

    bench, _, name = subset.rpartition("/") if "/" in subset else ("", "", subset)
    query = f"?benchmark={quote(bench, safe='')}" if bench else ""
    out = _call("GET", f"/v1/registry/subsets/{quote(name, safe='')}/leaderboard{query}", data_dir, api_url,
                api_key)
    if json_out:
        print(json.dumps(out, indent=2))
        return
    rows = [[r["model"], "n/a" if r["pass_rate"] is None else f"{r['pass_rate']:.1%}", str(r["runs"]),
             r["impl_id"] or "", f"{r['cost_usd']:.4f}", r["best_run_id"]] for r in out["rows"]]
    console.print(fitted_table(["model", "pass rate", "runs", "impl", "cost $", "best run"], rows,
                               whole=("model", "best run", "impl"), drop=("cost $", "runs")), crop=False)
