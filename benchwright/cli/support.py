"""What the ``benchwright`` commands share beyond typer: the ``run`` flags folded into the launch body, the live
progress bar, and the one-line and table renderings of runs, events and tasks.

Values are checked here only where the server could not say it better (a flag without ``=``, a key given twice);
everything else goes to the API, whose 400/422 message the CLI prints as it is.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from typer._click.core import Context  # typer parses with its own copy of click
from typer._click.exceptions import NoSuchOption
from typer.core import TyperCommand, TyperOption

from benchwright.settings import default_data_dir

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "arithmetic.jsonl"
DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ~/.benchwright, or "
                                                                    "$BENCHWRIGHT_DATA_DIR).")]

RESUMABLE_DISPLAY = ("paused", "waiting")
"""display_status values a watch stops at: the run waits for a person (resume, review), not for time."""
THROUGHPUT_WINDOW_S = 15.0
"""tasks/s is measured over the last 15 s of progress, so the ETA follows a run that speeds up or slows down."""
EXCERPT = 60


class BadFlag(ValueError):
    """A ``k=v`` flag the CLI cannot turn into JSON; the message names the flag and the value."""


def parse_number(text: str) -> int | float | str:
    """``5`` → 5, ``0.5`` → 0.5, ``1e3`` → 1000.0; anything else (``inf`` included) stays text for the API to
    judge."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


SAMPLE_COUNT_HINT = ("; to evaluate only the first N tasks (what lm-eval's and inspect's --limit N do) use "
                     "--max-tasks N (or -n N)")


