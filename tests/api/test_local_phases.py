"""A plain run's quick phases run as local activities in its workflow task (issue 25, patch ``quick-phases-local``),
all of them in one (patch ``quick-phases-chained``).

Fetch of a file, Analyze, Setup, Attach and Atomize leave one local-activity marker in the run's history (the chain,
``quick_phases``) instead of an activity each scheduled through the task queue; before the chain, one marker each.
A chain that runs past the workflow's local budget gives way to the phases' own local attempts, and a phase that
runs past its own to the ordinary activity of the same invocation (its events dedupe); a permanent failure is the
phase's failure and is not run again, one a retry may mend goes to the phase's activity; a phase that asks for a
review stops the chain; a stop sent while a local phase runs still lands.

A downloaded dataset's Fetch and a requirements install's Setup are tried locally only from a cross-run cache hit
(patch ``cached-phases-local``): a re-run of a known benchmark takes all five phases in its workflow task, and a
first run's misses go on as their activities without a trace in the log.

The run's end, too, is a local activity of the workflow task that decided it (patch ``run-finished-locally``), and
an end past its budget goes on as the ordinary ``finish_run``, its events landing once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.api.history.v1 import HistoryEvent

from benchwright.schemas import PHASES
from benchwright.stack.devstack import free_port
from benchwright.testkit.pip_index import build_wheel, page
from tests.api.helpers import launch, record_history, wait_terminal
from tests.conftest import SAMPLE, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
QUICK = ["fetch", "analyze", "setup", "attach", "atomize"]
CHAIN = ["quick_phases"]


def _all_local_markers(events: list[HistoryEvent]) -> list[str]:
    """The activity types of the local activities the workflow recorded, in order."""
    found = []
    for e in events:
        if e.HasField("marker_recorded_event_attributes"):
            attrs = e.marker_recorded_event_attributes
            if attrs.marker_name == "core_local_activity":
                data = json.loads(attrs.details["data"].payloads[0].data)
                found.append(data["activity_type"])
    return found


def _local_markers(events: list[HistoryEvent]) -> list[str]:
    """The local activities of the run's phases, in order: without the run's end (``finish_run``, local since
    ``run-finished-locally``; its own tests are at the end of this file)."""
    return [name for name in _all_local_markers(events) if name != "finish_run"]


async def _history(stack: Stack, run_id: str) -> list[HistoryEvent]:
    """The run's history, once it replays deterministically on the workflow's code as it stands."""
    from temporalio.worker import Replayer

    from benchwright.stack.workflow_runner import workflow_runner
    from worker import PASSTHROUGH
    from workflows.run import RunWorkflow

    history = await stack.client.get_workflow_handle(run_id).fetch_history()
    replayed = await Replayer(
        workflows=[RunWorkflow], data_converter=stack.client.data_converter,
        workflow_runner=workflow_runner(stack.client.data_converter, PASSTHROUGH),
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, str(replayed.replay_failure)
    return list(history.events)


def _scheduled(events: list[HistoryEvent]) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_type.name for e in events
            if e.HasField("activity_task_scheduled_event_attributes")]


def _once(events: list[dict[str, Any]]) -> None:
    counts = Counter((e["type"], e["data"].get("phase"), e["data"].get("index"), e["data"].get("trial"),
                      e["data"].get("sandbox_id"), e["data"].get("text")) for e in events)
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    assert [e["seq"] for e in events] == list(range(len(events)))


async def _plain_run(stack: Stack, metadata: dict[str, Any] | None = None
                     ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], list[HistoryEvent]]:
    """A plain run of the sample, once its workflow closed: the launch's answer, its log, its view and its history."""
    body: dict[str, Any] = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}
    if metadata is not None:
        body["metadata"] = metadata
    async with stack.http() as http:
        run = await launch(http, body)
        events = await wait_terminal(http, run["id"])
        await stack.client.get_workflow_handle(run["id"]).result()
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    return run, events, final, await _history(stack, run["id"])


