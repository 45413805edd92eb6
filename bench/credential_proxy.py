"""The model-call hop alone: 1,000 chat calls at C in flight against the dev model (latency L, demanding a key),
called directly, through the credential proxy, and through a LiteLLM proxy (the per-run proxy this replaced; its
multi-tenant mode needs Postgres for virtual keys, so its single-key, master-key config is what runs offline).

Prints per route: start-up time, wall (median of ``--repeat``), the caller's CPU, the proxy's CPU per call, its
RSS, and a call's mean and p90 duration as the caller sees it (what the hop adds to every call of a run). The
caller is the worker's own SUT client (``benchwright.llm.sut``), as in a run.

    python bench/credential_proxy.py                 # N=1000, C=128, L=50 ms, 3 repeats, all three routes
    python bench/credential_proxy.py --routes direct lean

LiteLLM's proxy server needs ``litellm[proxy]``, which cannot share benchwright's venv (every release of that extra
since 1.80 pins rich<14, every e2b >= 2.3 needs rich>=14), so it runs from a venv of its own; without one the
litellm route is skipped, saying why:

    python3 -m venv /tmp/litellm-proxy && /tmp/litellm-proxy/bin/pip install 'litellm[proxy]'
    python bench/credential_proxy.py --litellm /tmp/litellm-proxy/bin/litellm
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import yaml
from benchstack import BW, cpu_s, rss_mb, scratch_dir, wait_file, write_dataset

from benchwright.llm.prices import Prices
from benchwright.llm.sut import make_sut, run_sut
from benchwright.proxy.model_proxy import (
    ProxyHandle,
    start_model_proxy,
    stop_owned_proxies,
)
from benchwright.schemas import ModelSpec
from benchwright.stack.devstack import free_port
from benchwright.stack.procreg import ProcessRegistry

KEY = "sk-bench-provider-" + "k" * 24


class Unavailable(Exception):
    """A route that cannot run here; the message says why."""


async def sweep(sut_factory, n: int, c: int) -> tuple[float, float, list[float]]:  # type: ignore[no-untyped-def]
    """Wall and caller CPU for ``n`` calls, at most ``c`` in flight, and each call's duration (s) from its start
    past the concurrency bound to its reply (the model's latency plus what the route adds)."""
    sut = sut_factory()
    messages = [{"role": "user", "content": "What is 1 plus 8? (item 1)"}]
    await sut.warm(c)
    bound = asyncio.Semaphore(c)
    took: list[float] = []

    async def call():  # type: ignore[no-untyped-def]
        async with bound:
            started = time.perf_counter()
            reply = await sut.complete(messages, {})
            took.append(time.perf_counter() - started)
            return reply

    cpu0, t0 = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(call() for _ in range(n)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await sut.aclose()
    assert all(r.text == "9" for r in results), results[0]
    return wall, cpu, took


def litellm_proxy(cli: Path, work: Path, model_url: str) -> tuple[subprocess.Popen[bytes], ProxyHandle, float]:
    """LiteLLM's proxy server started by its ``litellm`` CLI; :class:`Unavailable` when it is absent or exits."""
    if not cli.is_file():
        raise Unavailable(f"no litellm CLI at {cli} (see --help: LiteLLM's proxy needs a venv of its own)")
    port = free_port()
    cfg = {"model_list": [{"model_name": "openai/dev", "litellm_params": {
        "model": "openai/dev", "api_base": model_url, "api_key": "os.environ/BENCH_KEY"}}],
        "general_settings": {"master_key": "sk-master-bench"}, "litellm_settings": {"telemetry": False}}
    (work / "litellm.yaml").write_text(yaml.safe_dump(cfg))
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_LOG": "ERROR", "BENCH_KEY": KEY}
    t0 = time.perf_counter()
    with open(work / "litellm.log", "wb") as log:
        proc = subprocess.Popen([str(cli), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:  # e.g. litellm without its proxy extra: "Missing dependency ..."
            lines = (work / "litellm.log").read_text(errors="replace").strip().splitlines() or ["(no output)"]
            raise Unavailable(f"{cli} exited with {proc.returncode}: {lines[-1]}")
        time.sleep(0.1)
    handle = ProxyHandle(pid=proc.pid, port=port, fake_key="sk-master-bench", model_name="openai/dev",
                         started_at=time.time())
    return proc, handle, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--routes", nargs="+", default=["direct", "lean", "litellm"])
    ap.add_argument("--litellm", type=Path, default=Path(sys.executable).parent / "litellm",
                    help="the litellm CLI of a venv with litellm[proxy] (default: this venv's)")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = scratch_dir("bw-proxy-bench-")
    answers = work / "answers.jsonl"
    write_dataset(answers, 10)
    model = subprocess.Popen([*BW, "dev-model", "--answers", str(answers), "--latency-ms", str(args.latency_ms),
                              "--port", "0", "--ready-file", str(work / "model.json"), "--api-key", KEY],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    registry = ProcessRegistry(work / "data")
    litellm: subprocess.Popen[bytes] | None = None
    try:
        url = wait_file(work / "model.json", model)["url"]
        spec = ModelSpec(identifier="openai/dev", api_base=url, input_cost_per_token=1e-6, output_cost_per_token=1e-6)
        opts = {"prices": Prices(), "concurrency": args.concurrency, "timeout_s": 60.0, "retries": 0}
        limit = args.calls * args.latency_ms / 1000 / args.concurrency
        print(f"{args.calls} calls, C={args.concurrency}, L={args.latency_ms:g} ms: physical limit {limit:.2f} s")
        for route in args.routes:
            proxy_pid, started = None, 0.0
            if route == "direct":
                def factory():  # type: ignore[no-untyped-def]
                    return make_sut(spec, api_key=KEY, **opts)  # type: ignore[arg-type]
            elif route == "lean":
                (work / "runs" / "bench").mkdir(parents=True, exist_ok=True)
                t0 = time.perf_counter()
                handle = start_model_proxy(run_dir=work / "runs" / "bench", spec=spec, secret_value=KEY,
                                           registry=registry, linger_s=30.0)
                started, proxy_pid = time.perf_counter() - t0, handle.pid

                def factory(handle: ProxyHandle = handle):  # type: ignore[no-untyped-def]
                    return run_sut(spec, proxy=handle, **opts)  # type: ignore[arg-type]
            else:
                try:
                    litellm, lhandle, started = litellm_proxy(args.litellm, work, url)
                except Unavailable as exc:
                    print(f"{route:>8}: skipped: {exc}")
                    continue
                proxy_pid = litellm.pid

                def factory(lhandle: ProxyHandle = lhandle):  # type: ignore[no-untyped-def]
                    return run_sut(spec, proxy=lhandle, **opts)  # type: ignore[arg-type]
            asyncio.run(sweep(factory, min(args.calls, 200), args.concurrency))  # warm-up
            cpu_proxy0 = cpu_s(proxy_pid) if proxy_pid else 0.0
            walls, cpus, took = [], [], []
            for _ in range(args.repeat):
                wall, cpu, durations = asyncio.run(sweep(factory, args.calls, args.concurrency))
                walls.append(wall)
                cpus.append(cpu)
                took += durations
            proxy_ms = ((cpu_s(proxy_pid) - cpu_proxy0) / (args.repeat * args.calls) * 1e3) if proxy_pid else 0.0
            rss = f"{rss_mb(proxy_pid):.0f} MB" if proxy_pid else "-"
            took.sort()
            print(f"{route:>8}: start {started:5.2f} s  wall median {statistics.median(walls):6.2f} s "
                  f"(all {[round(w, 2) for w in walls]})  caller CPU {statistics.median(cpus):5.2f} s  "
                  f"proxy CPU {proxy_ms:6.3f} ms/call  proxy RSS {rss}  a call {1000 * statistics.mean(took):.1f} ms "
                  f"(p90 {1000 * took[int(0.9 * len(took))]:.1f}) against the model's {args.latency_ms:g}")
            if litellm is not None:
                os.killpg(litellm.pid, signal.SIGTERM)
                litellm.wait(30)
                litellm = None
    finally:
        stop_owned_proxies(registry)
        if litellm is not None:
            os.killpg(litellm.pid, signal.SIGKILL)
        model.send_signal(signal.SIGTERM)
        model.wait(30)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
