"""Materialize against the physical limit: N tasks x k trials, a dev model with latency L, C SUT calls in flight.

Runs the real stack as a user would (``benchwright up`` with its Temporal dev server, worker and API, and the
``benchwright dev-model`` test double as separate processes), launches through the REST API and times each run
from the launch POST until the API reports the run finished. Prints, per configuration: wall time, tasks/s, the
physical limit N*k*L/C and the ratio to it, the workflow's history length, and the worker's peak RSS.

The first runs are a warm-up (the worker's first run pays imports); N=1 measures the fixed pipeline overhead. N=1 and
the configurations are run in turn, ``--repeat`` times; medians are compared with the target, best runs shown too.

    python bench/materialize.py                     # N=1000, k=1, L=50 ms, C=32 and C=128
    python bench/materialize.py --tasks 10000 --trials 5 --concurrency 128
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

from benchstack import cpu_s, peak_rss_mb, running_stack, write_dataset

from benchwright.client import Client


async def _history_length(address: str, run_id: str) -> int:
    from temporalio.client import Client as TemporalClient

    client = await TemporalClient.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    return len(history.events)


def _phase_ms(events: list[dict]) -> dict[str, int]:
    return {e["data"]["phase"]: e["data"]["duration_ms"] for e in events if e["type"] == "PhaseCompleted"}


def _all_events(client: Client, run_id: str) -> list[dict]:
    out, after = [], -1
    while True:
        page = client.events(run_id, after=after, limit=5000)
        out += page["events"]
        if not page["events"]:
            return out
        after = page["next_after"]


def run_once(client: Client, dev: dict, dataset: Path, model_url: str, *, k: int, c: int, pids: dict) -> dict:
    body = {"trials": {"plan": {"k": k}, "aggregator": {"name": "any_pass"}}} if k > 1 else {}
    cpu0 = {name: cpu_s(pid) for name, pid in pids.items()}
    t0 = time.perf_counter()
    run = client.launch(dataset=str(dataset), model={"identifier": "openai/dev", "api_base": model_url},
                        concurrency=c, **body)
    final = client.wait(run["id"])
    wall = time.perf_counter() - t0
    cpu = {name: round(cpu_s(pid) - cpu0[name], 2) for name, pid in pids.items()}
    assert final["status"] == "ok", final
    events = _all_events(client, run["id"])
    results = [e for e in events if e["type"] == "MaterializeTaskResult"]
    keys = {(e["data"]["index"], e["data"]["trial"]) for e in results}
    n = final["tasks"]["summary"]["total"]
    assert len(results) == len(keys) == n * k, "every (index, trial) exactly once"
    return {"run_id": run["id"], "wall_s": wall, "phases_ms": _phase_ms(events), "cpu_s": cpu,
            "history": asyncio.run(_history_length(dev["temporal_address"], run["id"])),
            "pass_rate": final["tasks"]["summary"]["pass_rate"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per configuration (median and best shown)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bw-bench-"))
    dataset, overhead_set = work / "tasks.jsonl", work / "one.jsonl"
    write_dataset(dataset, args.tasks)
    write_dataset(overhead_set, 1)
    with running_stack(work, answers=dataset, latency_ms=args.latency_ms) as stack:
        dev, model_url, pids = stack.dev, stack.model_url, stack.pids
        with Client(dev["api_url"], dev["api_key"], timeout=120) as client:
            # Warm-up (the worker's first runs pay imports and caches), then N=1 and each configuration in turn, so
            # the fixed overhead and the runs it is subtracted from are measured under the same conditions.
            run_once(client, dev, overhead_set, model_url, k=1, c=1, pids=pids)
            for c in args.concurrency:
                run_once(client, dev, dataset, model_url, k=args.trials, c=c, pids=pids)
            ones: list[dict] = []
            runs: dict[int, list[dict]] = {c: [] for c in args.concurrency}
            for _ in range(args.repeat):
                ones.append(run_once(client, dev, overhead_set, model_url, k=1, c=1, pids=pids))
                for c in args.concurrency:
                    runs[c].append(run_once(client, dev, dataset, model_url, k=args.trials, c=c, pids=pids))
            overhead = statistics.median(r["wall_s"] for r in ones)
            one = min(ones, key=lambda r: r["wall_s"])
            print(f"fixed pipeline overhead (N=1, warm): median {overhead:.3f} s, best {one['wall_s']:.3f} s  "
                  f"phases {one['phases_ms']}")
            print(f"{'N':>6} {'k':>2} {'C':>4} {'wall s':>8} {'best s':>7} {'trials/s':>8} {'limit s':>8} {'ratio':>6} "
                  f"{'target s':>8} {'history':>7}  cpu s (worker/api/temporal/dev-model)")
            for c in args.concurrency:
                wall = statistics.median(r["wall_s"] for r in runs[c])
                best = min(runs[c], key=lambda r: r["wall_s"])
                limit = args.tasks * args.trials * args.latency_ms / 1000 / c
                target = 1.15 * limit + overhead
                cpu = best["cpu_s"]
                print(f"{args.tasks:>6} {args.trials:>2} {c:>4} {wall:>8.2f} {best['wall_s']:>7.2f} "
                      f"{args.tasks * args.trials / wall:>8.0f} {limit:>8.2f} {wall / limit:>6.2f} "
                      f"{target:>8.2f} {best['history']:>7}  "
                      f"{cpu['worker']}/{cpu['api']}/{cpu['temporal']}/{cpu['dev_model']}   "
                      f"{'MEETS' if wall <= target else 'MISSES'} target (median vs 1.15 x limit + median overhead)")
                print(f"       phases ms {best['phases_ms']}; all walls {[round(r['wall_s'], 2) for r in runs[c]]}")
            print(f"worker peak RSS: {peak_rss_mb(pids['worker']):.0f} MB; lm-eval reference ~9 s, inspect_ai ~20 s "
                  f"for N=1000, C=128, L=50 ms (goal: < 4.5 s)")


if __name__ == "__main__":
    main()
