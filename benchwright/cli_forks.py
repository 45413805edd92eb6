"""``benchwright fork``, ``replay``, ``sweep`` and ``lineage`` (§10). Registered on the main app by
``benchwright/cli.py``; they share its client and consoles (imported when a command runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli_answers import ApiKey, ApiUrl, DataDir, JsonOut, _call, _print


def _model(value: str, api_base: str | None) -> str | dict[str, Any]:
    return {"identifier": value, "api_base": api_base} if api_base else value


def fork_cmd(run_id: str,
             rewind_to: Annotated[str | None, typer.Option(help="fetch, analyze, setup, attach, atomize or "
                                                                 "materialize (optional with --instructions).")] = None,
             task_impl: Annotated[Path | None, typer.Option(help="A replacement task_impl.py (rewind to atomize).")]
             = None,
             model: Annotated[str | None, typer.Option(help="Another model (rewind to attach).")] = None,
             api_base: Annotated[str | None, typer.Option(help="The model's endpoint.")] = None,
             dataset: Annotated[str | None, typer.Option(help="A mirror of the dataset (rewind to fetch).")] = None,
             instructions: Annotated[str | None, typer.Option(help="Prose for the Fork phase's Driver, e.g. 'use "
                                                                    "the mirror at URL'.")] = None,
             json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
             api_key: ApiKey = None) -> None:
    """Fork a run: a new run that inherits the phases before --rewind-to and continues with the overrides."""
    overrides: dict[str, Any] = {}
    if task_impl is not None:
        overrides["task_impl"] = task_impl.read_text()
    if model is not None:
        overrides["model"] = _model(model, api_base)
    if dataset is not None:
        overrides["dataset"] = dataset
    run = _call(lambda c: c.fork(run_id, rewind_to=rewind_to, instructions=instructions, **overrides),
                data_dir, api_url, api_key)
    _print(json.dumps(run, indent=2) if json_out else f"fork {run['id']} of {run_id} launched")


def sweep_cmd(run_id: str,
              model: Annotated[list[str], typer.Option("--model", help="A model to replay the run with "
                                                                        "(repeat for a sweep).")],
              api_base: Annotated[str | None, typer.Option(help="The endpoint every model is called at.")] = None,
              json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
              api_key: ApiKey = None) -> None:
    """Replay a run once per --model, all at once (one Fetch, Setup and Atomize in total: the reference's)."""
    result = _call(lambda c: c.sweep(run_id, models=[_model(m, api_base) for m in model]),
                   data_dir, api_url, api_key)
    if json_out:
        _print(json.dumps(result, indent=2))
        return
    for run in result["runs"]:
        _print(f"{run['id']}  {run['model'].get('identifier', '')}")


def lineage_cmd(run_id: str, json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
                api_key: ApiKey = None) -> None:
    """Print the fork tree a run belongs to: each run with its rewind point, model, status and pass rate."""
    tree = _call(lambda c: c.lineage(run_id), data_dir, api_url, api_key)
    _print(json.dumps(tree, indent=2) if json_out else "\n".join(lineage_lines(tree)))


def lineage_lines(tree: dict[str, Any]) -> list[str]:
    """The tree as indented lines, children under their parent (``├─``/``└─``), the asked-for run starred."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for node in tree["runs"]:
        children.setdefault(node["parent_run_id"], []).append(node)

    def label(n: dict[str, Any]) -> str:
        rate = "n/a" if n["pass_rate"] is None else f"{n['pass_rate']:.1%}"
        how = "" if n["kind"] == "root" else f"{n['kind']} at {n['rewind_to'] or '?'}  "
        mark = " *" if n["id"] == tree["run_id"] else ""
        return f"{n['id'][:8]}  {how}{n['model']}  {n['display_status']}  pass {rate}  fp {n['fingerprint']}{mark}"

    lines: list[str] = []

    def walk(n: dict[str, Any], prefix: str, last: bool, root: bool) -> None:
        lines.append(label(n) if root else f"{prefix}{'└─ ' if last else '├─ '}{label(n)}")
        kids = children.get(n["id"], [])
        for i, kid in enumerate(kids):
            walk(kid, prefix if root else prefix + ("   " if last else "│  "), i == len(kids) - 1, False)

    for top in children.get(None, []):
        walk(top, "", True, True)
    return lines
