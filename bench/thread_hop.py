"""What one hand-off from the event loop to a thread and back costs on this machine, with the two threads free to run
on any CPU and with both on one CPU (what ``BENCHWRIGHT_WORKER_CPU`` does for a worker; ``benchwright.stack.cpu``).

A worker makes ~75 such hand-offs a run before the batch's model calls (``bench/worker_threads.py`` counts them)
and more while it commits results; the GIL passes between its threads many times more. Each hop wakes a sleeping
thread, and a thread woken on another CPU that was idle costs an inter-processor interrupt: on a virtual machine, an
exit to the hypervisor. Prints, per way and round, the CPU and wall per ``asyncio.to_thread`` of a function that
does nothing, and the median ratio of the pinned way's CPU to the spread one's.

    python bench/thread_hop.py                    # 5,000 hops a round, 5 rounds, each way in turn
    python bench/thread_hop.py --hops 20000 --rounds 3

Each way runs in a process of its own (pinning is for good), the two ways alternating round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _nothing() -> None:
    return None


async def _hops(n: int) -> tuple[float, float]:
    for _ in range(200):  # the executor's thread started, the code warm
        await asyncio.to_thread(_nothing)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await asyncio.to_thread(_nothing)
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


def _one_way(pin: bool, n: int) -> None:
    """In a child process: the hops, pinned to one CPU first (as a worker pins itself) or not; prints µs per hop."""
    if pin:
        sys.path.insert(0, str(ROOT))
        from benchwright.stack.cpu import pin_threads

        pin_threads("auto")
    cpu, wall = asyncio.run(_hops(n))
    print(json.dumps({"cpu_us": cpu * 1e6, "wall_us": wall * 1e6}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hops", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--way", choices=["spread", "pinned"], help=argparse.SUPPRESS)  # the child's part
    args = ap.parse_args()
    if args.way:
        _one_way(args.way == "pinned", args.hops)
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print(f"this process may run on one CPU only ({cpus}): nothing to compare")
        return
    print(f"asyncio.to_thread of a function that does nothing, {args.hops:,} hops a round, CPUs {cpus}")
    ratios = []
    for r in range(args.rounds):
        seen = {}
        for way in ("spread", "pinned"):
            out = subprocess.run([sys.executable, __file__, "--way", way, "--hops", str(args.hops)],
                                 capture_output=True, text=True, check=True).stdout
            seen[way] = json.loads(out)
            print(f"round {r}, {way:>6}: {seen[way]['cpu_us']:6.1f} µs CPU, {seen[way]['wall_us']:6.1f} µs wall a hop")
        ratios.append(seen["pinned"]["cpu_us"] / seen["spread"]["cpu_us"])
    print(f"CPU a hop, pinned / spread: median {statistics.median(ratios):.2f} over {len(ratios)} rounds "
          f"(all {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
