"""The CLI over the whole launch body, and `runs`, `events --follow`, `tasks`, `admin halt` (issue 14): the real
`benchwright` command in a subprocess against the session stack's API."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchwright.cli.support import model_name
from benchwright.client import Client
from benchwright.events import AFTER_TERMINAL
from benchwright.stack.devstack import free_port
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.test_scale import _dataset
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
VOTING_IMPL = '''
class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut(self.extract(row))

    def score(self, row, response):
        return {"score": 1.0 if response.strip() == row["answer"] else 0.0, "answer": response.strip()}
'''


@dataclass
class Done:
    rc: int
    out: str
    err: str


async def bw(*args: str, env: dict[str, str], timeout_s: float = 180) -> Done:
    """Run `benchwright ARGS` as a user would (a separate process; the stack keeps serving on this loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchwright.cli", *args, env={**os.environ, "COLUMNS": "200", **env},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


def api_env(stack: Stack, key: str | None = None) -> dict[str, str]:
    return {"BENCHWRIGHT_API_URL": stack.api_url, "BENCHWRIGHT_API_KEY": key or stack.api_key}


async def _get(stack: Stack, path: str, **params: Any) -> Any:
    async with stack.http() as http:
        resp = await http.get(path, params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()


async def test_run_sends_every_launch_flag_and_watch_json_prints_the_final_run(stack: Stack, tmp_path: Path) -> None:
    impl = tmp_path / "task_impl.py"
    impl.write_text(VOTING_IMPL)
    done = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", stack.dev_url,
                    "--input-cost-per-token", "1e-7", "--output-cost-per-token", "2e-7",  # a cost limit needs a price
                    "--driver", "builtin", "--concurrency", "3", "--limit", "run.cost=5", "--limit",
                    "attempt.duration=60", "--limit", "task.attempts=2", "--constraints", "max_tasks=20",
                    "--compute", "local", "--visibility", "unlisted", "--task-impl", str(impl),
                    "--metadata", "team=evals", "--metadata", "shots:=5", "--metadata", "sha=0123",
                    "--trials", "3", "--aggregator", "majority_on", "--aggregator-param", "field=answer",
                    "--json", "--watch", env=api_env(stack))
    assert done.rc == 0, done.err
    final = json.loads(done.out)
    assert final["terminal"] and final["status"] == "ok" and final["display_status"] == "ok"
    assert final["visibility"] == "unlisted" and final["driver"] == "builtin"
    assert final["metadata"] == {"team": "evals", "shots": 5, "sha": "0123"}
    assert final["trials_config"]["plan"] == {"k": 3}
    assert final["trials_config"]["aggregator"]["name"] == "majority_on"
    assert final["trials_config"]["aggregator"]["field"] == "answer"
    assert final["limits"]["run_cost_usd"] == 5 and final["limits"]["max_tasks"] == 20
    assert final["limits"]["task"]["attempts"] == 2 and final["limits"]["task"]["attempt_duration_s"] == 60
    assert final["tasks"]["summary"]["total"] == 20 and final["tasks"]["summary"]["passed"] == 20, "max_tasks=20"
    # The progress bar (stderr): settled/total, tasks/s and ETA.
    assert "20/20" in done.err and "tasks/s" in done.err and "ETA" in done.err, done.err

    launched = (await _get(stack, f"/v1/runs/{final['id']}/events", after=-1, limit=1))["events"][0]
    assert launched["type"] == "RunLaunched"
    body = launched["data"]["launch"]
    assert body["concurrency"] == 3 and body["compute"] == "local" and body["driver"] == "builtin"
    assert body["model"]["input_cost_per_token"] == 1e-7 and body["model"]["output_cost_per_token"] == 2e-7
    assert body["limits"] == {"run": {"cost": 5}, "attempt": {"duration": 60}, "task": {"attempts": 2}}
    assert body["constraints"] == {"max_tasks": 20}
    assert body["task_impl"] == VOTING_IMPL
    assert body["trials"] == {"plan": {"k": 3}, "aggregator": {"name": "majority_on", "field": "answer"}}
    task = await _get(stack, f"/v1/runs/{final['id']}/tasks/0")
    assert len(task["trials"]) == 3 and {t["meta"]["answer"] for t in task["trials"]} == {task["output"].strip()}


async def test_requirements_are_sent_and_events_follow_ends_at_the_terminal_event(stack: Stack) -> None:
    done = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", stack.dev_url,
                    "--requirement", "six==1.16.0", "--requirement", "sympy>=1.12", env=api_env(stack))
    assert done.rc == 0, done.err
    run_id = done.out.strip()
    followed = await bw("events", run_id, "--follow", "--json", env=api_env(stack))
    assert followed.rc == 0, followed.err
    events = [json.loads(line) for line in followed.out.splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events))), "gapless, from seq 0, no repeats"
    assert events[0]["data"]["launch"]["requirements"] == ["six==1.16.0", "sympy>=1.12"]
    assert events[-1]["type"] == "PipelineFinished"
    # Without --follow: the same log, one readable line per event.
    plain = await bw("events", run_id, "--after", "0", env=api_env(stack))
    lines = plain.out.splitlines()
    # --follow ends at the terminal event; the narration and report may already follow it in the log
    assert plain.rc == 0 and len(lines) >= len(events) - 1
    assert lines[0].split()[0] == "1" and lines[len(events) - 2].split()[2] == "PipelineFinished"
    assert {line.split()[2] for line in lines[len(events) - 1:]} <= AFTER_TERMINAL


