"""The audit trail (issue 23 item 5): admin and operator actions (an admin halt, an impl promotion, account creation,
credit and key issue) are recorded with who, when, what and on what; admins read them at ``GET /v1/admin/audit``
(cursor-paged) and with ``benchwright admin audit``; for everyone else the route does not exist (404)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.security import audit
from benchwright.store.accounts import create_account, create_key, credit
from benchwright.store.db import make_engine, migrate
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _dataset
from tests.conftest import SAMPLE, DevModels, Stack


async def _all_entries(http: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    """Every entry, following next_cursor two at a time (exercises the paging)."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        paging = {"cursor": cursor} if cursor else {}
        resp = await http.get("/v1/admin/audit", params={"limit": 2, **params, **paging})
        assert resp.status_code == 200, resp.text
        page = resp.json()
        entries += page["entries"]
        cursor = page["next_cursor"]
        if cursor is None:
            return entries


async def test_admin_actions_are_recorded_and_only_admins_read_them(stack: Stack, dev_models: DevModels,
                                                                   tmp_path: Path) -> None:
    started = datetime.now(UTC) - timedelta(seconds=1)
    engine = make_engine(stack.settings.resolved_database_url())
    suffix = uuid.uuid4().hex[:8]
    admin_account, admin_key = create_account(engine, name=f"admin-{suffix}", admin=True, actor="cli:ops-alice")
    customer, _ = create_account(engine, name=f"customer-{suffix}", balance_usd=5.0)
    credit(engine, account_name=customer.name, amount_usd=12.5, actor="cli:ops-bob")
    new_key = create_key(engine, account_name=customer.name)
    engine.dispose()

    answers = _dataset(tmp_path / "slow.jsonl", 300)
    slow_url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=60))
    async with stack.http() as owner, stack.http(admin_key) as admin:
        # an impl promoted by the admin: publish a finished run first
        done = await launch(owner, {"dataset": str(SAMPLE / "arithmetic.jsonl"),
                                    "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(owner, done["id"])
        pub = await owner.post("/v1/registry/publish", json={"run_id": done["id"], "benchmark": f"audit{suffix}",
                                                             "subset": "all", "visibility": "public"})
        assert pub.status_code == 200, pub.text
        impl_id = pub.json()["impl_id"]
        assert (await admin.post(f"/v1/registry/impls/{impl_id}/promote")).json()["official"] is True
        # an admin halt of another account's running run
        run = await launch(owner, {"dataset": str(tmp_path / "slow.jsonl"), "concurrency": 2,
                                   "model": {"identifier": "openai/dev", "api_base": slow_url}})
        halted = await admin.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": "runaway spend"})
        assert halted.status_code == 200, halted.text
        await wait_terminal(owner, run["id"])
        # a refused halt (the run is over) is not an action taken: not recorded
        assert (await admin.post(f"/v1/admin/runs/{run['id']}/halt", json={"reason": "again"})).status_code == 409

        entries = await _all_entries(admin)
        mine = [e for e in entries if suffix in e["target"] or e["target"] in (f"run:{run['id']}", f"impl:{impl_id}")]
        by_action = {e["action"]: e for e in mine}
        assert set(by_action) == {"account.create", "account.credit", "account.key_create", "impl.promote",
                                  "run.admin_halt"}, mine
        assert [e["action"] for e in mine if e["action"] == "account.create"] == ["account.create"] * 2
        created = [e for e in mine if e["action"] == "account.create" and e["target"] == f"account:admin-{suffix}"]
        assert created and created[0]["actor"] == "cli:ops-alice" and created[0]["detail"]["admin"] is True
        assert by_action["account.credit"]["actor"] == "cli:ops-bob"
        assert by_action["account.credit"]["target"] == f"account:customer-{suffix}"
        assert by_action["account.credit"]["detail"] == {"amount_usd": 12.5, "balance_usd": 17.5}
        assert by_action["account.key_create"]["actor"].startswith("cli:")  # the OS user running the command
            # a key issued without a name is named after its prefix (named keys, docs/security.md)
        assert by_action["account.key_create"]["detail"] == {"key_name": new_key[:10], "key_prefix": new_key[:10]}
        assert by_action["impl.promote"]["actor"] == f"account:{admin_account.name}"
        assert by_action["impl.promote"]["target"] == f"impl:{impl_id}"
        assert by_action["run.admin_halt"]["actor"] == f"account:{admin_account.name}"
        assert by_action["run.admin_halt"]["target"] == f"run:{run['id']}"
        assert by_action["run.admin_halt"]["detail"]["reason"] == "runaway spend"
        for entry in mine:
            assert datetime.fromisoformat(entry["at"]).replace(tzinfo=UTC) >= started
        text = json.dumps(entries)
        assert admin_key not in text and new_key not in text, "a key is never in the trail (its prefix at most)"
        ids = [e["id"] for e in entries]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids), "newest first, each entry once"
        only = (await admin.get("/v1/admin/audit", params={"action": "run.admin_halt", "limit": 200})).json()
        assert {e["action"] for e in only["entries"]} == {"run.admin_halt"}
        assert (await admin.get("/v1/admin/audit", params={"cursor": ""})).status_code == 400

        # everyone else: the route does not exist
        unknown = await owner.get("/v1/admin/no-such-route")
        async with stack.http(stack.other_key) as stranger, stack.http(None) as anonymous:
            for http in (owner, stranger, anonymous):
                refused = await http.get("/v1/admin/audit")
                assert refused.status_code == 404 and refused.json() == unknown.json(), refused.text
                # a wrong method does not give the route away with a 405 and its Allow header either
                probed = await http.delete("/v1/admin/audit")
                assert probed.status_code == 404 and probed.json() == unknown.json(), probed.text
                assert "allow" not in probed.headers

    # the CLI prints the same trail for an admin key, and refuses a non-admin one
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    shown = await _cli(["admin", "audit", "--limit", "500", "--api-url", stack.api_url, "--api-key", admin_key], env)
    assert shown[0] == 0, shown[1]
    for needle in ("run.admin_halt", "impl.promote", "account.credit", f"account:customer-{suffix}", "cli:ops-bob"):
        assert needle in shown[1], (needle, shown[1][-3000:])
    as_json = await _cli(["admin", "audit", "--json", "--action", "impl.promote", "--api-url", stack.api_url,
                          "--api-key", admin_key], env)
    assert as_json[0] == 0 and any(e["target"] == f"impl:{impl_id}" for e in json.loads(as_json[1]))
    refused = await _cli(["admin", "audit", "--api-url", stack.api_url, "--api-key", stack.api_key], env)
    assert refused[0] == 1 and ("404" in refused[1] or "not found" in refused[1].lower()), refused


async def _cli(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "benchwright.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, out.decode()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_audit_table_migrates_and_pages_on_sqlite_and_postgres(backend: str, tmp_path: Path) -> None:
    from tests.store.conftest import _postgres_schema_url

    urls = iter([f"sqlite:///{tmp_path / 'audit.db'}"]) if backend == "sqlite" else _postgres_schema_url()
    url = next(urls)
    engine = make_engine(url)
    try:
        migrate(engine)
        for i in range(5):
            audit.record_now(engine, actor="cli:ops", action="account.credit", target=f"account:a{i}",
                             detail={"amount_usd": float(i)})
        first = audit.list_audit(engine, limit=3)
        rest = audit.list_audit(engine, limit=3, cursor=first.next_cursor)
        assert [e.target for e in first.entries + rest.entries] == [f"account:a{i}" for i in range(4, -1, -1)]
        assert rest.next_cursor is None
    finally:
        engine.dispose()
        for _ in urls:  # drops the Postgres schema
            pass