async def test_quick_phases_leave_markers_not_scheduled_activities(stack: Stack) -> None:
    run, events, final, history = await _plain_run(stack)
    assert _local_markers(history) == CHAIN
    assert not set(QUICK) & set(_scheduled(history)), _scheduled(history)
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60
    # The log reads as it did with activities: every phase started and completed once, in order
    _once(events)
    started = [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"]
    assert started == [p for p in PHASES if p != "find"]
    assert [e["data"]["phase"] for e in events if e["type"] == "PhaseCompleted"] == started
    assert (await stack.client.get_workflow_handle(run["id"]).query("state"))["invocations"] == {
        p: 1 for p in PHASES if p != "find"}
    await record_history(stack, run["id"], "run_quick_phases_chained.json")


async def _run_without(stack: Stack, monkeypatch: pytest.MonkeyPatch, patch: str
                       ) -> tuple[str, list[dict[str, Any]], list[HistoryEvent]]:
    """A plain run by a worker from before ``patch`` (the patch answered False in the stack's worker): its id, log
    and history, which replays on today's code (the replay, reaching the call with no marker recorded, keeps the old
    branch)."""
    from temporalio import workflow

    real = workflow.patched
    monkeypatch.setattr(workflow, "patched", lambda patch_id: False if patch_id == patch else real(patch_id))
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev",
                                                                "api_base": stack.dev_url}})
        events = await wait_terminal(http, run["id"])
        await stack.client.get_workflow_handle(run["id"]).result()
    monkeypatch.undo()
    return run["id"], events, await _history(stack, run["id"])


async def test_a_worker_without_the_chain_runs_a_local_activity_per_phase_and_its_run_replays(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker from before ``quick-phases-chained`` does: a local activity each."""
    run_id, events, history = await _run_without(stack, monkeypatch, "quick-phases-chained")
    assert _local_markers(history) == QUICK
    assert not set(QUICK) & set(_scheduled(history)), _scheduled(history)
    assert events[-1]["type"] == "PipelineFinished" and events[-1]["data"]["status"] == "ok"
    _once(events)
    await record_history(stack, run_id, "run_quick_phases_local.json")


async def test_a_worker_without_the_patch_schedules_every_phase_and_its_run_replays(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker from before ``quick-phases-local`` does with a run it started: every phase an activity, no
    marker."""
    run_id, events, history = await _run_without(stack, monkeypatch, "quick-phases-local")
    assert not _local_markers(history) and set(QUICK) <= set(_scheduled(history))
    assert events[-1]["type"] == "PipelineFinished" and events[-1]["data"]["status"] == "ok"
    await record_history(stack, run_id, "run_before_quick_phases_local.json")


async def test_a_local_phase_past_its_budget_goes_on_as_its_activity(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "metadata": {"fault_injection": {"phase": "atomize", "local_stall_s": 8}}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    history = await _history(stack, run["id"])
    # The chain's marker records its timeout; then each phase's own (atomize's its timeout too)
    assert _local_markers(history) == CHAIN + QUICK
    assert "atomize" in _scheduled(history), "the stalled local Atomize must go on as the ordinary activity"
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60
    _once(events)  # three tries wrote Atomize's events, two the other phases'; each is in the log once
    assert (await stack.client.get_workflow_handle(run["id"]).query("state"))["invocations"]["atomize"] == 1
    await record_history(stack, run["id"], "run_quick_phases_chain_past_local_budget.json")


async def test_a_permanent_failure_in_a_local_phase_is_not_run_again(stack: Stack) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: Attach's liveness probe is refused
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": dead}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    history = await _history(stack, run["id"])
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert final["status"] == "error" and [f["phase"] for f in failed] == ["attach"], failed
    assert failed[0]["error_type"] == "Unavailable", failed
    assert failed[0]["stack_trace"], "the failure keeps its trace through the chain"
    assert _local_markers(history) == CHAIN and "attach" not in _scheduled(history)
    assert not [e for e in events if e["type"] == "PhaseStarted" and e["data"]["phase"] == "atomize"]
    _once(events)


async def test_a_failure_a_retry_may_mend_in_the_chain_goes_to_the_phases_activity(stack: Stack) -> None:
    """Analyze fails its first attempt after committing its events (a transient fault): the chain stops there, Analyze
    goes on as its ordinary activity (which fails once more, then passes), and the phases after it run one by one."""
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "metadata": {"fault_injection": {"phase": "analyze"}}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    history = await _history(stack, run["id"])
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60, final
    assert _local_markers(history) == [*CHAIN, "setup", "attach", "atomize"]
    assert [p for p in _scheduled(history) if p in QUICK] == ["analyze"]
    _once(events)
    assert not [e for e in events if e["type"] == "PhaseFailed"]


async def test_a_review_asked_in_the_chain_stops_it(stack: Stack) -> None:
    """Analyze asks for a review: the chain ends with it, nothing after it starts until the resolution, and then
    Analyze's second invocation and the phases after it run one by one."""
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "metadata": {"test_hooks": {"review": {"phase": "analyze", "reason": "look"}}}})
        await _until_event(http, run["id"], "HumanReviewRequested", "analyze")
        events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
        assert [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"] == ["fetch", "analyze"]
        resolved = await http.patch(f"/v1/runs/{run['id']}", json={"review_resolution": "go on"})
        assert resolved.status_code < 300, resolved.text
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    history = await _history(stack, run["id"])
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60, final
    assert _local_markers(history) == [*CHAIN, "analyze", "setup", "attach", "atomize"]
    assert (await stack.client.get_workflow_handle(run["id"]).query("state"))["invocations"]["analyze"] == 2
    assert [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"] == [
        "fetch", "analyze", "analyze", "setup", "attach", "atomize", "materialize"]
    assert [e["seq"] for e in events] == list(range(len(events)))


async def test_a_stop_sent_while_a_local_phase_runs_lands(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "metadata": {"fault_injection": {"phase": "setup", "local_stall_s": 30}}})
        # Setup's events are in; it now stalls inside its local activity, holding the workflow task open
        await _until_event(http, run["id"], "PhaseCompleted", "setup")
        stopped = await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "enough"})
        assert stopped.status_code < 300, stopped.text
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["halted"] and final["halt_reason"].startswith("operator_kill"), final
    assert not [e for e in events if e["type"] == "PhaseStarted" and e["data"]["phase"] == "attach"]
    _once(events)
    assert "attach" not in _local_markers(await _history(stack, run["id"]))


