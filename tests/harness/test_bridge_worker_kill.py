"""A worker SIGKILLed while its harness runs: another worker resumes the bridge batch, skipping what was recorded,
and every sample is in the log exactly once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid

import pytest

from api.main import create_app
from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.conftest import DevModels, Stack, serve_app, start_worker_process
from tests.harness.qa import ROWS, answers, harness_config
from tests.harness.test_bridge_runs import bridge_model  # noqa: F401  (the session fixture: runtimes installed)

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_worker_sigkill_mid_harness_resumes_without_duplicates(stack: Stack, dev_models: DevModels,
                                                                     bridge_model: str) -> None:  # noqa: F811
    slow = await dev_models.start(DevModelConfig(answers=answers(), latency_ms=60))
    settings = stack.settings.model_copy(update={"task_queue": f"bw-harness-kill-{uuid.uuid4()}"})
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    def start_worker() -> subprocess.Popen[bytes]:
        return start_worker_process(settings)

    workers = [start_worker()]
    try:
        async with stack.http() as http:
            http.base_url = f"http://127.0.0.1:{port}"
            run = await launch(http, {"harness": "inspect", "model": {"identifier": "openai/dev", "api_base": slow},
                                      "harness_config": harness_config("inspect", max_connections=4)})
            deadline = asyncio.get_running_loop().time() + 180
            while True:  # the harness has recorded some samples: kill its worker mid-run
                summary = (await http.get(f"/v1/runs/{run['id']}")).json()["tasks"]["summary"]
                if summary["passed"] + summary["failed"] >= 30:
                    break
                assert asyncio.get_running_loop().time() < deadline, "the harness never got going"
                await asyncio.sleep(0.05)
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
            workers.append(start_worker())
            events = await wait_terminal(http, run["id"])
            final = (await http.get(f"/v1/runs/{run['id']}")).json()
        assert final["status"] == "ok", final["error"]
        keys = [(e["data"]["index"], e["data"]["trial"]) for e in events if e["type"] == "MaterializeTaskResult"]
        assert len(keys) == len(set(keys)) == ROWS
        assert final["tasks"]["summary"]["passed"] + final["tasks"]["summary"]["failed"] == ROWS
        assert [e["seq"] for e in events] == list(range(len(events)))
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
                w.wait(30)
        server.should_exit = True
        await task
