"""A run after a quiet spell: launch to the first model request, and to the answer, for a run launched after the
stack sat idle for ``--quiet-s`` seconds (longer than the credential proxy's linger, 30 s by default), beside one
launched right after another. Issue 25's goal for the first model request (0.2 s on a warm stack) holds for both: a
user's run usually follows a quiet spell, where a bench's runs follow each other.

    python bench/quiet.py                          # 4 pairs, 40 s quiet, one task; about 3 minutes
    python bench/quiet.py --tasks 1000 --concurrency 128
    BENCHWRIGHT_PROXY_KEEP_READY=false python bench/quiet.py    # without the worker's spare credential proxy

The stack's settings come from the environment, as for ``benchwright up``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import scratch_dir, spread, write_dataset
from materialize import run_once, warm_stack

GOAL_FIRST_REQUEST_S = 0.2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--quiet-s", type=float, default=40.0)
    args = ap.parse_args()
    work = scratch_dir("bw-quiet-")
    dataset = work / "tasks.jsonl"
    write_dataset(dataset, args.tasks)
    after_quiet: list[dict] = []
    back_to_back: list[dict] = []
    with warm_stack(work, dataset, c=args.concurrency) as (stack, client, model):
        for i in range(args.pairs):
            time.sleep(args.quiet_s)  # the quiet spell under test, not a synchronisation
            after_quiet.append(run_once(client, stack.dev, dataset, model, k=1, c=args.concurrency, pids=stack.pids))
            back_to_back.append(run_once(client, stack.dev, dataset, model, k=1, c=args.concurrency,
                                         pids=stack.pids))
            quiet, busy = after_quiet[-1], back_to_back[-1]
            print(f"pair {i + 1}: after {args.quiet_s:g} s quiet: first request {quiet['first_call_s']:.3f} s, answer "
                  f"{quiet['wall_s']:.3f} s; right after it: first request {busy['first_call_s']:.3f} s, answer "
                  f"{busy['wall_s']:.3f} s", flush=True)
    print(f"\n{args.tasks} task(s) at C={args.concurrency}, {args.pairs} pairs (median [95 % interval]):")
    for name, runs in (("after a quiet spell", after_quiet), ("right after another run", back_to_back)):
        first = [r["first_call_s"] for r in runs]
        verdict = "MEETS" if statistics.median(first) <= GOAL_FIRST_REQUEST_S else "MISSES"
        print(f"  {name:>24}: launch -> first model request {spread(first)} s ({verdict} the goal, "
              f"<= {GOAL_FIRST_REQUEST_S} s); launch -> answer {spread([r['wall_s'] for r in runs])} s")


if __name__ == "__main__":
    main()
