"""Operator sessions end to end (issue 26): the builtin operator answers structured goals on the real stack, with
dev models of known accuracy and price, within its budget, as its own account."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from benchwright.comparison.stats import mcnemar_exact
from benchwright.operator.sizing import tasks_for_paired_halfwidth
from benchwright.testkit.devmodel import DevModelConfig, is_answered_correctly
from tests.api.helpers import launch, record_history, wait_terminal
from tests.conftest import DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
N = 120


class Fixture:
    def __init__(self, dataset: str, questions: list[str], urls: dict[str, str]) -> None:
        self.dataset, self.questions, self.urls = dataset, questions, urls


MODELS = {  # name: (accuracy, hash seed)
    "weak": (0.55, ""), "strong": (0.95, ""), "same1": (0.80, "left"), "same2": (0.80, "right"),
    "m80": (0.80, ""), "m86": (0.86, ""), "m90": (0.90, ""),
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fx(dev_models: DevModels, tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    path = tmp_path_factory.mktemp("operator") / "plus.jsonl"
    questions = [f"What is {i} plus 41? (operator item {i})" for i in range(N)]
    path.write_text("".join(json.dumps({"question": q, "answer": str(i + 41)}) + "\n"
                            for i, q in enumerate(questions)))
    answers = {q: str(i + 41) for i, q in enumerate(questions)}
    urls = {name: await dev_models.start(DevModelConfig(answers=answers, accuracy=acc, seed=seed))
            for name, (acc, seed) in MODELS.items()}
    return Fixture(str(path), questions, urls)


def _model(fx: Fixture, name: str, price: float | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"identifier": f"openai/{name}", "api_base": fx.urls[name]}
    if price is not None:
        spec["input_cost_per_token"] = price
    return spec


def _correct(fx: Fixture, name: str) -> set[int]:
    acc, seed = MODELS[name]
    return {i for i, q in enumerate(fx.questions) if is_answered_correctly(q, acc, seed)}


async def _session(http: httpx.AsyncClient, goal: dict[str, Any], runs: int = 10,
                   cost: float | None = None) -> dict[str, Any]:
    session: dict[str, Any] = {"runs": runs} | ({"cost": cost} if cost is not None else {})
    resp = await http.post("/v1/operator/sessions", json={"operator": "builtin", "goal": goal,
                                                          "limits": {"session": session}})
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def _answered(http: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    for _ in range(20):  # long polls of up to 60 s each
        resp = await http.get(f"/v1/operator/sessions/{session_id}", params={"wait_s": 60}, timeout=90)
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        if body["status"] in ("answered", "stopped", "failed"):
            return body
    raise AssertionError(f"session {session_id} did not end: {body}")


async def _events(http: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    resp = await http.get(f"/v1/operator/sessions/{session_id}/events")
    assert resp.status_code == 200, resp.text
    page: dict[str, Any] = resp.json()
    assert [e["seq"] for e in page["events"]] == list(range(len(page["events"])))
    return page["events"]  # type: ignore[no-any-return]


async def test_better_finds_the_stronger_candidate(stack: Stack, fx: Fixture) -> None:
    async with stack.http() as http:
        started = await _session(http, {"question": "better", "dataset": fx.dataset,
                                        "baseline": _model(fx, "weak"), "candidate": _model(fx, "strong")})
        assert started["status"] == "running" and started["answer"] is None
        done = await _answered(http, started["id"])
        events = await _events(http, started["id"])
    answer = done["answer"]
    assert done["status"] == "answered" and answer["outcome"] == "candidate_better", answer
    assert answer["sentence"].startswith("Yes: the candidate (openai/strong) is better")
    weak, strong = _correct(fx, "weak"), _correct(fx, "strong")
    [pair] = answer["comparisons"]
    assert pair["difference"] == pytest.approx((len(strong) - len(weak)) / N)
    assert pair["p_value"] == pytest.approx(mcnemar_exact(b=len(weak - strong), c=len(strong - weak)))
    rows = {e["label"]: e for e in answer["evidence"]}
    assert rows["baseline"]["pass_rate"] == pytest.approx(len(weak) / N)
    assert rows["candidate"]["pass_rate"] == pytest.approx(len(strong) / N)
    assert [rows["baseline"]["run_id"], rows["candidate"]["run_id"]] == done["runs"]
    types = [e["type"] for e in events]
    assert types[0] == "SessionStarted" and types[-1] == "SessionAnswered"
    assert types.count("OperatorRunLaunched") == 2 and types.count("OperatorRunRead") == 2
    launches = [e["data"] for e in events if e["type"] == "OperatorDecision" and e["data"]["action"] == "launch"]
    assert [d["evidence"]["label"] for d in launches] == ["baseline", "candidate"]
    assert all(d["reason"] for d in launches)
    for run_id in done["runs"]:  # the Temporal UI names the session on each of its runs
        desc = await stack.client.get_workflow_handle(run_id).describe()
        assert await desc.memo_value("operator_session") == started["id"]


async def test_equal_models_are_no_significant_difference_with_the_needed_size(stack: Stack, fx: Fixture) -> None:
    left, right = _correct(fx, "same1"), _correct(fx, "same2")
    lost, gained = len(left - right), len(right - left)
    assert mcnemar_exact(b=lost, c=gained) > 0.05, "fixture: the two equal models must not differ by chance"
    async with stack.http() as http:
        started = await _session(http, {"question": "better", "dataset": fx.dataset, "halfwidth": 0.02,
                                        "baseline": _model(fx, "same1"), "candidate": _model(fx, "same2")})
        done = await _answered(http, started["id"])
    answer = done["answer"]
    assert answer["outcome"] == "no_significant_difference", answer
    needed = tasks_for_paired_halfwidth(lost=lost, gained=gained, n=N, halfwidth=0.02)
    assert answer["needed_tasks"] == needed > N
    assert answer["unestablished"] == [
        f"the difference is not significant at {N} tasks (p = {answer['comparisons'][0]['p_value']:.3g} > 0.05); "
        f"{needed:,} tasks would be needed for ±2 points"]


async def test_an_inconclusive_better_extends_within_its_budget(stack: Stack, fx: Fixture) -> None:
    first = 40
    left, right = _correct(fx, "same1"), _correct(fx, "same2")
    head = set(range(first))
    assert mcnemar_exact(b=len((left - right) & head), c=len((right - left) & head)) > 0.05, "fixture: inconclusive"
    async with stack.http() as http:
        started = await _session(http, {"question": "better", "dataset": fx.dataset, "tasks": first,
                                        "baseline": _model(fx, "same1"), "candidate": _model(fx, "same2")}, runs=4)
        done = await _answered(http, started["id"])
        events = await _events(http, started["id"])
        totals = [(await http.get(f"/v1/runs/{r}")).json()["tasks"]["summary"]["total"] for r in done["runs"]]
    assert totals == [first, first, N, N], totals  # the larger runs hold all the dataset has
    [ext] = [e["data"] for e in events if e["type"] == "OperatorDecision" and e["data"]["action"] == "extend"]
    assert ext["reason"].startswith(f"the difference is not significant at {first} tasks"), ext
    assert [x["label"] for x in ext["evidence"]["launches"]] == ["baseline (extended)", "candidate (extended)"]
    answer = done["answer"]
    assert [e["label"] for e in answer["evidence"]] == ["baseline (extended)", "candidate (extended)"]
    assert answer["comparisons"][0]["compared"] == N
    assert answer["comparisons"][0]["p_value"] == pytest.approx(mcnemar_exact(b=len(left - right),
                                                                              c=len(right - left)))
    await record_history(stack, f"operator-{started['id']}", "operator_builtin_extended.json")


async def test_cheapest_above_the_bar(stack: Stack, fx: Fixture) -> None:
    rates = {name: len(_correct(fx, name)) / N for name in ("m80", "m86", "m90")}
    assert rates["m80"] < 0.85 <= rates["m86"] <= rates["m90"], rates  # fixture: the bar splits them as intended
    models = [_model(fx, "m80", 1e-6), _model(fx, "m86", 2e-6), _model(fx, "m90", 5e-6)]
    async with stack.http() as http:
        started = await _session(http, {"question": "cheapest", "dataset": fx.dataset, "models": models,
                                        "min_score": 0.85})
        done = await _answered(http, started["id"])
    answer = done["answer"]
    assert answer["outcome"] == "cheapest", answer
    rows = {e["model"]: e for e in answer["evidence"]}
    assert answer["chosen"] == rows["openai/m86"]["run_id"]
    assert answer["sentence"].startswith("The cheapest model at ≥ 85 % is openai/m86")
    assert 0 < rows["openai/m80"]["model_cost"] < rows["openai/m86"]["model_cost"] < rows["openai/m90"]["model_cost"]
    assert done["cost"] == pytest.approx(sum(r["cost"] for r in rows.values()))
    assert len(done["runs"]) == 3


async def test_a_session_stops_at_its_run_budget(stack: Stack, fx: Fixture) -> None:
    models = [_model(fx, "m80", 1e-6), _model(fx, "m86", 2e-6), _model(fx, "m90", 5e-6)]
    async with stack.http() as http:
        started = await _session(http, {"question": "cheapest", "dataset": fx.dataset, "models": models,
                                        "min_score": 0.85}, runs=1)
        done = await _answered(http, started["id"])
        events = await _events(http, started["id"])
    assert len(done["runs"]) == 1
    answer = done["answer"]
    assert answer["outcome"] == "budget_exhausted", answer
    assert any("2 of 3 models were not measured" in u for u in answer["unestablished"])
    [stop] = [e["data"] for e in events if e["type"] == "OperatorDecision" and e["data"]["action"] == "stop"]
    assert stop["reason"] == "the session's budget allows 1 run(s) and the plan needs 3"


async def test_regressed_replays_the_reference_with_its_own_model(stack: Stack, fx: Fixture) -> None:
    async with stack.http() as http:
        ref = await launch(http, {"dataset": fx.dataset, "model": _model(fx, "m86")})
        await wait_terminal(http, ref["id"])
        started = await _session(http, {"question": "regressed", "reference_run": ref["id"]})
        done = await _answered(http, started["id"])
    answer = done["answer"]
    # the same deterministic model answers the same tasks: no flip at all, so nothing regressed
    assert answer["outcome"] == "no_significant_difference", answer
    [pair] = answer["comparisons"]
    assert pair["a"] == ref["id"] and pair["b"] == done["runs"][0] and pair["difference"] == 0
    assert [e["label"] for e in answer["evidence"]] == ["reference", "replay"]


async def test_a_session_never_touches_another_accounts_runs(stack: Stack, fx: Fixture) -> None:
    async with stack.http() as mine, stack.http(stack.other_key) as theirs:
        ref = await launch(mine, {"dataset": fx.dataset, "model": _model(fx, "m90")})
        await wait_terminal(mine, ref["id"])
        refused = await theirs.post("/v1/operator/sessions", json={"goal": {
            "question": "helps", "reference_run": ref["id"], "change": {"model": _model(fx, "m80")}}})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found", refused.text
        started = await _session(mine, {"question": "regressed", "reference_run": ref["id"]})
        sid = started["id"]
        assert (await theirs.get(f"/v1/operator/sessions/{sid}")).status_code == 404
        assert (await theirs.get(f"/v1/operator/sessions/{sid}/events")).status_code == 404
        assert (await theirs.post(f"/v1/operator/sessions/{sid}/stop")).status_code == 404
        done = await _answered(mine, sid)
        theirs_runs = (await theirs.get("/v1/runs", params={"limit": 200})).json()["runs"]
    assert done["status"] == "answered" and len(done["runs"]) == 1
    assert not {r["id"] for r in theirs_runs} & {ref["id"], *done["runs"]}


async def test_a_goal_that_cannot_be_launched_is_refused_before_a_session_exists(stack: Stack, fx: Fixture) -> None:
    async with stack.http() as http:
        resp = await http.post("/v1/operator/sessions", json={"goal": {
            "question": "better", "dataset": "ftp://example.com/data.jsonl", "baseline": _model(fx, "m80"),
            "candidate": _model(fx, "m90")}})
        listed = await http.get("/v1/runs", params={"limit": 200})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_dataset", resp.text
    assert all("ftp://" not in str(r) for r in listed.json()["runs"])


async def test_an_unknown_operator_is_refused(stack: Stack, fx: Fixture) -> None:
    async with stack.http() as http:
        resp = await http.post("/v1/operator/sessions", json={"operator": "buitlin", "goal": {
            "question": "regressed", "reference_run": "x"}})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unknown_operator", resp.text


async def test_ask_prints_progress_and_the_answer(stack: Stack, fx: Fixture, tmp_path: Path) -> None:
    from tests.cli.test_cli_launch import api_env, bw

    goal = tmp_path / "goal.json"
    goal.write_text(json.dumps({"question": "better", "dataset": fx.dataset, "baseline": _model(fx, "weak"),
                                "candidate": _model(fx, "strong")}))
    done = await bw("ask", "--goal", str(goal), "--runs", "2", env=api_env(stack), timeout_s=600)
    assert done.rc == 0, done.err
    assert "operator session" in done.err and f"{N}/{N} tasks" in done.err  # live progress of its runs
    assert "Yes: the candidate (openai/strong) is better" in done.out
    assert "openai/weak" in done.out and "paired p =" in done.out
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    refused = await bw("ask", "--goal", str(bad), env=api_env(stack))
    assert refused.rc == 2 and "expected an object with a 'question'" in refused.err


async def _until_session(http: httpx.AsyncClient, session_id: str, check: Any, timeout_s: float = 120) -> Any:
    """Poll the session until ``check(session)`` holds (readiness polling, bounded in time)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        session = (await http.get(f"/v1/operator/sessions/{session_id}")).json()
        if check(session):
            return session
        assert asyncio.get_running_loop().time() < deadline, f"condition not reached: {session}"
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def slow(fx: Fixture, dev_models: DevModels) -> dict[str, str]:
    """Two dev models answering slowly (Materialize lasts seconds), at 0.55 and 0.95."""
    answers = {q: str(i + 41) for i, q in enumerate(fx.questions)}
    return {name: await dev_models.start(DevModelConfig(answers=answers, accuracy=acc, latency_ms=2500))
            for name, acc in (("slow_weak", 0.55), ("slow_strong", 0.95))}


