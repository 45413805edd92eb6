"""Scorer time ceilings (issue 15 items 6, 7): a scorer that never returns ends as ``err`` rows and a finished run.

A Python thread spinning in ``while True: pass`` cannot be interrupted, so the host kills the scorer runtime and
carries on with a fresh one; these tests check the rows, that the run ends promptly, and that nothing is left
spinning afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from tests.api.helpers import launch, poll_all, wait_terminal
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
FINISH_WITHIN_S = 60.0
"""Generous: each of these runs measured well under 10 s here; a stuck run never ends."""

LOOPING_IMPL = '''
class Scorer:
    def extract(self, row):
        return row["question"]
    def solve(self, row, call_sut):
        while True:
            pass
    def score(self, row, response):
        return 1.0
'''

HALF_LOOPING_IMPL = '''
import ctypes
ctypes.CDLL(None).prctl(15, b"MARKER")  # PR_SET_NAME: the runtime shows up in /proc/<pid>/comm as MARKER

class Scorer:
    def extract(self, row):
        return row["question"]
    def solve(self, row, call_sut):
        if int(row["id"].rsplit("-", 1)[1]) % 2:
            while True:
                pass
        return call_sut(self.extract(row))
    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''


async def _run_to_end(stack: Stack, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """Launch, follow the SSE stream to PipelineFinished (bounded: a stuck run fails here), return events, run, s."""
    async with stack.http() as http:
        started = time.monotonic()
        run = await launch(http, body)
        try:
            async with asyncio.timeout(FINISH_WITHIN_S):
                events = await wait_terminal(http, run["id"])
        except TimeoutError:
            so_far = [(e["type"], e["data"].get("error")) for e in await poll_all(http, run["id"], page=500)]
            raise AssertionError(f"run {run['id']} did not finish within {FINISH_WITHIN_S:g} s: {so_far}") from None
        elapsed = time.monotonic() - started
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    return events, final, elapsed


def _results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]


async def test_looping_scorer_with_attempt_duration_ends_every_row_err_and_the_run(stack: Stack) -> None:
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
            "task_impl": LOOPING_IMPL, "constraints": {"max_tasks": 10}, "limits": {"attempt": {"duration": 1}}}
    events, final, elapsed = await _run_to_end(stack, body)
    print(f"10 looping tasks, attempt.duration 1 s: run finished in {elapsed:.1f} s")
    results = _results(events)
    assert len(results) == 10 and all(r["outcome"] == "err" for r in results)
    assert all(r["error"].startswith("limit_exceeded:attempt.duration") for r in results)
    assert all(r["meta"]["limit_exceeded"] == "attempt.duration" for r in results)
    assert events[-1]["type"] == "PipelineFinished" and final["status"] == "ok" and not final["halted"]
    assert final["tasks"]["summary"]["errored"] == 10


async def test_looping_scorer_without_limits_ends_through_the_default_ceiling(stack: Stack) -> None:
    default = stack.settings.default_attempt_duration_s
    async with stack.http() as http:
        published = (await http.get("/v1/limits")).json()
    assert published["defaults"]["attempt.duration"] == default
    assert published["ceilings"]["batch.duration"] == stack.settings.materialize_batch_duration_s
    assert published["levels"]["attempt"] == ["duration"], "the matrix itself is unchanged"
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
            "task_impl": LOOPING_IMPL, "constraints": {"max_tasks": 10}}
    events, final, elapsed = await _run_to_end(stack, body)
    print(f"10 looping tasks, no limits (default attempt.duration {default:g} s): run finished in {elapsed:.1f} s")
    results = _results(events)
    assert len(results) == 10 and all(r["outcome"] == "err" for r in results)
    assert all(r["error"] == f"limit_exceeded:attempt.duration ({default:g} s)" for r in results)
    assert elapsed >= default, "the default ceiling, not something else, ended the attempts"
    assert final["status"] == "ok" and final["tasks"]["summary"]["errored"] == 10


def _marked(marker: str) -> list[int]:
    """PIDs whose name (``/proc/<pid>/comm``) is ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == marker:
                    out.append(int(entry.name))
            except OSError:
                continue  # ended while we looked
    return out


async def test_half_looping_scorer_passes_the_rest_and_leaves_nothing_spinning(stack: Stack) -> None:
    marker = f"bwloop{secrets.token_hex(4)}"
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
            "task_impl": HALF_LOOPING_IMPL.replace("MARKER", marker), "constraints": {"max_tasks": 10},
            "limits": {"attempt": {"duration": 2}, "task": {"attempts": 2}}}
    seen: set[int] = set()

    async def watch_runtimes() -> None:
        while True:
            seen.update(_marked(marker))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_runtimes())
    try:
        events, final, elapsed = await _run_to_end(stack, body)
    finally:
        watcher.cancel()
    left = _marked(marker)
    print(f"5 looping + 5 answering tasks, attempt.duration 2 s x 2 attempts: {elapsed:.1f} s; "
          f"{len(seen)} scorer runtimes seen, {len(left)} left")
    by_index = {r["index"]: r for r in _results(events)}
    assert sorted(by_index) == list(range(10))
    for index, row in by_index.items():
        if index % 2:
            assert row["outcome"] == "err" and row["meta"]["limit_exceeded"] == "attempt.duration", row
            assert row["meta"]["attempts"] == 2, "the retry ran in the replacement runtime"
        else:
            assert row["outcome"] == "pass" and row["error"] is None, row
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 5
    assert len(seen) >= 2, "the stuck runtime was replaced (and the watcher could see runtimes at all)"
    assert left == [], "no scorer runtime outlives the run"
    created = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxCreated"}
    killed = {e["data"]["sandbox_id"] for e in events if e["type"] == "SandboxKilled"}
    assert created and created == killed
