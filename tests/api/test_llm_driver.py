"""The LLM driver end to end (issue 11): real launches on the real stack with the driver's calls going to the
scripted-LLM test double. Write → sample → restart → rewrite → finish; a review request resolved over PATCH; both
budgets; the missing secret; cost.driver; and no credential in anything the driver's model received.

The module runs its own API and worker on the session's Temporal server and store (a fresh task queue), configured
as a deployment would be for a gateway: ``driver_api_base`` points at the scripted LLM, with per-token prices.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from api.main import create_app
from benchwright.stack.devstack import free_port
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from benchwright.testkit.scripted_llm import (
    ScriptedLlm,
    ScriptedLlmServer,
    parse_script,
    start_scripted_llm,
)
from tests.api.helpers import launch, wait_terminal
from tests.api.test_control import until
from tests.conftest import SAMPLE, Stack, serve_app
from worker import build_worker

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
DRIVER_KEY = "sk-driver-" + uuid.uuid4().hex
SUT_KEY = "sk-sut-" + uuid.uuid4().hex
INPUT_PRICE, OUTPUT_PRICE = 2e-6, 8e-6

WRONG = '''
class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut([{"role": "user", "content": self.extract(row)}])

    def score(self, row, response):
        return 1.0 if response.strip() == row["question"] else 0.0   # compares against the wrong column
'''
RIGHT = '''
class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut([{"role": "system", "content": "Answer with only the number."},
                         {"role": "user", "content": self.extract(row)}])

    def score(self, row, response):
        return {"score": 1.0 if response.strip().rstrip(".") == str(row["answer"]) else 0.0,
                "extracted": response.strip()}
'''


@dataclass
class LlmStack:
    api_url: str
    key: str
    llm: ScriptedLlm
    dev_url: str

    def http(self, key: str | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.api_url, headers={"Authorization": f"Bearer {key or self.key}"},
                                 timeout=60)

    def script(self, conversations: list[Any]) -> str:
        """A fresh driver model scripted with ``conversations``; returns the driver string that uses it."""
        model = f"scorer-{uuid.uuid4().hex[:8]}"
        self.llm.add(model, parse_script({model: conversations})[model])
        return f"openai://{model}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def llm_stack(stack: Stack) -> AsyncIterator[LlmStack]:
    llm = ScriptedLlm()
    server: ScriptedLlmServer = await start_scripted_llm(llm, port=free_port())
    settings = stack.settings.model_copy(update={
        "task_queue": f"bw-llm-{uuid.uuid4()}", "driver_api_base": server.url,
        "driver_input_cost_per_token": INPUT_PRICE, "driver_output_cost_per_token": OUTPUT_PRICE})
    engine = make_engine(settings.resolved_database_url())
    _, key = create_account(engine, name=f"llm-{uuid.uuid4().hex[:6]}", balance_usd=100.0, local_paths=True)
    port = free_port()
    async with build_worker(stack.client, settings=settings, engine=engine):
        api, task = await serve_app(create_app(settings), port)
        try:
            out = LlmStack(api_url=f"http://127.0.0.1:{port}", key=key, llm=llm, dev_url=stack.dev_url)
            async with out.http() as http:
                for name, value in (("OPENAI_API_KEY", DRIVER_KEY), ("SUT_KEY", SUT_KEY)):
                    resp = await http.post("/v1/secrets", json={"name": name, "value": value})
                    assert resp.status_code == 201, resp.text
            yield out
        finally:
            api.should_exit = True
            await task
            await server.close()


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _body(driver: str, **extra: Any) -> dict[str, Any]:
    return {"dataset": DATASET, "driver": driver, "constraints": {"max_tasks": 4}, **extra}


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def _tool_answers(request_messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) if m["content"].startswith(("[", "{")) else m["content"]
            for m in request_messages if m.get("role") == "tool"]


async def test_write_sample_restart_rewrite_finish(llm_stack: LlmStack) -> None:
    driver = llm_stack.script([
        [_call("readSamples", limit=2), _call("writeTaskImpl", source=WRONG), _call("runScorer", count=3),
         {"content": "Every right answer scores 0: the scorer reads the wrong column.",
          **_call("requestRestart", reason="the scorer compares against the question column")}],
        [_call("writeTaskImpl", source=RIGHT), _call("runScorer", count=3),
         {"content": "Right answers score 1.0.", **_call("finishPhase", summary="exact match of the number")}],
    ])
    model = {"identifier": "openai/dev", "api_base": llm_stack.dev_url, "secret": "SUT_KEY"}
    async with llm_stack.http() as http:
        run = await launch(http, _body(driver, model=model))
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok", final["error"]
    assert final["driver"] == driver
    summary = final["tasks"]["summary"]
    assert (summary["passed"], summary["failed"], summary["pass_rate"]) == (4, 0, 1.0), "scored by the rewrite"

    restarts = _of(events, "PhaseRestartRequested")
    assert restarts == [{"phase": "atomize", "reason": "the scorer compares against the question column"}]
    artifacts = _of(events, "AtomizeArtifact")
    assert [(a["invocation"], a["impl_sha256"], a["source"]) for a in artifacts] == [
        (2, hashlib.sha256(RIGHT.encode()).hexdigest(), driver)], "only the finished invocation leaves an artifact"

    requests = [r for r in llm_stack.llm.requests_for(driver.split("://")[1]) if r.status == 200]
    first = [r for r in requests if r.conversation == 0]
    second = [r for r in requests if r.conversation == 1]
    assert [r.turn for r in first] == [0, 1, 2, 3] and [r.turn for r in second] == [0, 1, 2]
    wrong_scores = _tool_answers(first[-1].messages)[-1]
    assert [s["score"] for s in wrong_scores] == [0.0, 0.0, 0.0], "the sample run in the sandbox saw the bug"
    right_scores = _tool_answers(second[-1].messages)[-1]
    assert [s["score"] for s in right_scores] == [1.0, 1.0, 1.0] and right_scores[0]["meta"]["extracted"]
    assert "the scorer compares against the question column" in second[0].messages[1]["content"]

    calls, results = _of(events, "ToolCallEvent"), _of(events, "ToolResultEvent")
    assert [c["name"] for c in calls] == ["readSamples", "writeTaskImpl", "runScorer", "requestRestart",
                                         "writeTaskImpl", "runScorer", "finishPhase"]
    assert [r["ok"] for r in results] == [True] * 7 and [r["call_id"] for r in results] == [c["call_id"] for c in calls]
    assert any("right answer scores 0" in t["text"] for t in _of(events, "AgentTextEvent"))

    # cost.driver is the recorded usage x the configured prices, one DriverUsage per model call
    usages = _of(events, "DriverUsage")
    assert len(usages) == len(requests) == 7
    served = sum(r.response["usage"]["prompt_tokens"] * INPUT_PRICE
                 + r.response["usage"]["completion_tokens"] * OUTPUT_PRICE for r in requests)
    assert final["cost"]["driver"] == pytest.approx(served, rel=1e-9) and served > 0
    assert sum(u["cost_usd"] for u in usages) == pytest.approx(served, rel=1e-9)

    # nothing the driver's model received carries a credential but its own key, in its own header
    for r in llm_stack.llm.requests_for(driver.split("://")[1]):
        assert SUT_KEY not in r.text()
        assert DRIVER_KEY not in json.dumps(r.body)
        assert r.headers["authorization"] == f"Bearer {DRIVER_KEY}"
        assert "SUT_KEY" not in json.dumps(r.body), "not even the SUT secret's name"


async def test_review_request_resolved_over_patch_reaches_the_driver(llm_stack: LlmStack) -> None:
    reason = "two columns could be the reference; which one?"
    resolution = "Use the answer column and compare the number exactly."
    driver = llm_stack.script([
        [_call("readContext"), _call("requestHumanReview", reason=reason)],
        [_call("writeTaskImpl", source=RIGHT), _call("finishPhase", summary="as instructed")],
    ])
    async with llm_stack.http() as http:
        run = await launch(http, _body(driver, model={"identifier": "openai/dev", "api_base": llm_stack.dev_url}))
        waiting = await until(http, run["id"], lambda r: r["display_status"] == "waiting")
        assert waiting["halt_reason"] == f"agent_review: {reason}"
        resolved = await http.patch(f"/v1/runs/{run['id']}", json={"review_resolution": resolution})
        assert resolved.status_code == 200, resolved.text
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 4, final["error"]
    assert _of(events, "HumanReviewRequested") == [{"phase": "atomize", "reason": reason}]
    second = [r for r in llm_stack.llm.requests_for(driver.split("://")[1]) if r.conversation == 1]
    assert second and resolution in second[0].messages[1]["content"], "the instructions reach the Driver"
    context = _tool_answers([r for r in llm_stack.llm.requests_for(driver.split("://")[1])
                             if r.conversation == 0][-1].messages)[0]
    assert context["phase"] == "atomize" and "question" in context["dataset"]["columns"]


async def test_step_budget_spent_asks_for_review(llm_stack: LlmStack) -> None:
    driver = llm_stack.script([{"turns": [_call("readContext")], "repeat_last": True}])
    async with llm_stack.http() as http:
        run = await launch(http, _body(driver, model={"identifier": "openai/dev", "api_base": llm_stack.dev_url},
                                       limits={"phase:atomize": {"driver_steps": 3}}))
        waiting = await until(http, run["id"], lambda r: r["display_status"] == "waiting")
        assert waiting["halt_reason"].startswith("agent_review: the LLM driver used its 3 steps (phase.driver_steps)")
        assert len(llm_stack.llm.requests_for(driver.split("://")[1])) == 3
        stopped = await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "test over"})
        assert stopped.status_code == 200, stopped.text
        events = await wait_terminal(http, run["id"])
    assert len(_of(events, "DriverUsage")) == 3 and len(_of(events, "ToolCallEvent")) == 3


async def test_token_budget_spent_fails_the_phase_and_keeps_the_spend(llm_stack: LlmStack) -> None:
    turn = {**_call("readContext"), "usage": {"prompt_tokens": 30, "completion_tokens": 10}}
    driver = llm_stack.script([{"turns": [turn], "repeat_last": True}])
    async with llm_stack.http() as http:
        run = await launch(http, _body(driver, model={"identifier": "openai/dev", "api_base": llm_stack.dev_url},
                                       limits={"run": {"driver_tokens": 100}}))
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "error"
    failed = _of(events, "PhaseFailed")
    assert failed and failed[0]["phase"] == "atomize" and failed[0]["error_type"] == "DriverBudgetExhausted"
    assert "run.driver_tokens = 100" in failed[0]["detail"]
    usages = _of(events, "DriverUsage")
    assert len(usages) == 3, "40 + 40 + 40 tokens: the fourth call is never made"
    assert final["cost"]["driver"] == pytest.approx(3 * (30 * INPUT_PRICE + 10 * OUTPUT_PRICE), rel=1e-9)


async def test_launch_refuses_a_driver_without_its_secret_naming_it(llm_stack: LlmStack, stack: Stack) -> None:
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": llm_stack.dev_url},
            "driver": "openrouter://deepseek/deepseek-v4-flash"}
    async with llm_stack.http() as http:
        resp = await http.post("/v1/runs", json=body)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "missing_driver_secret" and "OPENROUTER_API_KEY" in error["message"]
        bad = await http.post("/v1/runs", json={**body, "driver": "openrouter://"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "unknown_driver"
        limits = (await http.get("/v1/limits")).json()
    assert "driver_tokens" in limits["levels"]["run"] and "driver_steps" in limits["levels"]["phase"]
    assert limits["defaults"]["phase.driver_steps"] >= 1 and limits["defaults"]["run.driver_tokens"] >= 1


async def test_third_restart_request_parks_the_run_restart_cap_exceeded(llm_stack: LlmStack) -> None:
    restart = [_call("requestRestart", reason="still wrong")]
    driver = llm_stack.script([restart, restart, restart])
    async with llm_stack.http() as http:
        run = await launch(http, _body(driver, model={"identifier": "openai/dev", "api_base": llm_stack.dev_url}))
        waiting = await until(http, run["id"], lambda r: r["display_status"] == "waiting")
        assert waiting["halt_reason"] == "restart_cap_exceeded: still wrong"
        stopped = await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "test over"})
        assert stopped.status_code == 200, stopped.text
        events = await wait_terminal(http, run["id"])
    assert len(_of(events, "PhaseRestartRequested")) == 3, "two restarts granted, the third parks the run"
    assert {r.conversation for r in llm_stack.llm.requests_for(driver.split("://")[1])} == {0, 1, 2}
