"""Materialize at scale: history stays bounded by batches, and a worker SIGKILLed mid-sweep loses nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from api.main import create_app
from benchwright.runs.pipeline import plan_batches
from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.conftest import DevModels, Stack, serve_app, start_worker_process

pytestmark = pytest.mark.asyncio(loop_scope="session")
EVENTS_PER_BATCH = 6
"""Upper bound on history events one batch adds: scheduled/started/completed + a workflow task (3) per batch."""
TARGET_TASKS, HISTORY_TARGET = 10_000, 2_000


def _dataset(path: Path, n: int) -> dict[str, str]:
    answers = {}
    with path.open("w") as f:
        for i in range(n):
            q = f"What is {i} times 3? (item {i})"
            answers[q] = str(3 * i)
            f.write(json.dumps({"question": q, "answer": answers[q]}) + "\n")
    return answers


async def _history_length(stack: Stack, run_id: str) -> int:
    return len((await stack.client.get_workflow_handle(run_id).fetch_history()).events)


async def test_history_grows_by_batches_not_tasks(stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = _dataset(tmp_path / "big.jsonl", 2000)
    _dataset(tmp_path / "one.jsonl", 1)
    url = await dev_models.start(DevModelConfig(answers=answers))
    # Batches of 250 (the default holds 2,500 tasks), so this run has eight batches: two rounds of four.
    batch, parallel = 250, stack.settings.materialize_parallel_batches
    port = free_port()
    server, task = await serve_app(create_app(stack.settings.model_copy(update={"materialize_batch_tasks": batch})),
                                   port)
    try:
        async with stack.http() as http:
            http.base_url = f"http://127.0.0.1:{port}"
            base_run = await launch(http, {"dataset": str(tmp_path / "one.jsonl"),
                                           "model": {"identifier": "openai/dev", "api_base": url}})
            await wait_terminal(http, base_run["id"])
            big = await launch(http, {"dataset": str(tmp_path / "big.jsonl"),
                                      "model": {"identifier": "openai/dev", "api_base": url}})
            events = await wait_terminal(http, big["id"])
    finally:
        server.should_exit = True
        await task
    base = await _history_length(stack, base_run["id"])
    length = await _history_length(stack, big["id"])
    batches = len(plan_batches(2000, batch, parallel)[0])
    budget_2k = base + EVENTS_PER_BATCH * (batches - 1)
    budget_10k = base + EVENTS_PER_BATCH * (len(plan_batches(TARGET_TASKS, batch, parallel)[0]) - 1)
    default_10k = base + EVENTS_PER_BATCH * (len(plan_batches(
        TARGET_TASKS, stack.settings.materialize_batch_tasks, parallel)[0]) - 1)
    print(f"history: N=1 {base}, N=2000 in {batches} batches {length} (budget {budget_2k}); projected N=10000: "
          f"{budget_10k} in batches of {batch}, {default_10k} with the default batch size")
    summaries = [e["data"] for e in events if e["type"] == "MaterializeTaskAggregated"]
    assert batches == 8 and length > base  # it did grow, by its batches
    assert length <= budget_2k
    assert budget_10k < HISTORY_TARGET and default_10k < HISTORY_TARGET
    assert sum(e["type"] == "MaterializeTaskResult" for e in events) == 2000 == len(summaries)


async def _live_sandboxes(stack: Stack, run_id: str) -> list[str]:
    """Sandboxes of the run still alive (any role); none may outlive its run."""
    from benchwright.sandbox import LocalBackend

    backend = LocalBackend(stack.settings.sandboxes_dir())
    try:
        return [i.sandbox_id for i in await backend.list_alive() if i.metadata.get("benchwright_run_id") == run_id]
    finally:
        await backend.close()


async def test_worker_sigkill_mid_materialize_completes_without_loss_or_duplicates(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    n = 300
    answers = _dataset(tmp_path / "tasks.jsonl", n)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=80))
    # A stack of its own on a separate task queue, so only the subprocess workers below can run its activities;
    # batches of 100 so the kill lands with several batches in flight.
    settings = stack.settings.model_copy(update={"task_queue": f"bw-kill-{uuid.uuid4()}",
                                                 "materialize_batch_tasks": 100})
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    def start_worker() -> subprocess.Popen[bytes]:
        return start_worker_process(settings)

    workers = [start_worker()]
    try:
        async with stack.http() as http:
            http.base_url = f"http://127.0.0.1:{port}"
            run = await launch(http, {"dataset": str(tmp_path / "tasks.jsonl"), "concurrency": 8,
                                      "model": {"identifier": "openai/dev", "api_base": url}})
            while True:  # wait until Materialize has committed some results, then kill the worker mid-sweep
                summary = (await http.get(f"/v1/runs/{run['id']}")).json()["tasks"]["summary"]
                if summary["passed"] >= 40:
                    break
                await asyncio.sleep(0.05)
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
            mid = (await http.get(f"/v1/runs/{run['id']}")).json()
            assert mid["status"] == "running" and mid["tasks"]["summary"]["passed"] < n
            workers.append(start_worker())
            events = await wait_terminal(http, run["id"])
            final = (await http.get(f"/v1/runs/{run['id']}")).json()
        assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == n
        keys = [(e["data"]["invocation"], e["data"]["index"], e["data"]["trial"])
                for e in events if e["type"] == "MaterializeTaskResult"]
        assert len(keys) == len(set(keys)) == n
        assert sorted(e["data"]["index"] for e in events if e["type"] == "MaterializeTaskAggregated") == list(range(n))
        assert [e["seq"] for e in events] == list(range(len(events)))
        assert await _live_sandboxes(stack, run["id"]) == [], "the killed worker's sandboxes were reaped"
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
                w.wait(30)
        server.should_exit = True
        await task
