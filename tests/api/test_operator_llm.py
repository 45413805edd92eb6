"""The LLM operator end to end (issue 26): ``"operator": "openai://<model>"`` with its calls going to the scripted-LLM
test double (its own, on loopback, named by the session's ``api_base``). The operator launches a run whose LLM
Driver struggles (its provider does not know the Driver's model: Atomize fails), reads that, re-runs it with the
builtin Driver, and answers; its tokens are priced on the session, never on a run's ``cost.driver``.

Runs on the module stack of ``tests/api/test_llm_driver.py`` (a worker whose LLM Drivers call the scripted LLM)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from benchwright.testkit.scripted_llm import ScriptedLlm, ScriptedLlmServer, parse_script, start_scripted_llm
from tests.api.helpers import record_history
from tests.api.test_llm_driver import DATASET, DRIVER_KEY, LlmStack, llm_stack  # noqa: F401 - the fixture
from tests.api.test_operator import _answered, _events
from tests.conftest import DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
INPUT_PRICE, OUTPUT_PRICE = 1e-6, 2e-6
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def operator_llm() -> AsyncIterator[tuple[ScriptedLlm, str]]:
    llm = ScriptedLlm()
    server: ScriptedLlmServer = await start_scripted_llm(llm, port=free_port())
    try:
        yield llm, server.url
    finally:
        await server.close()


def _turn(name: str, content: str | None = None, **arguments: Any) -> dict[str, Any]:
    return {"content": content, "tool_calls": [{"name": name, "arguments": arguments}], "usage": USAGE}


async def test_llm_operator_reruns_a_struggling_run_with_another_driver(
        stack: Stack, llm_stack: LlmStack, operator_llm: tuple[ScriptedLlm, str]) -> None:  # noqa: F811
    llm, url = operator_llm
    model = f"operator-{uuid.uuid4().hex[:8]}"
    struggling = f"openai://unscripted-{uuid.uuid4().hex[:8]}"  # its provider answers 404: Atomize fails
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": llm_stack.dev_url},
            "constraints": {"max_tasks": 4}}
    sentence = "openai/dev answers all 4 arithmetic tasks (builtin Driver; the LLM Driver failed at Atomize)."
    llm.add(model, parse_script({model: [[
        _turn("launch", "Measure the model.", reason="measure openai/dev with the LLM driver", label="first",
              launch={**body, "driver": struggling}),
        _turn("wait", reason="read the run when it settles"),
        _turn("launch", reason="the first run's driver failed at Atomize: re-run it with the builtin driver",
              label="rerun", launch={**body, "driver": "builtin"}),
        _turn("wait", reason="read the re-run"),
        _turn("replay", reason="check the re-run reproduces on its pinned tasks", label="replayed", run_id="rerun",
              model=body["model"]),
        _turn("wait", reason="read the replay"),
        _turn("answer", reason="the re-run measured the model", sentence=sentence, outcome="measured",
              runs=["first", "rerun", "replayed"], comparisons=[["rerun", "replayed"]],
              unestablished=["how the LLM driver would have scored it"]),
    ]]})[model])
    async with llm_stack.http() as http:
        before = (await http.get("/v1/account")).json()["balance_usd"]
        resp = await http.post("/v1/operator/sessions", json={
            "operator": f"openai://{model}", "goal": "How well does openai/dev do on the arithmetic sample?",
            "api_base": url, "input_cost_per_token": INPUT_PRICE, "output_cost_per_token": OUTPUT_PRICE,
            "limits": {"session": {"runs": 3, "cost": 5}}})
        assert resp.status_code == 201, resp.text
        started = resp.json()
        done = await _answered(http, started["id"])
        events = await _events(http, started["id"])
        runs = [(await http.get(f"/v1/runs/{r}")).json() for r in done["runs"]]
        lineage = (await http.get(f"/v1/runs/{done['runs'][1]}/lineage")).json()
        after = (await http.get("/v1/account")).json()["balance_usd"]

    answer = done["answer"]
    assert done["status"] == "answered" and answer["sentence"] == sentence and answer["outcome"] == "measured"
    first, rerun, replayed = runs
    assert (first["driver"], first["status"]) == (struggling, "error"), first
    assert (rerun["driver"], rerun["status"]) == ("builtin", "ok"), rerun
    assert rerun["tasks"]["summary"]["pass_rate"] == 1.0
    nodes = {n["id"]: n for n in lineage["runs"]}
    assert (nodes[replayed["id"]]["parent_run_id"], nodes[replayed["id"]]["kind"]) == (rerun["id"], "replay")
    assert replayed["status"] == "ok" and nodes[replayed["id"]]["fingerprint"] == nodes[rerun["id"]]["fingerprint"]
    [pair] = answer["comparisons"]
    assert (pair["a"], pair["b"], pair["difference"], pair["compared"]) == (rerun["id"], replayed["id"], 0.0, 4)
    rows = {e["label"]: e for e in answer["evidence"]}
    assert rows["first"]["run_id"] == first["id"] and rows["first"]["status"] == "error" and rows["first"]["error"]
    assert rows["rerun"]["pass_rate"] == 1.0
    assert "how the LLM driver would have scored it" in answer["unestablished"]

    # every tool call is a decision with its reason; the operator saw the failure before re-running
    decisions = [e["data"] for e in events if e["type"] == "OperatorDecision"]
    assert [d["action"] for d in decisions] == ["launch", "wait", "launch", "wait", "replay", "wait", "answer",
                                                "answer"]
    assert decisions[2]["reason"].startswith("the first run's driver failed at Atomize")
    assert decisions[2]["evidence"]["arguments"]["launch"]["driver"] == "builtin"
    launched = [e["data"] for e in events if e["type"] == "OperatorRunLaunched"]
    assert [(d["label"], d["run_id"]) for d in launched] == [
        ("first", first["id"]), ("rerun", rerun["id"]), ("replayed", replayed["id"])]
    requests = [r for r in llm.requests_for(model) if r.status == 200]
    assert len(requests) == 7 and all(r.headers["authorization"] == f"Bearer {DRIVER_KEY}" for r in requests)
    seen = json.loads(requests[2].messages[-1]["content"])  # the wait's answer, shown before the re-run
    assert seen["runs"][0]["run_id"] == first["id"] and seen["runs"][0]["status"] == "error"
    assert "steer" not in json.dumps(requests[-1].body)

    # the operator's tokens are the session's cost (and the balance's), never a run's cost.driver
    turns = [e["data"] for e in events if e["type"] == "OperatorLlmTurn"]
    own = 7 * (USAGE["prompt_tokens"] * INPUT_PRICE + USAGE["completion_tokens"] * OUTPUT_PRICE)
    assert len(turns) == 7 and sum(t["cost_usd"] for t in turns) == pytest.approx(own)
    assert own > 0 and done["operator_cost"] == pytest.approx(own)
    assert done["cost"] == pytest.approx(own + sum(r["cost"]["incurred"] for r in runs))
    assert [r["cost"]["driver"] for r in runs] == [0.0, 0.0, 0.0]
    assert before - after >= own * 0.999
    await record_history(stack, f"operator-{started['id']}", "operator_llm_session.json")


async def test_an_llm_operator_is_checked_at_create(llm_stack: LlmStack) -> None:  # noqa: F811
    async with llm_stack.http() as http:
        bad = await http.post("/v1/operator/sessions", json={
            "operator": "openai://x", "goal": "anything", "api_base": "ftp://127.0.0.1/v1"})
        unpriced = await http.post("/v1/operator/sessions", json={
            "operator": "openai://not-in-the-cost-map-x", "goal": "anything", "api_base": "http://127.0.0.1:9/v1",
            "limits": {"session": {"cost": 1}}})
        secretless = await http.post("/v1/operator/sessions", json={"operator": "nosuch://x", "goal": "anything"})
        prose = await http.post("/v1/operator/sessions", json={"operator": "builtin", "goal": "anything"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "model_endpoint_refused", bad.text
    assert unpriced.status_code == 400 and unpriced.json()["error"]["code"] == "unpriced_operator", unpriced.text
    assert secretless.status_code == 400 and "NOSUCH_API_KEY" in secretless.text, secretless.text
    assert prose.status_code == 400 and prose.json()["error"]["code"] == "prose_goal", prose.text


async def _until_event(http: Any, session_id: str, type_: str, count: int = 1) -> list[dict[str, Any]]:
    """The session's events once ``count`` events of ``type_`` are in (long polls of the session, never a sleep)."""
    for _ in range(60):
        events = await _events(http, session_id)
        if sum(e["type"] == type_ for e in events) >= count:
            return events
        await http.get(f"/v1/operator/sessions/{session_id}", params={"wait_s": 1})
    raise AssertionError(f"no {count} {type_} event(s) in session {session_id}")


