"""The API contract (issue 15 items 2, 4, 5, 11): body and field limits, integer bounds, summaries in lists, the
whole-policy PUT, and control calls racing the run's own completion. All through REST on the real stack."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio import workflow
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from api.main import create_app
from benchwright.errors import Conflict
from benchwright.runs.control import UPDATE_OUTLIVED_RUN, update_refusal
from benchwright.runs.launch import DRIVERS
from benchwright.sandbox.compute import COMPUTE_CHOICES
from benchwright.schemas import COMPUTE_VALUES, DRIVER_VALUES, MAX_METADATA_BYTES
from benchwright.stack.devstack import free_port
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
MIB = 1024 * 1024


def _model(stack: Stack) -> dict[str, Any]:
    return {"identifier": "openai/dev", "api_base": stack.dev_url}


async def _run_ids(http: httpx.AsyncClient) -> set[str]:
    ids: set[str] = set()
    cursor: str | None = None
    while True:
        page = (await http.get("/v1/runs", params={"limit": 200, **({"cursor": cursor} if cursor else {})})).json()
        ids |= {r["id"] for r in page["runs"]}
        if not (cursor := page["next_cursor"]):
            return ids


async def test_schema_enums_match_the_domain() -> None:
    assert COMPUTE_VALUES == COMPUTE_CHOICES and DRIVER_VALUES == DRIVERS


async def test_body_over_the_limit_is_413_with_or_without_content_length(stack: Stack) -> None:
    body = json.dumps({"dataset": DATASET, "model": _model(stack), "task_impl": "#" * (MIB + 10)}).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start:start + 64 * 1024]

    async with stack.http() as http:
        before = await _run_ids(http)
        declared = await http.post("/v1/runs", content=body, headers={"Content-Type": "application/json"})
        streamed = await http.post("/v1/runs", content=chunked(), headers={"Content-Type": "application/json"})
        after = await _run_ids(http)
    assert "transfer-encoding" not in declared.request.headers
    assert streamed.request.headers.get("transfer-encoding") == "chunked"
    for resp in (declared, streamed):
        assert resp.status_code == 413, resp.text
        err = resp.json()["error"]
        assert err["code"] == "payload_too_large" and str(stack.settings.max_body_bytes) in err["message"]
    assert after == before, "a refused launch leaves no run behind"


async def test_launch_fields_are_bounded(stack: Stack) -> None:
    big = {"k": "x" * MAX_METADATA_BYTES}
    async with stack.http() as http:
        before = await _run_ids(http)
        meta = await http.post("/v1/runs", json={"dataset": DATASET, "model": _model(stack), "metadata": big})
        params = await http.post("/v1/runs", json={"dataset": DATASET, "model": {**_model(stack),
                                                                                   "params": {"p": "x" * 20_000}}})
        reqs = await http.post("/v1/runs", json={"dataset": DATASET, "model": _model(stack),
                                                 "requirements": ["sympy"] * 101})
        url = await http.post("/v1/runs", json={"dataset": "http://x/" + "a" * 5000, "model": _model(stack)})
        conc = await http.post("/v1/runs", json={"dataset": DATASET, "model": _model(stack), "concurrency": 2**63})
        after = await _run_ids(http)
    assert meta.status_code == 422 and "metadata is" in meta.json()["error"]["message"]
    assert params.status_code == 422 and "model.params" in params.json()["error"]["message"]
    for resp in (reqs, url, conc):
        assert resp.status_code == 422, resp.text
    assert after == before


@pytest_asyncio.fixture(loop_scope="session")
async def roomy_api(stack: Stack) -> AsyncIterator[str]:
    """The API with an 8 MiB body limit, so a launch can pass it and still be too large for a workflow input."""
    port = free_port()
    server, task = await serve_app(create_app(stack.settings.model_copy(update={"max_body_bytes": 8 * MIB})), port)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


async def test_launch_too_large_for_temporal_is_refused_before_anything_is_written(stack: Stack,
                                                                                   roomy_api: str) -> None:
    impl = "\u20ac" * 500_000  # within task_impl's 512k characters; 1.5 MB of UTF-8 in the workflow input
    async with httpx.AsyncClient(base_url=roomy_api, headers={"Authorization": f"Bearer {stack.api_key}"},
                                 timeout=60) as http:
        before = await _run_ids(http)
        resp = await http.post("/v1/runs", json={"dataset": DATASET, "model": _model(stack), "task_impl": impl})
        after = await _run_ids(http)
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "payload_too_large" and "workflow input" in resp.json()["error"]["message"]
    assert after == before


async def test_integer_parameters_are_bounded(stack: Stack) -> None:
    paths = ["/tasks/9223372036854775808", "/tasks/2147483648", "/tasks/-1", "/tasks?after=9223372036854775808",
             "/events?after=9223372036854775808", "/events?after=-2", "/tasks?limit=99999999999999999999"]
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(stack)})
        answers = {path: await http.get(f"/v1/runs/{run['id']}{path}") for path in paths}
        within = await http.get(f"/v1/runs/{run['id']}/tasks/2147483647")
        await wait_terminal(http, run["id"])
    for path, resp in answers.items():
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "validation_error", (path, resp.text)
    assert within.status_code == 404


async def test_list_returns_summaries_and_cursors_are_what_the_schema_says(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(stack), "metadata": {"label": "summary"}})
        await wait_terminal(http, run["id"])
        listed = (await http.get("/v1/runs", params={"limit": 1})).json()
        one = (await http.get(f"/v1/runs/{run['id']}")).json()
        schema = (await http.get("/openapi.json")).json()
        cursor_param = next(p for p in schema["paths"]["/v1/runs"]["get"]["parameters"] if p["name"] == "cursor")
        # a cursor of the declared shape that this API never issued is still a position: the page after it
        unseen = await http.get("/v1/runs", params={"cursor": "1.0"})
        garbage = await http.get("/v1/runs", params={"cursor": "a"})
    summary = listed["runs"][0]
    assert summary["id"] == run["id"] and summary["model"] == "openai/dev"
    assert "metadata" not in summary and "limits" not in summary and one["metadata"] == {"label": "summary"}
    pattern = cursor_param["schema"]["pattern"]
    assert re.fullmatch(pattern, listed["next_cursor"]) and not re.fullmatch(pattern, "a")
    assert unseen.status_code == 200 and unseen.json()["runs"] == []
    assert garbage.status_code == 400 and garbage.json()["error"]["code"] == "invalid_cursor"


async def test_put_host_policy_replaces_the_whole_policy(stack: Stack) -> None:
    async with stack.http(stack.other_key) as http:
        await http.post("/v1/host-policy/rules", json={"pattern": "old.example", "action": "allow"})
        put = await http.put("/v1/host-policy", json={"default": "block", "rules": [
            {"pattern": "pypi.org", "action": "allow"}, {"pattern": "*.pythonhosted.org", "action": "allow"}]})
        bad = await http.put("/v1/host-policy", json={"default": "allow", "rules": [
            {"pattern": "fine.example", "action": "allow"}, {"pattern": "0", "action": "allow"}]})
        final = (await http.get("/v1/host-policy")).json()
        await http.put("/v1/host-policy", json={"default": "allow", "rules": []})
    assert put.status_code == 200 and put.json() == final
    assert final == {"default": "block", "rules": [{"pattern": "pypi.org", "action": "allow"},
                                                   {"pattern": "*.pythonhosted.org", "action": "allow"}]}
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_policy", "and it changed nothing"


async def test_bearer_scheme_is_case_insensitive(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        answers = [(await http.get("/v1/account", headers={"Authorization": f"{scheme} {stack.api_key}"})).status_code
                   for scheme in ("Bearer", "bearer", "BEARER", "Basic")]
    assert answers == [200, 200, 200, 401]


async def test_empty_patch_is_declared_and_refused(stack: Stack) -> None:
    async with stack.http() as http:
        schema = (await http.get("/openapi.json")).json()["components"]["schemas"]["RunPatch"]
        run = await launch(http, {"dataset": DATASET, "model": _model(stack)})
        empty = await http.patch(f"/v1/runs/{run['id']}", json={})
        await wait_terminal(http, run["id"])
    assert schema["minProperties"] == 1
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_patch"


RACES = 24


async def test_stop_racing_completion_answers_200_or_409_never_500(stack: Stack, tmp_path: Path) -> None:
    """A stop sent as a one-task run finishes: every answer is 200 (it halted the run) or 409 ``already_finished``,
    never a 500, whichever step of the finish it lands on."""
    one = tmp_path / "one.jsonl"
    one.write_text((SAMPLE / "arithmetic.jsonl").read_text().splitlines()[0] + "\n")
    answers: Counter[str] = Counter()

    async def race(http: httpx.AsyncClient, i: int) -> None:
        run = await launch(http, {"dataset": str(one), "model": _model(stack)})
        deadline, after = asyncio.get_running_loop().time() + 60, -1
        while True:  # until Materialize's PhaseCompleted: only finish_run (~15 ms measured here) is left
            page = (await http.get(f"/v1/runs/{run['id']}/events", params={"after": after})).json()
            after = page["next_after"]
            if any(e["type"] == "PhaseCompleted" and e["data"].get("phase") == "materialize" for e in page["events"]):
                break
            assert not page["terminal"] and asyncio.get_running_loop().time() < deadline
        # 0-20 ms later, so that over the runs the stop lands before, inside and after the finish (jitter to spread
        # the race, not synchronization: every outcome is checked)
        await asyncio.sleep((i % 6) * 0.004)
        resp = await http.post(f"/v1/runs/{run['id']}/stop")
        assert resp.status_code in (200, 409), resp.text
        answers["200" if resp.status_code == 200 else resp.json()["error"]["message"].split(" (")[0]] += 1
        if resp.status_code == 409:
            assert resp.json()["error"]["code"] == "already_finished", resp.text
        await wait_terminal(http, run["id"])

    async with stack.http() as http:
        for start in range(0, RACES, 6):
            await asyncio.gather(*(race(http, i) for i in range(start, min(start + 6, RACES))))
    print("stop answers while racing completion:", dict(answers))
    assert sum(answers.values()) == RACES


@workflow.defn(sandboxed=False)
class _EndsUnderAnUpdate:
    """Returns while its update's handler is still waiting: the server fails the accepted update with
    AcceptedUpdateCompletedWorkflow, the failure a control call racing RunWorkflow's end can get."""

    def __init__(self) -> None:
        self._accepted = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._accepted)

    @workflow.update(unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def stop(self) -> None:
        self._accepted = True
        await workflow.wait_condition(lambda: False)


async def test_update_outliving_its_workflow_is_a_409(stack: Stack) -> None:
    queue = f"outlived-{uuid.uuid4()}"
    async with Worker(stack.client, task_queue=queue, workflows=[_EndsUnderAnUpdate]):
        handle = await stack.client.start_workflow(_EndsUnderAnUpdate.run, id=queue, task_queue=queue)
        with pytest.raises(WorkflowUpdateFailedError) as failed:
            await handle.execute_update(_EndsUnderAnUpdate.stop)
    refusal = update_refusal(failed.value, update="stop", finished_code="already_finished")
    assert isinstance(failed.value.cause, ApplicationError) and failed.value.cause.type == UPDATE_OUTLIVED_RUN
    assert isinstance(refusal, Conflict) and refusal.code == "already_finished"
