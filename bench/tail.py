"""A run's end, event by event: from its last result's commit to the API's answer (the time a run's end adds to every
launch-and-wait, which grows with the run's size).

Starts the real stack (``benchwright up`` and the dev model at 50 ms), warms it with two one-task runs, launches one
run of ``--tasks`` x ``--trials`` at C=128, waits for it through the API's long poll, then prints:

* three more ``GET /v1/runs/{id}`` of the finished run, timed (what a dashboard's reads cost);
* the run's log from its last result on (ms after that result's commit): the phase's end, the sandbox's kill,
  PipelineFinished, the narration and report, and when the API answered;
* the workflow's history over the same stretch (the batch's end, finish_run, the report).

    python bench/tail.py                         # 10,000 tasks x 5 trials
    python bench/tail.py --tasks 1000 --trials 1
    python bench/tail.py --keep /tmp/tail-run    # keep the stack's data directory to read its store afterwards
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import running_stack, write_dataset
from hops import history
from materialize import _all_events, model_for, trials_body
from temporalio.api.enums.v1 import EventType

from benchwright.client import Client


def _at(event: dict) -> float:
    return datetime.fromisoformat(event["created_at"]).replace(tzinfo=UTC).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="the stack's work directory, kept after the run")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bw-tail-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        _measure(work, args)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, args: argparse.Namespace) -> None:
    dataset, one = work / "tasks.jsonl", work / "one.jsonl"
    write_dataset(dataset, args.tasks)
    write_dataset(one, 1)
    with running_stack(work, answers=dataset, latency_ms=50) as stack:
        client = Client(stack.dev["api_url"], api_key=stack.dev["api_key"])
        model = model_for(stack.model_url, keyed=False)
        for _ in range(2):  # the worker's first runs pay imports
            client.wait(client.launch(dataset=str(one), model=model, concurrency=1)["id"])
        run = client.launch(dataset=str(dataset), model=model, concurrency=128, **trials_body(args.trials))
        client.wait(run["id"])
        answered = time.time()
        print(f"run {run['id']} ({args.tasks} x {args.trials}, C=128) in {work}")
        for n in range(2, 5):
            started = time.perf_counter()
            client.run(run["id"])
            print(f"GET /v1/runs/{{id}} #{n}: {(time.perf_counter() - started) * 1000:.0f} ms")
        events = _all_events(client, run["id"])
        last = max(_at(e) for e in events if e["type"] == "MaterializeTaskResult")
        print("the log after the last result (ms):")
        shown = set()
        for e in events:
            key = (e["type"], round(_at(e) - last, 4))
            if _at(e) >= last and key not in shown:
                shown.add(key)
                print(f"  {(_at(e) - last) * 1000:7.1f}  {e['type']}")
        print(f"  {(answered - last) * 1000:7.1f}  the API answered the long poll")
        print("the workflow's history after the last result (ms):")
        for h in asyncio.run(history(stack.dev["temporal_address"], run["id"])):
            at = h.event_time.ToDatetime().replace(tzinfo=UTC).timestamp()
            if at >= last:
                print(f"  {(at - last) * 1000:7.1f}  {EventType.Name(h.event_type).removeprefix('EVENT_TYPE_')}")


if __name__ == "__main__":
    main()
