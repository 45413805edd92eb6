"""What recording one more snapshot costs once a benchmark has been run many times on one worker's data directory.

Every run of a benchmark records the same Setup and Atomize snapshots, so each snapshot's ``labels/<id>.jsonl`` grows
by a line a run. This bench fills a label file with N records, then times the next ones (CPU of this process,
``LocalBackend.snapshot_files`` of two small files, the Atomize hand-off's shape) and prints the cost per record at
each N: it should not grow with N (a JSON list rewritten whole, before 2026-12-06, cost ~0.8 ms at 100 records, ~8 ms
at 1,000, ~56 ms at 10,000 and ~0.5 s at 100,000).

    python bench/snapshot_labels.py                  # N = 100, 1,000, 10,000, 100,000
    python bench/snapshot_labels.py --records 1000 --timed 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchwright.sandbox import LocalBackend

FILES = {"task_impl.py": b"class Scorer: ...\n", "tasks.jsonl": b'{"question": "1 + 1?", "answer": "2"}\n'}
GOAL_RATIO = 2.0
"""The largest N's cost per record against the smallest N's: O(1) per record stays within noise of 1."""


async def per_record_ms(root: Path, records: int, timed: int) -> float:
    backend = LocalBackend(root)
    try:
        snapshot_id = await backend.snapshot_files(FILES, label="bench:fill")
        entry = json.dumps({"label": "00000000-0000-0000-0000-000000000000:atomize:v1", "source": "files",
                            "created_at": time.time()}) + "\n"
        with open(backend.snapshots.labels / f"{snapshot_id}.jsonl", "a") as fh:
            fh.write(entry * (records - 1))  # what the earlier runs left
        costs = []
        for i in range(timed):
            started = time.process_time()
            await backend.snapshot_files(FILES, label=f"bench:{i}")
            costs.append((time.process_time() - started) * 1000)
        return statistics.median(costs)
    finally:
        await backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    ap.add_argument("--timed", type=int, default=30, help="records timed at each N (median printed)")
    args = ap.parse_args()
    if not all(1 <= n <= 10_000_000 for n in args.records) or not 1 <= args.timed <= 10_000:
        ap.error("--records must be 1-10,000,000 and --timed 1-10,000")
    results = {}
    for n in args.records:
        with tempfile.TemporaryDirectory(prefix="bw-labels-") as tmp:
            results[n] = asyncio.run(per_record_ms(Path(tmp), n, args.timed))
        print(f"{n:>9,} records before: {results[n]:.3f} ms of CPU per snapshot recorded (median of {args.timed})")
    ratio = results[max(results)] / results[min(results)]
    print(f"cost at {max(results):,} / at {min(results):,}: {ratio:.2f}  "
          f"{'MEETS' if ratio <= GOAL_RATIO else 'MISSES'} the goal (<= {GOAL_RATIO:g}: one record costs the same "
          f"however many came before)")


if __name__ == "__main__":
    main()
