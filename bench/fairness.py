"""Fair share between accounts: account B's run while account A saturates the stack, against B's run alone.

The goal (issue 23): while account A runs 20 runs x 1,000 tasks at C=128, account B's 200-task run finishes within
2x its solo wall time, against a loopback dev model at 50 ms.

Runs the real stack as a user would (``benchwright up`` and ``benchwright dev-model`` as separate processes),
launches through the REST API, and times B's run from its launch POST until the API reports it finished:

1. B alone (``--solo-repeat`` times, the median kept);
2. A's runs launched, and once A has begun scoring, B launched and timed again; whether A's runs were still in
   flight when B finished is reported (a figure taken after A finished would measure nothing).

Prints both wall times, the ratio against the 2x goal, and the load average (the machine is shared: the figures
move with it). Scale with the flags where the machine cannot take the full load, and say so beside the figure.

    python bench/fairness.py                                       # the goal's scale
    python bench/fairness.py --a-runs 4 --a-tasks 300 --b-tasks 100  # reduced

"Before" figures are taken by running this script with PYTHONPATH pointing at a checkout without the fair share
(the stack's processes import whatever tree PYTHONPATH names).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import running_stack, write_dataset

from benchwright.client import ApiError, Client

BW = [sys.executable, "-m", "benchwright.cli"]


def timed_run(client: Client, dataset: Path, model: dict, c: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    run = client.launch(dataset=str(dataset), model=model, concurrency=c)
    final = client.wait(run["id"])
    wall = time.perf_counter() - t0
    assert final["status"] == "ok", final
    return wall, run["id"]


def timeline(client: Client, run_id: str) -> str:
    """B's run as its events tell it: when each phase started and ended, from the launch (where B waited)."""
    from datetime import datetime

    events = client.events(run_id, limit=1000)["events"]
    t0 = datetime.fromisoformat(events[0]["created_at"])
    marks = []
    for e in events:
        if e["type"] in ("PhaseStarted", "PhaseCompleted", "PhaseSkipped", "PipelineStarted", "PipelineFinished"):
            at = (datetime.fromisoformat(e["created_at"]) - t0).total_seconds()
            what = e["data"].get("phase", "") + (" done" if e["type"] == "PhaseCompleted" else "")
            marks.append(f"{what or e['type']} {at:.2f}")
    return ", ".join(marks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a-runs", type=int, default=20)
    ap.add_argument("--a-tasks", type=int, default=1000)
    ap.add_argument("--b-tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=128, help="C of every run, A's and B's")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--solo-repeat", type=int, default=3)
    ap.add_argument("--a-model-calls", type=int, default=None,
                    help="set A's model_calls quota (benchwright accounts quota) before A launches")
    ap.add_argument("--a-head-start", type=int, default=1, help="A's results recorded before B is launched")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bw-fair-") as tmp:
        work = Path(tmp)
        write_dataset(work / "a.jsonl", max(args.a_tasks, args.b_tasks))
        lines = (work / "a.jsonl").read_text().splitlines(keepends=True)
        (work / "b.jsonl").write_text("".join(lines[:args.b_tasks]))
        (work / "a-only.jsonl").write_text("".join(lines[:args.a_tasks]))
        with running_stack(work, answers=work / "a.jsonl", latency_ms=args.latency_ms) as stack:
            data_dir = work / "data"
            made = subprocess.run([*BW, "accounts", "create", "bench-b", "--local-paths", "--data-dir", str(data_dir)],
                                  capture_output=True, text=True, check=True)
            b_key = made.stdout.strip().splitlines()[-1]
            model = {"identifier": "openai/dev", "api_base": stack.model_url}
            a = Client(stack.dev["api_url"], stack.dev["api_key"], timeout=120)
            b = Client(stack.dev["api_url"], b_key, timeout=120)
            timed_run(b, work / "b.jsonl", model, args.concurrency)  # warm-up: imports, first sandbox
            solo = [timed_run(b, work / "b.jsonl", model, args.concurrency)[0] for _ in range(args.solo_repeat)]
            load_solo = os.getloadavg()[0]
            if args.a_model_calls is not None:
                subprocess.run([*BW, "accounts", "quota", a.account()["name"], "--model-calls",
                                str(args.a_model_calls), "--data-dir", str(data_dir)], capture_output=True, check=True)
            a_runs = [a.launch(dataset=str(work / "a-only.jsonl"), model=model, concurrency=args.concurrency)["id"]
                      for _ in range(args.a_runs)]
            while sum(a.run(r)["tasks"]["summary"]["passed"] for r in a_runs[:1]) < args.a_head_start:
                time.sleep(0.2)
            loaded, b_run = timed_run(b, work / "b.jsonl", model, args.concurrency)
            b_timeline = timeline(b, b_run)
            load_loaded = os.getloadavg()[0]
            a_live = sum(1 for r in a_runs if a.run(r)["finished_at"] is None)
            a_left = sum(max(0, args.a_tasks - (s := a.run(r)["tasks"]["summary"])["passed"] - s["failed"]
                             - s["errored"]) for r in a_runs)
            for r in a_runs:  # the rest of A's load is not measured: stop it
                with contextlib.suppress(ApiError):  # already finished
                    a.stop(r, reason="bench over")
    solo_s = statistics.median(solo)
    ratio = loaded / solo_s
    print(f"fair share: A {args.a_runs} runs x {args.a_tasks} tasks, B {args.b_tasks} tasks, C={args.concurrency}, "
          f"dev model {args.latency_ms:g} ms"
          + (f", A's model_calls quota {args.a_model_calls}" if args.a_model_calls is not None else ""))
    print(f"  B alone:        {solo_s:7.2f} s  (median of {len(solo)}: {', '.join(f'{s:.2f}' for s in solo)}; "
          f"load average {load_solo:.1f})")
    print(f"  B beside A:     {loaded:7.2f} s  (load average {load_loaded:.1f}); at B's end {a_live} of "
          f"{args.a_runs} A runs in flight, {a_left} A tasks unscored")
    print(f"  B's timeline beside A (s from launch): {b_timeline}")
    print(f"  ratio:          {ratio:7.2f}x  (goal <= 2x: {'met' if ratio <= 2 else 'NOT met'})")


if __name__ == "__main__":
    main()
