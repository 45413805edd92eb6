"""Control of a live run through REST: limits, stop, pause/resume, human review, the restart cap (§9, §10)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.main import create_app
from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, poll_all, record_history, wait_terminal
from tests.api.test_scale import _dataset, _live_sandboxes
from tests.conftest import SAMPLE, DevModels, Stack, serve_app, start_worker_process

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


async def until(http: httpx.AsyncClient, run_id: str, check: Any, timeout_s: float = 60) -> dict[str, Any]:
    """Poll the run until ``check(run)`` holds (readiness polling, bounded in time)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        run = (await http.get(f"/v1/runs/{run_id}")).json()
        if check(run):
            return run
        assert asyncio.get_running_loop().time() < deadline, f"condition not reached: {run}"
        await asyncio.sleep(0.05)


def settled(run: dict[str, Any]) -> int:
    s = run["tasks"]["summary"]
    return s["passed"] + s["failed"] + s["errored"]


@pytest.fixture
async def slow_model(dev_models: DevModels, tmp_path: Path) -> tuple[str, str]:
    """300 tasks against a dev model with 60 ms latency: Materialize lasts seconds at low concurrency."""
    answers = _dataset(tmp_path / "slow.jsonl", 300)
    return str(tmp_path / "slow.jsonl"), await dev_models.start(DevModelConfig(answers=answers, latency_ms=60))


async def test_run_cost_limit_halts_within_one_task_of_crossing(stack: Stack) -> None:
    ceiling = 0.05
    model = {"identifier": "openai/dev", "api_base": stack.dev_url, "input_cost_per_token": 1e-4,
             "output_cost_per_token": 1e-4}
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": model, "concurrency": 4,
                                  "limits": {"run": {"cost": ceiling}}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks")).json()["tasks"]
    assert final["halted"] and final["halt_reason"] == "limit_exceeded:run.cost"
    assert final["display_status"] == "halted" and final["status"] == "running"
    costs = [e["data"]["cost_usd"] for e in events if e["type"] == "MaterializeTaskResult"]
    assert sum(costs) > ceiling >= sum(costs[:-1]), "the run stops at the result that crosses the ceiling"
    assert final["cost"]["incurred"] == pytest.approx(sum(costs))
    assert final["cost"]["model"] == pytest.approx(sum(costs))
    assert 0 < len(tasks) < 60 and final["tasks"]["summary"]["passed"] == len(tasks)
    assert events[-1]["type"] == "PipelineFinished" and events[-1]["data"]["halted"]
    assert await _live_sandboxes(stack, run["id"]) == []


async def test_task_limits_fail_single_tasks_and_the_run_continues(stack: Stack) -> None:
    slow_impl = '''
import time
class Scorer:
    def extract(self, row):
        return row["question"]
    def solve(self, row, call_sut):
        if row["id"].endswith("7"):
            time.sleep(5)
        return call_sut(self.extract(row))
    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''
    flaky_impl = '''
_seen = set()
class Scorer:
    def extract(self, row):
        return row["question"]
    def solve(self, row, call_sut):
        if row["id"] not in _seen:
            _seen.add(row["id"])
            raise RuntimeError("first attempt always fails")
        return call_sut(self.extract(row))
    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''
    model = {"identifier": "openai/dev", "api_base": stack.dev_url}
    async with stack.http() as http:
        timed = await launch(http, {"dataset": DATASET, "model": model, "task_impl": slow_impl,
                                    "limits": {"attempt": {"duration": 0.5}}})
        retried = await launch(http, {"dataset": DATASET, "model": model, "task_impl": flaky_impl,
                                      "limits": {"task": {"attempts": 2}}})
        once = await launch(http, {"dataset": DATASET, "model": model, "task_impl": flaky_impl})
        for r in (timed, retried, once):
            await wait_terminal(http, r["id"])
        timed_final = (await http.get(f"/v1/runs/{timed['id']}")).json()
        slow_row = (await http.get(f"/v1/runs/{timed['id']}/tasks/7")).json()
        retried_final = (await http.get(f"/v1/runs/{retried['id']}")).json()
        retried_row = (await http.get(f"/v1/runs/{retried['id']}/tasks/0")).json()
        once_final = (await http.get(f"/v1/runs/{once['id']}")).json()
    assert timed_final["status"] == "ok" and not timed_final["halted"]
    assert timed_final["tasks"]["summary"]["errored"] == 6 and timed_final["tasks"]["summary"]["passed"] == 54
    assert slow_row["outcome"] == "err" and slow_row["trials"][0]["meta"]["limit_exceeded"] == "attempt.duration"
    assert retried_final["tasks"]["summary"]["passed"] == 60
    assert retried_row["trials"][0]["meta"]["attempts"] == 2
    assert once_final["tasks"]["summary"]["errored"] == 60, "task.attempts defaults to 1: no retry"


