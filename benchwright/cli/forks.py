"""``benchwright fork``, ``replay``, ``sweep`` and ``lineage`` (§10). Registered on the main app by
``benchwright/cli/app.py``; they share its client and consoles (imported when a command runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli.answers import ApiKey, ApiUrl, DataDir, JsonOut, _call, _print
from benchwright.cli.support import BadFlag, console, first_error, run_succeeded, run_summary, watch

MAX_MODELS_FILE_BYTES = 64 * 1024
MODEL_KEYS = ("model", "api_base", "secret")


def _model(value: str, api_base: str | None) -> str | dict[str, Any]:
    return {"identifier": value, "api_base": api_base} if api_base else value


def _fail(message: str) -> None:

    console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(2)


def parse_model_flag(item: str) -> dict[str, Any]:
    """``--model ID`` or ``--model ID=API_BASE`` (a model identifier has no '='): the sweep's model object."""
    identifier, sep, api_base = item.partition("=")
    if sep and not api_base:
        raise BadFlag(f"--model {item!r}: nothing after '=' (write --model {identifier}=http://HOST/v1)")
    return {"identifier": identifier, **({"api_base": api_base} if sep else {})}


def read_models_file(path: Path) -> list[dict[str, Any]]:
    """A models file: a YAML or JSON list (or ``{"models": [...]}``) of ``{model, api_base?, secret?}``; refused
    with BadFlag when it is not one (unknown keys, a model that is not a string, over 64 KiB)."""
    import yaml

    try:
        if path.stat().st_size > MAX_MODELS_FILE_BYTES:
            raise BadFlag(f"--models {path}: over {MAX_MODELS_FILE_BYTES // 1024} KiB")
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BadFlag(f"--models {path}: cannot read it ({exc})") from None
    if isinstance(data, dict) and set(data) == {"models"}:
        data = data["models"]
    if not isinstance(data, list) or not data:
        raise BadFlag(f"--models {path}: expected a list of {{model, api_base, secret}} entries")
    out = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str) or set(entry) - set(MODEL_KEYS):
            raise BadFlag(f"--models {path}: entry {i + 1} is not {{model, api_base, secret}} with a string model "
                          f"(got {str(entry)[:80]})")
        if any(not isinstance(entry.get(k), str | None) for k in ("api_base", "secret")):
            raise BadFlag(f"--models {path}: entry {i + 1}: api_base and secret are strings")
        out.append({"identifier": entry["model"], **{k: entry[k] for k in ("api_base", "secret") if entry.get(k)}})
    return out


def sweep_models(model: list[str], models_file: Path | None, api_base: list[str], secret: str | None
                 ) -> list[dict[str, Any]]:
    """The sweep's models from ``--model`` (each maybe ``ID=API_BASE``) or a ``--models`` file, with the global
    ``--api-base`` and ``--secret``; any combination that leaves a model's endpoint or key in doubt is refused."""
    if models_file is not None:
        if model or api_base or secret:
            raise BadFlag("--models FILE names every model with its api_base and secret: give no --model, "
                          "--api-base or --secret with it")
        return read_models_file(models_file)
    if not model:
        raise BadFlag("name the models to sweep: --model ID (repeat), --model ID=API_BASE, or --models FILE")
    if len(api_base) > 1:
        raise BadFlag(f"--api-base is given {len(api_base)} times; a sweep has one global endpoint: give each "
                      "model its own with --model ID=API_BASE (or a --models file)")
    parsed = [parse_model_flag(m) for m in model]
    own = [m["identifier"] for m in parsed if "api_base" in m]
    if own and api_base:
        raise BadFlag(f"--api-base {api_base[0]} and per-model endpoints ({', '.join(own)}) together: which one "
                      "does each model get? Give every model its own (--model ID=API_BASE), or none and one --api-base")
    if own and secret:
        raise BadFlag("--secret with per-model endpoints would send one key to several endpoints: name each "
                      "model's secret in a --models file ({model, api_base, secret})")
    for m in parsed:
        if api_base:
            m["api_base"] = api_base[0]
        if secret:
            m["secret"] = secret
    return parsed


