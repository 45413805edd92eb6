"""A worker SIGKILLed mid-Materialize of a product-sandbox run: another worker resumes the batch, skipping the tasks
already recorded, every task is in the log exactly once, and no task sandbox outlives the run."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid

import pytest

from api.main import create_app
from benchwright.stack.devstack import free_port
from benchwright.testkit import product_double
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import DevModels, Stack, serve_app, start_worker_process

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_worker_sigkill_mid_materialize_runs_every_task_once(stack: Stack, dev_models: DevModels) -> None:
    slow = await dev_models.start(product_double.config(latency_ms=400))
    settings = stack.settings.model_copy(update={"task_queue": f"bw-product-kill-{uuid.uuid4()}"})
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    workers: list[subprocess.Popen[bytes]] = [start_worker_process(settings)]
    try:
        async with stack.http() as http:
            http.base_url = f"http://127.0.0.1:{port}"
            run = await launch(http, {"recipe": product_double.RECIPE,
                                      "model": {"identifier": "openai/dev", "api_base": slow}})
            deadline = asyncio.get_running_loop().time() + 180
            while True:  # some tasks are recorded, others are in their sandboxes: kill the worker mid-sweep
                summary = (await http.get(f"/v1/runs/{run['id']}")).json()["tasks"]["summary"]
                settled = summary["passed"] + summary["failed"] + summary["errored"]
                if settled >= 1:
                    break
                assert asyncio.get_running_loop().time() < deadline, "Materialize never got going"
                await asyncio.sleep(0.05)
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
            assert settled < 22, "the sweep was over before the kill: nothing was tested"
            workers.append(start_worker_process(settings))
            events = await wait_terminal(http, run["id"])
            final = (await http.get(f"/v1/runs/{run['id']}")).json()
        assert final["status"] == "ok", final["error"]
        results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
        assert sorted(r["index"] for r in results) == list(range(22)), "every task exactly once"
        recipe = product_double.recipe()
        assert {recipe.tasks[r["index"]].id: r["outcome"] for r in results} == product_double.outcomes()
        summary = final["tasks"]["summary"]
        assert (summary["passed"], summary["failed"], summary["errored"]) == (16, 5, 1)
        assert [e["seq"] for e in events] == list(range(len(events)))
        assert await _live_sandboxes(stack, run["id"]) == []
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
                w.wait(30)
        server.should_exit = True
        await task