async def test_pause_holds_the_next_launch_and_steer_and_resume_are_logged(stack: Stack, fx: Fixture,
                                                                           slow: dict[str, str]) -> None:
    async with stack.http() as http:
        started = await _session(http, {
            "question": "better", "dataset": fx.dataset,
            "baseline": {"identifier": "openai/slow_weak", "api_base": slow["slow_weak"]},
            "candidate": {"identifier": "openai/slow_strong", "api_base": slow["slow_strong"]}})
        sid = started["id"]
        first = (await _until_session(http, sid, lambda s: len(s["runs"]) == 1))["runs"][0]
        assert (await http.post(f"/v1/operator/sessions/{sid}/pause")).status_code == 202
        steer = await http.post(f"/v1/operator/sessions/{sid}/steer", json={"message": "mind the budget"})
        assert steer.status_code == 202, steer.text
        await wait_terminal(http, first)
        await _until_session(http, sid, lambda s: s["status"] == "paused")
        assert (await http.post(f"/v1/operator/sessions/{sid}/resume")).status_code == 202
        done = await _answered(http, sid)
        events = await _events(http, sid)
        ended = await http.post(f"/v1/operator/sessions/{sid}/pause")
    assert done["status"] == "answered" and done["answer"]["outcome"] == "candidate_better", done
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "session_ended"
    controls = [(e["seq"], e["data"]["action"], e["data"]["message"]) for e in events if e["type"] == "OperatorControl"]
    assert [(a, m) for _, a, m in controls] == [("pause", None), ("steer", "mind the budget"), ("resume", None)]
    launched = [e["seq"] for e in events if e["type"] == "OperatorRunLaunched"]
    assert len(launched) == 2 and launched[0] < controls[0][0] and controls[2][0] < launched[1]


