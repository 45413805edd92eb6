"""Fair share between accounts: account B's run while account A saturates the stack, against B's run alone.

The goal (issue 23): while account A runs 20 runs x 1,000 tasks at C=128, account B's 200-task run finishes within
2x its solo wall time, against a loopback dev model at 50 ms.

Runs the real stack as a user would (``benchwright up`` and ``benchwright dev-model`` as separate processes),
launches through the REST API, and times B's run from its launch POST until the API reports it finished:

1. B alone (``--solo-repeat`` times, the median kept);
2. A's runs launched, and once A has begun scoring, B launched and timed again; whether A's runs were still in
   flight when B finished is reported (a figure taken after A finished would measure nothing).

Prints both wall times, the ratio against the 2x goal, and the load average (the machine is shared: the figures
move with it). Scale with the flags where the machine cannot take the full load, and say so beside the figure.

    python bench/fairness.py                                       # the goal's scale
    python bench/fairness.py --a-runs 4 --a-tasks 300 --b-tasks 100  # reduced

Also prints where B's time went, from its workflow's history (``where_waited``: the launch until the workflow
existed, workflow tasks queued and running on the worker, activities queued, each activity's running time) alone and
beside A; what A's workflows did during B's run (``overlapping``); and the CPU the stack's processes and the rest of
the machine spent meanwhile. ``FAIR_PYSPY=<py-spy binary> FAIR_PYSPY_OUT=<file>`` also records the worker with
py-spy (raw format) during B's run beside A.

"Before" figures are taken by running the checkout without the change's own copy of this script from its own
directory, with this checkout's interpreter: ``cd <checkout> && PYTHONPATH=$PWD <venv>/bin/python bench/fairness.py``.
The stack's processes are started as ``python -m benchwright.cli ...``, which puts the working directory first on
``sys.path``: ``PYTHONPATH`` alone, run from here, would still run this tree.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import cpu_s, running_stack, write_dataset

from benchwright.client import ApiError, Client

BW = [sys.executable, "-m", "benchwright.cli"]


def timed_run(client: Client, dataset: Path, model: dict, c: int) -> tuple[float, str, float]:
    """B's wall time from its launch POST to the API's "finished", its run id, and the launch's wall-clock time."""
    launched_at = time.time()
    t0 = time.perf_counter()
    run = client.launch(dataset=str(dataset), model=model, concurrency=c)
    final = client.wait(run["id"])
    wall = time.perf_counter() - t0
    assert final["status"] == "ok", final
    return wall, run["id"], launched_at


def where_waited(temporal_address: str, run_id: str, launched_at: float) -> dict[str, float]:
    """Where the run's wall time went, from its workflow's history (seconds, summed over the run): the launch until
    the workflow existed (``start``), workflow tasks waiting in the task queue (``wft_queue``) and running on the
    worker (``wft_run``), activities waiting in the queue (``act_queue``) and running (``run:<activity>``)."""
    import asyncio

    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client as TemporalClient

    async def history() -> list:
        client = await TemporalClient.connect(temporal_address)
        return list((await client.get_workflow_handle(run_id).fetch_history()).events)

    events = asyncio.run(history())
    at = {e.event_id: e.event_time.ToDatetime().timestamp() for e in events}
    out: dict[str, float] = {"start": at[events[0].event_id] - launched_at}
    out["end"] = at[events[-1].event_id] - launched_at
    names: dict[int, str] = {}
    for e in events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            a = e.workflow_task_started_event_attributes
            out["wft_queue"] = out.get("wft_queue", 0.0) + at[e.event_id] - at[a.scheduled_event_id]
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            a = e.workflow_task_completed_event_attributes
            out["wft_run"] = out.get("wft_run", 0.0) + at[e.event_id] - at[a.started_event_id]
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            key = f"queue:{names[a.scheduled_event_id]}"
            out["act_queue"] = out.get("act_queue", 0.0) + at[e.event_id] - at[a.scheduled_event_id]
            out[key] = out.get(key, 0.0) + at[e.event_id] - at[a.scheduled_event_id]
        elif kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED):
            a = (e.activity_task_completed_event_attributes if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                 else e.activity_task_failed_event_attributes)
            key = f"run:{names[a.scheduled_event_id]}"
            out[key] = out.get(key, 0.0) + at[e.event_id] - at[a.started_event_id]
    return out


