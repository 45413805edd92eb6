"""Product-sandbox runs end to end: the bundled recipe against the scripted agent double (loopback, OpenAI protocol)
reaches exactly the pass rate the script decides, one task sandbox per task, the base probed, every step logged."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchwright.testkit import product_double
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_bundled_recipe_reaches_the_scripted_pass_rate(stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(product_double.config())
    recipe = product_double.recipe()
    expected = product_double.outcomes()
    async with stack.http() as http:
        run = await launch(http, {"recipe": product_double.RECIPE, "model": {"identifier": "openai/dev",
                                                                            "api_base": url}})
        await wait_terminal(http, run["id"])
        run = (await http.get(f"/v1/runs/{run['id']}")).json()
        events: list[dict[str, Any]] = (await http.get(f"/v1/runs/{run['id']}/events",
                                                       params={"limit": 5000})).json()["events"]
    assert run["status"] == "ok", run["error"]
    summary = run["tasks"]["summary"]
    assert summary["total"] == len(recipe.tasks) == 22
    assert (summary["passed"], summary["failed"]) == (product_double.EXPECTED["pass"],
                                                      product_double.EXPECTED["fail"])
    results = {e["data"]["index"]: e["data"] for e in events if e["type"] == "MaterializeTaskResult"}
    assert {recipe.tasks[i].id: r["outcome"] for i, r in results.items()} == expected
    runaway = next(r for i, r in results.items() if recipe.tasks[i].id in product_double.RUNAWAY)
    assert "turns" in runaway["error"] and runaway["meta"]["turns"] == recipe.limits.turns

    skipped = {e["data"]["phase"] for e in events if e["type"] == "PhaseSkipped"}
    assert skipped == {"find", "fetch", "analyze", "atomize"}
    assert [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"] == ["setup", "attach", "materialize"]
    created = [e["data"] for e in events if e["type"] == "SandboxCreated"]
    roles = Counter(d["role"] for d in created)
    assert roles["task"] == 22 and roles["template_probe"] == 1
    task_boxes = {d["sandbox_id"]: d["metadata"]["task_index"] for d in created if d["role"] == "task"}
    assert sorted(task_boxes.values()) == list(range(22))
    killed = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxKilled"}
    assert {d["sandbox_id"] for d in created} <= killed
    probe = next(e["data"] for e in events if e["type"] == "TemplateProbeArtifact")
    assert "sh" in probe["shells"] and probe["base_files"] == len(recipe.base.files)
    artifact = next(e["data"] for e in events if e["type"] == "ProductRecipeArtifact")
    from benchwright.product.recipe import impl_id

    assert artifact["impl_id"] == impl_id(recipe)
    assert (run["subset_id"], run["impl_id"]) == ("terminal-basics", impl_id(recipe))  # §7: keyed on the subset
    calls = [e["data"] for e in events if e["type"] == "ToolCallEvent"]
    answers = [e["data"] for e in events if e["type"] == "ToolResultEvent"]
    assert {c["index"] for c in calls} == {i for i, t in enumerate(recipe.tasks)
                                           if t.id in {**product_double.SOLVED, **product_double.WRONG,
                                                       **product_double.RUNAWAY}}
    marker = recipe.tasks.index(next(t for t in recipe.tasks if t.id == "setup-marker"))
    read = next(a for a in answers if a["index"] == marker and a["name"] == "read_file")
    assert read["ok"] and read["content"].strip() == "setup ok"  # the task started from the post-Setup snapshot
    async with stack.http() as http:  # the dashboard's modal shows the agent's steps on the task
        detail = (await http.get(f"/v1/runs/{run['id']}/tasks/{marker}")).json()
    assert [(s["type"], s["data"].get("name")) for s in detail["agent"]] == [
        ("ToolCallEvent", "read_file"), ("ToolResultEvent", "read_file"), ("ToolCallEvent", "shell"),
        ("ToolResultEvent", "shell"), ("ToolCallEvent", "finish"), ("ToolResultEvent", "finish")]
    assert summary["pass_rate"] == pytest.approx(product_double.PASS_RATE, abs=1e-12)  # 16 / 21: err is left out
    assert await _live_sandboxes(stack, run["id"]) == []

    # A fork at Materialize re-runs every task from the parent's post-Setup snapshot, without Setup or the probe.
    async with stack.http() as http:
        resp = await http.post(f"/v1/runs/{run['id']}/fork", json={"rewind_to": "materialize"})
        assert resp.status_code == 201, resp.text
        fork = resp.json()
        await wait_terminal(http, fork["id"])
        fork = (await http.get(f"/v1/runs/{fork['id']}")).json()
        fork_events = (await http.get(f"/v1/runs/{fork['id']}/events", params={"limit": 5000})).json()["events"]
    own = [e for e in fork_events if "inherited_from" not in e["data"]]
    assert fork["status"] == "ok", fork["error"]
    assert [e["data"]["phase"] for e in own if e["type"] == "PhaseStarted"] == ["fork", "materialize"]
    assert (fork["subset_id"], fork["impl_id"]) == (run["subset_id"], run["impl_id"])  # the same impl, re-run
    assert Counter(e["data"]["role"] for e in own if e["type"] == "SandboxCreated") == {"task": 22}
    assert not [e for e in own if e["type"] == "SnapshotCreated"]
    fork_results = {e["data"]["index"]: e["data"]["outcome"] for e in own if e["type"] == "MaterializeTaskResult"}
    assert {recipe.tasks[i].id: o for i, o in fork_results.items()} == expected
    assert await _live_sandboxes(stack, fork["id"]) == []
    if os.environ.get("BW_RECORD_HISTORIES") == "1":  # recorded once for tests/replay, committed
        history = await stack.client.get_workflow_handle(run["id"]).fetch_history()
        (Path(__file__).resolve().parents[1] / "replay" / "histories" / "product_run.json").write_text(
            json.dumps(await _decrypted(stack, json.loads(history.to_json())), indent=1))


async def _decrypted(stack: Stack, node: Any) -> Any:
    """The history JSON with every payload decoded by the stack's codec (tests/replay replays without the key)."""
    from google.protobuf.json_format import MessageToDict, ParseDict
    from temporalio.api.common.v1 import Payload

    if isinstance(node, list):
        return [await _decrypted(stack, v) for v in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("metadata"), dict) and "encryption-key-id" in node["metadata"]:
        codec = stack.client.data_converter.payload_codec
        assert codec is not None
        [plain] = await codec.decode([ParseDict(node, Payload())])
        return MessageToDict(plain)
    return {k: await _decrypted(stack, v) for k, v in node.items()}


