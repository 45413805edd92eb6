"""SSE under load: S live streams on one N-task run must not stall the API (issue 15 item 9).

Runs the real stack as a user would (``benchwright up`` and ``benchwright dev-model`` as separate processes), launches
one N-task run and opens S SSE streams on it from a separate client process (raw asyncio sockets, so the clients'
CPU is neither the API's nor the sampler's). Meanwhile this process samples ``GET /v1/runs/{id}`` every 50 ms.

Prints, against the goals of the issue:
- the time from the run's terminal event (its ``created_at``) to the last stream closing (goal: 2 s);
- p50/p99 of ``GET /v1/runs/{id}`` while the run and the streams are live (goal: p99 under 50 ms), and idle;
- the API's RSS before, at its peak, and after; its CPU seconds over the test;
- that every stream got every event exactly once, in seq order, ending at the terminal event.

    python3 dev.py bench sse                           # N=3000, S=200, L=50 ms, C=32
    python3 bench/sse.py --tasks 3000 --streams 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from benchstack import (
    ROOT,
    BenchStack,
    cpu_s,
    peak_rss_mb,
    rss_mb,
    running_stack,
    scratch_dir,
    write_dataset,
)

from benchwright.stack.devstack import free_port

GOAL_TAIL_S, GOAL_P99_MS = 2.0, 50.0
_ID = re.compile(rb"\nid: (\d+)\n")


async def _one_stream(host: str, port: int, path: str, key: str, *, parse: bool) -> dict:
    """Read one SSE stream to its end. With ``parse``, check the ids are 0, 1, 2, ... with none missing or repeated;
    without, count the frames and read the last id (a tenth of the CPU: the clients share the API's two cores)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                 f"Accept: text/event-stream\r\nConnection: close\r\n\r\n".encode())
    opened = time.time()
    first: float | None = None
    expect, ok, pending = 0, True, b""
    while chunk := await reader.read(1 << 16):
        if first is None:
            first = time.time()
            if not chunk.startswith(b"HTTP/1.1 200"):
                return {"ok": False, "error": chunk[:200].decode(errors="replace")}
        pending += chunk
        # Frames end with a blank line; chunked transfer framing sits between frames, never inside one.
        cut = pending.rfind(b"\n\n")
        if cut < 0:
            continue
        if parse:
            for m in _ID.finditer(pending, 0, cut + 1):
                ok = ok and int(m.group(1)) == expect
                expect += 1
        else:
            expect += pending.count(b"\nid: ", 0, cut + 1)
            last = pending.rfind(b"\nid: ", 0, cut + 1)
            if last >= 0:
                ok = ok and int(pending[last + 5:pending.index(b"\n", last + 5)]) == expect - 1
        pending = pending[cut + 1:]
    closed = time.time()
    writer.close()
    return {"ok": ok, "last": expect - 1, "opened": opened, "first_byte": first, "closed": closed,
            "parsed": parse}


async def _clients(api_url: str, key: str, streams: int) -> None:
    """The client process: wait for the run id on stdin, open ``streams`` streams at once, print their results."""
    url = urlsplit(api_url)
    print("ready", flush=True)
    run_id = (await asyncio.to_thread(sys.stdin.readline)).strip()
    path = f"/v1/runs/{run_id}/events"
    results = await asyncio.gather(*(_one_stream(url.hostname or "127.0.0.1", url.port or 80, path, key,
                                                 parse=i % 10 == 0) for i in range(streams)), return_exceptions=True)
    print(json.dumps([r if isinstance(r, dict) else {"ok": False, "error": repr(r)} for r in results]), flush=True)


class _Sampler(threading.Thread):
    """GET /v1/runs/{id} every ``every_s`` on one keep-alive connection; latencies in ms."""

    def __init__(self, client: object, run_id: str, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.client, self.run_id, self.every_s = client, run_id, every_s
        self.ms: list[float] = []
        self.at: list[float] = []
        """When each sample was answered (epoch seconds)."""
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.client.get(f"/v1/runs/{self.run_id}").raise_for_status()  # type: ignore[attr-defined]
            took = time.perf_counter() - t0
            self.ms.append(took * 1000)
            self.at.append(time.time())
            self.stop.wait(max(0.0, self.every_s - took))


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs[0] if xs else 0.0)


def _created(event: dict) -> float:
    at = datetime.fromisoformat(event["created_at"])
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _terminal_event(http: object, run_id: str) -> dict:
    after = -1
    while True:
        page = http.get(f"/v1/runs/{run_id}/events", params={"after": after, "limit": 5000}).json()  # type: ignore[attr-defined]
        for event in page["events"]:
            if event["type"] == "PipelineFinished":
                return event
        after = page["next_after"]


def _tree(pid: int, read: Callable[[int], float]) -> float:
    """``read`` summed over the process and its children (uvicorn's workers)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return read(pid) + sum(read(child) for child in children)


@contextmanager
def _api(stack: BenchStack, work: Path, workers: int) -> Iterator[tuple[str, int]]:
    """The API under test: the stack's own, or one of ``workers`` uvicorn processes on the same store and Temporal."""
    if workers <= 0:
        yield stack.dev["api_url"], stack.pids["api"]
        return
    port = free_port()
    env = {**os.environ, "BENCHWRIGHT_DATA_DIR": str(work / "data"),
           "BENCHWRIGHT_TEMPORAL_ADDRESS": stack.dev["temporal_address"], "BENCHWRIGHT_ALLOW_LOCAL_PATHS": "true",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", str(workers), "--log-level", "warning",
                             "--no-access-log"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {workers}-worker API did not start")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=32, help="SUT calls in flight (32: a run of ~5 s)")
    ap.add_argument("--api-workers", type=int, default=0,
                    help="serve the streams and reads from a separate API of this many uvicorn workers (0: the stack's "
                         "own single-process API)")
    ap.add_argument("--clients", nargs=2, metavar=("API_URL", "KEY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.clients:
        asyncio.run(_clients(args.clients[0], args.clients[1], args.streams))
        return

    work = scratch_dir("bw-bench-sse-")
    dataset, one = work / "tasks.jsonl", work / "one.jsonl"
    write_dataset(dataset, args.tasks)
    write_dataset(one, 1)
    with running_stack(work, answers=dataset, latency_ms=args.latency_ms) as stack, \
            _api(stack, work, args.api_workers) as (api_url, api):
        headers = {"Authorization": f"Bearer {stack.dev['api_key']}"}
        with httpx.Client(base_url=api_url, headers=headers, timeout=300) as http:
            model = {"identifier": "openai/dev", "api_base": stack.model_url}
            warm = http.post("/v1/runs", json={"dataset": str(one), "model": model}).json()  # the worker's imports
            http.get(f"/v1/runs/{warm['id']}", params={"wait_s": 60}).raise_for_status()
            idle = _Sampler(http, warm["id"])
            idle.start()
            time.sleep(2.0)  # 40 samples of the idle API
            idle.stop.set()
            idle.join()

            clients = subprocess.Popen([sys.executable, __file__, "--streams", str(args.streams), "--clients",
                                        api_url, stack.dev["api_key"]],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert clients.stdout is not None and clients.stdin is not None
            assert clients.stdout.readline().strip() == "ready"
            rss0, cpu0 = _tree(api, rss_mb), _tree(api, cpu_s)
            t0 = time.time()
            run = http.post("/v1/runs", json={"dataset": str(dataset), "model": model,
                                              "concurrency": args.concurrency}).json()
            clients.stdin.write(run["id"] + "\n")
            clients.stdin.flush()
            live = _Sampler(httpx.Client(base_url=api_url, headers=headers, timeout=300), run["id"])
            live.start()
            results = json.loads(clients.stdout.readline())
            clients.wait(60)
            http.get(f"/v1/runs/{run['id']}", params={"wait_s": 60}).raise_for_status()  # for --streams 0
            live.stop.set()
            live.join()
            api_cpu, rss1, peak = _tree(api, cpu_s) - cpu0, _tree(api, rss_mb), _tree(api, peak_rss_mb)
            final = http.get(f"/v1/runs/{run['id']}").json()
            terminal = _terminal_event(http, run["id"])

    ended = _created(terminal)
    good = [r for r in results if r.get("ok") and r["last"] == terminal["seq"]]
    closed = [r["closed"] for r in good]
    tail = max(closed) - ended if closed else float("inf")
    p50, p99 = _pct(live.ms, 50), _pct(live.ms, 99)
    print(f"run {run['id']}: {args.tasks} tasks, status {final['status']}, {terminal['seq'] + 1} events, "
          f"ran {ended - t0:.2f} s from launch; {args.streams} streams")
    print(f"streams complete (ending at the terminal event, every frame counted; every id checked in order on "
          f"{sum(1 for r in good if r['parsed'])} of them): {len(good)}/{len(results)}"
          + ("" if len(good) == len(results) else f"  first failure: {next(r for r in results if r not in good)}"))
    if good:
        opened = max(r["first_byte"] for r in good)
        print(f"streams opened (first byte) within {opened - t0:.2f} s of the launch")
        steady = [ms for ms, at in zip(live.ms, live.at, strict=True) if at - ms / 1000 > opened]
        print(f"GET /v1/runs/{{id}} once every stream was open ({len(steady)} samples): p50 {_pct(steady, 50):.1f} ms, "
              f"p99 {_pct(steady, 99):.1f} ms, max {max(steady, default=0):.1f} ms")
    if closed:
        print(f"terminal event -> last stream closed: {tail:.2f} s (first closed {min(closed) - ended:.2f} s)"
              f"   goal {GOAL_TAIL_S} s: ratio {tail / GOAL_TAIL_S:.2f}")
    print(f"GET /v1/runs/{{id}} during the run ({len(live.ms)} samples): p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
          f"max {max(live.ms, default=0):.1f} ms   goal p99 {GOAL_P99_MS:.0f} ms: ratio {p99 / GOAL_P99_MS:.2f}")
    print(f"GET /v1/runs/{{id}} idle ({len(idle.ms)} samples): p50 {_pct(idle.ms, 50):.1f} ms, "
          f"p99 {_pct(idle.ms, 99):.1f} ms")
    print(f"API: RSS {rss0:.0f} MB before, {rss1:.0f} MB after, peak {peak:.0f} MB; CPU {api_cpu:.1f} s over the test "
          f"({api_cpu / max(1, (terminal['seq'] + 1) * args.streams) * 1e6:.1f} us per event per stream)")
    print(f"load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(other work on the machine inflates the latencies)")


if __name__ == "__main__":
    main()