def _split(flag: str, item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        bare_number = flag == "--limit" and isinstance(parse_number(item.strip()), (int, float))
        raise BadFlag(f"{flag} takes KEY=VALUE, got {item!r}"
                      + (f" ({flag} sets a ceiling such as run.cost=5){SAMPLE_COUNT_HINT}" if bare_number else ""))
    return key.strip(), value


def with_max_tasks(constraints: dict[str, Any] | None, max_tasks: int | None) -> dict[str, Any] | None:
    """``--max-tasks N`` / ``-n N`` folded into the launch's ``constraints.max_tasks`` (the one sample-count cap);
    given together with ``--constraints max_tasks=M`` it must agree."""
    if max_tasks is None:
        return constraints
    out = dict(constraints or {})
    if "max_tasks" in out and out["max_tasks"] != max_tasks:
        raise BadFlag(f"--max-tasks {max_tasks} and --constraints max_tasks={out['max_tasks']} disagree: give one")
    out["max_tasks"] = max_tasks
    return out


def nested(flag: str, items: Iterable[str]) -> dict[str, Any]:
    """``--limit run.cost=5 --limit attempt.duration=60`` → ``{"run": {"cost": 5}, "attempt": {"duration": 60}}``
    (numbers parsed as int/float; a key set twice, or both as a value and as a block, is refused)."""
    out: dict[str, Any] = {}
    for item in items:
        key, raw = _split(flag, item)
        *parents, leaf = key.split(".")
        node = out
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise BadFlag(f"{flag} {item!r}: {'.'.join(parents[:i + 1])} is already set to a value")
            node = child
        if leaf in node:
            raise BadFlag(f"{flag} {item!r}: {key} is given twice")
        node[leaf] = parse_number(raw)
    return out


def flat(flag: str, items: Iterable[str], *, numbers: bool, text_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """``k=v`` pairs as one object. With ``numbers``, values are parsed as int/float except for ``text_keys``;
    ``k:=JSON`` always gives a typed value (``--metadata shots:=5``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, raw = _split(flag, item)
        if key.endswith(":"):
            key = key[:-1]
            try:
                value: Any = json.loads(raw)
            except ValueError as exc:
                raise BadFlag(f"{flag} {item!r}: the value after ':=' is not JSON ({exc})") from None
        else:
            value = parse_number(raw) if numbers and key not in text_keys else raw
        if key in out:
            raise BadFlag(f"{flag} {item!r}: {key} is given twice")
        out[key] = value
    return out


def trials_block(*, k: int | None, aggregator: str | None, params: list[str]) -> dict[str, Any] | None:
    """The launch body's ``trials`` from ``--trials``, ``--aggregator`` and ``--aggregator-param`` (None: none
    given, so §7's precedence picks the default). Parameter names and types are the server's to check."""
    from benchwright.scoring.aggregators import AggregatorConfig

    text_keys = tuple(name for name, info in AggregatorConfig.model_fields.items()
                      if info.annotation in (str, str | None))  # field, weight: a "1" there is a key, not a number
    extra = flat("--aggregator-param", params, numbers=True, text_keys=text_keys)
    if k is None and aggregator is None and not extra:
        return None
    block: dict[str, Any] = {}
    if k is not None:
        block["plan"] = {"k": k}
    if aggregator is not None or extra:
        if "name" in extra:
            raise BadFlag("--aggregator-param name=... : name the aggregator with --aggregator")
        block["aggregator"] = {"name": aggregator or "any_pass", **extra}
    return block


class VisibleSuggestions(TyperCommand):
    """A command whose "No such option ... Did you mean" hint names only its visible options: a retired flag kept
    hidden so it can say what replaced it (``--agent``, ``--operator``) is never suggested for a typo."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as exc:
            if not exc.possibilities:
                raise
            visible = [name for p in self.params if isinstance(p, TyperOption) and not p.hidden
                       for name in (*p.opts, *p.secondary_opts) if name.startswith("--")]
            close = difflib.get_close_matches(exc.option_name, visible)
            raise NoSuchOption(exc.option_name, possibilities=close, ctx=ctx) from None


# -- watching ------------------------------------------------------------------------------------------------


class Throughput:
    """Settled tasks per second over a sliding window, and the time left at that pace."""

    def __init__(self, window_s: float = THROUGHPUT_WINDOW_S) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, settled: int) -> None:
        if self._samples and settled < self._samples[-1][1]:
            self._samples.clear()  # a new Materialize invocation counts from zero again
        self._samples.append((now, settled))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 and n1 > n0 else None

    def eta_s(self, remaining: int) -> float | None:
        rate = self.rate()
        return remaining / rate if rate and remaining > 0 else (0.0 if remaining <= 0 else None)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def settled_count(run: dict[str, Any]) -> int:
    s = run["tasks"]["summary"]
    return int(s["passed"] + s["failed"] + s["errored"])


def _fields(run: dict[str, Any], meter: Throughput) -> dict[str, Any]:
    s = run["tasks"]["summary"]
    rate = meter.rate()
    return {"status": run["display_status"], "phase": run["phase"] or "-",
            "rate": "- tasks/s" if rate is None else f"{rate:.1f} tasks/s",
            "eta": _clock(meter.eta_s(s["total"] - settled_count(run))),
            "pass_rate": "-" if s["pass_rate"] is None else f"{s['pass_rate']:.3f}"}


def watch_run(client: Any, run_id: str, console: Console) -> dict[str, Any]:
    """A progress bar (settled/total, tasks/s, ETA, pass rate) until the run is over or waits for a person;
    returns the final run.

    Driven by the API's long poll: each read is held up to 0.5 s and answered at once when the run settles, so the
    bar moves twice a second and the watch ends the moment the run does. A halted run is followed to its terminal
    event (teardown takes well under 2 s), so the returned view is final.
    """
    meter = Throughput()
    run: dict[str, Any] = client.run(run_id)
    columns = (TextColumn("[bold]{task.fields[status]}[/bold] {task.fields[phase]}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[rate]}  ETA {task.fields[eta]}"),
               TextColumn("pass rate {task.fields[pass_rate]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        bar = progress.add_task("run", total=run["tasks"]["summary"]["total"] or None, **_fields(run, meter))
        while not run.get("terminal") and run["display_status"] not in RESUMABLE_DISPLAY:
            if run["halted"]:
                time.sleep(0.2)  # tearing down: the long poll answers at once, so pace the reads
            run = client.run(run_id, wait_s=0.5)
            meter.add(time.monotonic(), settled_count(run))
            progress.update(bar, completed=settled_count(run), total=run["tasks"]["summary"]["total"] or None,
                            **_fields(run, meter))
    return run


# -- rendering -----------------------------------------------------------------------------------------------


def excerpt(text: str | None, width: int = EXCERPT) -> str:
    if text is None:
        return ""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= width else one_line[:width - 1] + "…"


def event_line(event: dict[str, Any]) -> str:
    """``seq  time  Type  {data}``: one line per event, the data as compact JSON cut to 160 characters."""
    data = json.dumps(event.get("data", {}), separators=(",", ":"), default=str)
    return f"{event['seq']:>6}  {event['created_at']}  {event['type']:<24} {excerpt(data, 160)}"


def model_name(run: dict[str, Any]) -> str:
    """The model's identifier: run summaries carry it as a string, run views (and APIs before the summaries) the
    model object."""
    model = run["model"]
    return str(model.get("identifier", "")) if isinstance(model, dict) else str(model)


def terminal_width() -> int:
    """The width tables are fitted to: the terminal's (``COLUMNS`` when set), 80 when there is none."""
    return Console().width


def fitted_table(headers: list[str], rows: list[list[str]], *, whole: tuple[str, ...], drop: tuple[str, ...] = (),
                 width: int | None = None, **table_args: Any) -> Table:
    """A table whose ``whole`` columns (ids, model names: what people copy) are never cut or wrapped.

    Other columns wrap at spaces when the table is too wide; if even their longest words leave too little room, the
    ``drop`` columns are left out, first named first. Where the whole columns alone are wider than the terminal,
    the table is rendered wider than it (the terminal folds the line; the id is still whole when copied).
    """
    width = width or terminal_width()
    box = table_args.get("box", "default")
    pad = 2  # each column's one space on either side (rich's default padding)
    edge = 0 if box is None else 1  # a column separator (and the outer edges) per column with a box

    def longest(i: int, words: bool) -> int:  # the header is one word: it is never split
        return max([len(headers[i]), *(len(w) for r in rows for w in (r[i].split() if words else [r[i]]))])

    keep = list(range(len(headers)))
    need = [longest(i, words=headers[i] not in whole) + pad + edge for i in keep]
    for name in drop:
        if sum(need[i] for i in keep) + edge <= width:
            break
        if name in headers:
            keep.remove(headers.index(name))
    whole_width = sum(need[i] for i in keep) + edge
    table = Table(**table_args)
    for i in keep:
        if headers[i] in whole:
            table.add_column(headers[i], no_wrap=True, min_width=longest(i, words=False))
        else:
            table.add_column(headers[i], overflow="fold")
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    if whole_width > width:
        table.width = whole_width  # rendered wider than the terminal rather than cut
    return table


def runs_table(runs: list[dict[str, Any]], *, width: int | None = None) -> Table:
    rows = []
    for r in runs:
        s = r["tasks"]["summary"]
        rows.append([r["id"], r["display_status"], model_name(r), r["phase"] or "-", f"{settled_count(r)}/{s['total']}",
                     "-" if s["pass_rate"] is None else f"{s['pass_rate']:.3f}", f"{r['cost']['incurred']:.4f}",
                     str(r["created_at"])[:19].replace("T", " ")])
    return fitted_table(["id", "status", "model", "phase", "tasks", "pass rate", "cost $", "created"], rows,
                        whole=("id", "model"), drop=("created", "phase", "cost $", "tasks"), width=width, box=None)


def _asked(model_input: str | None) -> str | None:
    """The part of a recorded model input a person reads first: its last user message."""
    if model_input is None:
        return None
    _, sep, last = model_input.rpartition("user: ")
    return last if sep else model_input


def _extracted(row: dict[str, Any]) -> str:
    if row.get("extracted") is False:
        return "(no answer)"
    return excerpt(row.get("answer"), 24)


def tasks_table(rows: list[dict[str, Any]]) -> Table:
    """Index, outcome, score, then what a person checks a task by (issue 21): the input the model saw, the
    reference, the extracted answer and the rule that found it, and the output."""
    table = Table("index", "outcome", "score", "input", "reference", "extracted", "rule", "output", box=None)
    for row in rows:
        table.add_row(str(row["index"]), row["outcome"], "-" if row["score"] is None else f"{row['score']:g}",
                      excerpt(_asked(row.get("input")), 40), excerpt(row.get("reference"), 24), _extracted(row),
                      row.get("rule") or "", excerpt(row["output"]))
    return table


# -- shared by every command module (cli.py and the cli_* modules import these; none imports cli.py) --

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def data_dir_of(value: Path | None) -> Path:
    if value is not None:
        return value.expanduser().resolve()
    return Path(os.environ.get("BENCHWRIGHT_DATA_DIR", default_data_dir())).expanduser().resolve()


def client_for(data_dir: Path | None, api_url: str | None, api_key: str | None):  # type: ignore[no-untyped-def]
    from benchwright.client import Client, read_dev_json

    if api_url and api_key:
        return Client(api_url, api_key)
    dev = read_dev_json(data_dir_of(data_dir))
    return Client(api_url or dev["api_url"], api_key or dev["api_key"])


def watch(client: Any, run_id: str) -> dict[str, Any]:
    """A live progress bar (tasks/s, ETA) on stderr until the run is over or waits for a person; the final run."""
    return watch_run(client, run_id, console)


def run_summary(run: dict[str, Any], first_error: str | None = None) -> str:
    """The final report: score and counts, then in plain words why the run is not a clean success (its error, its
    halt reason, its errored tasks with the first one's error), so a run of errors never reads as a result."""
    s = run["tasks"]["summary"]
    rate = "n/a" if s["pass_rate"] is None else f"{s['pass_rate']:.1%}"
    if s.get("pass_rate_ci"):
        rate += f" (95 % CI {s['pass_rate_ci'][0]:.1%}–{s['pass_rate_ci'][1]:.1%})"
    text = (f"run {run['id']}: {run['display_status']}  score (pass rate) {rate}  "
            f"passed {s['passed']}, failed {s['failed']}, errored {s['errored']} of {s['total']}")
    if s.get("no_answer"):
        text += f"\n  no answer found in {s['no_answer']} of the {s['failed']} failed tasks (counted as failed)"
    if run.get("error"):
        text += f"\n  error: {run['error']}"
    if run["halted"] and run.get("halt_reason"):
        text += f"\n  halted: {run['halt_reason']}"
    if s["errored"]:
        ended = "finished" if run["status"] == "ok" and not run["halted"] else "stopped"
        text += f"\n  {ended} with {s['errored']} of {s['total']} tasks errored" + (f": {first_error}" if first_error
                                                                                      else "")
    return text


def first_error(client: Any, run: dict[str, Any]) -> str | None:
    """The error of the first errored task (the run view carries counts only): what the summary shows as the cause."""
    if not run["tasks"]["summary"]["errored"]:
        return None
    after: int | None = -1
    while after is not None:
        page = client.tasks(run["id"], after=after)
        for task in page["tasks"]:
            if task["outcome"] == "err":
                trials = client.task(run["id"], task["index"])["trials"]
                return next((t["error"] for t in trials if t["error"]), None)
        after = page["next_after"]
    return None


def run_succeeded(run: dict[str, Any]) -> bool:
    """Whether ``run --watch`` exits 0: the run ended ok, unhalted, and not every task errored."""
    s = run["tasks"]["summary"]
    return run["status"] == "ok" and not run["halted"] and not (s["total"] > 0 and s["errored"] == s["total"])
