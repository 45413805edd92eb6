"""Issue 25's Postgres goal, side by side: the same runs on the Postgres store within 10 % of SQLite's.

Starts two stacks at once, the same as ``bench/materialize.py``'s (``benchwright up`` and the dev model at ``L``):
one on SQLite, one on a fresh schema of the ``--postgres`` database (dropped after). After a warm-up of each, every
round runs one task and then each ``--concurrency`` configuration of ``--tasks`` tasks on both stores, run by run
(which store goes first alternates round by round), so that this machine's drift (its windows minutes apart differ
by 10-50 %) falls on both alike; the idle stack meanwhile costs the measured one a little CPU, the same each way.
Prints per figure the medians on each store, the median of the rounds' ratios (Postgres / SQLite: each round's pair
ran seconds apart) with its distribution-free 95 % interval (``benchwright.comparison.stats.median_interval``), and
that ratio against the goal (<= 1.10), said to be undecided when the interval spans the goal:

    python bench/stores.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test
    python bench/stores.py --postgres URL --tasks 1000 --concurrency 32 128 --repeat 7

Figures: one task's wall (launch POST to the long poll's answer) and its launch to the first model request, and
each configuration's wall.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import postgres_store, ratio_verdict, running_stack, write_dataset
from materialize import model_for, run_once

from benchwright.client import Client

GOAL = 1.10
"""Issue 25: on the Postgres store, the same figures within 10 % of SQLite's."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postgres", metavar="URL", required=True, help="the Postgres database (a schema of its own)")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (each store runs every figure once a round)")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with ExitStack() as stacks:
        work = Path(stacks.enter_context(tempfile.TemporaryDirectory(prefix="bw-stores-")))  # removed last
        dataset, one = work / "tasks.jsonl", work / "one.jsonl"
        write_dataset(dataset, args.tasks)
        write_dataset(one, 1)
        for store in ("sqlite", "postgres"):
            (work / store).mkdir()
        # The SQLite stack starts before the Postgres schema is named: its processes read the store's URL as they
        # start (postgres_store sets it for the ones started inside it).
        started = {"sqlite": stacks.enter_context(running_stack(work / "sqlite", answers=dataset,
                                                                latency_ms=args.latency_ms))}
        stacks.enter_context(postgres_store(args.postgres))
        started["postgres"] = stacks.enter_context(running_stack(work / "postgres", answers=dataset,
                                                                 latency_ms=args.latency_ms))
        clients = {store: stacks.enter_context(Client(stack.dev["api_url"], stack.dev["api_key"], timeout=120))
                   for store, stack in started.items()}
        figures = ["one task", "one task: first model request", *(f"{args.tasks} tasks, C={c}"
                                                                   for c in args.concurrency)]
        walls: dict[str, dict[str, list[float]]] = {store: {f: [] for f in figures} for store in started}

        def round_of(n: int, record: bool) -> None:
            # Each figure's pair in turn, the store that goes first alternating round by round: no store always runs
            # right after the other.
            order = list(started.items()) if n % 2 == 0 else list(reversed(started.items()))
            for store, stack in order:
                ran = run_once(clients[store], stack.dev, one, model_for(stack.model_url, keyed=False), k=1, c=1,
                               pids=stack.pids)
                if record:
                    walls[store]["one task"].append(ran["wall_s"])
                    walls[store]["one task: first model request"].append(ran["first_call_s"])
            for c in args.concurrency:
                for store, stack in order:
                    ran = run_once(clients[store], stack.dev, dataset, model_for(stack.model_url, keyed=False), k=1,
                                   c=c, pids=stack.pids)
                    if record:
                        walls[store][f"{args.tasks} tasks, C={c}"].append(ran["wall_s"])

        round_of(0, record=False)  # the warm-up: each worker's first runs pay imports and caches
        for n in range(args.repeat):
            round_of(n, record=True)
    _report(walls, figures)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _report(walls: dict[str, dict[str, list[float]]], figures: list[str]) -> None:
    print(f"{'figure':>32} {'SQLite s':>9} {'Postgres s':>10}  ratio (median of the rounds' Postgres / SQLite, "
          f"its 95 % interval)")
    for figure in figures:
        lite, pg = walls["sqlite"][figure], walls["postgres"][figure]
        if not lite:
            continue
        ratios = [p / s for p, s in zip(pg, lite, strict=True)]
        print(f"{figure:>32} {statistics.median(lite):>9.3f} {statistics.median(pg):>10.3f}  "
              f"{ratio_verdict(ratios, GOAL)}; rounds {[round(r, 2) for r in ratios]}")


if __name__ == "__main__":
    main()
