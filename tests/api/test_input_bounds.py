"""Every number a launch carries is finite and bounded at the API (issue 23 item 1): NaN, ±Infinity, 1e400 and
out-of-range values in any numeric field answer 422 naming the field and its range, and nothing is launched. A value
that slips past the API anyway (a workflow started directly with it) ends the run ``error`` with the reason instead
of failing the workflow task forever."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from benchwright.runs.limits import RunLimits
from benchwright.runs.pipeline import RunInput
from benchwright.schemas import LaunchRequest
from benchwright.scoring.aggregators import TrialsConfig
from benchwright.store.db import make_engine
from benchwright.store.events import read_events
from benchwright.store.runs import create_run, get_run
from tests.conftest import SAMPLE, Stack
from worker import PASSTHROUGH
from workflows.run import RunWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "histories"
HOSTILE = "__HOSTILE__"

ALWAYS_BAD = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 30)
"""Refused in every numeric field: not finite (1e400 parses as infinity), or an integer past any column."""

# (the field's path in the launch body, a JSON literal past its range besides ALWAYS_BAD)
LAUNCH_FIELDS: list[tuple[str, str]] = [
    ("limits.run.cost", "1e14"), ("limits.run.duration", "1e14"), ("limits.run.driver_tokens", "1e14"),
    ("limits.phase.duration", "1e14"), ("limits.phase.driver_steps", "1e14"),
    ("limits.phase:atomize.duration", "1e14"), ("limits.phase:materialize.driver_steps", "1e9"),
    ("limits.task.attempts", "1e14"), ("limits.task.duration", "1e14"), ("limits.task.cost", "1e14"),
    ("limits.attempt.duration", "1e14"),
    ("constraints.max_cost_cents", "1e14"), ("constraints.max_duration_ms", "1e14"), ("constraints.max_tasks", "1e14"),
    ("metadata.limit", "1e14"), ("metadata.nested.deep", "1e17"),
    ("model.input_cost_per_token", "2"), ("model.output_cost_per_token", "1e14"),
    ("model.params.temperature", "1e17"), ("model.params.max_tokens", "1e17"),
    ("trials.plan.k", "1e14"), ("trials.aggregator.threshold", "1e17"),
    ("concurrency", "1e14"),
    ("harness_config.limit", "1e17"), ("harness_config.generate.temperature", "1e17"),
]


def _body(path: str, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with HOSTILE placed at ``path`` (dots split keys; the rest of the body is a valid launch)."""
    body = json.loads(json.dumps(base))
    node = body
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise AssertionError(path)
    node[keys[-1]] = HOSTILE
    if path.startswith("model.") and isinstance(body.get("model"), str):
        raise AssertionError(path)
    if path.startswith("trials.aggregator"):
        body["trials"]["aggregator"].update(name="min_above", field="confidence")
    if path.startswith("harness_config"):
        body.pop("dataset")
        body.update(harness="inspect")
        body["harness_config"]["task"] = "some_task"
    return body


def _raw(body: dict[str, Any], literal: str) -> bytes:
    return json.dumps(body).replace(json.dumps(HOSTILE), literal).encode()


def _launch_base(stack: Stack) -> dict[str, Any]:
    return {"dataset": str(SAMPLE / "arithmetic.jsonl"), "metadata": {"limit": 3},
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}


