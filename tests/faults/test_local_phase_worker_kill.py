"""A worker killed (SIGKILL, by its pid) while a quick phase runs as a local activity in the run's workflow task
(issue 25, ``quick-phases-local``): nothing of that workflow task reached Temporal, so once its 10 s timeout passes
the next worker replays the run, runs the quick phases again from the last recorded step, and the run finishes with
every event and every result once.

Analyze is held inside its local activity after its events are committed (``fault_injection.local_stall_s``, tests
only), so the kill lands while the workflow task is open; Temporal's history then shows the workflow task timed out.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from benchwright.stack.temporal_client import connect
from benchwright.store.events import read_events
from benchwright.testkit.devmodel import DevModelConfig
from tests.conftest import DevModels
from tests.faults.kit import FaultStack, exactly_once, start_stack, wait_for, write_dataset

pytestmark = pytest.mark.asyncio(loop_scope="session")
TASKS = 5


@pytest.fixture
async def stack_and_model(tmp_path: Path, dev_models: DevModels) -> AsyncIterator[tuple[FaultStack, str]]:
    answers = write_dataset(tmp_path / "tasks.jsonl", TASKS)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=20))
    stack = await start_stack(tmp_path, model_hosts=list(dev_models.allowed), allow_fault_injection="true")
    try:
        yield stack, url
    finally:
        await stack.close()


async def test_a_worker_killed_inside_a_local_phase_loses_and_doubles_nothing(
        stack_and_model: tuple[FaultStack, str], tmp_path: Path) -> None:
    stack, url = stack_and_model
    run_id = await stack.launch({
        "dataset": str(tmp_path / "tasks.jsonl"), "concurrency": 2,
        "model": {"identifier": "openai/dev", "api_base": url},
        "metadata": {"fault_injection": {"phase": "analyze", "local_stall_s": 30}}})

    def analyzed() -> bool:
        return any(e.type == "PhaseCompleted" and e.data.get("phase") == "analyze"
                   for e in read_events(stack.engine, run_id=run_id, after=-1, limit=100))

    await wait_for(analyzed, "Analyze's events, written inside its local activity", 60, every_s=0.02)
    worker = stack.worker
    assert worker is not None
    worker.send_signal(signal.SIGKILL)  # by its pid, while Analyze stalls inside the open workflow task
    worker.wait(30)
    stack.start_worker()
    await wait_for(lambda: stack.finished([run_id]), "the run finished on the next worker", 120, every_s=0.25)

    row = stack.runs()[run_id]
    assert (row.status, row.halted, row.error) == ("ok", False, None)
    exactly_once(stack.results(run_id), TASKS)
    events = read_events(stack.engine, run_id=run_id, after=-1, limit=1000)
    assert [e.seq for e in events] == list(range(len(events)))
    for phase in ("fetch", "analyze", "setup", "attach", "atomize"):
        mine = [e.type for e in events if e.data.get("phase") == phase]
        assert mine.count("PhaseStarted") == 1 and mine.count("PhaseCompleted") == 1, (phase, mine)

    history = (await (await connect(stack.settings)).get_workflow_handle(run_id).fetch_history()).events
    timed_out = [e for e in history if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT]
    assert timed_out, "the kill must have landed inside the workflow task that ran the local phases"
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    # On the next worker Analyze stalled in its local activity again and went on as its ordinary activity
    assert scheduled.count("analyze") == 1 and "fetch" not in scheduled, scheduled
