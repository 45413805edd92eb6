"""harbor bridge runs whose backend is remote (``e2b`` through the real SDK against the E2B double, ``sandbox0``
through the real Kubernetes client against the API-server double): harbor's orchestrator runs on the worker's local
backend, and every trial's environment is a ``harbor_task_env`` sandbox on the run's backend, from the template the
deployment maps to the task's ``FROM`` image (``harbor_templates``). ``oracle`` scores 100 %, ``nop`` 0 %; what
cannot be mapped is refused with the task, the line and the setting to change. Skipped where harbor cannot be
installed (no Python >= 3.12)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from benchwright.data.blobs import open_blob_store
from benchwright.harness.harbor import EnvPlan, Unmappable, prepare_remote
from benchwright.sandbox.base import TEMPLATE_KEY
from benchwright.sandbox.e2b import E2BBackend
from benchwright.sandbox.lifecycle import Sandbox
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, temporal_binary
from benchwright.stack.temporal_ui import SEARCH_ATTRIBUTES
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from benchwright.testkit.e2b_double import E2BDouble
from benchwright.testkit.k8s_double import K8sDouble
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, serve_app
from tests.harness.harbor_direct import harbor_runtime, harbor_skip_reason

TASKS = ["hello-file", "json-config", "reverse-script", "sum-to-100"]
HARBOR_DIRS = ["logs", "tests", "solution", "app"]
"""What the mapped template holds: harbor's fixed paths and the bundled tasks' WORKDIR, owned by its user."""
TEMPLATES = {"e2b": {"ubuntu:24.04": "bw-harbor-ubuntu", "alpine:3.20": "bw-plain"},
             "sandbox0": {"ubuntu:24.04": "bw/harbor-ubuntu:24.04", "alpine:3.20": "bw/plain"}}
"""The doubles' ``bw-harbor-ubuntu`` templates hold ``HARBOR_DIRS``; ``bw-plain`` ones hold nothing of harbor's."""
RATES = {"e2b-2cpu-2gb": 36.0, "sandbox0-2cpu-4gb": 72.0}


@dataclass
class Remote:
    backend: str
    http: httpx.AsyncClient
    settings: Settings
    alive: Any
    """The double's live sandboxes (E2B boxes or pods): none may outlive a run."""
    model: str


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["e2b", "sandbox0"])
async def remote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 dev_models: DevModels) -> AsyncIterator[Remote]:
    if (why := harbor_skip_reason()) is not None:
        pytest.skip(why)
    backend: str = request.param
    root = tmp_path_factory.mktemp(f"harbor-{backend}")
    extra: dict[str, Any]
    double: E2BDouble | K8sDouble
    if backend == "e2b":
        double = E2BDouble(root / "vms", allow_unisolated=True, templates={"bw-harbor-ubuntu": HARBOR_DIRS})
        url = await double.start()
        extra = {"e2b_api_key": double.api_key, "e2b_api_url": url, "e2b_sandbox_url": url,
                 "e2b_python": sys.executable}
    else:
        double = K8sDouble(root / "pods", allow_unisolated=True, images={"bw/harbor-ubuntu:24.04": HARBOR_DIRS})
        await double.start()
        extra = {"sandbox0_kubeconfig": str(double.kubeconfig(root / "kubeconfig")), "sandbox0_namespace": "bw",
                 "sandbox0_python": sys.executable, "sandbox0_pod_egress_url": "http://127.0.0.1:3128"}
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=pydantic_data_converter, dev_server_log_level="error")
    try:
        from worker import build_worker

        settings = Settings(data_dir=root / "data", task_queue=f"bw-harbor-{uuid.uuid4()}", allow_local_paths=True,
                            allow_unisolated=True, default_compute=backend, harbor_templates=TEMPLATES,
                            sandbox_usd_per_hour={**Settings().sandbox_usd_per_hour, **RATES},
                            temporal_address=env.client.service_client.config.target_host, **extra)
        took = await asyncio.to_thread(harbor_runtime, settings.data_dir)
        print(f"harbor install (0 = cached): {took:.0f} s")
        engine = make_engine(settings.resolved_database_url())
        migrate(engine)
        _, key = create_account(engine, name="harbor-remote", balance_usd=1000.0, local_paths=True)
        # harbor's oracle and nop agents call no model; a launch still names one, and Attach probes it.
        dev_url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl")))
        port = free_port()
        async with build_worker(env.client, settings=settings, engine=engine):
            server, task = await serve_app(create_app(settings), port)
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                             headers={"Authorization": f"Bearer {key}"}) as http:
                    alive = (lambda: list(double.boxes)) if isinstance(double, E2BDouble) else \
                        (lambda: list(double.pods))
                    yield Remote(backend=backend, http=http, settings=settings, alive=alive, model=dev_url)
            finally:
                server.should_exit = True
                await task
    finally:
        await env.shutdown()
        await double.stop()


