"""Where the worker's CPU goes, thread by thread: its event loop's thread, the default executor's threads (every
``asyncio.to_thread``: the store's reads and writes, the sandboxes' file work), Temporal's workflow threads and its
Rust core, each as CPU ms per run; then the functions the executor ran, with their CPU per run and per call.

Starts the real stack (``benchwright up`` and the dev model, as ``bench/materialize.py`` does) with
``bench/worker_threads_hooks`` first on its processes' ``PYTHONPATH``: its ``sitecustomize`` names each Python
thread for the kernel and times each function the worker's executor runs (see that file; nothing of the product
changes). After ``--warm`` runs, ``--runs`` runs of ``--tasks`` tasks at ``--concurrency``, one after the other, each
waited for by the API's long poll and its report; the CPU is read from ``/proc/<worker>/task/*`` before and after.

    python bench/worker_threads.py                          # one-task runs: the fixed pipeline
    python bench/worker_threads.py --tasks 1000 --concurrency 128 --runs 8
    python bench/worker_threads.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test

Session 40 (docs/performance.md): in a one-task run on SQLite the executor's threads took more of the worker's CPU
than its event loop did (73.5 against 55.5 of 146.5 ms), a phase's opening and close 1.1-1.8 ms each of it.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import postgres_store, running_stack, scratch_dir, write_dataset
from materialize import model_for, run_once

from benchwright.client import Client

HOOKS = Path(__file__).resolve().parent / "worker_threads_hooks"
_TICK = os.sysconf("SC_CLK_TCK")
KINDS = (("asyncio_", "default executor (asyncio.to_thread)"), ("temporal_workfl", "Temporal's workflow threads"),
         ("tokio-", "Temporal's Rust core"), ("workflow-proces", "Temporal's Rust core"))


def _kind(pid: int, tid: str, comm: str) -> str:
    if tid == str(pid):
        return "event loop (main thread)"
    return next((kind for prefix, kind in KINDS if comm.startswith(prefix)), f"other ({comm})")


def thread_cpu(pid: int) -> Counter[str]:
    """CPU seconds (user + kernel) of each kind of thread of ``pid`` so far; threads that ended are not counted (the
    worker's threads live as long as it does, the executor's included)."""
    out: Counter[str] = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[_kind(pid, tid, comm)] += (int(fields[11]) + int(fields[12])) / _TICK
    return out


def executor_totals(hooks: Path, pid: int, timeout_s: float = 30.0) -> dict[str, list[float]]:
    """The hook's totals so far (calls, CPU seconds) by function, asked of it over its FIFOs (see the hook).

    Raises:
        SystemExit: the worker's hook is not listening, or did not answer within ``timeout_s``.
    """
    ask, answer = hooks / f"ask.{pid}", hooks / f"totals.{pid}"
    try:  # without a reader a non-blocking open fails at once (ENXIO) instead of waiting for one
        request = os.open(ask, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SystemExit(f"the worker's hook is not listening on {ask} ({exc}); was the worker started as "
                         "'python -m benchwright.cli worker' with the hooks on PYTHONPATH?") from exc
    os.write(request, b"totals\n")
    os.close(request)
    reply = os.open(answer, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if not select.select([reply], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise SystemExit(f"the worker's hook did not answer on {answer} within {timeout_s:g} s")
            chunk = os.read(reply, 1 << 16)
            if not chunk and chunks:  # the hook wrote its answer and closed its end
                break
            chunks.append(chunk)
    finally:
        os.close(reply)
    found: dict[str, list[float]] = json.loads(b"".join(chunks))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5, help="runs first, not counted (the worker's first pay imports)")
    ap.add_argument("--top", type=int, default=25, help="executor functions shown")
    ap.add_argument("--postgres", metavar="URL", help="the store on this Postgres database (a schema of its own)")
    args = ap.parse_args()
    if not (1 <= args.tasks <= 100_000 and 1 <= args.concurrency <= 1024 and 1 <= args.runs <= 1000
            and 0 <= args.warm <= 100 and 1 <= args.top <= 500):
        ap.error("--tasks 1-100,000, --concurrency 1-1,024, --runs 1-1,000, --warm 0-100, --top 1-500")
    work = scratch_dir("bw-threads-")
    hooks_out = work / "hooks"
    hooks_out.mkdir()
    os.environ["BENCHWRIGHT_BENCH_THREADS"] = str(hooks_out)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p)
    dataset = work / "tasks.jsonl"
    write_dataset(dataset, args.tasks)
    with postgres_store(args.postgres), running_stack(work, answers=dataset, latency_ms=50.0) as stack, \
            Client(stack.dev["api_url"], stack.dev["api_key"], timeout=600) as client:
        model = model_for(stack.model_url, keyed=False)

        def run() -> None:
            run_once(client, stack.dev, dataset, model, k=1, c=args.concurrency, pids=stack.pids,
                     proxy_dir=work / "data")

        for _ in range(args.warm):
            run()
        worker = stack.pids["worker"]
        calls_before, cpu_before = executor_totals(hooks_out, worker), thread_cpu(worker)
        for _ in range(args.runs):
            run()
        cpu_after, calls_after = thread_cpu(worker), executor_totals(hooks_out, worker)
    per_run = {kind: (cpu_after[kind] - cpu_before.get(kind, 0.0)) / args.runs for kind in cpu_after}
    print(f"the worker's CPU per run, {args.runs} runs of {args.tasks} task(s) at C={args.concurrency} "
          f"({'Postgres' if args.postgres else 'SQLite'} store): {sum(per_run.values()) * 1000:.1f} ms")
    for kind, seconds in sorted(per_run.items(), key=lambda kv: -kv[1]):
        if seconds > 0:
            print(f"  {seconds * 1000:8.1f} ms  {kind}")
    spent = {label: (calls - calls_before.get(label, [0, 0.0])[0], cpu - calls_before.get(label, [0, 0.0])[1])
             for label, (calls, cpu) in calls_after.items()}
    total = sum(cpu for _, cpu in spent.values())
    print(f"the default executor's functions, CPU in their threads (time.thread_time): {total / args.runs * 1000:.1f} "
          f"ms per run in all; the top {args.top}:")
    print(f"  {'ms per run':>10} {'calls per run':>13} {'ms per call':>11}  function")
    for label, (calls, cpu) in sorted(spent.items(), key=lambda kv: -kv[1][1])[:args.top]:
        if calls:
            print(f"  {cpu / args.runs * 1000:10.2f} {calls / args.runs:13.1f} {cpu / calls * 1000:11.3f}  {label}")


if __name__ == "__main__":
    main()
