"""Where a run's time goes, launch to answer: one timeline from the API's answer, the run's log, its workflow's history
and time marks taken inside the worker and the API, medians over runs.

Starts the real stack (``benchwright up`` and the dev model at 50 ms) with ``bench/timeline_hooks`` first on its
processes' ``PYTHONPATH``: Python loads its ``sitecustomize`` there, which wraps a few functions of the worker and the
API as they are imported and appends a time mark for each call to a file (``BENCHWRIGHT_BENCH_MARKS``; nothing of the
product changes, see that file). Then it launches ``--runs`` runs of ``--tasks`` tasks at ``--concurrency`` one after
the other, each waited for by the API's long poll, after two warm-up runs, and prints each milestone of a run as ms
after its launch POST (the median over the runs, with the fastest and slowest), and the step from the one before it;
then how the model calls went as the worker saw them (each SUT call's duration, the credential proxy and the model
included, and how many were in flight) and how late the worker's event loop was while the batch ran (a 1 ms timer):

    python bench/timeline.py                                  # 1,000 tasks at C=128
    python bench/timeline.py --tasks 1 --concurrency 1        # one task: the fixed pipeline
    python bench/timeline.py --tasks 10000 --trials 5 --runs 1   # a 10,000 x 5 run (its end: bench/tail.py too)
    python bench/timeline.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test
    python bench/timeline.py --tasks 1 --concurrency 1 --runs 10 --postgres URL --round-trips   # and Postgres's trips
    python bench/timeline.py --tasks 1 --concurrency 1 --runs 1 --dump   # and every time mark of the last run
    python bench/timeline.py --tasks 1 --concurrency 1 --runs 1 --postgres URL --statements  # the last run's trips
    python bench/timeline.py --cpu                            # and each process's CPU in each stretch of a run
    cd <other checkout> && PYTHONPATH=$PWD python bench/timeline.py    # the same for that checkout

Sources: the run's log (each event's commit time), the workflow's history (Temporal's own times) and the marks (the
worker's activations and activity starts as its Python code sees them, the batch, the scorer runtime, the model calls
the scorer asked for and the SUT calls made for them, the workflow's code in an activation and Temporal's answer to
the activation's completion, the sandboxes' disposal, the API's run view and narration, the
loop probe). The marks cost a line-buffered write each (three per model call) and the probe a wake-up a millisecond,
so the marked runs are slightly slower than ``bench/materialize.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_stretches
from benchstack import postgres_store, running_stack, write_dataset
from hops import history
from materialize import _all_events, model_for, trials_body
from tail import _at
from temporalio.api.enums.v1 import EventType

from benchwright.client import Client

HOOKS = Path(__file__).resolve().parent / "timeline_hooks"

Mark = tuple[float, int, str]
"""(unix time, pid, label) of one time mark."""


def read_marks(path: Path) -> list[Mark]:
    marks = []
    for line in path.read_text().splitlines():
        at, pid, label = line.split(" ", 2)
        marks.append((float(at), int(pid), label))
    return sorted(marks)


def _first(marks: list[Mark], label: str, *, after: float = 0.0, pid: int | None = None) -> float | None:
    return next((t for t, p, lab in marks if lab == label and t >= after and (pid is None or p == pid)), None)


def milestones(*, launched: float, answered: float, events: list[dict], hist: list, marks: list[Mark],
               concurrency: int, api_pid: int) -> dict[str, float | None]:
    """Each milestone of one run as seconds since the epoch (None when the run had none of it)."""
    ours = [m for m in marks if launched <= m[0] <= answered + 0.5]
    by_type: dict[str, list[float]] = {}
    for e in events:
        by_type.setdefault(e["type"], []).append(_at(e))
    atomized = next((_at(e) for e in events if e["type"] == "PhaseCompleted" and e["data"]["phase"] == "atomize"),
                    None)
    results = by_type.get("MaterializeTaskResult", [])

    def when(kind: int, name: str | None = None, last: bool = False) -> float | None:
        names: dict[int, str] = {}
        found = []
        for e in hist:
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            if e.event_type != kind:
                continue
            if name is not None:
                attrs = (e.activity_task_completed_event_attributes if kind ==
                         EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED else e.activity_task_started_event_attributes)
                if names.get(attrs.scheduled_event_id) != name:
                    continue
            found.append(e.event_time.ToDatetime().replace(tzinfo=UTC).timestamp())
        return (found[-1] if last else found[0]) if found else None

    def local(name: str) -> float | None:
        """When the workflow task that recorded local activity ``name``'s marker completed."""
        for e in hist:
            attrs = e.marker_recorded_event_attributes
            if (e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and attrs.marker_name == "core_local_activity"
                    and json.loads(attrs.details["data"].payloads[0].data)["activity_type"] == name):
                return e.event_time.ToDatetime().replace(tzinfo=UTC).timestamp()
        return None

    terminal = (by_type.get("PipelineFinished") or [None])[0]
    since_atomize = atomized or answered
    batch_end = when(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, "materialize_batch", last=True)
    calls = [t for t, _, lab in ours if lab.startswith("model call ")]
    return {
        "workflow started (history)": when(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
        "its first activation in the worker": _first(ours, "activation initialize_workflow >"),
        "its workflow instance made": _first(ours, "workflow instance made <"),
        "quick phases start": _first(ours, "activity quick_phases >"),
        "Atomize completed (log)": atomized,
        "the quick phases' activation": _first(ours, "activation resolve_activity >", after=since_atomize),
        "its workflow code done": _first(ours, "workflow code <", after=since_atomize),
        "its commands taken by Temporal": _first(ours, "activation completed to the server <", after=since_atomize),
        "batch activity started (history)": when(EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, "materialize_batch"),
        "batch starts in the worker": _first(ours, "batch >"),
        "scorer runtime ready": _first(ours, "scorer runtime start <"),
        "first model call": calls[0] if calls else None,
        f"model call {concurrency} (C)": calls[concurrency - 1] if len(calls) >= concurrency else None,
        "first result committed (log)": min(results) if results else None,
        "last trial settled (its scorer runtime closed)": max(
            (t for t, _, lab in ours if lab == "scorer runtime close >"), default=None),
        "last result committed (log)": max(results) if results else None,
        "last batch's end in the worker": max((t for t, _, lab in ours if lab == "batch <"), default=None),
        "last batch activity completed (history)": batch_end,
        "its activation in the worker": _first(ours, "activation resolve_activity >", after=batch_end or answered),
        "finish_run starts in the worker": _first(ours, "activity finish_run >"),
        "PipelineFinished committed (log)": terminal,
        "finish_run completed (history)": when(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, "finish_run")
        or local("finish_run"),
        "API reads the terminal view": _first(ours, "run view >", after=terminal or answered, pid=api_pid),
        "API's narration done": _first(ours, "narration <", after=terminal or answered, pid=api_pid),
        "the long poll answered": answered,
        "the workflow closed, its report written (history)": when(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
    }


def call_figures(marks: list[Mark], *, launched: float, answered: float) -> dict[str, float] | None:
    """How the model calls of one run went, as the worker saw them: each SUT call's duration (the credential proxy and
    the model included; ms), how many were in flight on average from the first call's start to the last one's end, and
    how late the worker's event loop fired a 1 ms timer while the batch ran (the last batch's probe; ms)."""
    ours = [m for m in marks if launched <= m[0] <= answered + 0.5]
    starts: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    for at, _, label in ours:
        if label.startswith("sut call "):
            name, _, end = label.rpartition(" ")
            if end == ">":
                starts[name] = at
            elif name in starts:
                spans.append((starts.pop(name), at))
    if not spans:
        return None
    took = sorted(1000 * (b - a) for a, b in spans)
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    figures = {"call mean": statistics.mean(took), "call p50": took[len(took) // 2],
               "call p90": took[min(len(took) - 1, int(0.9 * len(took)))],
               "in flight": sum(b - a for a, b in spans) / window if window > 0 else 1.0}
    late = [label.split()[2:] for _, _, label in ours if label.startswith("loop late ")]
    if late:
        _n, mean, _p50, p90, p99, _top = map(float, late[-1])
        figures |= {"loop late mean": mean, "loop late p90": p90, "loop late p99": p99}
    return figures


STRETCH_BOUNDS = ("launch POST", "quick phases start", "batch starts in the worker", "scorer runtime ready",
                  "last trial settled (its scorer runtime closed)", "last batch's end in the worker",
                  "the long poll answered", "the workflow closed, its report written (history)")
"""The milestones between which ``--cpu`` counts each process's CPU."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=1, help="trials per task (k; any_pass as the aggregator)")
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--postgres", metavar="URL", help="the store on this Postgres database (a schema of its own)")
    ap.add_argument("--dump", action="store_true", help="also print every time mark of the last run, in order")
    ap.add_argument("--marks-out", metavar="PATH", type=Path,
                    help="also copy every run's raw time marks (<unix time> <pid> <label> a line) to PATH")
    ap.add_argument("--round-trips", action="store_true",
                    help="with --postgres: count each run's round trips to Postgres, launch to answer, per process")
    ap.add_argument("--statements", action="store_true",
                    help="with --postgres: also list the last run's round trips, each with what the client sent")
    ap.add_argument("--cpu", type=float, nargs="?", const=4.0, metavar="MS",
                    help="also the CPU each process spends in each stretch of a run, sampled every MS (4) ms "
                         "(bench/cpu_stretches.py)")
    args = ap.parse_args()
    if args.cpu is not None and not 0.5 <= args.cpu <= 1000:
        ap.error("--cpu samples every 0.5 to 1,000 ms")
    args.round_trips = args.round_trips or args.statements
    if args.round_trips and not args.postgres:
        ap.error("--round-trips and --statements count round trips to Postgres: give --postgres URL too")
    with postgres_store(args.postgres), tempfile.TemporaryDirectory(prefix="bw-timeline-") as tmp:
        work = Path(tmp)
        marks_file = work / "marks.txt"
        os.environ["BENCHWRIGHT_BENCH_MARKS"] = str(marks_file)
        traces = work / "pgtrace"
        if args.round_trips:
            traces.mkdir()
            os.environ["BENCHWRIGHT_BENCH_PGTRACE"] = str(traces)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p)
        dataset = work / "tasks.jsonl"
        write_dataset(dataset, args.tasks)
        with running_stack(work, answers=dataset, latency_ms=50) as stack, \
                Client(stack.dev["api_url"], stack.dev["api_key"], timeout=120) as client:
            model = model_for(stack.model_url, keyed=False)
            runs: list[dict[str, float | None]] = []
            windows: list[tuple[float, float]] = []
            pids = stack.pids
            figures: list[dict[str, float] | None] = []
            cpu_file = work / "cpu.txt"
            sampler = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("cpu_stretches.py")), "sample", str(cpu_file),
                 str(args.cpu), *(f"{role}={pid}" for role, pid in pids.items())]) if args.cpu else None
            try:
                for n in range(2 + args.runs):
                    launched = time.time()
                    run_id = client.launch(dataset=str(dataset), model=model, concurrency=args.concurrency,
                                           **trials_body(args.trials))["id"]
                    final = client.wait(run_id)
                    answered = time.time()
                    assert final["status"] == "ok", final
                    hist = asyncio.run(_closed_history(stack.dev["temporal_address"], run_id))
                    if n >= 2:  # the first two warm the worker up
                        marks = read_marks(marks_file)
                        runs.append(milestones(
                            launched=launched, answered=answered, events=_all_events(client, run_id), hist=hist,
                            marks=marks, concurrency=min(args.concurrency, args.tasks),
                            api_pid=stack.pids["api"]) | {"launch POST": launched})
                        figures.append(call_figures(marks, launched=launched, answered=answered))
                        windows.append((launched, answered))
            finally:
                if sampler is not None:  # also when a run fails: the sampler is this process's to stop
                    sampler.terminate()
                    sampler.wait(10)
        _print(runs, args)
        _print_calls([f for f in figures if f is not None], args)
        if args.cpu:
            samples = cpu_stretches.Samples(cpu_file)
            cpu_stretches.print_table([cpu_stretches.stretches(samples, [(name, run[name]) for name in STRETCH_BOUNDS])
                                       for run in runs], samples, args.cpu)
        if args.round_trips:  # read once the stack has stopped: each process's traces are flushed as it exits
            _print_round_trips(round_trips(traces, windows, pids))
        if args.statements and windows:
            _print_statements(exchanges(traces, windows[-1], pids), windows[-1][0])
        if args.marks_out:  # the raw marks, for an analysis of one's own
            shutil.copy(marks_file, args.marks_out)
        if args.dump:
            for at, pid, label in read_marks(marks_file):
                if launched <= at <= answered + 0.5 and not label.startswith(("model call ", "sut call ")):
                    print(f"{1000 * (at - launched):8.1f}  {pid:>7}  {label}")


def round_trips(traces: Path, windows: list[tuple[float, float]], pids: dict[str, int]) -> list[dict[str, int]]:
    """Each run's round trips to Postgres between its launch POST and its answer, by process (``api``, ``worker``,
    ``other``), from libpq's traces (``BENCHWRIGHT_BENCH_PGTRACE``): one ReadyForQuery from the server ends every
    exchange, a simple query's (BEGIN and COMMIT included) or an extended query's Sync."""
    names = {pids["api"]: "api", pids["worker"]: "worker"}
    counts = [{"api": 0, "worker": 0, "other": 0} for _ in windows]
    for path in traces.glob("*.trace"):
        who = names.get(int(path.name.split("-", 1)[0]), "other")
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if fields[1:4:2] != ["B", "ReadyForQuery"]:
                continue
            at = _local(fields[0])
            for n, (start, end) in enumerate(windows):
                if start <= at <= end:
                    counts[n][who] += 1
    return counts


_TRACE_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\t([FB])\t\d+\t(\w+)\t?(.*)$")


def exchanges(traces: Path, window: tuple[float, float],
              pids: dict[str, int]) -> list[tuple[float, float, str, str]]:
    """Every round trip of ``window`` as ``(the server's answer's time, how long after the client's first message of
    it, process, what the client sent)``, from the
    traces of ``BENCHWRIGHT_BENCH_PGTRACE`` (one file per connection)."""
    names = {pids["api"]: "api", pids["worker"]: "worker"}
    out: list[tuple[float, float, str, str]] = []
    for path in traces.glob("*.trace"):
        who = names.get(int(path.name.split("-", 1)[0]), "other")
        for asked, stamp, sent in _trips(path.read_text(errors="replace")):
            at = _local(stamp)
            if window[0] <= at <= window[1]:
                out.append((at, at - _local(asked), who, " | ".join(" ".join(text.split()) for text in sent) or "?"))
    return sorted(out)


def _local(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").astimezone().timestamp()  # libpq writes local time


def _trips(trace: str) -> Iterator[tuple[str, str, list[str]]]:
    """One connection's round trips in libpq's trace: the time of the client's first message of each, its
    ReadyForQuery's time and the statements the client sent before it (a simple query's text; an extended query's, a
    prepared one's by the text it was prepared from)."""
    prepared: dict[str, str] = {}
    sent: list[str] = []
    asked = ""
    message: list[str] = []  # the frontend message being read: its kind, then its text's lines
    for line in [*trace.splitlines(), ""]:
        m = _TRACE_LINE.match(line)
        if m is None and line and message:
            message.append(line)
            continue
        if message:  # a frontend message ended
            kind, text = message[0], "\n".join(message[1:]).strip()
            if kind == "Query":
                sent.append(text.strip('"'))
            elif kind == "Parse":
                name, _, rest = text.partition(" ")
                statement = rest.rsplit('"', 1)[0].lstrip('"')
                if name.strip('"'):
                    prepared[name.strip('"')] = statement
                sent.append(statement)
            elif kind == "Bind":
                parts = text.split(" ")
                name = parts[1].strip('"') if len(parts) > 1 else ""
                if name in prepared and (not sent or sent[-1] != prepared[name]):
                    sent.append(prepared[name])
            message = []
        if m is None:
            continue
        stamp, side, kind, rest = m.groups()
        if side == "F":
            message = [kind, rest]
            asked = asked or stamp
        elif kind == "ReadyForQuery":
            yield asked or stamp, stamp, sent
            sent, asked = [], ""


def _print_statements(trips: list[tuple[float, float, str, str]], launched: float) -> None:
    print(f"the last run's {len(trips)} round trips to Postgres (ms after its launch POST, ms from the client's first "
          f"message to the server's ReadyForQuery, process, what was sent):")
    for at, took, who, text in trips:
        print(f"{1000 * (at - launched):8.1f} {1000 * took:6.2f}  {who:>6}  {text[:150]}")
    print(f"in all {1000 * sum(took for _, took, _, _ in trips):.1f} ms waiting for the server")


def _print_round_trips(counts: list[dict[str, int]]) -> None:
    if not counts:
        return
    med = {who: statistics.median(c[who] for c in counts) for who in counts[0]}
    print(f"round trips to Postgres per run, launch POST to answer (medians over the runs): worker {med['worker']:g}, "
          f"API {med['api']:g}, other processes {med['other']:g}; all runs: "
          + ", ".join(str(sum(c.values())) for c in counts))


async def _closed_history(address: str, run_id: str) -> list:
    """The workflow's whole history, once it closed (after the report): no run overlaps the next one's launch."""
    for _ in range(600):
        events = await history(address, run_id)
        if events and events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            return events
        await asyncio.sleep(0.05)
    raise SystemExit(f"the workflow of run {run_id} did not close")


def _print(runs: list[dict[str, float | None]], args: argparse.Namespace) -> None:
    print(f"{len(runs)} runs of {args.tasks} tasks x {args.trials} trials at C={args.concurrency} (50 ms model); "
          "ms after the launch POST: "
          "median [fastest, slowest], then the step from the milestone above (medians of the per-run steps)")
    names = [k for k in runs[0] if k != "launch POST"]
    previous: Callable[[dict[str, float | None]], float | None] = lambda r: r["launch POST"]  # noqa: E731
    for name in names:
        offsets = [1000 * (r[name] - r["launch POST"]) for r in runs if r[name] is not None and r["launch POST"]]
        steps = [1000 * (r[name] - p) for r in runs if r[name] is not None and (p := previous(r)) is not None]
        if offsets:
            print(f"{statistics.median(offsets):8.1f} [{min(offsets):7.1f}, {max(offsets):7.1f}]  "
                  f"{'+' if steps and statistics.median(steps) >= 0 else ''}"
                  f"{statistics.median(steps) if steps else float('nan'):6.1f}  {name}")
            previous = lambda r, name=name: r[name]  # noqa: E731
        else:
            print(f"{'':36}{name}: not in these runs")


def _print_calls(figures: list[dict[str, float]], args: argparse.Namespace) -> None:
    if not figures:
        return
    med = {k: statistics.median(f[k] for f in figures) for k in figures[0] if all(k in f for f in figures)}
    print(f"the model calls as the worker saw them (medians over the runs): each {med['call mean']:.1f} ms on average "
          f"(p50 {med['call p50']:.1f}, p90 {med['call p90']:.1f}) against the model's 50 ms; "
          f"{med['in flight']:.1f} of C={min(args.concurrency, args.tasks)} in flight on average")
    if "loop late mean" in med:
        print(f"the worker's event loop while the batch ran: a 1 ms timer fired {med['loop late mean']:.2f} ms late on "
              f"average (p90 {med['loop late p90']:.2f}, p99 {med['loop late p99']:.2f})")


if __name__ == "__main__":
    main()