async def _until_event(http: httpx.AsyncClient, run_id: str, event_type: str, phase: str) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while not [e for e in (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 5000})).json()["events"]
               if e["type"] == event_type and e["data"].get("phase") == phase]:
        assert asyncio.get_running_loop().time() < deadline, f"no {event_type} of {phase}"
        await asyncio.sleep(0.05)


PKG = "bwlocalphasedep"


@pytest_asyncio.fixture(loop_scope="session")
async def origin(stack: Stack) -> AsyncIterator[str]:
    """A loopback mirror listed in ``egress_internal_allowed``: datasets at /data/{tag}.jsonl (the sample's rows, made
    unique by the tag, so no other test's public run can feed these runs) and a PEP 503 index at /simple/ serving
    one wheel, which Setup installs through it."""
    wheel = build_wheel(PKG)
    rows = (SAMPLE / "arithmetic.jsonl").read_text().splitlines()

    async def serve(request: Request) -> Response:
        path = request.url.path
        if path.startswith("/data/"):
            tag = path.removeprefix("/data/").removesuffix(".jsonl")
            return Response("".join(json.dumps({**json.loads(r), "tag": tag}) + "\n" for r in rows),
                            media_type="application/jsonl")
        found = page(path, [wheel])
        return Response(found[0], media_type=found[1]) if found else Response(status_code=404)

    port = free_port()
    server, task = await serve_app(Starlette(routes=[Route("/{path:path}", serve)]), port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    stack.settings.pip_index_url = f"http://127.0.0.1:{port}/simple/"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stack.settings.pip_index_url = None
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")
        server.should_exit = True
        await task


async def _cached_run(stack: Stack, http: httpx.AsyncClient, dataset: str, model: str
                      ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = await launch(http, {"dataset": dataset, "requirements": [PKG],
                              "model": {"identifier": model, "api_base": stack.dev_url}})
    events = await wait_terminal(http, run["id"])
    final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60, final
    _once(events)
    await stack.client.get_workflow_handle(run["id"]).result()
    return final, events


def _hits(events: list[dict[str, Any]]) -> set[str]:
    return {e["data"]["phase"] for e in events if e["type"] == "PhaseCacheHit"}


async def test_a_re_run_takes_its_cached_phases_in_its_workflow_task(stack: Stack, origin: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = f"{origin}/data/{uuid.uuid4().hex[:8]}.jsonl"
    async with stack.http() as http:
        # The first run misses: its local Fetch and Setup give way before they open, and their activities do the work
        first, events = await _cached_run(stack, http, dataset, "openai/dev")
        history = await _history(stack, first["id"])
        assert not _hits(events)
        assert _local_markers(history) == QUICK  # Fetch's and Setup's record that they gave way
        assert [p for p in _scheduled(history) if p in QUICK] == ["fetch", "setup"]
        assert [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"][:5] == QUICK
        assert not [e for e in events if e["type"] == "PhaseFailed"]
        published = await http.post("/v1/registry/publish", json={
            "run_id": first["id"], "benchmark": f"local-{uuid.uuid4().hex[:6]}", "subset": "all",
            "visibility": "public"})
        assert published.status_code == 200, published.text

        # A re-run with another model: Fetch, Analyze and Setup hit the cache, and no quick phase is scheduled
        again, events = await _cached_run(stack, http, dataset, "openai/dev-b")
        history = await _history(stack, again["id"])
        assert _hits(events) == {"fetch", "analyze", "setup"}
        assert _local_markers(history) == QUICK
        assert not set(QUICK) & set(_scheduled(history)), _scheduled(history)
        assert again["fingerprint"] != first["fingerprint"]
        await record_history(stack, again["id"], "run_cached_phases_local.json")

        # A worker from before the patch schedules every phase of the same re-run; its history replays today
        from temporalio import workflow

        real = workflow.patched
        monkeypatch.setattr(workflow, "patched", lambda patch_id: False if patch_id == "cached-phases-local"
                            else real(patch_id))
        before, events = await _cached_run(stack, http, dataset, "openai/dev-c")
        monkeypatch.undo()
        history = await _history(stack, before["id"])
        assert _hits(events) == {"fetch", "analyze", "setup"}
        assert not _local_markers(history) and set(QUICK) <= set(_scheduled(history))
        await record_history(stack, before["id"], "run_before_cached_phases_local.json")


# -- the run's end (patch ``run-finished-locally``) ------------------------------------------------------------------

def _terminal_tail(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(e["type"], e["data"].get("phase") or e["data"].get("role")) for e in events[-4:]]


async def test_a_runs_end_is_a_local_activity_of_the_task_that_decided_it(stack: Stack) -> None:
    """The last batch's completion wakes the workflow, which ends the run in that workflow task: a local activity,
    no ``finish_run`` through the task queue; the log ends as it did."""
    run, events, final, history = await _plain_run(stack)
    assert _all_local_markers(history)[-1] == "finish_run"
    assert "finish_run" not in _scheduled(history), _scheduled(history)
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60, final
    assert _terminal_tail(events) == [("PhaseCompleted", "materialize"), ("SandboxKilled", "proxy"),
                                      ("ProxyLingerMetered", None), ("PipelineFinished", None)]
    _once(events)
    await record_history(stack, run["id"], "run_finished_locally.json")


async def test_a_runs_end_past_its_local_budget_goes_on_as_its_activity(stack: Stack) -> None:
    """The local end commits the terminal event, then stalls past the budget: the ordinary ``finish_run`` runs the
    end again, and the log holds it once (the route's revocation included)."""
    run, events, final, history = await _plain_run(
        stack, {"fault_injection": {"phase": "finish", "local_stall_s": 8}})
    assert _all_local_markers(history)[-1] == "finish_run"
    assert _scheduled(history).count("finish_run") == 1, _scheduled(history)
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 60, final
    assert _terminal_tail(events) == [("PhaseCompleted", "materialize"), ("SandboxKilled", "proxy"),
                                      ("ProxyLingerMetered", None), ("PipelineFinished", None)]
    _once(events)
    await record_history(stack, run["id"], "run_finished_locally_past_budget.json")


async def test_a_worker_without_the_local_end_schedules_finish_run_and_its_run_replays(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker from before ``run-finished-locally`` does: the run's end through the task queue."""
    run_id, events, history = await _run_without(stack, monkeypatch, "run-finished-locally")
    assert "finish_run" not in _all_local_markers(history) and _scheduled(history).count("finish_run") == 1
    assert events[-1]["type"] == "PipelineFinished" and events[-1]["data"]["status"] == "ok"
    _once(events)
    await record_history(stack, run_id, "run_before_finished_locally.json")
