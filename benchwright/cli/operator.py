"""``benchwright ask``: start an Operator session from a structured goal, follow the runs it launches, print its
answer (issue 26). Registered on the main app by ``benchwright/cli/app.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli.answers import ApiKey, ApiUrl, DataDir, JsonOut, _call, _ci, _pct
from benchwright.cli.support import BadFlag, console, out

MAX_GOAL_BYTES = 64 * 1024
ENDED = ("answered", "stopped", "failed")
POLL_WAIT_S = 5.0
"""Long-poll window of each progress read (the API answers at once when the session ends)."""


def read_goal(path: Path) -> dict[str, Any]:
    """A goal file: JSON (or YAML) object, at most 64 KiB; refused with BadFlag otherwise."""
    import yaml

    try:
        if path.stat().st_size > MAX_GOAL_BYTES:
            raise BadFlag(f"--goal {path}: over {MAX_GOAL_BYTES // 1024} KiB")
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BadFlag(f"--goal {path}: cannot read it ({exc})") from None
    if not isinstance(data, dict) or "question" not in data:
        raise BadFlag(f"--goal {path}: expected an object with a 'question' (better, cheapest, regressed, helps)")
    return data


def _progress(client: Any, session: dict[str, Any], seen: dict[str, str]) -> None:
    """One line per change: a run launched, a run's tasks moving, a run ending."""

    for run_id in session["runs"]:
        run = client.run(run_id)
        s = run["tasks"]["summary"]
        line = (f"run {run_id[:8]} {run['model'].get('identifier', '')}: {run['display_status']}, "
                f"{s['passed'] + s['failed'] + s['errored']}/{s['total'] or '?'} tasks, "
                f"pass rate {_pct(s['pass_rate'])}")
        if seen.get(run_id) != line:
            seen[run_id] = line
            console.print(line, highlight=False, markup=False)


def print_answer(session: dict[str, Any]) -> None:
    from rich.table import Table


    answer = session.get("answer")
    if not answer:
        out.print(f"session {session['id']} ended {session['status']} without an answer", markup=False)
        return
    out.print(answer["sentence"], highlight=False, markup=False)
    table = Table("run", "label", "model", "status", "pass rate", "95 % CI", "no answer", "errors", "cost")
    for e in answer["evidence"]:
        table.add_row(e["run_id"][:8], e["label"], e["model"], e["status"], _pct(e["pass_rate"]),
                      _ci(e["pass_rate_ci"]), str(e["no_answer"]), str(e["errored"]), f"${e['cost']:.4f}")
    out.print(table)
    for c in answer["comparisons"]:
        out.print(f"{c['b'][:8]} vs {c['a'][:8]}: {c['difference'] * 100:+.1f} points "
                      f"[{c['difference_ci'][0] * 100:+.1f}, {c['difference_ci'][1] * 100:+.1f}], "
                      f"paired p = {c['p_value']:.3g} over {c['compared']} tasks", highlight=False, markup=False)
    for u in answer["unestablished"]:
        out.print(f"not established: {u}", highlight=False, markup=False)
    out.print(f"session {session['id']} · {len(session['runs'])} run(s) · ${session['cost']:.4f}",
                  highlight=False, markup=False)


def ask_cmd(question: Annotated[str | None, typer.Argument(help="The goal in prose (an LLM operator, --operator "
                                                          "<provider>://<model>).")] = None,
            goal: Annotated[Path | None, typer.Option(help="A structured goal (JSON/YAML): {question: better|"
                                                      "cheapest|regressed|helps, ...}; see docs/operator.md.")] = None,
            operator: Annotated[str, typer.Option(help="'builtin' or an LLM operator '<provider>://<model>' (its key: "
                                                  "the account secret <PROVIDER>_API_KEY).")] = "builtin",
            api_base: Annotated[str | None, typer.Option(help="Where an LLM operator's calls go.")] = None,
            input_cost_per_token: Annotated[float | None, typer.Option(min=0, help="An LLM operator's input "
                                                                       "token price (USD).")] = None,
            output_cost_per_token: Annotated[float | None, typer.Option(min=0, help="An LLM operator's output "
                                                                        "token price (USD).")] = None,
            runs: Annotated[int, typer.Option(min=1, max=50, help="Most runs the session may launch.")] = 10,
            cost: Annotated[float | None, typer.Option(min=0.000001, help="Most USD the session may spend.")] = None,
            wait: Annotated[bool, typer.Option(help="Follow the session and print its answer.")] = True,
            json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
            api_key: ApiKey = None) -> None:
    """Ask the Operator a question: it launches the runs that answer it and answers with the evidence."""

    try:
        if (question is None) == (goal is None):
            raise BadFlag("give the goal either as a sentence (QUESTION, with an LLM --operator) or as --goal FILE")
        parsed: dict[str, Any] | str = read_goal(goal) if goal is not None else str(question)
    except BadFlag as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    llm = {k: v for k, v in (("api_base", api_base), ("input_cost_per_token", input_cost_per_token),
                             ("output_cost_per_token", output_cost_per_token)) if v is not None}
    body = {"operator": operator, "goal": parsed, **llm,
            "limits": {"session": {"runs": runs, **({"cost": cost} if cost is not None else {})}}}

    def go(client: Any) -> dict[str, Any]:
        session: dict[str, Any] = client._call("POST", "/v1/operator/sessions", json=body)
        console.print(f"operator session {session['id']} started", highlight=False, markup=False)
        seen: dict[str, str] = {}
        while wait and session["status"] not in ENDED:
            session = client._call("GET", f"/v1/operator/sessions/{session['id']}",
                                   params={"wait_s": POLL_WAIT_S}, timeout=POLL_WAIT_S + 30)
            _progress(client, session, seen)
        return session

    session = _call(go, data_dir, api_url, api_key)
    if json_out:
        typer.echo(json.dumps(session, indent=2))
    elif wait:
        print_answer(session)
    else:
        typer.echo(session["id"])
    if wait and session["status"] != "answered":
        raise typer.Exit(1)