async def test_unenforceable_limit_is_400_naming_the_path(stack: Stack) -> None:
    async with stack.http() as http:
        resp = await http.post("/v1/runs", json={"dataset": DATASET, "model": "openai/dev",
                                                 "limits": {"run": {"attempts": 3}}})
        published = (await http.get("/v1/limits")).json()
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unenforceable_limit"
    assert "run.attempts" in resp.json()["error"]["message"] and "run.cost" in resp.json()["error"]["message"]
    assert published["levels"]["run"] == ["cost", "duration", "driver_tokens"]


async def test_max_tasks_caps_the_sample_and_finishes_ok(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "constraints": {"max_tasks": 10}, "metadata": {"limit": 20}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok" and not final["halted"]
    assert final["tasks"]["summary"]["total"] == 10 and final["tasks"]["summary"]["passed"] == 10
    assert sorted(e["data"]["index"] for e in events if e["type"] == "MaterializeTaskAggregated") == list(range(10))


async def test_run_duration_limit_halts(stack: Stack, slow_model: tuple[str, str]) -> None:
    dataset, url = slow_model
    async with stack.http() as http:
        run = await launch(http, {"dataset": dataset, "model": {"identifier": "openai/dev", "api_base": url},
                                  "concurrency": 2, "constraints": {"max_duration_ms": 1500}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["halt_reason"] == "limit_exceeded:run.duration" and final["display_status"] == "halted"
    assert 0 < settled(final) < 300
    assert await _live_sandboxes(stack, run["id"]) == []


async def test_stop_during_materialize_lands_within_2s_and_leaves_no_process(
        stack: Stack, slow_model: tuple[str, str]) -> None:
    dataset, url = slow_model
    async with stack.http() as http:
        run = await launch(http, {"dataset": dataset, "model": {"identifier": "openai/dev", "api_base": url},
                                  "concurrency": 4})
        await until(http, run["id"], lambda r: settled(r) >= 20)
        stopped = await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "enough"})
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["display_status"] == "killed"
        events = await wait_terminal(http, run["id"])
        again = await http.post(f"/v1/runs/{run['id']}/stop")
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    halted = next(e for e in events if e["type"] == "RunHalted")
    finished = events[-1]
    lag = datetime.fromisoformat(finished["created_at"]) - datetime.fromisoformat(halted["created_at"])
    assert lag.total_seconds() < 2, f"the halt took {lag.total_seconds():.2f} s to land"
    assert final["halt_reason"] == "operator_kill: enough" and final["display_status"] == "killed"
    assert 20 <= settled(final) < 300, "partial results are kept"
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_finished"
    assert await _live_sandboxes(stack, run["id"]) == []
    await record_history(stack, run["id"], "run_stopped_during_materialize.json")


async def _task_outcomes(http: httpx.AsyncClient, run_id: str) -> list[tuple[int, str, float | None]]:
    rows, after = [], -1
    while True:
        page = (await http.get(f"/v1/runs/{run_id}/tasks", params={"after": after})).json()
        rows += [(t["index"], t["outcome"], t["score"]) for t in page["tasks"]]
        if page["next_after"] is None:
            return rows
        after = page["next_after"]


async def test_pause_then_resume_gives_the_same_results_as_an_uninterrupted_run(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = _dataset(tmp_path / "pr.jsonl", 300)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=60, accuracy=0.7))
    body = {"dataset": str(tmp_path / "pr.jsonl"), "model": {"identifier": "openai/dev", "api_base": url},
            "concurrency": 4}
    async with stack.http() as http:
        straight = await launch(http, body)
        paused = await launch(http, body)
        await until(http, paused["id"], lambda r: settled(r) >= 20)
        resp = await http.post(f"/v1/runs/{paused['id']}/pause")
        assert resp.status_code == 200 and resp.json()["display_status"] == "paused"
        assert resp.json()["halt_reason"] == "operator_pause"
        second = await http.post(f"/v1/runs/{paused['id']}/pause")
        assert second.status_code == 409 and second.json()["error"]["code"] == "already_halted"
        while_paused = (await http.get(f"/v1/runs/{paused['id']}")).json()
        assert while_paused["display_status"] == "paused" and settled(while_paused) < 300
        resumed = await http.post(f"/v1/runs/{paused['id']}/resume")
        assert resumed.status_code == 200 and not resumed.json()["halted"]
        for r in (straight, paused):
            await wait_terminal(http, r["id"])
        expected = await _task_outcomes(http, straight["id"])
        got = await _task_outcomes(http, paused["id"])
        events = await poll_all(http, paused["id"], page=500)
        not_paused = await http.post(f"/v1/runs/{paused['id']}/resume")
    assert got == expected and len(got) == 300
    types = [e["type"] for e in events]
    assert types.count("RunHalted") == 1 and types.count("RunResumed") == 1
    keys = [(e["data"]["index"], e["data"]["trial"]) for e in events if e["type"] == "MaterializeTaskResult"]
    assert len(keys) == len(set(keys)) == 300
    assert not_paused.status_code == 409 and not_paused.json()["error"]["code"] == "not_paused"


