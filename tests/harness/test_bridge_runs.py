"""Harness-bridge runs end to end (real inspect_ai and lm-evaluation-harness in the work sandbox, loopback dev model):
the run's pass rate and per-sample scores equal the harness's own when it runs directly against the same model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import DevModels, Stack
from tests.harness.qa import (
    ROWS,
    answers,
    harness_config,
    run_inspect_directly,
    run_lmeval_directly,
    runtimes,
    timed,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
ACCURACY = 0.7


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def bridge_model(stack: Stack, dev_models: DevModels) -> str:
    """Both harness runtimes installed for the stack, and a dev model that gets ~70 % of the QA rows right."""
    took = await asyncio.to_thread(runtimes, stack.data_dir)
    print(f"harness installs (0 = cached): {took}")
    return await dev_models.start(DevModelConfig(answers=answers(), accuracy=ACCURACY))


async def _all_events(http: Any, run_id: str) -> list[dict[str, Any]]:
    return (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 5000})).json()["events"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("harness", ["inspect", "lmeval"])
async def test_bridge_run_matches_the_harness_run_directly(stack: Stack, bridge_model: str, tmp_path: Path,
                                                          harness: str) -> None:
    async with stack.http() as http:
        run, bridge_s = await _timed_run(http, {"harness": harness, "harness_config": harness_config(harness),
                                                "model": {"identifier": "openai/dev", "api_base": bridge_model}})
        events = await _all_events(http, run["id"])
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks", params={"limit": 5000})).json()["tasks"]
        log = await http.get(f"/v1/runs/{run['id']}/harness-log")
        one = (await http.get(f"/v1/runs/{run['id']}/tasks/3")).json()
    direct = run_inspect_directly if harness == "inspect" else run_lmeval_directly
    (accuracy, scores), direct_s = await asyncio.to_thread(timed, direct, tmp_path / "direct", bridge_model)
    print(f"{harness}: bridge run {bridge_s:.1f} s (launch to terminal), directly {direct_s:.1f} s")

    assert run["status"] == "ok", run["error"]
    summary = run["tasks"]["summary"]
    assert summary["total"] == ROWS == summary["passed"] + summary["failed"]
    assert 0.5 < accuracy < 0.9  # the dev model is wrong on some rows, so the comparison means something
    assert summary["pass_rate"] == pytest.approx(accuracy, abs=1e-12)
    by_id = {t["index"]: t["score"] for t in tasks}
    direct_by_index = {(int(k[1:]) if harness == "inspect" else int(k)): v for k, v in scores.items()}
    assert by_id == direct_by_index, "per-sample scores match the harness's own"
    skipped = {e["data"]["phase"]: e["data"]["reason"] for e in events if e["type"] == "PhaseSkipped"}
    assert set(skipped) == {"find", "fetch", "analyze", "atomize"}
    assert all("harness-bridge" in r for r in skipped.values())
    started = [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"]
    assert started == ["setup", "attach", "materialize"]
    keys = [(e["data"]["index"], e["data"]["trial"]) for e in events if e["type"] == "MaterializeTaskResult"]
    assert len(keys) == len(set(keys)) == ROWS
    meta = one["trials"][0]["meta"]
    assert meta["harness"] == harness and meta["sample_id"] in ("q3", 3) and "item 3" in str(meta["input"])
    assert log.status_code == 200 and len(log.content) > 1000
    assert log.content[:2] == b"PK" if harness == "inspect" else log.content.startswith(b"{")
    assert await _live_sandboxes(stack, run["id"]) == []


async def _timed_run(http: Any, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    run = await launch(http, body)
    await wait_terminal(http, run["id"])
    took = loop.time() - started
    return (await http.get(f"/v1/runs/{run['id']}")).json(), took
