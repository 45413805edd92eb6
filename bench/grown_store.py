"""A one-task run on a fresh store against the same run on a store that holds many more runs of the same benchmark.

Every other bench starts on a new data directory, so a cost that grows with the runs a deployment has made never
shows in them (the cross-run cache's lookup read every earlier run's cell of the same input: 44 ms a run after 10,000
runs, docs/performance.md, session 39). This one starts two stacks side by side (``benchwright up`` and the dev
model each, as ``bench/materialize.py`` does), warms both, then clones the finished runs in the second one's SQLite
store (every table's rows of each run, under new run ids: private finished runs of the same account and benchmark)
until it holds ``--grow`` more. Then round after round it runs one task on each (which goes first alternates), so
that the machine's drift falls on both alike. Printed: each figure's medians on both (the wall from the launch POST
to the long poll's answer, the worker's and the API's CPU per run, the launch to the first model request) and the
median of the rounds' ratios (grown / fresh) with its 95 % interval, against the goal (<= 1.10: a run costs the same
however many came before).

    python bench/grown_store.py                   # 10,000 more runs, 20 rounds
    python bench/grown_store.py --grow 50000 --rounds 30
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from benchstack import ratio_verdict, running_stack, scratch_dir, write_dataset
from materialize import model_for, run_once

from benchwright.client import Client

GOAL = 1.10


FIGURES = ("wall s", "worker CPU s", "API CPU s", "first model request s")


def one_run(client: Client, stack: Any, one: Path, data_dir: Path) -> dict[str, float]:
    r = run_once(client, stack.dev, one, model_for(stack.model_url, keyed=False), k=1, c=1, pids=stack.pids,
                 proxy_dir=data_dir)
    return dict(zip(FIGURES, (r["wall_s"], r["cpu_s"]["worker"], r["cpu_s"]["api"], r["first_call_s"]), strict=True))


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def clone_runs(db: Path, more: int) -> int:
    """Copy the store's finished runs, every table's rows of each under a new run id, until ``more`` were made."""
    con = sqlite3.connect(db, timeout=60)
    try:
        tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {t: [(c[1], c[2], c[5]) for c in con.execute(f"PRAGMA table_info('{t}')")] for t in tables}
        with_run = [t for t in tables if any(name == "run_id" for name, _, _ in columns[t])]
        sources = [row[0] for row in con.execute("SELECT id FROM runs WHERE finished_at IS NOT NULL")]
        run_cols = [name for name, _, _ in columns["runs"]]
        made = 0
        while made < more:
            for source in sources:
                new = str(uuid.uuid4())
                row = dict(zip(run_cols, con.execute("SELECT * FROM runs WHERE id = ?", (source,)).fetchone(),
                               strict=True))
                con.execute(f"INSERT INTO runs ({_quoted(run_cols)}) VALUES ({', '.join('?' * len(run_cols))})",
                            [*{**row, "id": new}.values()])
                for table in with_run:  # an INTEGER primary key "id" is the row's own: left to the store
                    cols = [n for n, kind, pk in columns[table] if not (n == "id" and pk and kind.upper() == "INTEGER")]
                    copies = []
                    for values in con.execute(f"SELECT {_quoted(cols)} FROM {table} WHERE run_id = ?", (source,)):
                        copy = dict(zip(cols, values, strict=True))
                        copy["run_id"] = new
                        if copy.get("idem_key"):
                            copy["idem_key"] = str(copy["idem_key"]).replace(source, new)
                        copies.append([*copy.values()])
                    if copies:
                        con.executemany(f"INSERT INTO {table} ({_quoted(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                        copies)
                made += 1
                if made >= more:
                    break
            con.commit()
        return made
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grow", type=int, default=10_000, help="runs added to the second store")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of one run on each store (medians printed)")
    args = ap.parse_args()
    if not 1 <= args.grow <= 1_000_000 or not 1 <= args.rounds <= 500:
        ap.error("--grow must be 1-1,000,000 and --rounds 1-500")
    fresh_dir, grown_dir = scratch_dir("bw-grown-fresh-"), scratch_dir("bw-grown-")
    one = fresh_dir / "one.jsonl"
    write_dataset(one, 1)
    with running_stack(fresh_dir, answers=one, latency_ms=50.0) as fresh, \
            running_stack(grown_dir, answers=one, latency_ms=50.0) as grown, \
            Client(fresh.dev["api_url"], fresh.dev["api_key"], timeout=120) as fresh_client, \
            Client(grown.dev["api_url"], grown.dev["api_key"], timeout=120) as grown_client:
        sides = {"fresh": (fresh_client, fresh, fresh_dir / "data"), "grown": (grown_client, grown, grown_dir / "data")}
        for client, stack, data_dir in sides.values():  # warm-up: a worker's first runs pay imports and caches
            for _ in range(10):
                one_run(client, stack, one, data_dir)
        started = time.perf_counter()
        made = clone_runs(grown_dir / "data" / "benchwright.db", args.grow)
        print(f"{made:,} runs cloned into the second store in {time.perf_counter() - started:.0f} s", flush=True)
        one_run(grown_client, grown, one, grown_dir / "data")
        measured: dict[str, list[dict[str, float]]] = {"fresh": [], "grown": []}
        for n in range(args.rounds):
            for side in (("fresh", "grown") if n % 2 == 0 else ("grown", "fresh")):
                measured[side].append(one_run(*sides[side][:2], one, sides[side][2]))
    print(f"one-task runs, {args.rounds} rounds: a fresh store against one with {made:,} more runs of the benchmark; "
          f"the rounds' ratios grown / fresh: their median, its 95 % interval")
    for name in FIGURES:
        was = statistics.median(m[name] for m in measured["fresh"])
        now = statistics.median(m[name] for m in measured["grown"])
        ratios = [g[name] / f[name] for f, g in zip(measured["fresh"], measured["grown"], strict=True) if f[name]]
        print(f"{name:>22}: {was:.3f} fresh, {now:.3f} grown; "
              f"{ratio_verdict(ratios, GOAL) if ratios else 'no ratio (the fresh side measured 0)'}")

if __name__ == "__main__":
    main()