async def test_steer_reaches_the_llm_and_stop_halts_the_sessions_runs(
        llm_stack: LlmStack, operator_llm: tuple[ScriptedLlm, str], dev_models: DevModels) -> None:  # noqa: F811
    llm, url = operator_llm
    slow = await dev_models.start(DevModelConfig(answers=load_answers(Path(DATASET)), latency_ms=120_000))
    model = f"operator-{uuid.uuid4().hex[:8]}"
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": slow}, "driver": "builtin",
            "constraints": {"max_tasks": 2}}
    llm.add(model, parse_script({model: [[
        _turn("launch", reason="measure the model", label="first", launch=body),
        _turn("wait", reason="read it"),
        _turn("launch", reason="as the person asked, measure it again", label="second", launch=body),
        _turn("wait", reason="read it"),
    ]]})[model])
    steer = "measure it once more, please"
    async with llm_stack.http() as http:
        resp = await http.post("/v1/operator/sessions", json={
            "operator": f"openai://{model}", "goal": "Measure openai/dev.", "api_base": url,
            "input_cost_per_token": INPUT_PRICE, "output_cost_per_token": OUTPUT_PRICE})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        events = await _until_event(http, sid, "OperatorRunLaunched")
        first = next(e["data"]["run_id"] for e in events if e["type"] == "OperatorRunLaunched")
        assert (await http.post(f"/v1/operator/sessions/{sid}/steer", json={"message": steer})).status_code == 202
        await _until_event(http, sid, "OperatorControl")  # recorded while the operator waits on the slow run
        assert (await http.post(f"/v1/runs/{first}/stop", json={"reason": "test"})).status_code == 200
        events = await _until_event(http, sid, "OperatorRunLaunched", 2)
        second = [e["data"]["run_id"] for e in events if e["type"] == "OperatorRunLaunched"][1]
        assert (await http.post(f"/v1/operator/sessions/{sid}/stop")).status_code == 202
        done = await _answered(http, sid)
        events = await _events(http, sid)
        run = (await http.get(f"/v1/runs/{second}", params={"wait_s": 30})).json()

    requests = [r for r in llm.requests_for(model) if r.status == 200]
    shown = [m["content"] for m in requests[2].messages if m["role"] == "user"]
    assert shown[-1] == f"A person steers the session: {steer}", shown
    assert not any(steer in m.get("content", "") for r in requests[:2] for m in r.messages if m["role"] == "user")
    assert done["status"] == "stopped" and done["answer"]["outcome"] == "stopped"
    halts = [e["data"] for e in events if e["type"] == "OperatorDecision" and e["data"]["action"] == "halt"]
    assert halts and halts[0]["evidence"]["runs"] == [second], halts
    assert run["halted"] and f"operator session {sid} was stopped" in (run["halt_reason"] or ""), run


