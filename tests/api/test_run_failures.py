"""Failures end to end: a dead dataset URL, bad launch bodies, auth, another account's run, a retried activity."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from benchwright.stack.devstack import free_port
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


@pytest_asyncio.fixture(loop_scope="session")
async def missing_url(stack: Stack) -> AsyncIterator[str]:
    """A real HTTP server on loopback whose dataset path answers 404 (an operator-listed internal endpoint)."""
    app = Starlette(routes=[Route("/data.jsonl", lambda _: PlainTextResponse("gone", status_code=404))])
    port = free_port()
    server, task = await serve_app(app, port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}/data.jsonl"
    stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")
    server.should_exit = True
    await task


async def test_dataset_404_ends_in_error_with_fetch_failed(stack: Stack, missing_url: str) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": missing_url, "model": {"identifier": "openai/dev",
                                                                      "api_base": stack.dev_url}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    types = [e["type"] for e in events]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert types[:3] == ["RunLaunched", "PipelineStarted", "PhaseSkipped"]
    failed = [e for e in events if e["type"] == "PhaseFailed"]
    assert len(failed) == 1 and failed[0]["data"]["phase"] == "fetch"
    assert failed[0]["data"]["error_type"] == "DatasetError" and "404" in failed[0]["data"]["detail"]
    assert "Traceback" in failed[0]["data"]["stack_trace"]
    assert "PhaseCompleted" not in types and types[-1] == "PipelineFinished"
    assert final["status"] == "error" and final["display_status"] == "error" and "404" in final["error"]


@pytest.mark.parametrize("body, fragment", [
    ({"datset": "x.jsonl", "model": "openai/dev"}, "unknown key 'datset'"),
    ({"dataset": "x.jsonl", "model": "openai/dev", "operator": "m"}, "'operator' is a retired launch key"),
    ({"dataset": "x.jsonl", "model": {"identifier": "openai/dev", "apibase": "http://x"}},
     "unknown key 'model.apibase'"),
    ({"dataset": "x.jsonl"}, "model: Field required"),
    ({"dataset": "x.jsonl", "model": "openai/dev", "visibility": "publik"}, "visibility"),
])
async def test_bad_launch_bodies_get_422_naming_the_problem(stack: Stack, body: dict, fragment: str) -> None:
    async with stack.http() as http:
        before = (await http.get("/v1/runs", params={"limit": 200})).json()["runs"]
        resp = await http.post("/v1/runs", json=body)
        after = (await http.get("/v1/runs", params={"limit": 200})).json()["runs"]
    assert resp.status_code == 422
    err = resp.json()["error"]
    assert err["code"] == "validation_error" and fragment in err["message"], err
    assert len(after) == len(before), "a refused launch records nothing"


@pytest.mark.parametrize("body, status, code", [
    ({"dataset": "x.jsonl", "model": "openai/dev", "driver": "bultin"}, 400, "unknown_driver"),
    ({"dataset": "ftp://host/x.jsonl", "model": "openai/dev"}, 400, "invalid_dataset"),
    ({"dataset": "x.jsonl", "model": "openai/dev", "trials": {"aggregator": {"name": "any_pas"}}}, 400,
     "invalid_input"),
])
async def test_unacceptable_values_get_400(stack: Stack, body: dict, status: int, code: str) -> None:
    async with stack.http() as http:
        resp = await http.post("/v1/runs", json=body)
    assert resp.status_code == status and resp.json()["error"]["code"] == code, resp.text


async def test_malformed_json_body_is_422(stack: Stack) -> None:
    async with stack.http() as http:
        resp = await http.post("/v1/runs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "validation_error"


async def test_auth_and_isolation_between_accounts(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
    async with stack.http(None) as anon:
        assert (await anon.get(f"/v1/runs/{run['id']}")).status_code == 401
        assert (await anon.get("/v1/runs")).status_code == 401
    async with stack.http("bw_not-a-real-key") as wrong:
        resp = await wrong.get(f"/v1/runs/{run['id']}")
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
    async with stack.http(stack.other_key) as other:
        for path in ("", "/events", "/tasks", "/tasks/0"):
            resp = await other.get(f"/v1/runs/{run['id']}{path}")
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", path
        stream = await other.get(f"/v1/runs/{run['id']}/events", headers={"Accept": "text/event-stream"})
        assert stream.status_code == 404
        assert all(r["id"] != run["id"] for r in (await other.get("/v1/runs")).json()["runs"])


async def test_retried_activity_does_not_duplicate_events(stack: Stack) -> None:
    """Analyze and one Materialize batch each fail once after committing their events; the retries re-append
    the same keys and the log still holds every event once."""
    async with stack.http() as http:
        for phase in ("analyze", "materialize"):
            run = await launch(http, {"dataset": DATASET,
                                      "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                      "metadata": {"fault_injection": {"phase": phase}}})
            events = await wait_terminal(http, run["id"])
            handle = stack.client.get_workflow_handle(run["id"])
            history = await handle.fetch_history()
            retried = [e for e in history.events if e.HasField("activity_task_started_event_attributes")
                       and e.activity_task_started_event_attributes.attempt > 1]
            assert retried, f"the injected {phase} fault must have caused a retry"
            assert [e["seq"] for e in events] == list(range(len(events)))
            # A phase may narrate more than once (the Driver's own lines, then the phase's summary): the text is part
            # of what makes two narrations different events; a retry re-appending one would repeat its text too.
            counts = Counter((e["type"], e["data"].get("phase"), e["data"].get("index"), e["data"].get("trial"),
                              e["data"].get("sandbox_id"), e["data"].get("text")) for e in events)
            assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
            final = (await http.get(f"/v1/runs/{run['id']}")).json()
            assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60


async def test_runs_list_is_newest_first_and_paginates(stack: Stack) -> None:
    async with stack.http() as http:
        ids = [(await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev",
                                                                   "api_base": stack.dev_url}}))["id"]
               for _ in range(3)]
        for run_id in ids:
            await wait_terminal(http, run_id)
        first = (await http.get("/v1/runs", params={"limit": 2})).json()
        second = (await http.get("/v1/runs", params={"limit": 2, "cursor": first["next_cursor"]})).json()
        bad = await http.get("/v1/runs", params={"cursor": "garbage!"})
    assert [r["id"] for r in first["runs"]] == ids[::-1][:2]
    assert second["runs"][0]["id"] == ids[0]
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"
