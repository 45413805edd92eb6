"""End to end through REST against the real stack (Temporal dev server, worker, API, SQLite, dev model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchwright.events import AFTER_TERMINAL
from benchwright.schemas import PHASES
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from tests.api.helpers import launch, poll_all, record_history, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


def model(url: str) -> dict[str, str]:
    return {"identifier": "openai/dev", "api_base": url}


async def test_launch_reaches_ok_with_gapless_log_in_phase_order(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": model(stack.dev_url)})
        assert run["status"] == "running" and run["driver"] == "builtin"
        events = await wait_terminal(http, run["id"])
        polled = await poll_all(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()

    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "RunLaunched"
    # The stream closes at the terminal event; the narration and report land after it (output events only).
    assert events == polled[:len(events)], "SSE and polling must return identical records"
    assert events[-1]["type"] == "PipelineFinished"
    assert {e["type"] for e in polled[len(events):]} <= AFTER_TERMINAL

    started = [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"]
    completed = [e["data"]["phase"] for e in events if e["type"] == "PhaseCompleted"]
    skipped = {e["data"]["phase"]: e["data"]["reason"] for e in events if e["type"] == "PhaseSkipped"}
    assert skipped == {"find": "dataset given at launch"}
    expected = [p for p in PHASES if p not in skipped]
    assert started == expected and completed == expected

    assert final["status"] == "ok" and final["display_status"] == "ok"
    summary = final["tasks"]["summary"]
    # 60 of 60: the Wilson 95 % interval is [n/(n+z²), 1] = [0.9398, 1], its standard error 0 (issue 17)
    low, high = summary.pop("pass_rate_ci")
    assert low == pytest.approx(60 / (60 + 1.959964**2), abs=1e-4)
    assert high == pytest.approx(1.0)
    assert summary == {"passed": 60, "failed": 0, "errored": 0, "no_answer": 0, "running": 0, "total": 60,
                       "pass_rate": 1.0, "pass_at_k": {}, "pass_rate_se": 0.0, "mean_score": None, "pass_at_k_ci": {}}
    results = [e for e in events if e["type"] == "MaterializeTaskResult"]
    assert sorted(r["data"]["index"] for r in results) == list(range(60))
    assert all(r["data"]["usage"]["prompt_tokens"] > 0 for r in results)
    artifacts = [e["type"] for e in events if e["type"].endswith("Artifact")]
    assert artifacts == ["FetchArtifact", "AnalyzeArtifact", "DatasetTasksArtifact", "SetupArtifact",
                         "ModelProxyArtifact", "AtomizeArtifact"]
    # PipelineStarted and Find's skip land with Fetch's PhaseStarted; Materialize's PhaseStarted with its batches
    # (issue 25): the log reads as before, with no activity of their own
    assert [e["type"] for e in events[1:4]] == ["PipelineStarted", "PhaseSkipped", "PhaseStarted"]
    # The sweep's close, the model route's end and the terminal event are written by one activity, in that order
    # (issue 25): the log reads as before.
    tail = [(e["type"], e["data"].get("phase") or e["data"].get("role")) for e in events[-4:]]
    assert tail == [("PhaseCompleted", "materialize"), ("SandboxKilled", "proxy"), ("ProxyLingerMetered", None),
                    ("PipelineFinished", None)]
    await record_history(stack, run["id"], "run_closed_by_finish.json")


async def test_wrong_answer_key_scores_zero(stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = load_answers(SAMPLE / "arithmetic.jsonl")
    wrong_url = await dev_models.start(DevModelConfig(answers=answers, accuracy=0.0))
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": model(wrong_url)})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks")).json()["tasks"]
    assert final["status"] == "ok"
    assert final["tasks"]["summary"]["pass_rate"] == 0.0
    assert final["tasks"]["summary"]["failed"] == 60
    assert len(tasks) == 60 and all(t["outcome"] == "fail" and t["score"] == 0.0 for t in tasks)
    by_question = {json.loads(line)["answer"] for line in (SAMPLE / "arithmetic.jsonl").read_text().splitlines()}
    assert all(t["output"] is not None for t in tasks) and by_question


async def test_temporal_ui_shows_run_phase_status_and_model(stack: Stack) -> None:
    from benchwright.stack.temporal_ui import RUN_ACCOUNT, RUN_MODEL, RUN_PHASE, RUN_STATUS

    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": model(stack.dev_url)})
        await wait_terminal(http, run["id"])
    handle = stack.client.get_workflow_handle(run["id"])
    await handle.result()
    desc = await handle.describe()
    attrs = desc.typed_search_attributes
    assert attrs.get(RUN_STATUS) == "ok" and attrs.get(RUN_PHASE) == "materialize"
    assert attrs.get(RUN_MODEL) == "openai/dev" and attrs.get(RUN_ACCOUNT) == "tester"
    assert await desc.static_summary() == f"openai/dev on {DATASET}"
    assert (await handle.query("state"))["invocations"] == {p: 1 for p in PHASES if p != "find"}
    found = [w.id async for w in stack.client.list_workflows(f"BenchwrightModel = 'openai/dev' AND "
                                                            f"WorkflowId = '{run['id']}'")]
    assert found == [run["id"]]
    history = await handle.fetch_history()
    # The quick phases run as one local activity (its marker carries the summary), Materialize as activities
    summaries = [e.user_metadata.summary for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")
                 or e.HasField("marker_recorded_event_attributes")]
    # Summaries are payloads, encrypted by the deployment key's codec like every other (docs/security.md)
    codec = stack.client.data_converter.payload_codec
    assert codec is not None
    summaries = await codec.decode([s for s in summaries if s.data])
    assert any(b"quick phases fetch..atomize (local)" in s.data for s in summaries)
    assert any(b"materialize v1: tasks 0..59" in s.data for s in summaries)


async def test_non_openai_model_strings_go_through_litellm(stack: Stack) -> None:
    """`hosted_vllm/…` is not on the direct OpenAI-compatible route: litellm.acompletion makes the calls, with the
    launch's prices feeding cost.model."""
    spec = {"identifier": "hosted_vllm/dev", "api_base": stack.dev_url, "input_cost_per_token": 1e-6,
            "output_cost_per_token": 2e-6}
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": spec})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok" and final["tasks"]["summary"]["pass_rate"] == 1.0
    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    expected = sum(r["usage"]["prompt_tokens"] * 1e-6 + r["usage"]["completion_tokens"] * 2e-6 for r in results)
    assert final["cost"]["model"] == pytest.approx(expected) and expected > 0
    proxy = next(e["data"] for e in events if e["type"] == "ModelProxyArtifact")
    assert "input_cost_per_token: 1.0e-06" in proxy["litellm_config_yaml"]
    assert "api_key" not in proxy["litellm_config_yaml"]
