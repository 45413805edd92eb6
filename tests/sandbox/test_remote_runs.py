"""Whole runs on the remote backends, end to end: a stack of its own per backend (Temporal dev server, the real
worker and API) whose settings configure ``e2b`` (the real SDK against the E2B double) or ``sandbox0`` (the real
Kubernetes client against the API-server double), a run launched with that ``compute``, and then:

* every SandboxCreated names the backend that made it (no silent fallback to local), with its role;
* E2B runs Materialize in fanout (a task sandbox per task), sandbox0 sequential (§4);
* cost.sandbox is Σ lifetime × the backend's rate for the instance size (§9), and the run's scores are right;
* a backend named but not configured is refused at launch with 400, naming what to configure.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from benchwright.sandbox.factory import open_backend
from benchwright.schemas import LaunchRequest
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, temporal_binary
from benchwright.stack.teardown import reap_worker_leftovers
from benchwright.stack.temporal_ui import SEARCH_ATTRIBUTES
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.runs import create_run
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from benchwright.testkit.e2b_double import E2BDouble
from benchwright.testkit.k8s_double import K8sDouble
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, serve_app
from worker import build_worker

DATASET = str(SAMPLE / "arithmetic.jsonl")
RATES = {"e2b-2cpu-2gb": 36.0, "sandbox0-2cpu-4gb": 72.0}  # 1 and 2 cents per sandbox-second: visible in cost


async def _backend_settings(backend: str, root: Path) -> AsyncIterator[dict[str, Any]]:
    if backend == "e2b":
        e2b = E2BDouble(root / "vms", allow_unisolated=True)
        url = await e2b.start()
        try:
            yield {"e2b_api_key": e2b.api_key, "e2b_api_url": url, "e2b_sandbox_url": url,
                   "e2b_python": sys.executable}
        finally:
            await e2b.stop()
    else:
        k8s = K8sDouble(root / "pods", allow_unisolated=True)
        await k8s.start()
        try:
            yield {"sandbox0_kubeconfig": str(k8s.kubeconfig(root / "kubeconfig")), "sandbox0_namespace": "bw",
                   "sandbox0_python": sys.executable, "sandbox0_pod_egress_url": "http://127.0.0.1:3128"}
        finally:
            await k8s.stop()


@pytest.fixture(params=["e2b", "sandbox0"])
async def remote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 dev_models: DevModels) -> AsyncIterator[tuple[str, httpx.AsyncClient, str, Settings]]:
    backend: str = request.param
    root = tmp_path_factory.mktemp(f"remote-{backend}")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=pydantic_data_converter, dev_server_log_level="error")
    try:
        async for extra in _backend_settings(backend, root):
            settings = Settings(data_dir=root / "data", task_queue=f"bw-remote-{uuid.uuid4()}",
                                allow_local_paths=True, allow_unisolated=True, default_compute=backend,
                                sandbox_usd_per_hour={**Settings().sandbox_usd_per_hour, **RATES},
                                temporal_address=env.client.service_client.config.target_host, **extra)
            engine = make_engine(settings.resolved_database_url())
            migrate(engine)
            _, key = create_account(engine, name="remote", balance_usd=1000.0, local_paths=True)
            dev_url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl")))
            port = free_port()
            async with build_worker(env.client, settings=settings, engine=engine):
                server, task = await serve_app(create_app(settings), port)
                try:
                    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                                 headers={"Authorization": f"Bearer {key}"}) as http:
                        yield backend, http, dev_url, settings
                finally:
                    server.should_exit = True
                    await task
    finally:
        await env.shutdown()


async def test_a_run_on_a_remote_backend_uses_it_throughout(
        remote: tuple[str, httpx.AsyncClient, str, Settings]) -> None:
    backend, http, dev_url, settings = remote
    other = "sandbox0" if backend == "e2b" else "e2b"
    refused = await http.post("/v1/runs", json={"dataset": DATASET, "model": "openai/dev", "compute": other})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "compute_not_configured"
    assert ("BENCHWRIGHT_E2B_API_KEY" if other == "e2b" else "BENCHWRIGHT_SANDBOX0_KUBECONFIG") in error["message"]

    run = await launch(http, {"dataset": DATASET, "compute": backend,
                              "model": {"identifier": "openai/dev", "api_base": dev_url}})
    events = await wait_terminal(http, run["id"])
    final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok", [e for e in events if e["type"] in ("PhaseFailed", "PipelineFinished")]
    assert final["backend"] == backend
    assert final["tasks"]["summary"]["passed"] == final["tasks"]["summary"]["total"] == 60

    created = [e["data"] for e in events if e["type"] == "SandboxCreated"]
    killed = [e["data"] for e in events if e["type"] == "SandboxKilled"]
    # The model proxy is a process on the worker (benchwright.proxy), and its SandboxCreated says so: "local".
    assert {c["backend"] for c in created if c["role"] == "proxy"} <= {"local"}
    created = [c for c in created if c["role"] != "proxy"]
    killed = [k for k in killed if k["role"] != "proxy"]
    assert created and {c["backend"] for c in created} == {backend}
    assert {c["sandbox_id"] for c in created} == {k["sandbox_id"] for k in killed}
    roles = {c["metadata"]["benchwright_role"] for c in created}
    if backend == "e2b":  # §4: an E2B run gets fanout, a sandbox per task
        assert final["materialize_mode"] == "fanout" and "task" in roles
    else:
        assert final["materialize_mode"] == "sequential" and "task" not in roles
    size = settings.e2b_instance_size if backend == "e2b" else settings.sandbox0_instance_size
    assert {c["instance_size"] for c in created} == {size}
    expected = sum(k["duration_ms"] / 1000 / 3600 * RATES[size] for k in killed)
    assert expected > 0
    assert final["cost"]["sandbox"] == pytest.approx(expected, rel=0.01)
    assert sum(k["cost_usd"] for k in killed) == pytest.approx(expected, rel=0.01)

    # A worker that died with a sandbox of this (now finished) run alive: the next worker's start reaps it.
    opened = open_backend(settings, backend=backend)
    try:
        engine = make_engine(settings.resolved_database_url())
        owner, _ = create_account(engine, name="still-going", balance_usd=1.0)
        going = create_run(engine, account_id=owner.id, driver="builtin", trials_config={},
                           launch=LaunchRequest(dataset=DATASET, model="openai/dev"))  # never finishes
        left = await opened.backend.create(role="work", run_id=run["id"])
        live = await opened.backend.create(role="work", run_id=going.id)
        reaped = await reap_worker_leftovers(settings=settings, engine=engine)
        assert left.sandbox_id in reaped and live.sandbox_id not in reaped
        assert {i.sandbox_id for i in await opened.backend.list_alive()} >= {live.sandbox_id}
        assert left.sandbox_id not in {i.sandbox_id for i in await opened.backend.list_alive()}
        await opened.backend.kill(live.sandbox_id)
    finally:
        await opened.backend.close()