async def test_review_waits_refuses_resume_and_continues_with_the_resolution(stack: Stack) -> None:
    hooks = {"review": {"phase": "atomize", "reason": "which field is the answer?"}}
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "metadata": {"test_hooks": hooks}})
        waiting = await until(http, run["id"], lambda r: r["halted"])
        assert waiting["display_status"] == "waiting"
        assert waiting["halt_reason"] == "agent_review: which field is the answer?"
        refused = await http.post(f"/v1/runs/{run['id']}/resume")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_paused"
        resolved = await http.patch(f"/v1/runs/{run['id']}", json={"review_resolution": "Use the answer column."})
        assert resolved.status_code == 200, resolved.text
        assert resolved.json()["halted"] is False and resolved.json()["halt_reason"] is None
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        late = await http.patch(f"/v1/runs/{run['id']}", json={"review_resolution": "again"})
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60
    resumed = next(e for e in events if e["type"] == "RunResumed")
    assert resumed["data"] == {"previous_reason": "agent_review: which field is the answer?",
                               "review_resolution": "Use the answer column."}
    texts = [e["data"]["text"] for e in events if e["type"] == "AgentTextEvent"]
    assert "Following the reviewer's instructions: Use the answer column." in texts
    atomize_starts = [e for e in events if e["type"] == "PhaseStarted" and e["data"]["phase"] == "atomize"]
    assert len(atomize_starts) == 2
    assert any(e["type"] == "HumanReviewRequested" for e in events)
    assert late.status_code == 409 and late.json()["error"]["code"] == "not_waiting"


async def test_third_restart_request_parks_the_run_for_a_human(stack: Stack) -> None:
    hooks = {"restart": {"phase": "atomize", "times": 3, "reason": "scorer disagrees with samples"}}
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "metadata": {"test_hooks": hooks}})
        waiting = await until(http, run["id"], lambda r: r["halted"])
        assert waiting["display_status"] == "waiting"
        assert waiting["halt_reason"] == "restart_cap_exceeded: scorer disagrees with samples"
        state = await stack.client.get_workflow_handle(run["id"]).query("state")
        assert state["restarts"] == 2 and state["invocations"]["atomize"] == 3
        resp = await http.patch(f"/v1/runs/{run['id']}", json={"review_resolution": "Ship the current scorer."})
        assert resp.status_code == 200
        events = await wait_terminal(http, run["id"])
    restarts = [e for e in events if e["type"] == "PhaseRestartRequested"]
    assert len(restarts) == 3
    artifacts = [e["data"]["invocation"] for e in events if e["type"] == "AtomizeArtifact"]
    assert artifacts == [1, 2, 3, 4]
    assert events[-1]["data"]["status"] == "ok"


async def test_paused_and_waiting_runs_survive_a_killed_worker(stack: Stack, slow_model: tuple[str, str]) -> None:
    dataset, url = slow_model
    settings = stack.settings.model_copy(update={"task_queue": f"bw-kill-{uuid.uuid4()}"})
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    def start_worker() -> subprocess.Popen[bytes]:
        return start_worker_process(settings, BENCHWRIGHT_ALLOW_FAULT_INJECTION="true")

    def kill(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    worker = start_worker()
    try:
        async with stack.http() as http:
            http.base_url = f"http://127.0.0.1:{port}"
            review = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev",
                                                                        "api_base": stack.dev_url},
                                         "metadata": {"test_hooks": {"review": {"phase": "setup", "reason": "check"}}}})
            slow = await launch(http, {"dataset": dataset, "model": {"identifier": "openai/dev", "api_base": url},
                                       "concurrency": 4})
            await until(http, review["id"], lambda r: r["display_status"] == "waiting")
            await until(http, slow["id"], lambda r: settled(r) >= 20)
            paused = await http.post(f"/v1/runs/{slow['id']}/pause")
            assert paused.status_code == 200 and paused.json()["display_status"] == "paused"

            kill(worker)  # both runs are at rest in Temporal: one waiting for a human, one paused
            worker = start_worker()
            ok = await http.patch(f"/v1/runs/{review['id']}", json={"review_resolution": "carry on"})
            assert ok.status_code == 200, ok.text
            resumed = await http.post(f"/v1/runs/{slow['id']}/resume")
            assert resumed.status_code == 200, resumed.text
            for r in (review, slow):
                await wait_terminal(http, r["id"])
            assert (await http.get(f"/v1/runs/{review['id']}")).json()["status"] == "ok"
            final = (await http.get(f"/v1/runs/{slow['id']}")).json()
            assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 300, final["error"]
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(30)
        server.should_exit = True
        await task