async def test_recipe_launches_are_checked_before_a_run_exists(stack: Stack) -> None:
    model = {"identifier": "openai/dev", "api_base": stack.dev_url}
    async with stack.http() as http:
        before = (await http.get("/v1/runs", params={"limit": 200})).json()
        for body, code in [({"recipe": "no-such-recipe"}, "unknown_recipe"),
                           ({"recipe": "terminal-basics", "dataset": "/tmp/x.jsonl"}, "invalid_recipe"),
                           ({"recipe": "terminal-basics", "harness": "inspect",
                             "harness_config": {"task": "x"}}, "invalid_recipe"),
                           ({"recipe": str(stack.data_dir / "recipe.yaml")}, "dataset_blocked")]:
            resp = await http.post("/v1/runs", json={**body, "model": model})
            assert resp.status_code == 400 and resp.json()["error"]["code"] == code, (body, resp.text)
        after = (await http.get("/v1/runs", params={"limit": 200})).json()
    assert len(after["runs"]) == len(before["runs"])


async def test_stop_mid_materialize_kills_every_task_sandbox(stack: Stack, dev_models: DevModels) -> None:
    slow = await dev_models.start(product_double.config(latency_ms=300))
    async with stack.http() as http:
        run = await launch(http, {"recipe": product_double.RECIPE,
                                  "model": {"identifier": "openai/dev", "api_base": slow}})
        deadline = asyncio.get_running_loop().time() + 120
        while True:  # the agents are at work in their task sandboxes
            events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
            if any(e["type"] == "ToolCallEvent" for e in events):
                break
            assert asyncio.get_running_loop().time() < deadline, "no agent ever called a tool"
            await asyncio.sleep(0.05)
        assert (await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "enough"})).status_code == 200
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["halted"] and final["halt_reason"].startswith("operator_kill")
    assert final["tasks"]["summary"]["passed"] + final["tasks"]["summary"]["failed"] < 22, "stopped mid-sweep"
    created = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxCreated"}
    killed = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxKilled"}
    assert created and created == killed
    assert await _live_sandboxes(stack, run["id"]) == []