async def test_ask_a_question_in_prose(llm_stack: LlmStack, operator_llm: tuple[ScriptedLlm, str]) -> None:  # noqa: F811
    from tests.cli.test_cli_launch import bw

    llm, url = operator_llm
    model = f"operator-{uuid.uuid4().hex[:8]}"
    llm.add(model, parse_script({model: [[
        _turn("answer", reason="no run is needed", sentence="Yes: 2 + 2 is 4, no run needed.", outcome="known"),
    ]]})[model])
    question = "Is 2 + 2 equal to 4?"
    env = {"BENCHWRIGHT_API_URL": llm_stack.api_url, "BENCHWRIGHT_API_KEY": llm_stack.key}
    done = await bw("ask", question, "--operator", f"openai://{model}", "--api-base", url,
                    "--input-cost-per-token", "1e-6", "--output-cost-per-token", "2e-6", env=env, timeout_s=300)
    assert done.rc == 0, done.err
    assert "Yes: 2 + 2 is 4, no run needed." in done.out and "0 run(s)" in done.out
    [request] = llm.requests_for(model)
    assert f"Goal: {question}" in request.messages[1]["content"]
    both = await bw("ask", question, "--goal", "x.json", env=env)
    assert both.rc == 2 and "either as a sentence" in both.err


