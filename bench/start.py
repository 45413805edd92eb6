"""A run's start, event by event: each event of a one-task run's log as ms after its RunLaunched, medians over runs.

Starts the real stack (``benchwright up`` and the dev model at ``--latency-ms``), launches ``--runs`` one-task runs
one after the other (``--pause-s`` apart; the first, a cold start, is left out), reads each run's log through the
API and prints every event (its type and phase) with the median of its offset from the run's RunLaunched, taken
from the events' ``created_at`` (stamped by the store as each append's transaction takes the run's lock). The gaps
show what each phase's own work and store traffic cost and what lies between two phases; run it on both stores to
see where Postgres's start differs (docs/performance.md, session 22):

    python bench/start.py
    python bench/start.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import postgres_store, running_stack, write_dataset
from materialize import _all_events
from tail import _at

from benchwright.client import Client


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--pause-s", type=float, default=0.5)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--postgres", metavar="URL", help="the store on this Postgres database (a schema of its own)")
    args = ap.parse_args()
    with postgres_store(args.postgres), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = work / "one.jsonl"
        write_dataset(dataset, 1)
        with running_stack(work, answers=dataset, latency_ms=args.latency_ms) as stack:
            client = Client(stack.dev["api_url"], api_key=stack.dev["api_key"])
            model = {"identifier": "openai/dev", "api_base": stack.model_url}
            logs = []
            for i in range(args.runs):
                if i:
                    time.sleep(args.pause_s)
                run = client.launch(dataset=str(dataset), model=model, concurrency=1)
                client.wait(run["id"])
                if i:  # the first run is a cold start
                    logs.append((run["id"], _all_events(client, run["id"])))
    offsets: dict[str, list[float]] = {}
    order: list[str] = []
    for _run_id, events in logs:
        launched = _at(events[0])
        seen: dict[str, int] = {}
        for event in events:
            phase = event["data"].get("phase")
            label = f"{event['type']} {phase}" if isinstance(phase, str) else event["type"]
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > 1:
                label = f"{label} #{seen[label]}"
            if label not in offsets:
                offsets[label] = []
                order.append(label)
            offsets[label].append((_at(event) - launched) * 1000)
    print(f"{len(logs)} one-task runs, {args.pause_s:g} s apart; ms after RunLaunched (median), each event:")
    for key in order:
        print(f"  {statistics.median(offsets[key]):8.1f}  {key}")


if __name__ == "__main__":
    main()
