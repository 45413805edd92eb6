"""Workers on any host: a run survives losing the worker that holds it, twice, with nothing shared but the stores.

Three worker *processes* in turn (``benchwright worker``), each with a data directory of its own (no shared disk),
against one Postgres store (127.0.0.1:5432, database ``test``, a schema of its own), one S3 blob store (moto's
server), and either one "cluster" (the sandbox0 API-server double, whose pods outlive workers) or each worker's own
local sandboxes (their snapshots exported to and imported from the blob store):

1. worker A runs Fetch and Analyze; the run is paused at a phase boundary and A is SIGKILLed;
2. worker B (empty disk) gets the run on resume, restores the hand-off from the blob store, and is SIGKILLed in
   the middle of Materialize;
3. worker C (empty disk) retries the batch, which resumes from the store: the run completes, every task scored
   exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, temporal_binary
from benchwright.stack.teardown import reap_stack
from benchwright.stack.temporal_ui import SEARCH_ATTRIBUTES
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from benchwright.testkit.k8s_double import K8sDouble
from benchwright.testkit.moto_s3 import MotoS3, start_moto_s3
from tests.api.helpers import launch, poll_all
from tests.conftest import SAMPLE, DevModels, serve_app
from tests.store.conftest import _postgres_schema_url

REPO = Path(__file__).resolve().parents[2]
DATASET = str(SAMPLE / "arithmetic.jsonl")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    yield from _postgres_schema_url()


@pytest.fixture
def moto() -> Iterator[MotoS3]:
    server = start_moto_s3()
    try:
        yield server
    finally:
        server.stop()


async def _until(what: str, check: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.1)  # polling the store/Temporal for a condition, bounded by the deadline
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Workers:
    """Worker processes started one at a time, each on its own data directory."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.procs = root, env, list[subprocess.Popen[bytes]]()

    def start(self, name: str) -> subprocess.Popen[bytes]:
        data_dir = self.root / f"worker-{name}"
        data_dir.mkdir()
        log = (self.root / f"worker-{name}.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "benchwright.cli", "worker", "--data-dir", str(data_dir)],
                                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and anything it started: a host lost at once
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


@pytest.fixture(params=["sandbox0", "local"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str, moto: MotoS3,
                  dev_models: DevModels) -> AsyncIterator[tuple[httpx.AsyncClient, Workers, Client, str]]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=pydantic_data_converter, dev_server_log_level="error")
    k8s = K8sDouble(tmp_path / "pods", allow_unisolated=True)
    await k8s.start()
    kubeconfig = k8s.kubeconfig(tmp_path / "kubeconfig")
    queue = f"bw-any-host-{uuid.uuid4()}"
    common = {"database_url": postgres_url, "temporal_address": env.client.service_client.config.target_host,
              "task_queue": queue, "sandbox0_kubeconfig": str(kubeconfig), "sandbox0_namespace": "bw",
              "sandbox0_python": sys.executable, "sandbox0_pod_egress_url": "http://127.0.0.1:3128",
              "default_compute": request.param, "blob_store_url": "s3://bw-any-host/runs",
              "blob_s3_endpoint_url": moto.endpoint_url, "allow_local_paths": True, "allow_unisolated": True,
              "materialize_concurrency": 2}
    worker_env = {**os.environ, **moto.env, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                  **{f"BENCHWRIGHT_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
                     for k, v in common.items()}}
    workers = Workers(tmp_path, worker_env)
    saved = {k: os.environ.get(k) for k in moto.env}
    os.environ.update(moto.env)  # the API process opens no blob store, but keep its boto3 config consistent
    settings = Settings(data_dir=tmp_path / "api", **common)
    engine = make_engine(postgres_url)
    migrate(engine)
    _, key = create_account(engine, name="any-host", balance_usd=1000.0, local_paths=True)
    dev_url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl"),
                                                    latency_ms=250))
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            yield http, workers, env.client, dev_url
    finally:
        workers.stop_all()
        # A SIGKILLed worker's sandboxes outlive it (their inits are daemons) until someone reaps its data dir, as
        # `benchwright up` does at its next start: do that here so no test leaves a process behind.
        for data_dir in sorted(tmp_path.glob("worker-*")):
            if data_dir.is_dir():
                await asyncio.to_thread(reap_stack, data_dir=data_dir, workers_timeout_s=5, others_timeout_s=5)
        server.should_exit = True
        await task
        await k8s.stop()
        engine.dispose()
        await env.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def test_run_survives_losing_its_worker_between_phases_and_mid_materialize(
        cluster: tuple[httpx.AsyncClient, Workers, Client, str]) -> None:
    http, workers, temporal, dev_url = cluster
    a = workers.start("a")
    run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": dev_url}})
    run_id = run["id"]

    async def types() -> list[str]:
        return [e["type"] for e in await poll_all(http, run_id)]

    async def completed(phase: str) -> bool:
        return any(e["type"] == "PhaseCompleted" and e["data"]["phase"] == phase
                   for e in await poll_all(http, run_id))

    # 1. Between phases: pause once Analyze is done, wait until A holds no activity, then lose A.
    await _until("analyze to complete on worker A", lambda: completed("analyze"))
    paused = await http.post(f"/v1/runs/{run_id}/pause")
    assert paused.status_code == 200, paused.text

    async def idle() -> bool:
        description = await temporal.get_workflow_handle(run_id).describe()
        return not description.raw_description.pending_activities
    await _until("worker A to finish what it held", idle)
    workers.kill(a)

    # 2. Worker B, empty disk: the run resumes there; lose B in the middle of Materialize.
    b = workers.start("b")
    resumed = await http.post(f"/v1/runs/{run_id}/resume")
    assert resumed.status_code == 200, resumed.text

    async def scored() -> int:
        return (await types()).count("MaterializeTaskResult")
    await _until("Materialize to be under way on worker B", lambda: _at_least(scored, 10))
    assert await scored() < 60, "Materialize finished before worker B could be killed mid-way"
    workers.kill(b)

    # 3. Worker C, empty disk: the batch is retried and resumes from the store.
    workers.start("c")
    final = await _until("the run to finish on worker C", lambda: _terminal(http, run_id), timeout_s=240)
    events = await poll_all(http, run_id)
    assert final["status"] == "ok", [e for e in events if e["type"] in ("PhaseFailed", "PipelineFinished")]
    results = Counter((e["data"]["index"], e["data"]["trial"]) for e in events
                      if e["type"] == "MaterializeTaskResult")
    assert len(results) == 60 and set(results.values()) == {1}, "every task scored exactly once"
    assert final["tasks"]["summary"]["passed"] == 60
    created = [e["data"] for e in events if e["type"] == "SandboxCreated" and e["data"]["role"] != "proxy"]
    assert created and {c["backend"] for c in created} == {final["backend"]}  # the model proxy is a worker process
    # Each worker's own disk held only its own share: B and C started empty and got the hand-off from S3.
    for name in ("b", "c"):
        work = workers.root / f"worker-{name}" / "runs" / run_id / "work"
        assert (work / "tasks.jsonl").is_file(), f"worker {name} never restored the hand-off"


async def _at_least(count: Callable[[], Any], n: int) -> bool:
    return bool(await count() >= n)


async def _terminal(http: httpx.AsyncClient, run_id: str) -> dict[str, Any] | None:
    view = (await http.get(f"/v1/runs/{run_id}")).json()
    return view if view["status"] in ("ok", "error", "cancelled") else None