async def test_a_retried_turn_is_read_back_and_the_cost_limit_stops_the_next(
        tmp_path: Path, operator_llm: tuple[ScriptedLlm, str]) -> None:
    """The turn activity on a real store and the scripted LLM: a repeated turn (a retry after the call was paid for)
    is answered from the log, neither called nor charged again; once the session's cost limit is reached no call
    is made."""
    from typing import cast

    from temporalio.client import Client

    from activities.common import Deps
    from activities.operator import OperatorLlmActivities
    from benchwright.operator.goals import SessionCreate
    from benchwright.operator.llm import admit_operator
    from benchwright.operator.steps import LlmTurnStep
    from benchwright.operator.store import create_session, get_session
    from benchwright.security.crypto import ensure_key_file, load_keyring
    from benchwright.settings import Settings
    from benchwright.store.accounts import create_account, get_account
    from benchwright.store.db import make_engine, migrate
    from benchwright.store.policy import prepare_secrets, put_secret

    llm, url = operator_llm
    model = f"operator-{uuid.uuid4().hex[:8]}"
    usage = {"prompt_tokens": 1000, "completion_tokens": 0}
    llm.add(model, parse_script({model: [[{"tool_calls": [{"name": "get_run", "arguments": {
        "reason": "look", "run_id": "x"}}], "usage": usage}] * 3]})[model])
    settings = Settings(data_dir=tmp_path, allow_local_paths=True, billing_markup=1.5)
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    ensure_key_file(tmp_path)
    prepare_secrets(engine, load_keyring(settings))
    account, _ = create_account(engine, name="op", balance_usd=1.0, local_paths=True)
    put_secret(engine, account_id=account.id, name="OPENAI_API_KEY", value="sk-op", host_pattern=None)
    req = SessionCreate.model_validate({"operator": f"openai://{model}", "goal": "g", "api_base": url,
                                        "input_cost_per_token": 1e-4, "output_cost_per_token": 0,
                                        "limits": {"session": {"cost": 0.15}}})
    config = admit_operator(settings, engine, account=account, req=req)
    assert config is not None
    sid = str(uuid.uuid4())
    row = create_session(engine, session_id=sid, account_id=account.id, req=req)
    acts = OperatorLlmActivities(Deps(engine=engine, settings=settings), cast(Client, None))

    transcript: list[dict[str, Any]] = []

    def step(turn: int) -> LlmTurnStep:
        return LlmTurnStep(session_id=sid, account_id=account.id, llm=config, goal=row.goal, limits=req.limits,
                           turn=turn, transcript=list(transcript))

    def answered(reply: Any) -> None:
        transcript.extend([reply.message(), {"role": "tool", "tool_call_id": reply.calls[0].id, "content": "{}"}])

    first = await acts.turn(step(0))
    again = await acts.turn(step(0))
    assert first.reply is not None and again == first and len(llm.requests_for(model)) == 1
    assert first.reply.cost_usd == pytest.approx(0.1)
    assert get_account(engine, account_id=account.id).balance_usd == pytest.approx(1.0 - 0.1 * 1.5)
    answered(first.reply)
    second = await acts.turn(step(1))  # $0.10 spent of $0.15: one more call
    assert second.reply is not None
    answered(second.reply)
    third = await acts.turn(step(2))  # $0.20 spent: none
    assert third.reply is None and len(llm.requests_for(model)) == 2
    assert third.over is not None and "limits.session.cost" in third.over
    session = get_session(engine, session_id=sid, account_id=account.id)
    from benchwright.operator.store import session_view

    assert session_view(engine, session).operator_cost == pytest.approx(0.2)
    engine.dispose()