async def test_tasks_and_runs_list_what_the_api_holds(stack: Stack, tmp_path: Path) -> None:
    # This one reads its API URL and key from a data directory's dev.json, as after `benchwright up`.
    data_dir = tmp_path / "bw"
    data_dir.mkdir()
    (data_dir / "dev.json").write_text(json.dumps({"api_url": stack.api_url, "api_key": stack.api_key}))
    env = {"BENCHWRIGHT_DATA_DIR": str(data_dir), "BENCHWRIGHT_API_URL": "", "BENCHWRIGHT_API_KEY": ""}
    launched = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", stack.dev_url,
                        "--metadata", "label=cli-list", "--watch", env=env)
    assert launched.rc == 0, launched.err
    run_id = launched.out.split()[1].rstrip(":")

    rows = await bw("tasks", run_id, "--json", env=env)
    table = await bw("tasks", run_id, env=env)
    assert rows.rc == 0 and table.rc == 0, rows.err + table.err
    parsed = json.loads(rows.out)
    api_rows = (await _get(stack, f"/v1/runs/{run_id}/tasks"))["tasks"]
    assert parsed == api_rows and [r["index"] for r in parsed] == list(range(60))
    body = [line.split() for line in table.out.splitlines()[1:]]
    assert [(int(b[0]), b[1]) for b in body] == [(r["index"], r["outcome"]) for r in api_rows]
    assert "60 tasks settled" in table.err

    listed = json.loads((await bw("runs", "--json", "--limit", "500", env=env)).out)
    mine = next(r for r in listed if r["id"] == run_id)
    assert mine["display_status"] == "ok" and model_name(mine) == "openai/dev"
    ok_dev = json.loads((await bw("runs", "--json", "--status", "ok", "--model", "dev", "--limit", "500",
                                  env=env)).out)
    assert run_id in [r["id"] for r in ok_dev]
    assert all(r["display_status"] == "ok" or r["status"] == "ok" for r in ok_dev)
    paused = json.loads((await bw("runs", "--json", "--status", "paused", env=env)).out)
    assert run_id not in [r["id"] for r in paused]
    one = json.loads((await bw("runs", "--json", "--limit", "1", env=env)).out)
    assert len(one) == 1
    text = await bw("runs", "--limit", "3", env=env)
    assert text.rc == 0 and text.out.splitlines()[0].split()[:2] == ["id", "status"]


async def test_retired_operator_and_agent_flags_name_driver_and_send_nothing(stack: Stack) -> None:
    nowhere = {"BENCHWRIGHT_API_URL": f"http://127.0.0.1:{free_port()}", "BENCHWRIGHT_API_KEY": "bw_x"}
    for flag in ("--operator", "--agent"):
        done = await bw("run", "--dataset", DATASET, "--model", "openai/dev", flag, "builtin", env=nowhere)
        assert done.rc == 2 and f"{flag} was renamed --driver (see docs/concepts.md §8)" in done.err, done.err
        assert "No such option" not in done.err and "unreachable" not in done.err
    with Client(nowhere["BENCHWRIGHT_API_URL"], "bw_x") as sdk:
        for key in ("operator", "agent"):
            with pytest.raises(TypeError, match=f"'{key}=', which was renamed 'driver='"):
                sdk.launch(dataset=DATASET, model="openai/dev", **{key: "builtin"})


