"""A run's per-run key dies at the end of the run on every worker host, not only on the one that ran its revocation.

Two workers with data directories of their own against one store: the session's stack worker (A) runs the whole run,
Attach's registration and the end-of-run revocation included; a second worker (B, on a queue of its own, so it never
needs the run's hand-off, which this stack keeps on A's disk) gets the same run registered at *its* credential proxy
by ``live_proxy``, exactly as a Materialize batch landing on B does. When the run ends only A's route is revoked by
the run itself; B's goes with B's periodic route sweep (``benchwright.stack.teardown.sweep_routes``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest

from activities.attach import live_proxy
from activities.common import Deps
from benchwright.proxy.model_proxy import (
    ProxyHandle,
    load_handle,
    proxy_file,
    revoke_ended_routes,
    start_model_proxy,
    stop_owned_proxies,
    sweep_ended_routes,
)
from benchwright.schemas import ModelSpec
from benchwright.stack.procreg import ProcessRegistry, proc_starttime
from benchwright.store.db import make_engine
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack
from worker import build_worker

DATASET = str(SAMPLE / "arithmetic.jsonl")
REFUSED_WITHIN_S = 20.0


async def _models_status(handle: ProxyHandle) -> int:
    """The proxy's answer to the run's key: 200 while the route is registered (``GET /v1/models`` is answered by
    the proxy itself, no model call), 401 once it is revoked."""
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.get(f"{handle.base_url}/models", headers={"Authorization": f"Bearer {handle.fake_key}"})
    return resp.status_code


async def _refused_within(handle: ProxyHandle, timeout_s: float) -> float:
    """Poll until the proxy refuses the run's key (401); returns how long that took. Polling with a deadline."""
    started = time.monotonic()
    while (status := await _models_status(handle)) != 401:
        assert status == 200, status
        assert time.monotonic() - started < timeout_s, f"the key still works at {handle.base_url} after {timeout_s} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.asyncio(loop_scope="session")
async def test_an_ended_runs_key_is_refused_at_every_workers_proxy(stack: Stack, tmp_path: Path) -> None:
    settings_b = stack.settings.model_copy(update={
        "data_dir": tmp_path / "host-b", "task_queue": f"bw-host-b-{uuid.uuid4()}",
        "database_url": stack.settings.resolved_database_url(),
        "deployment_key_file": stack.data_dir / "deployment.key"})  # every host of a deployment holds its key
    # Not disposed at the end: build_worker registers this process's LLM driver with it (same database as A's).
    engine_b = make_engine(settings_b.resolved_database_url())
    worker_b = build_worker(stack.client, settings=settings_b, engine=engine_b)
    model = {"identifier": "openai/dev", "api_base": stack.dev_url}
    async with worker_b, stack.http() as http:
        run_id = (await launch(http, {"dataset": DATASET, "model": model}))["id"]
        deadline = time.monotonic() + 60
        while load_handle(stack.settings.runs_dir() / run_id) is None:  # A's Attach registered the run
            assert time.monotonic() < deadline, "Attach never registered the run on worker A"
            await asyncio.sleep(0.05)
        paused = await http.post(f"/v1/runs/{run_id}/pause")  # the run stays live while B registers it
        assert paused.status_code == 200, paused.text
        handle_a = load_handle(stack.settings.runs_dir() / run_id)
        assert handle_a is not None

        # B's run directory exists once a phase there restored the run's hand-off; the route is what it registers.
        (settings_b.runs_dir() / run_id).mkdir(parents=True)
        handle_b = await live_proxy(Deps(engine=engine_b, settings=settings_b), run_id=run_id,
                                    spec=ModelSpec.model_validate(model))
        assert handle_b.pid != handle_a.pid, "each worker has a credential proxy of its own"
        assert (await http.get(f"/v1/runs/{run_id}")).json()["finished_at"] is None
        assert await _models_status(handle_a) == 200 and await _models_status(handle_b) == 200

        resumed = await http.post(f"/v1/runs/{run_id}/resume")
        assert resumed.status_code == 200, resumed.text
        events = await wait_terminal(http, run_id)
        assert events[-1]["data"]["status"] == "ok", events[-1]

        # A deadline, not a timing goal: ten sweep intervals of the default (2 s), room for a loaded 2-core machine.
        took_a = await _refused_within(handle_a, REFUSED_WITHIN_S)
        took_b = await _refused_within(handle_b, REFUSED_WITHIN_S)
        print(f"key refused after the terminal event: worker A {took_a:.2f} s, worker B {took_b:.2f} s "
              f"(sweep every {settings_b.proxy_route_sweep_s} s)")
        # The sweep refuses the key first, then removes the handle file (stop_model_proxy): the same deadline.
        gone_by = time.monotonic() + REFUSED_WITHIN_S
        while load_handle(settings_b.runs_dir() / run_id) is not None and time.monotonic() < gone_by:
            await asyncio.sleep(0.05)
        assert load_handle(settings_b.runs_dir() / run_id) is None, "B's handle went with its route"
        assert proc_starttime(handle_b.pid) is not None, "the sweep revokes routes; B's proxy lingers for the next run"


