"""Benchwright beside its peers: the same N questions, the same dev model (L ms a reply), C calls in flight, run by a
bare asyncio client, by Benchwright (a REST launch on a warm stack, timed to the long poll's answer), by lm-eval
(``lm_eval``, ``local-chat-completions`` with ``num_concurrent=C``) and by inspect_ai (``inspect eval`` with
``--max-connections C``), in turn, ``--repeat`` times; medians, and each one's ratio to the bare client.

    python bench/peers.py                                  # N=1000, L=50 ms, C=128, three rounds
    python bench/peers.py --tasks 1000 --concurrency 32 --repeat 5

lm-eval and inspect_ai run as their users run them, one command each on the host, from the harness environments the
tests install (``~/.cache/benchwright-harness``; installed here when missing). Two figures for each: the command's
wall (imports and start-up included, as a user waits for it) and the time the harness itself reports for its
evaluation (lm-eval's ``total_evaluation_time_seconds``, inspect_ai's ``stats.started_at``..``completed_at``, which
it writes to the second). Every
run's score is printed beside its time: all four must score the dev model alike, or the times compare different work.
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
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchstack import scratch_dir, spread, write_dataset
from materialize import _bare, run_once, warm_stack

from benchwright.harness.install import install, venv_dir
from tests.harness.qa import CACHE, INSPECT_TASK, LMEVAL_TASK, OFFLINE


def lmeval_once(work: Path, dataset: Path, base_url: str, c: int) -> dict:
    """One ``lm_eval`` command over ``dataset``: its wall, its own evaluation time and its exact_match."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "bw_qa.yaml").write_text(LMEVAL_TASK)
    (work / "qa.jsonl").write_text(dataset.read_text())
    out = work / "out"
    env = {**os.environ, **OFFLINE, "OPENAI_API_KEY": "none", "HF_HOME": str(work / ".hf")}
    args = [str(venv_dir(CACHE, "lmeval") / "bin" / "lm_eval"), "--model", "local-chat-completions", "--model_args",
            f"model=dev,base_url={base_url}/chat/completions,tokenized_requests=False,num_concurrent={c}",
            "--tasks", "bw_qa", "--include_path", str(work), "--apply_chat_template", "--output_path", str(out)]
    t0 = time.perf_counter()
    subprocess.run(args, cwd=work, env=env, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - t0
    results = json.loads(max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime).read_text())
    return {"wall_s": wall, "eval_s": float(results["total_evaluation_time_seconds"]),
            "score": results["results"]["bw_qa"]["exact_match,none"]}


_INSPECT_LOG = ("import json, sys\nfrom inspect_ai.log import read_eval_log\n"
                "log = read_eval_log(sys.argv[1], header_only=True)\n"
                "print(json.dumps({'accuracy': log.results.scores[0].metrics['accuracy'].value,"
                " 'started': log.stats.started_at, 'completed': log.stats.completed_at}))")


def inspect_once(work: Path, dataset: Path, base_url: str, c: int) -> dict:
    """One ``inspect eval`` over ``dataset``: its wall, its own evaluation time and its accuracy."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "task.py").write_text(INSPECT_TASK)
    (work / "qa.jsonl").write_text(dataset.read_text())
    logs = work / "logs"
    venv = venv_dir(CACHE, "inspect")
    env = {**os.environ, **OFFLINE, "BW_BASE_URL": base_url, "BW_API_KEY": "none"}
    args = [str(venv / "bin" / "inspect"), "eval", "task.py", "--model", "openai-api/bw/dev", "--log-dir", str(logs),
            "--log-format", "eval", "--display", "none", "--max-connections", str(c)]
    t0 = time.perf_counter()
    subprocess.run(args, cwd=work, env=env, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - t0
    log = max(logs.glob("*.eval"), key=lambda p: p.stat().st_mtime)
    read = subprocess.run([str(venv / "bin" / "python"), "-c", _INSPECT_LOG, str(log)], check=True,
                          capture_output=True, text=True, timeout=120)
    data = json.loads(read.stdout)
    took = datetime.fromisoformat(data["completed"]) - datetime.fromisoformat(data["started"])
    return {"wall_s": wall, "eval_s": took.total_seconds(), "score": data["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n, c = args.tasks, args.concurrency
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for harness in ("lmeval", "inspect"):
        _, took = install(CACHE, harness)
        if took:
            print(f"installed {harness} into {CACHE} in {took:.0f} s")
    work = scratch_dir("bw-peers-")
    dataset = work / "tasks.jsonl"
    write_dataset(dataset, n)
    rows: dict[str, list[dict]] = {"bare asyncio client": [], "Benchwright": [], "lm-eval": [], "inspect_ai": []}
    with warm_stack(work, dataset, c=c, latency_ms=args.latency_ms) as (stack, client, model):
        asyncio.run(_bare(stack.model_url, dataset, c))  # the bare client's first run too
        for r in range(args.repeat):
            wall, _first = asyncio.run(_bare(stack.model_url, dataset, c))
            rows["bare asyncio client"].append({"wall_s": wall, "eval_s": wall, "score": None})
            run = run_once(client, stack.dev, dataset, model, k=1, c=c, pids=stack.pids)
            rows["Benchwright"].append({"wall_s": run["wall_s"], "eval_s": run["wall_s"], "score": run["pass_rate"]})
            rows["lm-eval"].append(lmeval_once(work / f"lmeval-{r}", dataset, stack.model_url, c))
            rows["inspect_ai"].append(inspect_once(work / f"inspect-{r}", dataset, stack.model_url, c))
            print(f"round {r + 1}: " + ", ".join(f"{name} {row[-1]['wall_s']:.2f} s" for name, row in rows.items()),
                  flush=True)
    bare = statistics.median(x["wall_s"] for x in rows["bare asyncio client"])
    print(f"\n{n} tasks, a {args.latency_ms:g} ms model, C={c}, medians of {args.repeat} "
          f"(physical limit N*L/C = {n * args.latency_ms / 1000 / c:.2f} s):")
    print(f"{'':>21} {'wall s':>8} {'x bare':>7} {'its own eval s':>15} {'x bare':>7}  score  walls")
    for name, runs in rows.items():
        wall = statistics.median(x["wall_s"] for x in runs)
        own = statistics.median(x["eval_s"] for x in runs)
        scores = sorted({x["score"] for x in runs if x["score"] is not None})
        score = "/".join(f"{s:.3f}" for s in scores) if scores else "-"
        print(f"{name:>21} {wall:8.2f} {wall / bare:6.2f}x {own:15.2f} {own / bare:6.2f}x  {score:>5}  "
              f"{spread([x['wall_s'] for x in runs])}")
    print("wall: from the launch POST to the answer (Benchwright, a warm stack) or the command's start to its exit "
          "(lm-eval, inspect_ai: their imports included); its own eval: the harness's own timing of its evaluation")


if __name__ == "__main__":
    main()
