"""harbor bridge runs end to end (real harbor in a harbor_orchestrator sandbox, each trial a harbor_task_env sandbox):
on the bundled task set ``oracle`` scores 100 % and ``nop`` 0 %, trial by trial equal to ``harbor run`` run directly.
Skipped, with the reason printed, where no Python >= 3.12 exists to build harbor's venv."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import Stack
from tests.harness.harbor_direct import harbor_runtime, harbor_skip_reason, run_harbor_directly

pytestmark = [pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.skipif(harbor_skip_reason() is not None, reason=harbor_skip_reason() or "")]
TASKS = ["hello-file", "json-config", "reverse-script", "sum-to-100"]


async def _run(http: Any, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = await launch(http, body)
    await wait_terminal(http, run["id"])
    events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
    return (await http.get(f"/v1/runs/{run['id']}")).json(), events


@pytest.mark.parametrize(("agent", "expected", "attempts"), [("oracle", 1.0, 1), ("nop", 0.0, 2)])
async def test_harbor_run_scores_as_harbor_does_directly(stack: Stack, tmp_path: Path, agent: str, expected: float,
                                                         attempts: int) -> None:
    took = await asyncio.to_thread(harbor_runtime, stack.data_dir)
    print(f"harbor install (0 = cached): {took:.0f} s")
    model = stack.dev_url  # harbor's oracle and nop agents call no model; a launch still names one
    async with stack.http() as http:
        run, events = await _run(http, {"harness": "harbor", "model": {"identifier": "openai/dev", "api_base": model},
                                        "harness_config": {"path": "bundled/demo", "agent": agent,
                                                           "epochs": attempts}})
        log = await http.get(f"/v1/runs/{run['id']}/harness-log")
    direct = await run_harbor_directly(tmp_path, agent=agent, attempts=attempts)

    assert run["status"] == "ok", run["error"]
    summary = run["tasks"]["summary"]
    assert summary["total"] == len(TASKS) and summary["pass_rate"] == expected
    results = {(e["data"]["index"], e["data"]["trial"]): e["data"] for e in events
               if e["type"] == "MaterializeTaskResult"}
    assert sorted(results) == [(i, t) for i in range(len(TASKS)) for t in range(attempts)]  # attempts are trials
    assert [results[i, 0]["meta"]["sample_id"] for i in range(len(TASKS))] == TASKS
    ours = {task: [results[i, t]["score"] for t in range(attempts)] for i, task in enumerate(TASKS)}
    assert ours == direct == {t: [expected] * attempts for t in TASKS}, "each trial's reward is harbor's own"
    created = [e["data"] for e in events if e["type"] == "SandboxCreated"]
    roles = sorted(c.get("role") for c in created)
    assert roles.count("harbor_task_env") == len(TASKS) * attempts and roles.count("harbor_orchestrator") == 1, roles
    killed = [e for e in events if e["type"] == "SandboxKilled"]
    assert len(killed) == len(created)
    assert log.status_code == 200 and b'"n_total_trials"' in log.content  # harbor's own job result.json
    assert await _live_sandboxes(stack, run["id"]) == []
