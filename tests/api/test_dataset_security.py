"""The dataset field is untrusted input (issue 15), end to end through the real stack: a second account cannot
read the data directory or the host's secrets, cannot make the worker fetch the platform's own services or cloud
metadata, and is held to its host policy; every refused host lands in the run's blocked-host log, once (Fetch is
not retried for a refusal); an operator-listed loopback dataset server still works."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from benchwright.stack.devstack import free_port
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
SECRET = "bw_" + "s3cr3t" * 6


@dataclass
class Origin:
    """A loopback dataset server the operator listed in ``egress_internal_allowed``."""

    url: str
    hits: list[str]


@pytest_asyncio.fixture(loop_scope="session")
async def origin(stack: Stack) -> AsyncIterator[Origin]:
    hits: list[str] = []

    async def serve(request: Request) -> Response:
        hits.append(request.url.path)
        if request.url.path == "/arithmetic.jsonl":
            return FileResponse(SAMPLE / "arithmetic.jsonl")
        return RedirectResponse(f"{stack.api_url}/openapi.json", status_code=302)  # /to-api

    port = free_port()
    server, task = await serve_app(Starlette(routes=[Route("/{name}", serve)]), port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    try:
        yield Origin(url=f"http://127.0.0.1:{port}", hits=hits)
    finally:
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")
        server.should_exit = True
        await task


def _new_account(stack: Stack) -> str:
    """An account added to the running stack the ordinary way: no grant for local paths."""
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        return create_account(engine, name=f"late-{uuid.uuid4().hex[:8]}", balance_usd=100.0)[1]
    finally:
        engine.dispose()


def _model(stack: Stack) -> dict[str, Any]:
    return {"identifier": "openai/dev", "api_base": stack.dev_url}


async def _fetch_failure(stack: Stack, key: str, dataset: str) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                                          dict[str, int], str]:
    """Launch, wait for the end, and return Fetch's PhaseFailed data, every event, the run's blocked hosts with
    their counts, and the run's whole visible record (events, tasks, run view) as text."""
    async with stack.http(key) as http:
        run = await launch(http, {"dataset": dataset, "model": _model(stack)})
        events = await wait_terminal(http, run["id"])
        hosts = (await http.get(f"/v1/runs/{run['id']}/blocked-hosts")).json()["hosts"]
        record = json.dumps(events) + (await http.get(f"/v1/runs/{run['id']}/tasks")).text + \
            (await http.get(f"/v1/runs/{run['id']}")).text
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert len(failed) == 1 and failed[0]["phase"] == "fetch", [e["type"] for e in events]
    return failed[0], events, {h["host"]: h["seen_count"] for h in hosts}, record


async def test_data_dir_and_host_secrets_are_refused_at_launch(stack: Stack, tmp_path: Path) -> None:
    key_file = stack.data_dir / "dev-account.json"
    key_file.write_text(json.dumps({"account": "dev", "api_key": SECRET}))
    (tmp_path / "innocent.json").symlink_to(key_file)
    try:
        async with stack.http(stack.other_key) as http:  # an account the operator granted local paths
            before = len((await http.get("/v1/runs", params={"limit": 200})).json()["runs"])
            for dataset in (str(key_file), str(stack.data_dir / "benchwright.db"), str(tmp_path / "innocent.json"),
                            f"{tmp_path}/../{stack.data_dir.name}/dev-account.json", "/etc/shadow",
                            "/proc/self/environ"):
                resp = await http.post("/v1/runs", json={"dataset": dataset, "model": _model(stack)})
                assert resp.status_code == 400 and resp.json()["error"]["code"] == "dataset_blocked", resp.text
                assert "secrets" in resp.json()["error"]["message"] and SECRET not in resp.text
            after = len((await http.get("/v1/runs", params={"limit": 200})).json()["runs"])
        assert after == before, "a refused launch records no run"
        async with stack.http(_new_account(stack)) as late:
            resp = await late.post("/v1/runs", json={"dataset": str(SAMPLE / "arithmetic.jsonl"),
                                                     "model": _model(stack)})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "local_paths_disabled"
        assert "this account may not read datasets from local paths" in resp.json()["error"]["message"]
    finally:
        key_file.unlink()


async def test_fetch_enforces_the_path_rules_again(stack: Stack, tmp_path: Path) -> None:
    """What the API cannot know (the API and worker need not share a disk) is refused at Fetch, permanently."""
    failed, _, _, _ = await _fetch_failure(stack, stack.other_key, str(tmp_path))
    assert failed["error_type"] == "DatasetError" and "is not a regular file" in failed["detail"]