def overlapping(temporal_address: str, run_ids: list[str], start: float, end: float) -> dict[str, float]:
    """What account A's workflows did in the window ``[start, end]`` (wall-clock): per activity type, the seconds
    of it running inside the window and how many started in it; workflow tasks completed in it."""
    import asyncio

    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client as TemporalClient

    async def histories() -> list[list]:
        client = await TemporalClient.connect(temporal_address)
        return [list((await client.get_workflow_handle(r).fetch_history()).events) for r in run_ids]

    out: dict[str, float] = {}
    for events in asyncio.run(histories()):
        at = {e.event_id: e.event_time.ToDatetime().timestamp() for e in events}
        names: dict[int, str] = {}
        started: dict[int, float] = {}
        for e in events:
            kind = e.event_type
            if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and start <= at[e.event_id] <= end:
                out["wft"] = out.get("wft", 0) + 1
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                a = e.activity_task_started_event_attributes
                started[a.scheduled_event_id] = at[e.event_id]
        for e in events:
            if e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
                                EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED):
                sched = (e.activity_task_completed_event_attributes.scheduled_event_id
                         if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED else
                         e.activity_task_failed_event_attributes.scheduled_event_id
                         if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED else
                         e.activity_task_canceled_event_attributes.scheduled_event_id)
                ended = at[e.event_id]
            else:
                continue
            began = started.pop(sched, None)
            if began is None:
                continue
            name = names[sched]
            inside = max(0.0, min(end, ended) - max(start, began))
            out[f"s:{name}"] = out.get(f"s:{name}", 0.0) + inside
            if start <= began <= end:
                out[f"n:{name}"] = out.get(f"n:{name}", 0) + 1
        for sched, began in started.items():  # still running at the end
            name = names[sched]
            out[f"s:{name}"] = out.get(f"s:{name}", 0.0) + max(0.0, end - max(start, began))
            if start <= began <= end:
                out[f"n:{name}"] = out.get(f"n:{name}", 0) + 1
    return out


def waited_line(parts: dict[str, float]) -> str:
    main = ("start", "wft_queue", "wft_run", "act_queue")
    runs = sorted(((k, v) for k, v in parts.items() if k.startswith("run:")), key=lambda kv: -kv[1])
    return ", ".join([f"{k} {parts.get(k, 0.0):.2f}" for k in main] + [f"{k[4:]} {v:.2f}" for k, v in runs[:8]]
                     + [f"end {parts['end']:.2f}"])


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent (all cores, user + system), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(f) for i, f in enumerate(fields) if i not in (3, 4))  # less idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _procs() -> dict[int, tuple[int, str, float]]:
    """Every process: pid -> (parent pid, command name, CPU seconds of it and its reaped children)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            raw = (entry / "stat").read_text()
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            out[int(entry.name)] = (int(fields[1]), comm, sum(int(f) for f in fields[11:15]) / tick)
    return out


def cpu_snapshot(pids: dict[str, int]) -> dict[str, Any]:
    snap: dict[str, Any] = {"machine": machine_cpu_s(), "procs": _procs()}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            snap[name] = cpu_s(pid)
    return snap


def stack_children(before: dict[str, Any], after: dict[str, Any], pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds spent by the descendants of the stack's processes (sandboxes, scorer runtimes, model proxies),
    by command name (children that started and ended in between count once reaped, in their parent's)."""
    procs = after["procs"]
    roots = set(pids.values())
    out: dict[str, float] = {}
    for pid, (ppid, comm, cpu) in procs.items():
        if pid in roots:
            continue
        used = cpu - before["procs"].get(pid, (0, "", 0.0))[2]
        if before["procs"].get(pid, (0, comm, 0.0))[1] != comm:
            used = cpu
        chain, parent = set(), ppid
        while parent > 1 and parent not in roots and parent not in chain:
            chain.add(parent)
            parent = procs.get(parent, (0, "", 0.0))[0]
        if parent in roots:
            out[f"stack:{comm}"] = out.get(f"stack:{comm}", 0.0) + used
    return out


