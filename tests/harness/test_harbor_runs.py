"""harbor bridge runs end to end (real harbor in a harbor_orchestrator sandbox, each trial a harbor_task_env sandbox):
on the bundled task set ``oracle`` scores 100 % and ``nop`` 0 %, trial by trial equal to ``harbor run`` run directly;
``terminus-2`` (harbor's LiteLLM agent) against the scripted-LLM double reaches it only through the run's relay.
Skipped, with the reason printed, where no Python >= 3.12 exists to build harbor's venv."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from benchwright.stack.devstack import free_port
from benchwright.testkit.scripted_llm import ScriptedLlm, parse_script, start_scripted_llm
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import DevModels, Stack
from tests.harness.harbor_direct import harbor_runtime, harbor_skip_reason, run_harbor_directly

pytestmark = [pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.skipif(harbor_skip_reason() is not None, reason=harbor_skip_reason() or "")]
TASKS = ["hello-file", "json-config", "reverse-script", "sum-to-100"]


async def _batch_attempts(stack: Stack, run_id: str) -> tuple[int, list[str]]:
    """How many times the run's Materialize batch started (the history records the last attempt's start), and why
    each earlier attempt ended (its last failure, as Temporal recorded it)."""
    history = await stack.client.get_workflow_handle(run_id).fetch_history()
    batches = {e.event_id for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
               and e.activity_task_scheduled_event_attributes.activity_type.name == "materialize_batch"}
    started = [e.activity_task_started_event_attributes for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
               and e.activity_task_started_event_attributes.scheduled_event_id in batches]
    why = [repr(await stack.client.data_converter.decode_failure(s.last_failure)) for s in started if s.attempt > 1]
    return sum(s.attempt for s in started), why


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
    starts, why = await _batch_attempts(stack, run["id"])  # a batch started again re-opens what was not done
    assert roles.count("harbor_orchestrator") == starts, (roles, why)
    assert len(TASKS) * attempts <= roles.count("harbor_task_env") <= len(TASKS) * attempts * starts, (roles, why)
    if why:
        print(f"the batch ran {starts} times: {why}")
    killed = [e for e in events if e["type"] == "SandboxKilled"]
    assert len(killed) == len(created)
    assert log.status_code == 200 and b'"n_total_trials"' in log.content  # harbor's own job result.json
    assert await _live_sandboxes(stack, run["id"]) == []


REAL_KEY = "sk-real-provider-key-" + "7" * 24


def _terminus_turn(keystrokes: list[str], complete: bool, *, duration: float = 0.5) -> dict[str, Any]:
    """One reply of the agent's model: ``keystrokes`` typed into the task's shell, each given ``duration`` seconds
    (terminus-2 waits that long, whether or not the command has finished, before its next model call)."""
    return {"content": json.dumps({"analysis": "scripted", "plan": "scripted", "task_complete": complete,
                                   "commands": [{"keystrokes": k, "duration": duration} for k in keystrokes]})}


# The agent's one command: look for the real key in every process environment and file of its task sandbox (the
# key itself never typed: it is rebuilt from its reverse), and solve the task only when it is nowhere. The
# orchestrator is scanned from the host by the double (``_ProbingLlm``).
PROBE = (f'K=$(echo {REAL_KEY[::-1]} | rev); grep -rqs "$K" /proc/*/environ /sandbox /tmp /logs || '
         'echo "Hello, world!" > /app/hello.txt\n')


def _scan_orchestrators(key: str) -> tuple[int, int, bool]:
    """From the host, while harbor runs: every process whose environment has harbor's broker variable (the
    orchestrator's harbor process and its children), and every file under its working directory and /tmp (seen
    through /proc/<pid>/cwd and /root): (processes, files, key found)."""
    procs, files, found = 0, 0, False
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"BW_HARBOR_ENV_URL=" not in environ or b"OPENAI_BASE_URL=" not in environ:
            continue
        procs += 1
        found |= key.encode() in environ
        for top in (proc / "cwd", proc / "root" / "tmp"):
            for item in top.rglob("*") if top.is_dir() else []:
                with contextlib.suppress(OSError):
                    if item.is_file() and not item.is_symlink():
                        files += 1
                        found |= key.encode() in item.read_bytes()
    return procs, files, found


@dataclass
class _ProbingLlm(ScriptedLlm):
    """The scripted double, scanning the orchestrator sandbox from the host at each call it gets (the agent is
    mid-run then)."""

    scans: list[tuple[int, int, bool]] = field(default_factory=list)
    probing: bool = True

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if self.probing:
            self.scans.append(_scan_orchestrators(REAL_KEY))
        return super().answer(body, headers)


async def test_terminus_2_reaches_the_model_only_through_the_relay(stack: Stack, dev_models: DevModels,
                                                                   tmp_path: Path) -> None:
    await asyncio.to_thread(harbor_runtime, stack.data_dir)
    llm = _ProbingLlm()
    # The probe's grep must end before the next turn marks the task complete (then the verifier runs): 0.5 s was
    # too short once with the suite's other process busy beside it.
    script = {"turns": [_terminus_turn([PROBE], False, duration=3.0), _terminus_turn([], True)], "repeat_last": True}
    llm.add("dev", parse_script({"dev": [script, script]})["dev"])  # one conversation per run (bridge, direct)
    server = await start_scripted_llm(llm, port=free_port())
    dev_models.allowed.append(server.url.split("//", 1)[1].split("/", 1)[0])
    try:
        async with stack.http() as http:
            made = await http.post("/v1/secrets", json={"name": "HARBORKEY", "value": REAL_KEY})
            assert made.status_code in (201, 409)
            run, events = await _run(http, {
                "harness": "harbor", "harness_config": {"path": "bundled/demo/hello-file", "agent": "terminus-2"},
                "model": {"identifier": "openai/dev", "api_base": server.url, "secret": "HARBORKEY",
                          "input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}})
            log = await http.get(f"/v1/runs/{run['id']}/harness-log")
        through_relay, llm.probing = list(llm.requests), False
        direct = await run_harbor_directly(tmp_path, agent="terminus-2", path="bundled/demo/hello-file",
                                           model_base_url=server.url)
    finally:
        await server.close()

    assert run["status"] == "ok", run["error"]
    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    assert [(r["index"], r["trial"], r["meta"]["sample_id"]) for r in results] == [(0, 0, "hello-file")]
    # Solved, so the probe found the key nowhere in the task sandbox; and harbor's own verdict is the same.
    assert [r["score"] for r in results] == direct["hello-file"] == [1.0]
    # Every model call of the agent reached the double through the run's route (the credential proxy adds the
    # real key); the relay metered each one.
    assert len(through_relay) >= 3 and all(r.status == 200 for r in through_relay)
    assert {r.headers.get("authorization") for r in through_relay} == {f"Bearer {REAL_KEY}"}
    assert run["cost"]["model"] > 0
    roles = sorted(e["data"].get("role") for e in events if e["type"] == "SandboxCreated")
    # One orchestrator per start of the batch, and one task environment until the task is done. A batch Temporal
    # started again (a retryable failure, seen in the full suite on a loaded machine; printed with its cause) opens
    # its own, and the earlier ones are killed (below); a start that ended before it got as far (a heartbeat timeout
    # while it waited for a thread, seen once) opens none.
    attempts, why = await _batch_attempts(stack, run["id"])
    assert 1 <= roles.count("harbor_orchestrator") <= attempts and 1 <= roles.count("harbor_task_env") <= attempts, (
        roles, why)
    if why:
        print(f"the batch ran {attempts} times: {why}")
    assert len([e for e in events if e["type"] == "SandboxKilled"]) == len(roles)
    # The orchestrator (harbor and the agent's LiteLLM) was seen at every call, and held the key nowhere.
    assert llm.scans and all(procs >= 1 and files >= 1 for procs, files, _ in llm.scans), llm.scans
    assert not any(found for _, _, found in llm.scans)
    assert log.status_code == 200 and REAL_KEY.encode() not in log.content
    assert REAL_KEY not in json.dumps(events)
    assert await _live_sandboxes(stack, run["id"]) == []
