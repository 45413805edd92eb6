"""A pause in the middle of a phase other than Materialize (issue 23, ``patched("phase-heartbeat")``): the halt's
cancellation reaches the phase activity through its heartbeat while the phase is still blocked (before, the
workflow waited for the phase to end on its own), the workflow takes the phase as interrupted, and on resume the
same invocation runs again and the run ends ``ok`` with the phase's events once.

Fetch is held by a loopback dataset server (an operator-allowed internal host) that answers no download until the
test releases it; the cancellation is read from Temporal's history while the download is still held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route
from temporalio.api.enums.v1 import EventType

from benchwright.stack.devstack import free_port
from tests.api.helpers import launch, poll_all
from tests.conftest import SAMPLE, Stack, serve_app
from tests.faults.kit import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


class HeldOrigin:
    def __init__(self, dataset: Path) -> None:
        self.dataset = dataset
        self.url = ""
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.downloads = 0

    async def serve(self, request: Request) -> Response:
        self.downloads += 1
        self.held.set()
        await self.release.wait()
        return FileResponse(self.dataset)


@pytest_asyncio.fixture(loop_scope="session")
async def held(stack: Stack) -> AsyncIterator[HeldOrigin]:
    origin = HeldOrigin(SAMPLE / "arithmetic.jsonl")
    port = free_port()
    server, task = await serve_app(Starlette(routes=[Route("/{name}", origin.serve)]), port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    origin.url = f"http://127.0.0.1:{port}/arithmetic.jsonl"
    try:
        yield origin
    finally:
        origin.release.set()
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")
        server.should_exit = True
        await task


async def test_a_pause_mid_phase_cancels_the_phase_and_resume_runs_it_again(stack: Stack, held: HeldOrigin) -> None:
    async with stack.http() as http:
        model = {"identifier": "openai/dev", "api_base": stack.dev_url}
        run = await launch(http, {"dataset": held.url, "model": model})
        await wait_for(held.held.is_set, "Fetch downloading the dataset", 120)
        paused = await http.post(f"/v1/runs/{run['id']}/pause")
        assert paused.status_code == 200 and paused.json()["display_status"] == "paused", paused.text
        handle = stack.client.get_workflow_handle(run["id"])

        async def fetch_cancelled() -> bool:
            history = await handle.fetch_history()
            return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED for e in history.events)

        # The download is still held: only the heartbeat can have told Fetch to stop (the read would time out at
        # 30 s; without heartbeats the workflow waits for the phase to end on its own).
        await wait_for(fetch_cancelled, "Fetch's cancellation reaching the activity while held", 25, every_s=0.2)
        assert not held.release.is_set() and held.downloads == 1
        held.release.set()
        resumed = await http.post(f"/v1/runs/{run['id']}/resume")
        assert resumed.status_code == 200, resumed.text
        await wait_for(lambda: _finished(http, run["id"]), "the resumed run finished", 120, every_s=0.25)
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        events = await poll_all(http, run["id"], page=500)
    assert final["status"] == "ok", final
    assert held.downloads == 2, "the interrupted download and the resumed invocation's"
    fetch = [e["type"] for e in events if e["data"].get("phase") == "fetch"]
    assert fetch.count("PhaseStarted") == 1 and fetch.count("PhaseCompleted") == 1, fetch
    history = await handle.fetch_history()
    fetches = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
               and e.activity_task_scheduled_event_attributes.activity_type.name == "fetch"]
    assert len(fetches) == 2, "the cancelled attempt and the resumed one"


async def _finished(http: httpx.AsyncClient, run_id: str) -> bool:
    return (await http.get(f"/v1/runs/{run_id}")).json().get("finished_at") is not None
