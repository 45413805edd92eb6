"""The ``admin`` halt (§9): an admin account halts any account's run through the workflow; for everyone else the
route does not exist (issue 14)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_control import settled, until
from tests.api.test_scale import _dataset, _live_sandboxes
from tests.conftest import DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _admin_key(stack: Stack) -> str:
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        _, key = create_account(engine, name=f"admin-{uuid.uuid4().hex[:8]}", admin=True)
    finally:
        engine.dispose()
    return key


async def test_admin_halts_another_accounts_running_run(stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = _dataset(tmp_path / "slow.jsonl", 300)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=60))
    admin_key = _admin_key(stack)
    async with stack.http() as owner, stack.http(admin_key) as admin, stack.http(stack.other_key) as stranger:
        run = await launch(owner, {"dataset": str(tmp_path / "slow.jsonl"),
                                   "model": {"identifier": "openai/dev", "api_base": url}, "concurrency": 4})
        await until(owner, run["id"], lambda r: settled(r) >= 10)
        # Not an admin (another account, the owner itself, no key, a wrong key): the route does not exist.
        unknown = await stranger.post("/v1/admin/no-such-route", json={"reason": "x"})
        for http in (stranger, owner):
            refused = await http.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": "abuse"})
            assert refused.status_code == 404 and refused.json() == unknown.json(), refused.text
        async with stack.http(None) as anonymous, stack.http("bw_wrong") as wrong:
            for http in (anonymous, wrong):
                refused = await http.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": "abuse"})
                assert refused.status_code == 404 and refused.json() == unknown.json(), refused.text
        assert (await owner.get(f"/v1/runs/{run['id']}")).json()["halted"] is False
        assert (await admin.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": ""})).status_code == 422

        halted = await admin.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": "abuse of the free tier"})
        assert halted.status_code == 200, halted.text
        assert halted.json()["display_status"] == "killed"
        events = await wait_terminal(owner, run["id"])
        final = (await owner.get(f"/v1/runs/{run['id']}")).json()
        again = await admin.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": "twice"})
        missing = await admin.post(f"/v1/admin/runs/{uuid.uuid4()}/halt", json={"reason": "x"})
    assert final["halted"] and final["halt_reason"] == "admin: abuse of the free tier"
    assert final["display_status"] == "killed" and final["status"] == "running"
    assert 10 <= settled(final) < 300, "in-flight work was cancelled; what it measured is kept"
    halt_events = [e for e in events if e["type"] == "RunHalted"]
    assert [e["data"]["halt_reason"] for e in halt_events] == ["admin: abuse of the free tier"]
    finished = events[-1]
    assert finished["type"] == "PipelineFinished" and finished["data"]["halted"]
    assert finished["data"]["halt_reason"] == "admin: abuse of the free tier"
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_finished"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert await _live_sandboxes(stack, run["id"]) == []


async def test_admin_route_is_not_in_the_public_schema(stack: Stack) -> None:
    async with stack.http(None) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith("/v1/admin")]
