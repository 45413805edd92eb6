"""Host policy, blocked hosts, secrets and compute selection through REST."""

from __future__ import annotations

import pytest

from benchwright.store.policy import record_blocked
from benchwright.store.runs import get_run
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


async def test_host_policy_crud_validates_patterns(stack: Stack) -> None:
    async with stack.http(stack.other_key) as http:
        fresh = (await http.get("/v1/host-policy")).json()
        assert fresh == {"default": "allow", "rules": []}
        assert (await http.put("/v1/host-policy/default", json={"default": "block"})).json()["default"] == "block"
        made = await http.post("/v1/host-policy/rules", json={"pattern": "*.PyPI.org", "action": "allow"})
        assert made.status_code == 201 and made.json() == {"pattern": "*.pypi.org", "action": "allow"}
        bad = await http.post("/v1/host-policy/rules", json={"pattern": "https://x.org/path", "action": "allow"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_policy"
        typo = await http.post("/v1/host-policy/rules", json={"pattern": "x.org", "action": "alow"})
        assert typo.status_code == 422 and "action" in typo.json()["error"]["message"]
        assert (await http.delete("/v1/host-policy/rules/*.pypi.org")).status_code == 204
        assert (await http.delete("/v1/host-policy/rules/*.pypi.org")).status_code == 404
        assert (await http.put("/v1/host-policy/default", json={"default": "allow"})).status_code == 200
    async with stack.http() as mine:
        assert (await mine.get("/v1/host-policy")).json()["default"] == "allow", "policies are per account"


async def test_secrets_are_write_only_and_allow_their_host(stack: Stack) -> None:
    async with stack.http(stack.other_key) as http:
        made = await http.post("/v1/secrets", json={"name": "OPENROUTER", "value": "sk-or-real-123",
                                                    "host_pattern": "openrouter.ai"})
        assert made.status_code == 201 and "value" not in made.json()
        listed = (await http.get("/v1/secrets")).text
        assert "OPENROUTER" in listed and "sk-or-real-123" not in listed
        rules = (await http.get("/v1/host-policy")).json()["rules"]
        assert {"pattern": "openrouter.ai", "action": "allow"} in rules
        missing = await http.post("/v1/runs", json={"dataset": DATASET, "model": {"identifier": "openrouter/x",
                                                                                    "secret": "NOPE"}})
        assert missing.status_code == 400 and missing.json()["error"]["code"] == "unknown_secret"
        bad_name = await http.post("/v1/secrets", json={"name": "has space", "value": "v"})
        assert bad_name.status_code == 422
        assert (await http.delete("/v1/secrets/OPENROUTER")).status_code == 204
        assert (await http.delete("/v1/secrets/OPENROUTER")).status_code == 404


async def test_compute_selection_and_typos(stack: Stack) -> None:
    model = {"identifier": "openai/dev", "api_base": stack.dev_url}
    async with stack.http() as http:
        typo = await http.post("/v1/runs", json={"dataset": DATASET, "model": model, "compute": "e2bb"})
        assert typo.status_code == 400
        err = typo.json()["error"]
        assert err["code"] == "invalid_compute" and "local, sandbox0, e2b, default, auto" in err["message"]
        assert "did you mean 'e2b'" in err["message"]
        unconfigured = await http.post("/v1/runs", json={"dataset": DATASET, "model": model, "compute": "e2b"})
        assert unconfigured.status_code == 400 and unconfigured.json()["error"]["code"] == "compute_not_configured"
        saved = await http.put("/v1/settings/compute", json={"compute": "sandbox0"})
        assert saved.status_code == 400
        local = await launch(http, {"dataset": DATASET, "model": model, "compute": "local"})
        default = await launch(http, {"dataset": DATASET, "model": model, "compute": "auto"})
        for r in (local, default):
            await wait_terminal(http, r["id"])
        assert (await http.get(f"/v1/runs/{local['id']}")).json()["backend"] == "local"
        assert (await http.get(f"/v1/runs/{default['id']}")).json()["backend"] == "local"
        assert (await http.get("/v1/settings/compute")).json() == {"compute": None, "effective": "local"}


async def test_blocked_hosts_endpoints_count_per_run_and_aggregate(stack: Stack) -> None:
    model = {"identifier": "openai/dev", "api_base": stack.dev_url}
    async with stack.http() as http:
        a = await launch(http, {"dataset": DATASET, "model": model})
        b = await launch(http, {"dataset": DATASET, "model": model})
        for r in (a, b):
            await wait_terminal(http, r["id"])
        account_id = get_run(stack_engine(stack), run_id=a["id"]).account_id
        for run_id, times in ((a["id"], 3), (b["id"], 2)):
            for _ in range(times):
                record_blocked(stack_engine(stack), run_id=run_id, account_id=account_id, host="evil.example")
        one = (await http.get(f"/v1/runs/{a['id']}/blocked-hosts")).json()["hosts"]
        agg = (await http.get("/v1/blocked-hosts")).json()["hosts"]
    assert [(h["host"], h["seen_count"]) for h in one] == [("evil.example", 3)]
    assert one[0]["first_seen"] <= one[0]["last_seen"]
    assert ("evil.example", 5) in [(h["host"], h["seen_count"]) for h in agg]
    async with stack.http(stack.other_key) as other:
        assert (await other.get(f"/v1/runs/{a['id']}/blocked-hosts")).status_code == 404
        assert all(h["host"] != "evil.example" for h in (await other.get("/v1/blocked-hosts")).json()["hosts"])


def stack_engine(stack: Stack):  # type: ignore[no-untyped-def]
    from benchwright.store.db import make_engine

    return make_engine(stack.settings.resolved_database_url())