async def test_stop_ends_the_session_with_what_it_read(stack: Stack, fx: Fixture, slow: dict[str, str]) -> None:
    models = [{"identifier": f"openai/{n}", "api_base": slow[n]} for n in ("slow_weak", "slow_strong")]
    async with stack.http() as http:
        started = await _session(http, {"question": "cheapest", "dataset": fx.dataset, "models": models,
                                        "min_score": 0.5})
        sid = started["id"]
        await _until_session(http, sid, lambda s: len(s["runs"]) == 1)
        assert (await http.post(f"/v1/operator/sessions/{sid}/stop")).status_code == 202
        done = await _answered(http, sid)
        run = (await http.get(f"/v1/runs/{done['runs'][0]}", params={"wait_s": 30})).json()
    assert done["status"] == "stopped" and done["answer"]["outcome"] == "stopped", done
    assert len(done["runs"]) == 1
    assert run["halted"] and f"operator session {sid} was stopped" in (run["halt_reason"] or ""), run
    await record_history(stack, f"operator-{sid}", "operator_builtin_stopped.json")


async def test_a_killed_worker_loses_nothing_and_launches_no_run_twice(stack: Stack, fx: Fixture,
                                                                       slow: dict[str, str]) -> None:
    from temporalio.worker import Replayer
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    from api.main import create_app
    from benchwright.stack.devstack import free_port
    from tests.conftest import serve_app, start_worker_process
    from worker import PASSTHROUGH
    from workflows.operator import OperatorWorkflow

    settings = stack.settings.model_copy(update={"task_queue": f"bw-op-kill-{uuid.uuid4()}"})
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    worker = start_worker_process(settings)
    killed = False
    try:
        async with stack.http() as http:
            http.base_url = f"http://127.0.0.1:{port}"
            started = await _session(http, {
                "question": "better", "dataset": fx.dataset,
                "baseline": {"identifier": "openai/kill_weak", "api_base": slow["slow_weak"]},
                "candidate": {"identifier": "openai/kill_strong", "api_base": slow["slow_strong"]}})
            sid = started["id"]
            first = (await _until_session(http, sid, lambda s: len(s["runs"]) == 1))["runs"][0]
            # kill during the first run's Materialize (its batches heartbeat, so the new worker takes them over at
            # once; a kill inside an earlier phase would wait out that phase's start-to-close timeout)
            deadline = asyncio.get_running_loop().time() + 120
            while (run := (await http.get(f"/v1/runs/{first}")).json())["phase"] != "materialize":
                assert run["status"] == "running", f"the run ended before the kill: {run['display_status']}"
                assert asyncio.get_running_loop().time() < deadline, run
                await asyncio.sleep(0.05)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            killed = True
            worker = start_worker_process(settings)
            done = await _answered(http, sid)
            events = await _events(http, sid)
            listed = (await http.get("/v1/runs", params={"limit": 200})).json()["runs"]
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(30)
        server.should_exit = True
        await task
    assert killed
    assert done["status"] == "answered" and done["answer"]["outcome"] == "candidate_better", done
    assert len(done["runs"]) == 2 and done["runs"][0] == first
    assert [e["type"] for e in events].count("OperatorRunLaunched") == 2
    mine = [r["id"] for r in listed if r["model"] in ("openai/kill_weak", "openai/kill_strong")]
    assert sorted(mine) == sorted(done["runs"])  # exactly one run per planned launch
    history = await stack.client.get_workflow_handle(f"operator-{sid}").fetch_history()
    replayed = await Replayer(
        workflows=[OperatorWorkflow], data_converter=stack.client.data_converter,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)),
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_helps_reruns_the_reference_with_the_change(stack: Stack, fx: Fixture) -> None:
    gained = _correct(fx, "m90") - _correct(fx, "m80")
    assert _correct(fx, "m80") <= _correct(fx, "m90") and mcnemar_exact(b=0, c=len(gained)) < 0.05  # fixture
    async with stack.http() as http:
        ref = await launch(http, {"dataset": fx.dataset, "model": _model(fx, "m80")})
        await wait_terminal(http, ref["id"])
        started = await _session(http, {"question": "helps", "reference_run": ref["id"],
                                        "change": {"model": _model(fx, "m90")}})
        done = await _answered(http, started["id"])
        changed = (await http.get(f"/v1/runs/{done['runs'][0]}")).json()
    answer = done["answer"]
    assert answer["outcome"] == "helps", answer
    assert answer["sentence"].startswith("Yes: the change helps by +")
    [pair] = answer["comparisons"]
    assert pair["difference"] == pytest.approx(len(gained) / N)
    assert changed["model"]["identifier"] == "openai/m90"