async def _run(remote: Remote, config: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    http = remote.http
    run = await launch(http, {"harness": "harbor", "harness_config": config,
                              "model": {"identifier": "openai/dev", "api_base": remote.model}})
    await wait_terminal(http, run["id"])
    events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
    return (await http.get(f"/v1/runs/{run['id']}")).json(), events


@pytest.mark.parametrize(("agent", "expected"), [("oracle", 1.0), ("nop", 0.0)])
async def test_each_task_environment_is_a_sandbox_on_the_runs_backend(remote: Remote, agent: str,
                                                                      expected: float) -> None:
    run, events = await _run(remote, {"path": "bundled/demo", "agent": agent})

    assert run["status"] == "ok", run["error"]
    assert run["tasks"]["summary"]["total"] == len(TASKS) and run["tasks"]["summary"]["pass_rate"] == expected
    results = {e["data"]["meta"]["sample_id"]: e["data"] for e in events if e["type"] == "MaterializeTaskResult"}
    scores = {task: result["score"] for task, result in results.items()}
    errors = {task: result["error"] for task, result in results.items() if result.get("error")}
    assert scores == {t: expected for t in TASKS}, f"harbor's own reward per task; errors: {errors}"
    created = {e["data"]["sandbox_id"]: e["data"] for e in events if e["type"] == "SandboxCreated"}
    envs = [c for c in created.values() if c["role"] == "harbor_task_env"]
    assert len(envs) == len(TASKS) and {c["backend"] for c in envs} == {remote.backend}
    assert {c["metadata"]["template"] for c in envs} == {TEMPLATES[remote.backend]["ubuntu:24.04"]}
    orchestrators = [c for c in created.values() if c["role"] == "harbor_orchestrator"]
    assert [c["backend"] for c in orchestrators] == ["local"]  # where harbor's venv is; it holds no backend key
    killed = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxKilled"}
    assert killed == set(created), "every sandbox, the task environments too, was killed and its cost recorded"
    assert remote.alive() == []


def _one_task(remote: Remote, name: str, image: str) -> None:
    task = remote.settings.data_dir / "harness" / "harbor-tasks" / name / "t1"
    for sub in ("environment", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\n")
    (task / "task.toml").write_text('schema_version = "1.4"\n')
    (task / "instruction.md").write_text("nothing\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")


async def test_an_image_without_a_template_is_refused_before_harbor_starts(remote: Remote) -> None:
    _one_task(remote, "other-image", "debian:12")

    run, events = await _run(remote, {"path": "other-image", "agent": "oracle"})

    assert run["status"] == "error"
    kind = {"e2b": "E2B template", "sandbox0": "sandbox0 image"}[remote.backend]
    assert (f"harbor task t1: environment/Dockerfile line 1 (FROM debian:12) cannot be mapped on the "
            f"{remote.backend} backend: no {kind} is mapped to the image 'debian:12'") in run["error"]
    assert not [e for e in events if e["type"] == "SandboxCreated" and e["data"]["role"].startswith("harbor")]


async def test_a_template_without_harbors_directories_fails_the_trial_naming_them(remote: Remote) -> None:
    _one_task(remote, "plain-image", "alpine:3.20")

    _run_row, events = await _run(remote, {"path": "plain-image", "agent": "nop"})

    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    assert [r["outcome"] for r in results] == ["err"], results
    assert (f"harbor task environment on {remote.backend}: the template '{TEMPLATES[remote.backend]['alpine:3.20']}' "
            "has no directory /app /logs /solution /tests its user can write") in results[0]["error"]
    created = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxCreated"}
    assert created == {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxKilled"}
    assert remote.alive() == []


async def test_a_template_without_harbors_directories_is_refused_naming_them(tmp_path: Path) -> None:
    double = E2BDouble(tmp_path / "vms", allow_unisolated=True, templates={"with-dirs": HARBOR_DIRS})
    url = await double.start()
    backend = E2BBackend(api_key=double.api_key, blobs=open_blob_store(f"file://{tmp_path / 'blobs'}"),
                         api_url=url, sandbox_url=url)
    plan = EnvPlan(workdir="/app", image="ubuntu:24.04", image_line=1)
    try:
        # A sandbox of the double's runs in a private root (an unisolated one would make these paths on the host).
        probe = await double.local.create(role="task", run_id="probe")
        assert probe.metadata.get("isolation") == "namespaces", probe.metadata
        await double.local.kill(probe.sandbox_id)
        for template in ("with-dirs", "plain"):
            info = await backend.create(role="harbor_task_env", run_id="r", metadata={TEMPLATE_KEY: template})
            box = Sandbox(backend=backend, info=info, home="/home/user", python=sys.executable)
            try:
                if template == "with-dirs":
                    ready = await prepare_remote(box, plan)
                    assert ready.home == "/sandbox"  # the double's work directory, as its commands see it
                else:
                    with pytest.raises(Unmappable) as caught:
                        await prepare_remote(box, plan)
                    assert "the template 'plain' has no directory /app /logs /solution /tests its user can " \
                           "write" in str(caught.value), str(caught.value)
            finally:
                await backend.kill(info.sandbox_id)
    finally:
        await backend.close()
        await double.stop()


@pytest.mark.parametrize("agent", ["claude-code", "codex", "aider", "openhands"])
async def test_an_agent_that_installs_its_cli_from_the_network_is_refused_at_launch(remote: Remote,
                                                                                    agent: str) -> None:
    refused = await remote.http.post("/v1/runs", json={
        "harness": "harbor", "harness_config": {"path": "bundled/demo", "agent": agent},
        "model": {"identifier": "openai/dev", "api_base": remote.model}})

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "harness_not_supported"
    assert error["message"].startswith(f"harbor agent '{agent}' is not supported here: only oracle, nop, "
                                       "terminus-2 run on a bridge")
    assert "installs its own CLI into the task environment from the network" in error["message"]
    assert "cannot be pinned to the run's relay" in error["message"]
