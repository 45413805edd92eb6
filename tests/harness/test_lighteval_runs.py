"""A lighteval bridge run end to end (real lighteval in the work sandbox, offline, a custom task over a local JSONL,
loopback dev model through the relay): pass rate and per-doc scores equal ``lighteval endpoint litellm`` run
directly on the same files against the same model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import DevModels, Stack
from tests.harness.qa import LIGHTEVAL_ROWS, answers, harness_config, lighteval_runtime, run_lighteval_directly

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_lighteval_bridge_run_matches_lighteval_run_directly(stack: Stack, dev_models: DevModels,
                                                                   tmp_path: Path) -> None:
    took = await asyncio.to_thread(lighteval_runtime, stack.data_dir)
    print(f"lighteval install (0 = cached): {took:.0f} s")
    model = await dev_models.start(DevModelConfig(answers=answers(), accuracy=0.7))
    async with stack.http() as http:
        run = await launch(http, {"harness": "lighteval", "harness_config": harness_config("lighteval"),
                                  "model": {"identifier": "openai/dev", "api_base": model}})
        await wait_terminal(http, run["id"])
        run = (await http.get(f"/v1/runs/{run['id']}")).json()
        events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
        log = await http.get(f"/v1/runs/{run['id']}/harness-log")
    accuracy, scores = await asyncio.to_thread(run_lighteval_directly, tmp_path / "direct", model)

    assert run["status"] == "ok", run["error"]
    summary = run["tasks"]["summary"]
    assert summary["total"] == LIGHTEVAL_ROWS == summary["passed"] + summary["failed"]
    assert 0.5 < accuracy < 0.9  # the dev model is wrong on some rows, so the comparison means something
    assert summary["pass_rate"] == pytest.approx(accuracy, abs=1e-12)
    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    assert {r["index"]: r["score"] for r in results} == scores, "per-doc scores equal lighteval's own"
    assert len(results) == LIGHTEVAL_ROWS
    three = next(r for r in results if r["index"] == 3)
    assert three["meta"]["harness"] == "lighteval" and "item 3" in three["meta"]["input"]
    assert log.status_code == 200 and b'"qa|0"' in log.content  # lighteval's own results JSON
    assert await _live_sandboxes(stack, run["id"]) == []