async def test_internal_addresses_fail_fetch_and_land_in_the_blocked_host_log(stack: Stack) -> None:
    openapi = f"{stack.api_url}/openapi.json"
    failed, events, hosts, record = await _fetch_failure(stack, stack.other_key, openapi)
    assert failed["error_type"] == "DatasetError"
    assert "127.0.0.1" in failed["detail"] and "internal address" in failed["detail"], failed["detail"]
    assert hosts == {"127.0.0.1": 1}, "recorded once: Fetch was not retried after the refusal"
    assert '"openapi"' not in record and "/v1/runs" not in record.replace(openapi, "")
    assert events[-1]["type"] == "PipelineFinished"
    failed, _, hosts, _ = await _fetch_failure(stack, stack.other_key, "http://169.254.169.254/latest/meta-data/")
    assert "link-local" in failed["detail"] and hosts == {"169.254.169.254": 1}


async def test_the_account_host_policy_applies_to_fetch(stack: Stack) -> None:
    key = _new_account(stack)
    async with stack.http(key) as http:
        made = await http.post("/v1/host-policy/rules", json={"pattern": "*.datasets.example", "action": "block"})
        assert made.status_code == 201, made.text
    failed, _, hosts, _ = await _fetch_failure(stack, key, "https://eval.datasets.example/arith.jsonl")
    assert "eval.datasets.example is blocked by the account's host policy" in failed["detail"]
    assert "'*.datasets.example'" in failed["detail"] and hosts == {"eval.datasets.example": 1}


async def test_an_operator_listed_loopback_server_works_and_its_redirects_are_checked(stack: Stack,
                                                                                       origin: Origin) -> None:
    key = _new_account(stack)  # no local paths needed for a URL
    async with stack.http(key) as http:
        run = await launch(http, {"dataset": f"{origin.url}/arithmetic.jsonl", "model": _model(stack)})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok", final
    failed, _, hosts, record = await _fetch_failure(stack, key, f"{origin.url}/to-api")
    assert "redirect" not in hosts and hosts == {"127.0.0.1": 1}
    assert "internal address" in failed["detail"] and '"openapi"' not in record
    assert origin.hits.count("/to-api") == 1, "the redirect was followed by hand, once, and refused"


async def test_model_api_base_is_held_to_the_internal_address_refusal_and_the_host_policy(
        stack: Stack, origin: Origin) -> None:
    """The model's ``api_base`` is a place too (benchwright.llm.model_access): an account not trusted with the machine
    cannot point its run's calls (and the credential proxy's key) at the cloud metadata address, the platform's own
    API or an unlisted loopback port; the operator-listed dev model works. Refusals fail Attach, land in the
    blocked-host log, and never reach the endpoint."""
    key = _new_account(stack)
    dataset = f"{origin.url}/arithmetic.jsonl"
    refused = {"http://169.254.169.254/latest/meta-data/iam/?x=": "169.254.169.254: link-local",
               f"{stack.api_url}/v1": "127.0.0.1: loopback"}
    async with stack.http(key) as http:
        for api_base, why in refused.items():
            run = await launch(http, {"dataset": dataset, "model": {"identifier": "openai/dev", "api_base": api_base}})
            events = await wait_terminal(http, run["id"])
            failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
            assert failed and failed[0]["phase"] == "attach", [e["type"] for e in events]
            assert "resolves to an internal address" in failed[0]["detail"] and why in failed[0]["detail"]
            assert not [e for e in events if e["type"] == "MaterializeTaskResult"]
            hosts = (await http.get(f"/v1/runs/{run['id']}/blocked-hosts")).json()["hosts"]
            assert [h["host"] for h in hosts] == [why.split(":")[0]]
        ok = await launch(http, {"dataset": dataset, "model": _model(stack)})  # listed by the operator
        await wait_terminal(http, ok["id"])
        final = (await http.get(f"/v1/runs/{ok['id']}")).json()
        assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] > 0
        # the same dev model is refused once the account's host policy blocks it (a rule for its port alone: the
        # dataset server on the same address stays reachable)
        dev_port = stack.dev_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
        assert (await http.post("/v1/host-policy/rules", json={"pattern": f"127.0.0.1:{dev_port}",
                                                               "action": "block"})).status_code == 201
        run = await launch(http, {"dataset": dataset, "model": _model(stack)})
        events = await wait_terminal(http, run["id"])
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert failed and failed[0]["phase"] == "attach", [e["type"] for e in events]
    assert "blocked by the account's host policy" in failed[0]["detail"]