async def test_hostile_numbers_in_every_launch_field_answer_422_naming_the_field(stack: Stack) -> None:
    async with stack.http() as http:
        listed = (await http.get("/v1/runs", params={"limit": 200})).json()["runs"]
        answers: list[tuple[str, str, int, str]] = []
        for path, past_range in LAUNCH_FIELDS:
            body = _body(path, _launch_base(stack))
            for literal in (*ALWAYS_BAD, past_range):
                resp = await http.post("/v1/runs", content=_raw(body, literal),
                                       headers={"Content-Type": "application/json"})
                message = resp.json()["error"]["message"] if resp.status_code >= 400 else ""
                answers.append((path, literal, resp.status_code, message))
        wrong = [a for a in answers if a[2] != 422 or a[0] not in a[3]]
        assert not wrong, "\n".join(map(str, wrong))
        # A field with a range names it; the limits the issue found say the range and the unit.
        by = {(p, lit): msg for p, lit, _, msg in answers}
        assert "at most 31,622,400 (seconds)" in by[("limits.phase.duration", "1e14")]
        nan_cost = by[("limits.run.cost", "NaN")]
        assert "got NaN" in nan_cost and "at most 1,000,000 (USD)" in nan_cost
        assert "got inf" in by[("limits.attempt.duration", "1e400")]
        after = (await http.get("/v1/runs", params={"limit": 200})).json()["runs"]
        assert len(after) == len(listed), "no hostile launch made a run"
        # In range, the same fields launch (the table is not refusing everything).
        priced = {**_launch_base(stack)["model"], "input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}
        ok = await http.post("/v1/runs", json={**_launch_base(stack), "model": priced, "limits": {
            "phase": {"duration": 3600}, "run": {"cost": 5.0}, "attempt": {"duration": 30}}, "concurrency": 4})
        assert ok.status_code == 201, ok.text
        await http.post(f"/v1/runs/{ok.json()['id']}/stop", json={})
        await http.get(f"/v1/runs/{ok.json()['id']}", params={"wait_s": 30})


async def test_hostile_numbers_in_fork_replay_and_sweep_bodies_answer_422(stack: Stack) -> None:
    async with stack.http() as http:
        run = await http.post("/v1/runs", json=_launch_base(stack))
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        cases = [
            (f"/v1/runs/{run_id}/fork", {"rewind_to": "materialize", "overrides": {"limits": {"phase": {
                "duration": HOSTILE}}}}, "overrides.limits.phase.duration"),
            (f"/v1/runs/{run_id}/fork", {"rewind_to": "materialize", "overrides": {"concurrency": HOSTILE}},
             "overrides.concurrency"),
            (f"/v1/runs/{run_id}/fork", {"rewind_to": "attach", "overrides": {"model": {
                "identifier": "openai/dev", "api_base": stack.dev_url, "input_cost_per_token": HOSTILE}}},
             "overrides.model.input_cost_per_token"),
            (f"/v1/runs/{run_id}/replay", {"model": {"identifier": "openai/dev", "api_base": stack.dev_url,
                                                     "params": {"temperature": HOSTILE}}}, "model.params.temperature"),
            (f"/v1/runs/{run_id}/sweep", {"models": [{"identifier": "openai/dev", "api_base": stack.dev_url,
                                                       "output_cost_per_token": HOSTILE}]},
             "models[0].output_cost_per_token"),
        ]
        wrong = []
        for url, body, field in cases:
            for literal in ALWAYS_BAD:
                resp = await http.post(url, content=_raw(body, literal), headers={"Content-Type": "application/json"})
                if resp.status_code != 422 or field not in resp.json()["error"]["message"]:
                    wrong.append((url, field, literal, resp.status_code, resp.text[:300]))
        assert not wrong, "\n".join(map(str, wrong))
        await http.get(f"/v1/runs/{run_id}", params={"wait_s": 60})


async def test_a_number_past_timedelta_that_slips_past_validation_ends_the_run_error(stack: Stack) -> None:
    """Started directly (no API between): phase.duration 1e14 s, past ``timedelta``'s range.
    Before the fix the workflow task failed forever on OverflowError, the run sat ``running`` and stop answered
    503; now the run ends ``error`` naming the limit, and its history replays deterministically."""
    engine = make_engine(stack.settings.resolved_database_url())
    async with stack.http() as http:
        account_id = (await http.get("/v1/account")).json()["id"]
    launch = LaunchRequest.model_validate(_launch_base(stack))
    limits = RunLimits(phase_duration_s=1e14)
    run_id = str(uuid.uuid4())
    create_run(engine, account_id=account_id, launch=launch, driver="builtin",
               trials_config=TrialsConfig().model_dump(mode="json"), limits=limits.model_dump(mode="json"),
               run_id=run_id)
    inp = RunInput(run_id=run_id, account_id=account_id, launch=launch, driver="builtin", trials=TrialsConfig(),
                   limits=limits)
    handle = await stack.client.start_workflow(RunWorkflow.run, inp, id=run_id, task_queue=stack.settings.task_queue)
    result = await asyncio.wait_for(handle.result(), timeout=120)
    assert result.status == "error" and "limits.phase.duration" in (result.error or ""), result
    row = get_run(engine, run_id=run_id)
    assert row.status == "error" and row.finished_at is not None and "limits.phase.duration" in (row.error or "")
    assert "31,622,400" in (row.error or ""), "the reason names the range"
    events = read_events(engine, run_id=run_id, after=-1, limit=100)
    failed = [e for e in events if e.type == "PhaseFailed"]
    assert failed and failed[0].data["error_type"] == "UnusableInput", [e.type for e in events]
    assert events[-1].type == "PipelineFinished"
    # stop answers the finished run's 409 now, not 503 from a workflow stuck on its task
    async with stack.http() as http:
        stop = await http.post(f"/v1/runs/{run_id}/stop", json={})
    assert stop.status_code == 409, stop.text
    history = await handle.fetch_history()
    # the stack's converter: its payloads are encrypted by the deployment key's codec (docs/security.md)
    replayer = Replayer(workflows=[RunWorkflow], data_converter=stack.client.data_converter,
                        workflow_runner=SandboxedWorkflowRunner(
                            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)))
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
    if os.environ.get("BW_RECORD_HISTORIES") == "1":  # recorded once for tests/replay, committed
        (HISTORIES / "run_unusable_limits.json").write_text(history.to_json())
    engine.dispose()


async def test_a_405_names_the_allowed_methods_in_allow(stack: Stack) -> None:
    async with stack.http() as http:
        launches = await http.delete("/v1/runs")
        account = await http.post("/v1/account", json={})
    assert launches.status_code == 405 and launches.json()["error"]["code"] == "method_not_allowed"
    assert {m.strip() for m in launches.headers["allow"].split(",")} == {"GET", "POST"}, launches.headers
    assert account.status_code == 405 and "GET" in account.headers["allow"], account.headers


async def test_an_empty_cursor_is_refused_not_taken_as_absent(stack: Stack) -> None:
    async with stack.http() as http:
        listed = await http.get("/v1/runs", params={"cursor": ""})
        dashboard = await http.get("/v1/ui/runs", params={"cursor": ""})
        absent = await http.get("/v1/runs")
    assert listed.status_code == 400 and listed.json()["error"]["code"] == "invalid_cursor", listed.text
    assert dashboard.status_code == 400, dashboard.text
    assert absent.status_code == 200
