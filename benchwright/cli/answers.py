"""CLI commands that answer questions across runs (issue 17): ``show``, ``compare``, ``frontier``, ``schedule ...``.

Registered on the main app by ``benchwright/cli/app.py``; they share its client and consoles (imported when a command
runs, so the two modules do not import each other at load time).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from benchwright.cli.support import client_for, console, fitted_table, out

schedule_app = typer.Typer(no_args_is_help=True, help="Scheduled regression runs: replay a run on a cadence and "
                                                      "alert on a significant drop.")
DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ~/.benchwright).")]
ApiUrl = Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_URL")]
ApiKey = Annotated[str | None, typer.Option(envvar="BENCHWRIGHT_API_KEY")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f"[{ci[0]:.1%}, {ci[1]:.1%}]"


def _call(fn: Callable[[Any], Any], data_dir: Path | None, api_url: str | None, api_key: str | None) -> Any:
    """Run ``fn(client)``; an API or set-up error is printed in plain words and exits 1."""
    from benchwright.client import ApiError

    try:
        with client_for(data_dir, api_url, api_key) as client:
            return fn(client)
    except (ApiError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


def _print(value: Any) -> None:

    if isinstance(value, str):
        out.print(value, highlight=False, markup=False)
    else:
        out.print(value)


def summary_lines(run: dict[str, Any]) -> list[str]:
    """A run's score with its uncertainty, as ``show`` prints it."""
    s = run["tasks"]["summary"]
    se = "n/a" if s.get("pass_rate_se") is None else f"{s['pass_rate_se']:.2%}"
    lines = [f"run {run['id']}: {run['display_status']}  model {run['model'].get('identifier', '')}",
             (f"  pass rate {_pct(s['pass_rate'])}  95 % CI {_ci(s.get('pass_rate_ci')) or 'n/a'} (Wilson)  "
              f"SE {se}  on {s['passed'] + s['failed']} scored tasks ({s['errored']} errored, {s['total']} in all)"),
             (f"  passed {s['passed']}, failed {s['failed']} (no answer {s.get('no_answer', 0)}), "
              f"errored {s['errored']}")]
    if s.get("mean_score"):
        m = s["mean_score"]
        lines.append(f"  mean score {m['value']:.3f}  95 % CI [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}] (bootstrap over "
                     f"tasks)  SE {m['se']:.3f}")
    for name, value in sorted(s.get("pass_at_k", {}).items()):
        lines.append(f"  {name} {_pct(value)}  95 % CI {_ci(s.get('pass_at_k_ci', {}).get(name)) or 'n/a'}")
    lines.append(f"  cost: model ${run['cost']['model']:.4f}, incurred ${run['cost']['incurred']:.4f}")
    return lines


def breakdown_table(result: dict[str, Any]) -> Table:
    """Per-group results as lm-eval prints them: group, n, pass rate, its 95 % interval, and the counts."""
    table = Table(result["by"], "n", "pass rate", "95 % CI", "passed", "failed", "no_answer", "errored")
    for g in result["groups"]:
        table.add_row(g["group"], str(g["total"]), _pct(g["pass_rate"]), _ci(g["pass_rate_ci"]) or "n/a",
                      str(g["passed"]), str(g["failed"]), str(g["no_answer"]), str(g["errored"]))
    return table


