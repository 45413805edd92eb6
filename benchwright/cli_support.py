"""What the ``benchwright`` commands share beyond typer: the ``run`` flags folded into the launch body, the live
progress bar, and the one-line and table renderings of runs, events and tasks.

Values are checked here only where the server could not say it better (a flag without ``=``, a key given twice);
everything else goes to the API, whose 400/422 message the CLI prints as it is.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

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


def _split(flag: str, item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise BadFlag(f"{flag} takes KEY=VALUE, got {item!r}")
    return key.strip(), value


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


def runs_table(runs: list[dict[str, Any]]) -> Table:
    table = Table("id", "status", "model", "phase", "tasks", "pass rate", "cost $", "created", box=None)
    for r in runs:
        s = r["tasks"]["summary"]
        table.add_row(r["id"], r["display_status"], model_name(r), r["phase"] or "-",
                      f"{settled_count(r)}/{s['total']}",
                      "-" if s["pass_rate"] is None else f"{s['pass_rate']:.3f}", f"{r['cost']['incurred']:.4f}",
                      str(r["created_at"])[:19])
    return table


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
