"""``benchwright session ...``: Operator sessions (issue 26) from the terminal: list them, watch one live (its log
over SSE: each decision with its reason, each run it launched and read), print its answer. Registered on the main
app by ``benchwright/cli/app.py``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from benchwright.cli.answers import ApiKey, ApiUrl, DataDir, JsonOut, _call, _ci, _pct
from benchwright.cli.support import console, out

session_app = typer.Typer(no_args_is_help=True, help="Operator sessions: list them, watch one live, read its answer.")


def session_line(event: dict[str, Any]) -> str | None:
    """One line for a person per event of a session's log (None for the answer, printed whole at the end)."""
    d, kind = event.get("data", {}), event["type"]
    if kind == "SessionStarted":
        return f"session started ({d.get('operator')}): {d.get('goal', {}).get('question', '?')}"
    if kind == "OperatorDecision":
        return f"{d.get('action')}: {d.get('reason')}"
    if kind == "OperatorRunLaunched":
        return f"run {d.get('run_id', '')[:8]} launched ({d.get('label')}, {d.get('model')})"
    if kind == "OperatorRunRefused":
        return f"launch of {d.get('label')} refused ({d.get('code')}): {d.get('message')}"
    if kind == "OperatorRunRead":
        e = d.get("evidence", {})
        return (f"run {d.get('run_id', '')[:8]} read ({d.get('label')}): {e.get('status')}, pass rate "
                f"{_pct(e.get('pass_rate'))} {_ci(e.get('pass_rate_ci'))}, {e.get('scored', 0)} scored, "
                f"{e.get('no_answer', 0)} no answer, {e.get('errored', 0)} errored, ${e.get('cost', 0.0):.4f}")
    if kind == "OperatorControl":
        return f"{d.get('action')}" + (f": {d['message']}" if d.get("message") else "") + " (from a person)"
    if kind == "SessionAnswered":
        return None
    return f"{kind}: {json.dumps(d, default=str)[:160]}"


@session_app.command("watch")
def watch_cmd(session_id: str, json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
              api_key: ApiKey = None) -> None:
    """Follow a session live until it answers: its decisions, the runs it launches and reads, then the answer."""
    from benchwright.cli.operator import print_answer

    def go(client: Any) -> dict[str, Any]:
        for event in client.stream_session_events(session_id):
            if json_out:
                console.print(json.dumps(event), highlight=False, markup=False, soft_wrap=True)
            elif (line := session_line(event)) is not None:
                console.print(line, highlight=False, markup=False, soft_wrap=True)
        return client.session(session_id)  # type: ignore[no-any-return]

    session = _call(go, data_dir, api_url, api_key)
    if json_out:
        typer.echo(json.dumps(session, indent=2))
    else:
        print_answer(session)
    if session["status"] != "answered":
        raise typer.Exit(1)


@session_app.command("list")
def list_cmd(limit: Annotated[int, typer.Option(min=1, max=200)] = 50, json_out: JsonOut = False,
             data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """The account's sessions, newest first."""
    from rich.table import Table

    page = _call(lambda c: c._call("GET", "/v1/operator/sessions", params={"limit": limit}), data_dir, api_url,
                 api_key)
    if json_out:
        typer.echo(json.dumps(page, indent=2))
        return
    table = Table("session", "status", "question", "runs", "cost", "started", "answer")
    for s in page["sessions"]:
        table.add_row(s["id"], s["status"], str(s["goal"].get("question", "")), str(len(s["runs"])),
                      f"${s['cost']:.4f}", str(s["created_at"])[:19],
                      (s["answer"] or {}).get("sentence", "")[:80])
    out.print(table)
