"""A worker killed (SIGKILL, by its pid) in the middle of a phase other than Materialize (issue 23: the soak left 2
of 207 runs waiting so): the phase heartbeats, so another worker retries it once the heartbeat timeout passes,
not after the phase's 30-minute ``start_to_close_timeout``.

The phase is Fetch, held in the middle by a loopback dataset server (an operator-allowed internal host) that
answers its first download only after the worker holding it is dead. Two workers poll from the start (the one
Temporal handed Fetch to is found by its identity, ``pid@host``), so the retry does not wait for a worker to
start. The retry's cause is read from Temporal's history: the second attempt of ``fetch`` follows a heartbeat
timeout. Without phase heartbeats the run would wait out the 30-minute bound and ``wait_for`` fails at its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route
from temporalio.api.enums.v1 import EventType, TimeoutType

from benchwright.stack.devstack import free_port
from benchwright.stack.temporal_client import connect
from benchwright.store.events import read_events
from benchwright.testkit.devmodel import DevModelConfig
from tests.conftest import DevModels, serve_app
from tests.faults.kit import FaultStack, exactly_once, start_stack, wait_for, write_dataset

pytestmark = pytest.mark.asyncio(loop_scope="session")
TASKS = 5
HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "histories"


class HeldOrigin:
    """Serves the dataset, but holds every download that arrives before ``release`` until it is set."""

    def __init__(self, dataset: Path) -> None:
        self.dataset = dataset
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.downloads = 0

    async def serve(self, request: Request) -> Response:
        self.downloads += 1
        if not self.release.is_set():
            self.held.set()
            await self.release.wait()
        return FileResponse(self.dataset)


Held = tuple[FaultStack, str, HeldOrigin, list["subprocess.Popen[bytes] | None"]]


@pytest.fixture
async def held_stack(tmp_path: Path, dev_models: DevModels) -> AsyncIterator[Held]:
    """The fault stack with a second worker process (``stack.spare``), both started at once."""
    answers = write_dataset(tmp_path / "tasks.jsonl", TASKS)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=20))
    origin = HeldOrigin(tmp_path / "tasks.jsonl")
    port = free_port()
    server, serving = await serve_app(Starlette(routes=[Route("/{name}", origin.serve)]), port)
    stack = await start_stack(tmp_path, model_hosts=list(dev_models.allowed), dataset_hosts=(f"127.0.0.1:{port}",))
    first = stack.worker
    stack.start_worker()
    workers = [first, stack.worker]
    try:
        yield stack, url, origin, workers
    finally:
        origin.release.set()
        for worker in workers:  # each by its own pid; the fault stack stops none of them twice
            if worker is not None and worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(60)
        stack.worker = None
        await stack.close()
        server.should_exit = True
        await serving


async def test_a_worker_killed_mid_phase_is_replaced_after_the_heartbeat_timeout(
        held_stack: Held) -> None:
    stack, url, origin, workers = held_stack
    port = stack.settings.egress_internal_allowed[0].rsplit(":", 1)[1]
    run_id = await stack.launch({"dataset": f"http://127.0.0.1:{port}/tasks.jsonl", "concurrency": 2,
                                 "model": {"identifier": "openai/dev", "api_base": url}})
    await wait_for(origin.held.is_set, "Fetch downloading the dataset", 120)
    client = await connect(stack.settings)
    handle = client.get_workflow_handle(run_id)
    pending = (await handle.describe()).raw_description.pending_activities
    holder = next(int(a.last_worker_identity.split("@")[0]) for a in pending if a.activity_type.name == "fetch")
    victim = next(w for w in workers if w is not None and w.pid == holder)
    victim.send_signal(signal.SIGKILL)  # by its pid, in the middle of Fetch
    victim.wait(30)
    origin.release.set()  # the next download (the retry's, on the other worker) is answered at once
    # Far below the phase's 30-minute start_to_close_timeout: only a heartbeat timeout can have freed the phase.
    await wait_for(lambda: stack.finished([run_id]), "the run finished on the other worker", 150, every_s=0.25)

    row = stack.runs()[run_id]
    assert (row.status, row.halted, row.error) == ("ok", False, None)
    exactly_once(stack.results(run_id), TASKS)
    assert origin.downloads == 2, "one download held on the killed worker, one by the retry"
    events = read_events(stack.engine, run_id=run_id, after=-1, limit=1000)
    fetch_events = [e.type for e in events if e.data.get("phase") == "fetch"]
    assert fetch_events.count("PhaseStarted") == 1 and fetch_events.count("PhaseCompleted") == 1, fetch_events

    history = await handle.fetch_history()
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    fetch_ids = {i for i, a in scheduled.items() if a.activity_type.name == "fetch"}
    assert len(fetch_ids) == 1
    fetch = scheduled[next(iter(fetch_ids))]
    assert fetch.heartbeat_timeout.ToSeconds() == 10 and fetch.start_to_close_timeout.ToSeconds() == 30 * 60
    started = [e.activity_task_started_event_attributes for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
               and e.activity_task_started_event_attributes.scheduled_event_id in fetch_ids]
    assert len(started) == 1 and started[0].attempt == 2, started
    cause = started[0].last_failure.timeout_failure_info.timeout_type
    assert cause == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, started[0].last_failure
    # Every other phase scheduled as an activity carries the heartbeat timeout too (the patch, recorded once in the
    # history); the quick phases after a download run as local activities (quick-phases-local), which beat none.
    phases = {a.activity_type.name: a.heartbeat_timeout.ToSeconds() for a in scheduled.values()
              if a.activity_type.name in {"find", "fetch", "analyze", "setup", "attach", "atomize"}}
    assert "fetch" in phases and set(phases.values()) == {10}, phases
    if os.environ.get("BW_RECORD_HISTORIES") == "1":  # recorded once for tests/replay, committed
        (HISTORIES / "run_phase_heartbeat_retry.json").write_text(history.to_json())