def cpu_line(before: dict[str, Any], after: dict[str, Any], wall: float, pids: dict[str, int]) -> str:
    used = {k: after[k] - before[k] for k in after if k in before and k != "procs"}
    parts = [f"{k} {v:.1f}" for k, v in used.items() if k != "machine"]
    children = sorted(stack_children(before, after, pids).items(), key=lambda kv: -kv[1])
    parts += [f"{k} {v:.1f}" for k, v in children if v >= 0.05][:10]
    stack = sum(v for k, v in used.items() if k != "machine") + sum(v for _, v in children)
    return (f"{used['machine']:.1f} CPU-s in {wall:.1f} s ({os.cpu_count()} cores): " + ", ".join(parts)
            + f"; the rest of the machine (other work on it) {used['machine'] - stack:.1f}")


def timeline(client: Client, run_id: str) -> str:
    """B's run as its events tell it: when each phase started and ended, from the launch (where B waited)."""
    from datetime import datetime

    events = client.events(run_id, limit=1000)["events"]
    t0 = datetime.fromisoformat(events[0]["created_at"])
    marks = []
    for e in events:
        if e["type"] in ("PhaseStarted", "PhaseCompleted", "PhaseSkipped", "PipelineStarted", "PipelineFinished"):
            at = (datetime.fromisoformat(e["created_at"]) - t0).total_seconds()
            what = e["data"].get("phase", "") + (" done" if e["type"] == "PhaseCompleted" else "")
            marks.append(f"{what or e['type']} {at:.2f}")
    return ", ".join(marks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a-runs", type=int, default=20)
    ap.add_argument("--a-tasks", type=int, default=1000)
    ap.add_argument("--b-tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=128, help="C of every run, A's and B's")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--solo-repeat", type=int, default=3)
    ap.add_argument("--a-model-calls", type=int, default=None,
                    help="set A's model_calls quota (benchwright accounts quota) before A launches")
    ap.add_argument("--a-head-start", type=int, default=1, help="A's results recorded before B is launched")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bw-fair-") as tmp:
        work = Path(tmp)
        write_dataset(work / "a.jsonl", max(args.a_tasks, args.b_tasks))
        lines = (work / "a.jsonl").read_text().splitlines(keepends=True)
        (work / "b.jsonl").write_text("".join(lines[:args.b_tasks]))
        (work / "a-only.jsonl").write_text("".join(lines[:args.a_tasks]))
        with running_stack(work, answers=work / "a.jsonl", latency_ms=args.latency_ms) as stack:
            data_dir = work / "data"
            made = subprocess.run([*BW, "accounts", "create", "bench-b", "--local-paths", "--data-dir", str(data_dir)],
                                  capture_output=True, text=True, check=True)
            b_key = made.stdout.strip().splitlines()[-1]
            model = {"identifier": "openai/dev", "api_base": stack.model_url}
            a = Client(stack.dev["api_url"], stack.dev["api_key"], timeout=120)
            b = Client(stack.dev["api_url"], b_key, timeout=120)
            timed_run(b, work / "b.jsonl", model, args.concurrency)  # warm-up: imports, first sandbox
            solo_runs = [timed_run(b, work / "b.jsonl", model, args.concurrency) for _ in range(args.solo_repeat)]
            solo = [wall for wall, _, _ in solo_runs]
            load_solo = os.getloadavg()[0]
            temporal = stack.dev["temporal_address"]
            _, last_solo, last_at = solo_runs[-1]
            solo_waited = where_waited(temporal, last_solo, last_at)
            solo_timeline = timeline(b, last_solo)
            if args.a_model_calls is not None:
                subprocess.run([*BW, "accounts", "quota", a.account()["name"], "--model-calls",
                                str(args.a_model_calls), "--data-dir", str(data_dir)], capture_output=True, check=True)
            a_runs = [a.launch(dataset=str(work / "a-only.jsonl"), model=model, concurrency=args.concurrency)["id"]
                      for _ in range(args.a_runs)]
            while sum(a.run(r)["tasks"]["summary"]["passed"] for r in a_runs[:1]) < args.a_head_start:
                time.sleep(0.2)
            cpu_before = cpu_snapshot(stack.pids)
            spy = subprocess.Popen([os.environ["FAIR_PYSPY"], "record", "-p", str(stack.pids["worker"]), "-f",
                                    "raw", "-o", os.environ["FAIR_PYSPY_OUT"], "-r", "50", "--threads"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) \
                if os.environ.get("FAIR_PYSPY") else None
            loaded, b_run, b_at = timed_run(b, work / "b.jsonl", model, args.concurrency)
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            cpu_after = cpu_snapshot(stack.pids)
            b_timeline = timeline(b, b_run)
            b_waited = where_waited(temporal, b_run, b_at)
            a_did = overlapping(temporal, a_runs, b_at, b_at + loaded)
            load_loaded = os.getloadavg()[0]
            a_live = sum(1 for r in a_runs if a.run(r)["finished_at"] is None)
            a_left = sum(max(0, args.a_tasks - (s := a.run(r)["tasks"]["summary"])["passed"] - s["failed"]
                             - s["errored"]) for r in a_runs)
            for r in a_runs:  # the rest of A's load is not measured: stop it
                with contextlib.suppress(ApiError):  # already finished
                    a.stop(r, reason="bench over")
    solo_s = statistics.median(solo)
    ratio = loaded / solo_s
    print(f"fair share: A {args.a_runs} runs x {args.a_tasks} tasks, B {args.b_tasks} tasks, C={args.concurrency}, "
          f"dev model {args.latency_ms:g} ms"
          + (f", A's model_calls quota {args.a_model_calls}" if args.a_model_calls is not None else ""))
    print(f"  B alone:        {solo_s:7.2f} s  (median of {len(solo)}: {', '.join(f'{s:.2f}' for s in solo)}; "
          f"load average {load_solo:.1f})")
    print(f"  B beside A:     {loaded:7.2f} s  (load average {load_loaded:.1f}); at B's end {a_live} of "
          f"{args.a_runs} A runs in flight, {a_left} A tasks unscored")
    print(f"  B's timeline alone (s from launch):    {solo_timeline}")
    print(f"  B's timeline beside A (s from launch): {b_timeline}")
    print(f"  where B's time went alone (s):    {waited_line(solo_waited)}")
    print(f"  where B's time went beside A (s): {waited_line(b_waited)}")
    names = sorted({k[2:] for k in a_did if k[:2] in ("s:", "n:")}, key=lambda n: -a_did.get(f"s:{n}", 0.0))
    print("  A during B's run: " + f"{int(a_did.get('wft', 0))} workflow tasks; activities (started, s running): "
          + ", ".join(f"{n} {int(a_did.get(f'n:{n}', 0))}/{a_did.get(f's:{n}', 0.0):.1f}" for n in names))
    print(f"  CPU during B beside A: {cpu_line(cpu_before, cpu_after, loaded, stack.pids)}")
    print(f"  B beside A ran from {b_at:.2f} to {b_at + loaded:.2f} (wall clock)")
    print(f"  ratio:          {ratio:7.2f}x  (goal <= 2x: {'met' if ratio <= 2 else 'NOT met'})")


if __name__ == "__main__":
    main()