async def test_bad_flags_are_named_locally_and_the_servers_refusal_is_printed_plainly(stack: Stack) -> None:
    env = api_env(stack)
    no_value = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--limit", "run.cost", env=env)
    assert no_value.rc == 2 and "--limit takes KEY=VALUE, got 'run.cost'" in no_value.err
    twice = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--limit", "run.cost=1", "--limit",
                     "run.cost=2", env=env)
    assert twice.rc == 2 and "run.cost is given twice" in twice.err
    unenforceable = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--limit", "run.tokens=5", env=env)
    assert unenforceable.rc == 1 and "400" in unenforceable.err and "run.tokens" in unenforceable.err
    bad_visibility = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--visibility", "secret", env=env)
    assert bad_visibility.rc == 1 and "422" in bad_visibility.err and "visibility" in bad_visibility.err


@dataclass
class CuttingProxy:
    """A loopback TCP proxy in front of the API that cuts the first SSE response after ``cut_bytes`` (as a
    restarting API or a proxy's idle timeout would), and records each SSE request's Last-Event-ID."""

    upstream_port: int
    cut_bytes: int
    last_event_ids: list[str] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        sse = b"text/event-stream" in head.lower()
        limit = None
        if sse:
            header = next((h for h in head.decode().split("\r\n") if h.lower().startswith("last-event-id:")), "")
            self.last_event_ids.append(header.partition(":")[2].strip())
            limit = self.cut_bytes if len(self.last_event_ids) == 1 else None
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        up_writer.write(head)

        async def pump_up() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        upward = asyncio.create_task(pump_up())
        sent = 0
        try:
            while data := await up_reader.read(4096):
                if limit is not None and sent + len(data) >= limit:
                    writer.write(data[:limit - sent])
                    await writer.drain()
                    break
                writer.write(data)
                await writer.drain()
                sent += len(data)
        finally:
            upward.cancel()
            writer.close()
            up_writer.close()


async def test_events_follow_resumes_after_a_dropped_stream_without_loss_or_repeats(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = _dataset(tmp_path / "slow.jsonl", 120)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=20))
    proxy = CuttingProxy(upstream_port=int(stack.api_url.rsplit(":", 1)[1]), cut_bytes=6000)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        env = {"BENCHWRIGHT_API_URL": f"http://127.0.0.1:{port}", "BENCHWRIGHT_API_KEY": stack.api_key}
        launched = await bw("run", "--dataset", str(tmp_path / "slow.jsonl"), "--model", "openai/dev",
                            "--api-base", url, "--concurrency", "4", env=env)
        assert launched.rc == 0, launched.err
        followed = await bw("events", launched.out.strip(), "--follow", "--json", env=env)
    finally:
        server.close()
    assert followed.rc == 0, followed.err
    seqs = [json.loads(line)["seq"] for line in followed.out.splitlines()]
    assert seqs == list(range(len(seqs))) and len(seqs) > 120
    assert json.loads(followed.out.splitlines()[-1])["type"] == "PipelineFinished"
    assert len(proxy.last_event_ids) >= 2, "the first stream was cut and the CLI reconnected"
    assert proxy.last_event_ids[0] == "-1" and int(proxy.last_event_ids[1]) >= 0, proxy.last_event_ids


async def test_admin_halt_from_the_cli(stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = _dataset(tmp_path / "slow.jsonl", 300)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=60))
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        _, admin_key = create_account(engine, name=f"admin-{uuid.uuid4().hex[:8]}", admin=True)
    finally:
        engine.dispose()
    launched = await bw("run", "--dataset", str(tmp_path / "slow.jsonl"), "--model", "openai/dev", "--api-base", url,
                        "--concurrency", "2", env=api_env(stack, stack.other_key))
    run_id = launched.out.strip()
    refused = await bw("admin", "halt", run_id, "--reason", "abuse", env=api_env(stack))
    assert refused.rc == 1 and "404" in refused.err, "a non-admin key finds no such route"
    halted = await bw("halt", run_id, "--admin", "--reason", "abuse", env=api_env(stack, admin_key))
    assert halted.rc == 0, halted.err
    assert f"run {run_id}: killed (admin: abuse)" in halted.out
    watched = await bw("events", run_id, "--follow", "--json", env=api_env(stack, stack.other_key))
    last = json.loads(watched.out.splitlines()[-1])
    assert last["type"] == "PipelineFinished" and last["data"]["halt_reason"] == "admin: abuse"
