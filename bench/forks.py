"""Bench: a 5-model sweep of a 1,000-task benchmark (one reference run, then ``POST /v1/runs/{id}/sweep`` with
five models) against the same five models launched as five independent runs, all at once in both cases.

Starts the real stack (``benchwright up`` and the ``benchwright dev-model`` test double as separate processes),
and times from the POST until the API reports every run finished. Five "models" are five model names on one
dev model (same answers, so every run of either kind must score the same). Prints the wall time of each, the
phases each kind ran (a sweep's replays run only Fork and Materialize) and how many tasks a second they settled.

    python bench/forks.py                       # 1,000 tasks, 5 models, 50 ms per model call
    python bench/forks.py --tasks 200 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from benchstack import running_stack, scratch_dir, write_dataset

from benchwright.client import Client


def _phases(client: Client, run_id: str) -> Counter[str]:
    started: Counter[str] = Counter()
    after = -1
    while True:
        page = client.events(run_id, after=after, limit=1000)
        for e in page["events"]:
            if e["type"] == "PhaseStarted" and "inherited_from" not in e["data"]:
                started[e["data"]["phase"]] += 1
        if not page["events"]:
            return started
        after = page["next_after"]


def _wait_all(client: Client, ids: list[str]) -> list[dict]:
    with ThreadPoolExecutor(len(ids)) as pool:
        finals = list(pool.map(client.wait, ids))
    assert all(f["status"] == "ok" for f in finals), [f["status"] for f in finals]
    return finals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2, help="timed rounds (each: independent launches, then a sweep)")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = scratch_dir("bw-bench-forks-")
    dataset = work / "tasks.jsonl"
    write_dataset(dataset, args.tasks)
    with running_stack(work, answers=dataset, latency_ms=args.latency_ms) as stack:
        models = [{"identifier": f"openai/dev-{i}", "api_base": stack.model_url} for i in range(args.models)]
        with Client(stack.dev["api_url"], stack.dev["api_key"], timeout=300) as client:
            ref = client.launch(dataset=str(dataset), model=models[0], concurrency=args.concurrency)
            client.wait(ref["id"])  # the reference (and the worker's warm-up)
            indep, sweep = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                ids = [client.launch(dataset=str(dataset), model=m, concurrency=args.concurrency)["id"]
                       for m in models]
                finals = _wait_all(client, ids)
                indep.append(time.perf_counter() - t0)
                indep_phases = _phases(client, ids[0])
                t0 = time.perf_counter()
                ids = [r["id"] for r in client.sweep(ref["id"], models=models)["runs"]]
                replays = _wait_all(client, ids)
                sweep.append(time.perf_counter() - t0)
                sweep_phases = _phases(client, ids[0])
                assert [f["tasks"]["summary"]["passed"] for f in replays] == \
                    [f["tasks"]["summary"]["passed"] for f in finals] == [args.tasks] * args.models
    n = args.tasks * args.models
    print(f"{args.models} models x {args.tasks} tasks, {args.latency_ms:g} ms per call, C={args.concurrency} per run")
    for name, walls, phases in (("independent launches", indep, indep_phases), ("sweep of replays", sweep,
                                                                                 sweep_phases)):
        print(f"  {name:22s} wall median {statistics.median(walls):6.2f} s  best {min(walls):6.2f} s  "
              f"({n / min(walls):7.0f} tasks/s)  phases per run: {', '.join(phases)}")
    print(f"  sweep / independent: {statistics.median(sweep) / statistics.median(indep):.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