def show_cmd(run_id: str, json_out: JsonOut = False,
             by: Annotated[str | None, typer.Option("--by", help=(
                 "Also print results per value of this dataset column (subject, category...).")
             )] = None, data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """One run's score with its 95 % interval and standard error (and mean score, pass@k where they apply);
    with ``--by COLUMN``, the same per group of the data."""
    run = _call(lambda c: c.run(run_id), data_dir, api_url, api_key)
    result = _call(lambda c: c.breakdown(run_id, by=by), data_dir, api_url, api_key) if by else None
    if json_out:
        _print(json.dumps({**run, "breakdown": result} if result else run, indent=2, default=str))
        return
    _print("\n".join(summary_lines(run)))
    if run.get("narration"):
        _print("\n" + run["narration"])
    if result:
        _print(breakdown_table(result))
        if result["folded"]:
            _print(f"  {result['folded']} smaller groups are folded into (other)")


def compare_cmd(runs: Annotated[list[str], typer.Argument(help="A B: B against A; three or more: a ranked table.")],
                rank: Annotated[bool, typer.Option("--rank", help="Rank even two runs.")] = False,
                json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
                api_key: ApiKey = None) -> None:
    """Compare runs of one shape: two paired task by task (flips, interval, McNemar's p, verdict), or rank many."""
    if len(runs) < 2:
        raise typer.BadParameter("give at least two run ids")
    if len(runs) == 2 and not rank:
        cmp = _call(lambda c: c.compare(runs[0], runs[1]), data_dir, api_url, api_key)
        if json_out:
            _print(json.dumps(cmp, indent=2))
            return
        _print(cmp["verdict"])
        for side in ("a", "b"):
            r = cmp[side]
            _print(f"  {side.upper()} {r['run_id']}  {r['model']}  {_pct(r['pass_rate'])} {_ci(r['pass_rate_ci'])}")
        _print(f"  {len(cmp['gained'])} tasks flipped to pass, {len(cmp['lost'])} to fail, of {cmp['compared']} "
               f"compared; difference {cmp['difference'] * 100:+.1f} points {_ci(cmp['difference_ci'])}")
        return
    ranking = _call(lambda c: c.rank(runs), data_dir, api_url, api_key)
    if json_out:
        _print(json.dumps(ranking, indent=2))
        return
    rows = [[str(r["rank"]), r["run_id"], r["model"], _pct(r["pass_rate"]), _ci(r["pass_rate_ci"]),
             "" if r["p_vs_leader"] is None else f"{r['p_vs_leader']:.3g}", "yes" if r["tied_with_leader"] else "no"]
            for r in ranking["runs"]]
    _print(fitted_table(["#", "run", "model", "pass rate", "95 % CI", "p vs #1", "tied with #1"], rows,
                        whole=("run", "model"), drop=("95 % CI", "tied with #1")))


def frontier_cmd(runs: Annotated[list[str], typer.Argument(help="Run ids of one shape.")], json_out: JsonOut = False,
                 data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """The cost–quality frontier: pass rate against cost per task, Pareto-optimal runs starred."""
    result = _call(lambda c: c.frontier(runs), data_dir, api_url, api_key)
    if json_out:
        _print(json.dumps(result, indent=2))
        return
    rows = [["*" if p["pareto_optimal"] else "", p["run_id"], p["model"], f"${p['cost_per_task']:.6f}",
             _pct(p["pass_rate"]), _ci(p["pass_rate_ci"])] for p in result["points"]]
    _print(fitted_table(["", "run", "model", "cost / task", "pass rate", "95 % CI"], rows, whole=("run", "model"),
                        drop=("95 % CI",)))
    _print("* Pareto-optimal: no other run is as cheap and as good")


def _schedule_line(s: dict[str, Any]) -> str:
    state = "paused" if s["paused"] else f"next {s['next_runs'][0]}" if s["next_runs"] else "active"
    return f"{s['id']}  replays {s['replay_of']} every {s['every']}  alert drop>={s['alert']['drop']:.1%} " \
           f"p<={s['alert']['p']}  {state}"


@schedule_app.command("create")
def schedule_create(run_id: Annotated[str, typer.Argument(help="The reference run to replay.")],
                    every: Annotated[str, typer.Option(help="30s, 15m, 2h, 1d or a cron expression (UTC).")],
                    drop: Annotated[float | None, typer.Option(help="Alert on a fall of at least this fraction "
                                                                       "(0.03 = 3 points).")] = None,
                    p: Annotated[float | None, typer.Option("--p", help="... with McNemar's p at most this.")
                                 ] = None,
                    webhook: Annotated[str | None, typer.Option(help="URL POSTed the alert (host policy).")
                                       ] = None,
                    data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Replay RUN on a cadence; a significant drop raises RegressionDetected (and calls the webhook)."""
    made = _call(lambda c: c.create_schedule(replay_of=run_id, every=every, drop=drop, p=p, webhook=webhook),
                 data_dir, api_url, api_key)
    _print(_schedule_line(made))


@schedule_app.command("list")
def schedule_list(json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
                  api_key: ApiKey = None) -> None:
    """Your schedules."""
    found = _call(lambda c: c.schedules(), data_dir, api_url, api_key)["schedules"]
    _print(json.dumps(found, indent=2) if json_out else "\n".join(map(_schedule_line, found)) or "no schedules")


@schedule_app.command("show")
def schedule_show(schedule_id: str, json_out: JsonOut = False, data_dir: DataDir = None, api_url: ApiUrl = None,
                  api_key: ApiKey = None) -> None:
    """One schedule and its recent firings (replay run, outcome, verdict)."""
    s = _call(lambda c: c.schedule(schedule_id), data_dir, api_url, api_key)
    if json_out:
        _print(json.dumps(s, indent=2))
        return
    _print(_schedule_line(s))
    for f in s["firings"]:  # each firing's outcome and why (a refused launch, a failure, the webhook's delivery)
        r = f["result"] or {}
        run = f"  run {r['run_id']}" if r.get("run_id") else ""
        _print(f"  {f['started_at']}  {f.get('outcome', f['status'])}{run}"
               + (f"  {f['reason']}" if f.get("reason") else f"  {r['verdict']}" if r else ""))
    if s.get("skipped"):
        _print(f"  {s['skipped']} firings skipped: the previous one was still running")


@schedule_app.command("pause")
def schedule_pause(schedule_id: str, data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Stop firing until resumed (a firing in progress finishes)."""
    _print(_schedule_line(_call(lambda c: c.pause_schedule(schedule_id), data_dir, api_url, api_key)))


@schedule_app.command("resume")
def schedule_resume(schedule_id: str, data_dir: DataDir = None, api_url: ApiUrl = None,
                    api_key: ApiKey = None) -> None:
    """Fire again on the cadence."""
    _print(_schedule_line(_call(lambda c: c.pause_schedule(schedule_id, paused=False), data_dir, api_url, api_key)))


@schedule_app.command("delete")
def schedule_delete(schedule_id: str, data_dir: DataDir = None, api_url: ApiUrl = None,
                    api_key: ApiKey = None) -> None:
    """Delete the schedule (the runs it made stay)."""
    _call(lambda c: c.delete_schedule(schedule_id), data_dir, api_url, api_key)
    _print(f"deleted {schedule_id}")