async def test_start_run_is_idempotent_on_the_run_id(stack: Stack, fx: Fixture) -> None:
    """The Operator's launch activity may run twice (a retry, a killed worker): one run, one workflow, one log."""
    from benchwright.errors import Conflict
    from benchwright.runs.launch import start_run
    from benchwright.schemas import LaunchRequest
    from benchwright.store.accounts import authenticate
    from benchwright.store.db import make_engine

    engine = make_engine(stack.settings.resolved_database_url())
    account = authenticate(engine, stack.api_key)
    body = LaunchRequest.model_validate({"dataset": fx.dataset, "model": _model(fx, "m90")})
    run_id = str(uuid.uuid4())
    first = await start_run(stack.settings, engine, stack.client, account=account, launch=body, run_id=run_id)
    again = await start_run(stack.settings, engine, stack.client, account=account, launch=body, run_id=run_id)
    assert first.id == again.id == run_id
    async with stack.http() as http:
        await wait_terminal(http, run_id)
        after = await start_run(stack.settings, engine, stack.client, account=account, launch=body, run_id=run_id)
        final = (await http.get(f"/v1/runs/{run_id}")).json()
        events = (await http.get(f"/v1/runs/{run_id}/events")).json()["events"]
    assert after.status == "ok" and final["status"] == "ok"  # a finished run is not started again
    assert [e["type"] for e in events].count("RunLaunched") == 1
    assert [e["type"] for e in events].count("PipelineStarted") == 1
    other = authenticate(engine, stack.other_key)
    with pytest.raises(Conflict):  # another account's run id is refused, never touched
        await start_run(stack.settings, engine, stack.client, account=other, launch=body, run_id=run_id)
