"""Per-account quotas over the real API (issue 23, fair sharing): 429 ``quota_exceeded`` naming the quota, the use
and the limit with ``Retry-After``; overrides set by an admin (API) and by the operator (CLI)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_control import until
from tests.api.test_scale import _dataset
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


def _account(stack: Stack, *, admin: bool = False) -> tuple[str, str]:
    name = f"quota-{uuid.uuid4().hex[:8]}"
    _, key = create_account(make_engine(stack.settings.resolved_database_url()), name=name, balance_usd=100.0,
                            local_paths=True, admin=admin)
    return name, key


async def _set_quota(stack: Stack, admin_key: str, name: str, body: dict[str, int | None]) -> dict[str, object]:
    async with stack.http(admin_key) as http:
        resp = await http.put(f"/v1/admin/accounts/{name}/quota", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_concurrent_runs_quota_answers_429_naming_it_until_a_run_ends(stack: Stack) -> None:
    name, key = _account(stack)
    _, admin_key = _account(stack, admin=True)
    view = await _set_quota(stack, admin_key, name, {"runs": 1})
    assert view["runs"] == 1 and view["overridden"] == ["runs"]
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}
    async with stack.http(key) as http:
        first = await launch(http, body)
        paused = await http.post(f"/v1/runs/{first['id']}/pause")  # holds its place as a running run
        assert paused.status_code == 200, paused.text
        refused = await http.post("/v1/runs", json=body)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert "quota runs exceeded" in error["message"] and "1 concurrent runs of its limit of 1" in error["message"]
        assert refused.headers["retry-after"] == str(stack.settings.quota_retry_after_s)
        runs = (await http.get("/v1/runs")).json()["runs"]
        assert [r["id"] for r in runs] == [first["id"]]  # the refused launch left nothing behind
        await http.post(f"/v1/runs/{first['id']}/stop", json={"reason": "make room"})
        await wait_terminal(http, first["id"])
        again = await launch(http, body)
        await wait_terminal(http, again["id"])


async def test_tasks_queued_quota_answers_429_while_a_run_holds_them(stack: Stack, dev_models: DevModels,
                                                                     tmp_path: Path) -> None:
    name, key = _account(stack)
    _, admin_key = _account(stack, admin=True)
    await _set_quota(stack, admin_key, name, {"tasks": 50})
    answers = _dataset(tmp_path / "q.jsonl", 200)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=50))
    slow = {"dataset": str(tmp_path / "q.jsonl"), "model": {"identifier": "openai/dev", "api_base": url},
            "concurrency": 2}
    async with stack.http(key) as http:
        first = await launch(http, slow)
        await until(http, first["id"], lambda r: r["tasks"]["summary"]["total"] == 200)
        await http.post(f"/v1/runs/{first['id']}/pause")
        refused = await http.post("/v1/runs", json={"dataset": DATASET, "model": {
            "identifier": "openai/dev", "api_base": stack.dev_url}})
        assert refused.status_code == 429, refused.text
        message = refused.json()["error"]["message"]
        assert refused.json()["error"]["code"] == "quota_exceeded" and "quota tasks exceeded" in message
        assert "of its limit of 50" in message and "--tasks N" in message
        assert int(refused.headers["retry-after"]) > 0
        # an override back to the default lifts it
        view = await _set_quota(stack, admin_key, name, {"tasks": None})
        assert view["tasks"] == stack.settings.quota_tasks and view["overridden"] == []
        assert view["used_runs"] == 1 and 0 < int(view["used_tasks"]) <= 200  # type: ignore[call-overload]
        await http.post(f"/v1/runs/{first['id']}/stop", json={"reason": "done"})
        await wait_terminal(http, first["id"])


async def test_quota_admin_surface_is_admins_only_and_bounded(stack: Stack) -> None:
    name, key = _account(stack)
    _, admin_key = _account(stack, admin=True)
    async with stack.http(key) as http:
        assert (await http.put(f"/v1/admin/accounts/{name}/quota", json={"runs": 5})).status_code == 404
    async with stack.http(admin_key) as http:
        for bad in ({"runs": 0}, {"runs": 10**12}, {"model_calls": 1.5}, {"bogus": 3}):
            assert (await http.put(f"/v1/admin/accounts/{name}/quota", json=bad)).status_code == 422, bad
        missing = await http.put("/v1/admin/accounts/no-such-account/quota", json={"runs": 2})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        got = (await http.get(f"/v1/admin/accounts/{name}/quota")).json()
    assert got["runs"] == stack.settings.quota_runs and got["overridden"] == []


def _rows(stdout: str) -> dict[str, list[str]]:
    rows = [line.translate({ord(c): " " for c in "│┃║|"}).split() for line in stdout.splitlines()]
    return {row[0]: row for row in rows if row}


async def test_cli_sets_and_shows_an_accounts_quotas(stack: Stack) -> None:
    name, _ = _account(stack)
    env = {**os.environ, "BENCHWRIGHT_DATA_DIR": str(stack.settings.data_dir)}
    cli = [sys.executable, "-m", "benchwright.cli", "accounts", "quota", name]

    async def run(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(subprocess.run, [*cli, *args], env=env, capture_output=True, text=True,
                                       timeout=120)

    shown = await run("--runs", "3", "--model-calls", "7")
    assert shown.returncode == 0, shown.stderr
    lines = _rows(shown.stdout)
    assert lines["runs"][1] == "3" and "account" in lines["runs"]
    assert lines["model-calls"][1] == "7"
    assert lines["tasks"][1] == str(stack.settings.quota_tasks)
    refused = await run("--runs", "0")
    assert refused.returncode == 1 and "from 1 to" in refused.stderr + refused.stdout
    reset = await run("--reset", "runs")
    assert reset.returncode == 0, reset.stderr
    after = _rows(reset.stdout)
    assert after["runs"][1] == str(stack.settings.quota_runs) and "deployment" in after["runs"]
    assert after["model-calls"][1] == "7" and "account" in after["model-calls"]