def _watch(c: Any, run_id: str) -> tuple[dict[str, Any], str | None]:

    final = watch(c, run_id)
    return final, first_error(c, final)


def fork_cmd(run_id: str,
             rewind_to: Annotated[str | None, typer.Option(help="fetch, analyze, setup, attach, atomize or "
                                                                 "materialize (optional with --instructions).")] = None,
             task_impl: Annotated[Path | None, typer.Option(help="A replacement task_impl.py (rewind to atomize).")]
             = None,
             model: Annotated[str | None, typer.Option(help="Another model, provider/model (rewind to attach).")
                              ] = None,
             api_base: Annotated[str | None, typer.Option(help="The model's endpoint.")] = None,
             secret: Annotated[str | None, typer.Option(help="The secret holding the model's API key (with "
                                                             "--model).")] = None,
             dataset: Annotated[str | None, typer.Option(help="A mirror of the dataset (rewind to fetch).")] = None,
             instructions: Annotated[str | None, typer.Option(help="Prose for the Fork phase's Driver, e.g. 'use "
                                                                    "the mirror at URL'.")] = None,
             watch: Annotated[bool, typer.Option("--watch/--no-watch", help="Show live progress until the fork "
                                                                           "ends (as run --watch).")] = False,
             json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
             api_key: ApiKey = None) -> None:
    """Fork a run: a new run that inherits the phases before --rewind-to and continues with the overrides."""

    overrides: dict[str, Any] = {}
    if task_impl is not None:
        overrides["task_impl"] = task_impl.read_text()
    if (api_base or secret) and model is None:
        _fail("--api-base and --secret go with --model (the fork's new model)")
    if model is not None:
        spec = _model(model, api_base)
        overrides["model"] = {**({"identifier": spec} if isinstance(spec, str) else spec),
                              **({"secret": secret} if secret else {})}
    if dataset is not None:
        overrides["dataset"] = dataset
    run = _call(lambda c: c.fork(run_id, rewind_to=rewind_to, instructions=instructions, **overrides),
                data_dir, api_url, api_key)
    if not watch:
        _print(json.dumps(run, indent=2) if json_out else f"fork {run['id']} of {run_id} launched")
        return
    console.print(f"fork [bold]{run['id']}[/bold] of {run_id} launched")
    final, first_error = _call(lambda c: _watch(c, run["id"]), data_dir, api_url, api_key)
    _print(json.dumps(final, indent=2) if json_out else run_summary(final, first_error))
    raise typer.Exit(0 if run_succeeded(final) else 1)


def sweep_cmd(run_id: str,
              model: Annotated[list[str] | None, typer.Option(
                  "--model", metavar="ID[=API_BASE]", help="A model to replay the run with (repeat for a sweep); "
                  "ID=API_BASE gives it its own endpoint, e.g. openai/m1=http://127.0.0.1:9001/v1.")] = None,
              models_file: Annotated[Path | None, typer.Option(
                  "--models", exists=True, dir_okay=False, readable=True, help="A YAML/JSON list of {model, "
                  "api_base, secret}: each model with its own endpoint and key (instead of --model).")] = None,
              api_base: Annotated[list[str] | None, typer.Option(
                  help="The one endpoint every --model is called at (not with per-model endpoints).")] = None,
              secret: Annotated[str | None, typer.Option(
                  help="The secret holding the API key every --model is called with.")] = None,
              json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
              api_key: ApiKey = None) -> None:
    """Replay a run once per model, all at once (one Fetch, Setup and Atomize in total: the reference's). The
    sample is the reference's (a replay pins it), so there is no --max-tasks here."""
    try:
        models = sweep_models(model or [], models_file, api_base or [], secret)
    except BadFlag as exc:
        _fail(str(exc))
    result = _call(lambda c: c.sweep(run_id, models=models), data_dir, api_url, api_key)
    if json_out:
        _print(json.dumps(result, indent=2))
        return
    for run in result["runs"]:
        m = run["model"]
        _print(f"{run['id']}  {m.get('identifier', '')}" + (f"  at {m['api_base']}" if m.get("api_base") else ""))


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