async def test_billed_sandbox_time_debits_the_balance_and_halts_at_zero(stack: Stack) -> None:
    """Sandbox time is the platform portion: billed with the markup, debited from the balance by the cost trigger;
    an account that hits zero halts its run with balance_exhausted (not resumable), and cannot launch again."""
    from benchwright.store.accounts import create_account, get_account
    from benchwright.store.db import make_engine

    engine = make_engine(stack.settings.resolved_database_url())
    account, key = create_account(engine, name=f"thin-{uuid.uuid4().hex[:6]}", balance_usd=0.05,
                                  local_paths=True)  # its dataset is a local file
    stack.settings.local_sandbox_usd_per_hour = 3600.0  # $1 per sandbox-second
    try:
        async with stack.http(key) as http:
            run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev",
                                                                     "api_base": stack.dev_url}})
            events = await wait_terminal(http, run["id"])
            final = (await http.get(f"/v1/runs/{run['id']}")).json()
            refused = await http.post(f"/v1/runs/{run['id']}/resume")
            again = await http.post("/v1/runs", json={"dataset": DATASET, "model": "openai/dev"})
            shown = (await http.get("/v1/account")).json()
    finally:
        stack.settings.local_sandbox_usd_per_hour = 0.0
    assert final["halt_reason"] == "balance_exhausted" and final["display_status"] == "halted"
    killed = [e["data"] for e in events if e["type"] == "SandboxKilled"]
    assert killed and final["cost"]["sandbox"] == pytest.approx(sum(k["cost_usd"] for k in killed))
    assert final["cost"]["billed"] == pytest.approx(final["cost"]["sandbox"] * stack.settings.billing_markup)
    balance = get_account(engine, account_id=account.id).balance_usd
    assert balance == pytest.approx(0.05 - final["cost"]["billed"]) and balance <= 0
    assert shown["balance_usd"] == pytest.approx(balance)
    assert refused.status_code == 409 and refused.json()["error"]["code"] in ("not_paused", "already_finished")
    assert again.status_code == 402 and again.json()["error"]["code"] == "balance_exhausted"


async def test_long_poll_answers_on_pause_on_finish_and_at_its_deadline(stack: Stack,
                                                                        slow_model: tuple[str, str]) -> None:
    dataset, url = slow_model
    loop = asyncio.get_running_loop()
    async with stack.http() as http:
        run = await launch(http, {"dataset": dataset, "model": {"identifier": "openai/dev", "api_base": url},
                                  "concurrency": 4})
        t0 = loop.time()
        still = (await http.get(f"/v1/runs/{run['id']}", params={"wait_s": 0.4})).json()
        assert still["status"] == "running" and loop.time() - t0 >= 0.4  # held to its deadline, then answered
        paused = await http.post(f"/v1/runs/{run['id']}/pause")
        assert paused.status_code == 200
        t0 = loop.time()
        held = (await http.get(f"/v1/runs/{run['id']}", params={"wait_s": 30})).json()
        assert held["display_status"] == "paused" and loop.time() - t0 < 5  # a halt answers at once
        assert (await http.post(f"/v1/runs/{run['id']}/resume")).status_code == 200
        done = (await http.get(f"/v1/runs/{run['id']}", params={"wait_s": 60}, timeout=90)).json()
        assert done["status"] == "ok" and settled(done) == 300
        refused = await http.get(f"/v1/runs/{run['id']}", params={"wait_s": 61})
    assert refused.status_code == 422 and "wait_s" in refused.text


async def test_long_poll_on_a_run_whose_workflow_is_gone_answers_at_its_deadline(
        stack: Stack, slow_model: tuple[str, str]) -> None:
    """A workflow terminated behind the platform's back never writes the row's end: the long poll still answers, at
    its deadline, with the row as it stands."""
    dataset, url = slow_model
    loop = asyncio.get_running_loop()
    async with stack.http() as http:
        run = await launch(http, {"dataset": dataset, "model": {"identifier": "openai/dev", "api_base": url},
                                  "concurrency": 1})
        await stack.client.get_workflow_handle(run["id"]).terminate(reason="test: gone")
        t0 = loop.time()
        held = await http.get(f"/v1/runs/{run['id']}", params={"wait_s": 0.8})
        waited = loop.time() - t0
    assert held.status_code == 200 and held.json()["status"] == "running"
    assert 0.8 <= waited < 5
