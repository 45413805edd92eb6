"""A bridge run's harness under Benchwright's control: a stop halts the harness process, and the harness
never sees the real provider key (the isolation pattern of tests/api/test_isolation.py, applied to a bridge)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, record_history, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import DevModels, Stack
from tests.harness.qa import answers, harness_config, qa_jsonl
from tests.harness.test_bridge_runs import bridge_model  # noqa: F401  (the session fixture: runtimes installed)

pytestmark = pytest.mark.asyncio(loop_scope="session")
REAL_KEY = "sk-real-provider-key-" + "5" * 24


def _harness_pids() -> list[int]:
    """Host PIDs of bridge scripts running anywhere on this machine (their PID namespaces nest in the host's)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if b"bw_bridge.py" in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


async def test_stop_halts_the_harness(stack: Stack, dev_models: DevModels, bridge_model: str) -> None:  # noqa: F811
    """A stop ends the harness process mid-run (partial results kept, the rest never run). How fast is printed, not
    asserted: on a loaded machine that is timing, not behaviour (a quiet one prints 100-200 ms)."""
    slow = await dev_models.start(DevModelConfig(answers=answers(), latency_ms=150))
    config = harness_config("inspect", max_connections=2)
    async with stack.http() as http:
        run = await launch(http, {"harness": "inspect", "harness_config": config,
                                  "model": {"identifier": "openai/dev", "api_base": slow}})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while True:  # the harness is scoring: some samples are in the log
            summary = (await http.get(f"/v1/runs/{run['id']}")).json()["tasks"]["summary"]
            if summary["passed"] + summary["failed"] >= 5 and _harness_pids():
                break
            assert loop.time() < deadline, "the harness never got going"
            await asyncio.sleep(0.05)
        stopped_at = loop.time()
        assert (await http.post(f"/v1/runs/{run['id']}/stop", json={"reason": "enough"})).status_code == 200
        gone_by = loop.time() + 120  # a hang guard, not a timing assertion
        while _harness_pids():
            assert loop.time() < gone_by, "the harness outlived the stop"
            await asyncio.sleep(0.02)
        halted_s = loop.time() - stopped_at
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    print(f"stop -> harness gone in {halted_s * 1000:.0f} ms")
    assert final["halted"] and final["halt_reason"].startswith("operator_kill")
    settled = final["tasks"]["summary"]["passed"] + final["tasks"]["summary"]["failed"]
    assert 5 <= settled < 200, "partial results are kept, the rest never ran"
    assert await _live_sandboxes(stack, run["id"]) == []


LEAK_TASK = r'''
import glob, json, os, urllib.request
from inspect_ai import Task, task
from inspect_ai.dataset import FieldSpec, json_dataset
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, match, scorer
from inspect_ai.solver import TaskState, generate

REAL_KEY = "".join(reversed(%(reversed_key)r))  # not spelled out, so the launch body does not carry it


def _leaks():
    seen = json.dumps(dict(os.environ))
    for path in glob.glob("/proc/*/environ"):
        try:
            seen += open(path, "rb").read().decode(errors="replace")
        except OSError:
            pass
    found = REAL_KEY in seen
    # The relay takes only the key the bridge gave: a guessed one and the real one are refused.
    statuses = []
    for key in ("sk-guessed", REAL_KEY):
        body = json.dumps({"model": "dev", "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(os.environ["BW_BASE_URL"] + "/chat/completions", data=body,
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        try:
            statuses.append(urllib.request.urlopen(req, timeout=30).status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    return found or os.environ.get("BW_API_KEY") == REAL_KEY or statuses != [401, 401]


@scorer(metrics=[accuracy()])
def answered_without_leaks():
    inner = match()

    async def score(state: TaskState, target: Target) -> Score:
        answered = await inner(state, target)
        ok = answered.value == CORRECT and not _leaks()
        return Score(value=CORRECT if ok else INCORRECT, answer=state.output.completion)

    return score


@task
def qa():
    return Task(dataset=json_dataset("qa.jsonl", FieldSpec(input="question", target="answer", id="id")),
                solver=generate(), scorer=answered_without_leaks())
'''


async def test_the_harness_never_sees_the_real_key(stack: Stack, dev_models: DevModels,
                                                   bridge_model: str) -> None:  # noqa: F811
    keyed = await dev_models.start(DevModelConfig(answers=answers(), api_key=REAL_KEY))
    config = {"task_file": LEAK_TASK % {"reversed_key": REAL_KEY[::-1]}, "files": {"qa.jsonl": qa_jsonl()},
              "limit": 10}
    async with stack.http() as http:
        made = await http.post("/v1/secrets", json={"name": "BRIDGEKEY", "value": REAL_KEY})
        assert made.status_code in (201, 409)
        run = await launch(http, {"harness": "inspect", "harness_config": config,
                                  "model": {"identifier": "openai/dev", "api_base": keyed, "secret": "BRIDGEKEY",
                                            "input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok", final["error"]
    # Every answer came back (only a caller holding the real key gets one), and no probe found the key.
    assert final["tasks"]["summary"]["passed"] == 10 == final["tasks"]["summary"]["total"]
    assert final["cost"]["model"] > 0
    assert REAL_KEY not in str(events)
    await record_history(stack, run["id"], "run_harness_bridge.json")  # the harness-bridge patch on (tests/replay)