def _handle(run_dir: Path, pid: int) -> None:
    """A run's proxy.json naming a proxy process that is gone (its routes went with it)."""
    run_dir.mkdir(parents=True)
    handle = ProxyHandle(pid=pid, port=1, fake_key="sk-bw-x", model_name="m", started_at=time.time(),
                         start_ticks=1, control=str(run_dir / "control.sock"))
    proxy_file(run_dir).write_text(json.dumps(asdict(handle)))


def test_the_sweep_asks_the_store_once_for_all_handles_and_not_at_all_when_idle(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    asked: list[list[str]] = []

    def ended_at(run_ids: Sequence[str]) -> dict[str, float]:
        asked.append(sorted(run_ids))
        return {"done": time.time() - 1, "unknown": 0.0}

    assert revoke_ended_routes(runs_dir=runs, ended_at=ended_at, linger_s=30) == 0
    (runs / "no-route").mkdir(parents=True)  # a run this worker ran without registering it here
    assert revoke_ended_routes(runs_dir=runs, ended_at=ended_at, linger_s=30) == 0
    assert asked == [], "no handle, no query"

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for run_id in ("done", "unknown", "running"):
        _handle(runs / run_id, gone.pid)
    assert revoke_ended_routes(runs_dir=runs, ended_at=ended_at, linger_s=30) == 0, "no live route among them"
    assert asked == [["done", "running", "unknown"]], "one question for every handle"
    assert sorted(p.parent.name for p in runs.glob("*/proxy.json")) == ["running"], \
        "ended runs' handles dropped; a running run's kept (its per-run key is reused when it registers again)"


def test_the_periodic_sweep_lists_nothing_while_no_proxy_holds_a_route(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _handle(runs / "done", gone.pid)
    asked: list[Sequence[str]] = []

    def ended_at(run_ids: Sequence[str]) -> dict[str, float]:
        asked.append(run_ids)
        return dict.fromkeys(run_ids, 0.0)

    assert sweep_ended_routes(registry=ProcessRegistry(tmp_path), runs_dir=runs, ended_at=ended_at, linger_s=30) == 0
    assert asked == [] and load_handle(runs / "done") is not None, "no proxy up: no listing, no query"


async def test_the_sweep_reads_only_the_runs_the_proxy_routes(tmp_path: Path) -> None:
    """The proxy names the runs it routes; the sweep asks the store about those alone, however many run directories
    (with handles left from before) the worker's disk keeps."""
    registry = ProcessRegistry(tmp_path / "data")
    runs = tmp_path / "runs"
    spec = ModelSpec(identifier="openai/dev", api_base="http://127.0.0.1:9/v1")
    try:
        for run_id in ("routed-done", "routed-running"):
            (runs / run_id).mkdir(parents=True)
            await asyncio.to_thread(start_model_proxy, run_dir=runs / run_id, spec=spec, secret_value=None,
                                    registry=registry, linger_s=30.0)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        for i in range(50):
            _handle(runs / f"old-{i}", gone.pid)  # handles of a proxy that died long ago
        asked: list[list[str]] = []

        def ended_at(run_ids: Sequence[str]) -> dict[str, float]:
            asked.append(sorted(run_ids))
            return {"routed-done": time.time() - 1}

        revoked = await asyncio.to_thread(sweep_ended_routes, registry=registry, runs_dir=runs, ended_at=ended_at,
                                          linger_s=30.0)
        assert revoked == 1 and asked == [["routed-done", "routed-running"]]
        assert load_handle(runs / "routed-done") is None and load_handle(runs / "routed-running") is not None
    finally:
        stop_owned_proxies(registry)
