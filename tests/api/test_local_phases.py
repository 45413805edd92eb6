"""Short phases run as local activities (issue 25, ``patched("quick-phases-local")``): in the worker holding the
workflow task, without a hop through Temporal's queues; one past its budget goes on as an ordinary activity.

Read from the run's Temporal history (which activities were scheduled, which local-activity markers were recorded)
and from its log (which must read exactly as before: every event once, phases in order)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import pytest
from temporalio.api.history.v1 import HistoryEvent

from benchwright.runs.pipeline import QUICK_PHASES
from tests.api.helpers import launch, poll_all, record_history, wait_terminal
from tests.conftest import SAMPLE, Stack
from workflows.run import LOCAL_PHASE_BUDGET

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


def _model(stack: Stack) -> dict[str, str]:
    return {"identifier": "openai/dev", "api_base": stack.dev_url}


async def _history(stack: Stack, run_id: str) -> list[HistoryEvent]:
    return list((await stack.client.get_workflow_handle(run_id).fetch_history()).events)


def _scheduled(history: list[HistoryEvent]) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_type.name for e in history
            if e.HasField("activity_task_scheduled_event_attributes")]


def _local(history: list[HistoryEvent]) -> list[tuple[str, bool]]:
    """(activity type, failed) of every local activity the workflow recorded, in order."""
    out = []
    for e in history:
        if e.HasField("marker_recorded_event_attributes") and e.marker_recorded_event_attributes.marker_name == \
                "core_local_activity":
            attrs = e.marker_recorded_event_attributes
            data = json.loads(attrs.details["data"].payloads[0].data)
            out.append((data.get("activity_type", data.get("activityType")), attrs.HasField("failure")))
    return out


def _once(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(len(events)))
    counts = Counter((e["type"], e["data"].get("phase"), e["data"].get("index"), e["data"].get("trial"),
                      e["data"].get("sandbox_id"), e["data"].get("text")) for e in events)
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]


async def test_short_phases_run_in_the_workflow_task_and_the_log_reads_as_before(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(stack)})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    history = await _history(stack, run["id"])
    assert _local(history) == [(p, False) for p in ("fetch", "analyze", "setup", "attach", "atomize")]
    assert not QUICK_PHASES & set(_scheduled(history)), "no short phase went through Temporal's activity queue"
    _once(events)
    started = [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"]
    assert started == ["fetch", "analyze", "setup", "attach", "atomize", "materialize"]
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60
    await record_history(stack, run["id"], "run_quick_phases_local.json")


async def test_a_local_phase_past_its_budget_goes_on_as_an_ordinary_activity(stack: Stack) -> None:
    """Atomize, held past its budget in its local attempt (after its events are written), is cancelled and runs as
    the ordinary ``atomize`` activity: the run ends ok and its log holds every event once."""
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(stack),
                                  "metadata": {"fault_injection": {"phase": "atomize", "local_stall_s": 30}}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    history = await _history(stack, run["id"])
    assert ("atomize", True) in _local(history), "the local attempt timed out"
    assert [a for a in _scheduled(history) if a in QUICK_PHASES] == ["atomize"]
    _once(events)
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60


async def test_a_stop_during_a_local_phase_lands_once_the_phase_yields(stack: Stack) -> None:
    """An update waits while a local phase holds the workflow task, for at most its budget: a stop sent while
    Atomize stalls is answered, and the run ends killed without reaching Materialize."""
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(stack),
                                  "metadata": {"fault_injection": {"phase": "atomize", "local_stall_s": 30}}})
        await _until_completed(http, run["id"], "atomize")
        stopped = await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "enough"},
                                  timeout=LOCAL_PHASE_BUDGET.total_seconds() + 30)
        assert stopped.status_code == 200, stopped.text
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["display_status"] == "killed" and final["halt_reason"] == "operator_kill: enough"
    assert "materialize" not in {e["data"].get("phase") for e in events if e["type"] == "PhaseStarted"}
    _once(events)


async def _until_completed(http: httpx.AsyncClient, run_id: str, phase: str) -> None:
    """Poll the run's log until ``phase`` has completed (readiness polling, bounded in time)."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        events = await poll_all(http, run_id, page=500)
        if any(e["type"] == "PhaseCompleted" and e["data"]["phase"] == phase for e in events):
            return
        assert asyncio.get_running_loop().time() < deadline, f"{phase} did not complete: {events[-3:]}"
        await asyncio.sleep(0.05)
