"""Where a run's time goes before its first result, hop by hop, from its workflow's history (one task by default).

Starts the real stack (``benchwright up`` and the dev model at ``--latency-ms``), launches ``--runs`` runs of
``--tasks`` tasks (one by default) at ``--concurrency``, one after the other with ``--pause-s`` between them, and
prints for each (after the first, a cold start):

* the time from the launch to the Materialize batch's start and end (the first result is in at the end);
* each phase activity's running time (Atomize among them);
* the hops' waits in Temporal's task queue (workflow tasks and activities, scheduled to started), and their sum;

and at the end the worker's CPU seconds per run (runs 1..n: its whole run, the report included), the figure that
moves when a run's fixed work gets cheaper however noisy the machine's wall clock is.

Run it with and without a pause to see Temporal's dispatch latency (docs/performance.md, "Atomize's load check
remembered, and Temporal's own dispatch"; ``bench/temporal_dispatch.py`` shows it without Benchwright):

    python bench/hops.py --pause-s 2
    python bench/hops.py --pause-s 0
    python bench/hops.py --tasks 1000 --concurrency 128 --timeline    # a bigger run's start (its batch's own steps
                                                                      # need time marks: docs/performance.md)
    python bench/hops.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test    # on the Postgres store
    cd <other checkout> && PYTHONPATH=$PWD python bench/hops.py --pause-s 2    # the same, for that checkout
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import cpu_s, postgres_store, running_stack, write_dataset
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client as TemporalClient

from benchwright.client import Client


async def history(address: str, run_id: str) -> list:
    client = await TemporalClient.connect(address)
    return [e async for e in client.get_workflow_handle(run_id).fetch_history_events()]


def hops(events: list, launched: float) -> dict:
    """Offsets (ms from the launch) of the batch's start and end, activities' running times, queue waits."""
    at = {e.event_id: e.event_time.ToDatetime().timestamp() for e in events}
    names: dict[int, str] = {}
    out: dict = {"waits": [], "running": {}}
    for e in events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            out["waits"].append(at[e.event_id] - at[e.workflow_task_started_event_attributes.scheduled_event_id])
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = e.activity_task_started_event_attributes.scheduled_event_id
            out["waits"].append(at[e.event_id] - at[scheduled])
            if names[scheduled] == "materialize_batch":
                out.setdefault("batch_start", at[e.event_id] - launched)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = e.activity_task_completed_event_attributes
            name = names[a.scheduled_event_id]
            out["running"][name] = out["running"].get(name, 0.0) + at[e.event_id] - at[a.started_event_id]
            if name == "materialize_batch":
                out["batch_done"] = at[e.event_id] - launched
    return out


def timeline(events: list, launched: float) -> str:
    """Every history event up to the Materialize batch's start, as ms from the launch: what each hop was and when
    (a workflow task's run is its STARTED to COMPLETED; an activity's queue wait its SCHEDULED to STARTED)."""
    names: dict[int, str] = {}
    lines = []
    for e in events:
        kind = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
        what = ""
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = what = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            what = names[e.activity_task_started_event_attributes.scheduled_event_id]
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            what = names[e.activity_task_completed_event_attributes.scheduled_event_id]
        lines.append(f"  {(e.event_time.ToDatetime().timestamp() - launched) * 1000:7.1f}  {kind} {what}".rstrip())
        if what == "materialize_batch" and e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            break
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--pause-s", type=float, default=2.0, help="between one run's end and the next launch")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--tasks", type=int, default=1, help="tasks per run (the hops of a bigger run's start)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--timeline", action="store_true", help="also print the last run's history event by event")
    ap.add_argument("--postgres", metavar="URL", help="the store on this Postgres database (a schema of its own)")
    args = ap.parse_args()
    with postgres_store(args.postgres), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset, answers = work / "one.jsonl", work / "answers.jsonl"
        write_dataset(dataset, args.tasks)
        write_dataset(answers, args.tasks)
        with running_stack(work, answers=answers, latency_ms=args.latency_ms) as stack:
            client = Client(stack.dev["api_url"], api_key=stack.dev["api_key"])
            model = {"identifier": "openai/dev", "api_base": stack.model_url}
            done = []
            cpu_from = 0.0
            for i in range(args.runs):
                if i:
                    time.sleep(args.pause_s)  # the pause under test: how long the stack was idle before this launch
                if i == 1:
                    cpu_from = cpu_s(stack.pids["worker"])
                launched = time.time()
                run = client.launch(dataset=str(dataset), model=model, concurrency=args.concurrency)
                client.wait(run["id"])
                events = asyncio.run(history(stack.dev["temporal_address"], run["id"]))
                h = hops(events, launched)
                label = "cold" if i == 0 else f"run {i}"
                by_time = sorted(h["running"].items(), key=lambda kv: -kv[1])
                running = ", ".join(f"{k} {v * 1000:.0f}" for k, v in by_time)
                print(f"{label}: batch start {h.get('batch_start', 0) * 1000:.0f} ms, first result "
                      f"{h.get('batch_done', 0) * 1000:.0f} ms; queue waits {len(h['waits'])} hops, "
                      f"{sum(h['waits']) * 1000:.0f} ms ({sum(w < 0.01 for w in h['waits'])} under 10 ms); "
                      f"running (ms): {running}")
                if i:
                    done.append(h.get("batch_done", 0.0))
                if args.timeline and i == args.runs - 1:
                    print(timeline(events, launched))
            if done:
                cpu = (cpu_s(stack.pids["worker"]) - cpu_from) / len(done)
                print(f"first result, median of runs 1-{len(done)}: {statistics.median(done) * 1000:.0f} ms "
                      f"(pause {args.pause_s:g} s between runs); worker CPU per run {cpu * 1000:.0f} ms")


if __name__ == "__main__":
    main()
