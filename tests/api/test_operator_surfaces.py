"""An Operator session's surfaces (issue 26): its log live over SSE (the runs' hub and rules: id = seq, resume with
``Last-Event-ID``, close at SessionAnswered), the account's session list, ``benchwright session watch``, and the
Temporal UI naming the session on its own workflow and on every run it launched (a search attribute)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import pytest_asyncio

from benchwright.stack.temporal_ui import OPERATOR_SESSION
from tests.api.helpers import launch, parse_sse, wait_terminal
from tests.cli.test_cli_launch import api_env, bw
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
SSE = {"Accept": "text/event-stream"}
ENDED = ("answered", "stopped", "failed")


async def _stream(http: httpx.AsyncClient, session_id: str, headers: dict[str, str] | None = None,
                  ) -> list[dict[str, Any]]:
    async with http.stream("GET", f"/v1/operator/sessions/{session_id}/events", headers={**SSE, **(headers or {})},
                           timeout=httpx.Timeout(300)) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return [e async for e in parse_sse(resp)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def reference(stack: Stack) -> str:
    async with stack.http() as http:
        ref = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"),
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, ref["id"])
    return str(ref["id"])


async def test_session_log_streams_live_resumes_and_lists(stack: Stack, reference: str) -> None:
    async with stack.http() as http, stack.http(stack.other_key) as theirs:
        resp = await http.post("/v1/operator/sessions", json={"goal": {"question": "regressed",
                                                                        "reference_run": reference}})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        # Opened while the session runs: the stream carries the log to SessionAnswered and closes there.
        live, watched = await asyncio.gather(_stream(http, sid),
                                             bw("session", "watch", sid, env=api_env(stack), timeout_s=300))
        polled = (await http.get(f"/v1/operator/sessions/{sid}/events")).json()
        done = (await http.get(f"/v1/operator/sessions/{sid}")).json()

        assert [e["seq"] for e in live] == list(range(len(live)))
        assert live[-1]["type"] == "SessionAnswered" and live[0]["type"] == "SessionStarted"
        assert live == polled["events"] and polled["terminal"]
        assert done["status"] == "answered" and len(done["runs"]) == 1

        # Resumed from an event it sent: the rest, nothing twice; resumed at the end of an answered session: nothing.
        assert await _stream(http, sid, {"Last-Event-ID": "1"}) == live[2:]
        assert await _stream(http, sid, {"Last-Event-ID": str(live[-1]["seq"])}) == []
        bad = await http.get(f"/v1/operator/sessions/{sid}/events", headers={**SSE, "Last-Event-ID": "999"})
        assert bad.status_code == 422 and "event of this operator session" in bad.text, bad.text
        assert (await theirs.get(f"/v1/operator/sessions/{sid}/events", headers=SSE)).status_code == 404

        # The account's sessions, newest first, paged; none of them is another account's.
        first = (await http.get("/v1/operator/sessions", params={"limit": 1})).json()
        assert [s["id"] for s in first["sessions"]] == [sid] and first["sessions"][0] == done
        if first["next_cursor"]:
            older = (await http.get("/v1/operator/sessions", params={"cursor": first["next_cursor"]})).json()
            assert sid not in [s["id"] for s in older["sessions"]]
        assert sid not in [s["id"] for s in (await theirs.get("/v1/operator/sessions")).json()["sessions"]]
        refused = await theirs.get("/v1/operator/sessions", params={"cursor": sid})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_cursor", refused.text

    # benchwright session watch: every decision as it came, then the answer.
    assert watched.rc == 0, watched.err
    replay = done["runs"][0]
    assert f"run {replay[:8]} launched (replay, openai/dev)" in watched.err
    assert f"run {replay[:8]} read (replay): ok, pass rate 100.0%" in watched.err
    assert done["answer"]["sentence"] in watched.out

    # The Temporal UI: the session's workflow and its run carry BenchwrightOperatorSession = the session id.
    for workflow_id in (f"operator-{sid}", replay):
        desc = await stack.client.get_workflow_handle(workflow_id).describe()
        assert desc.typed_search_attributes.get(OPERATOR_SESSION) == sid, workflow_id
    ref_desc = await stack.client.get_workflow_handle(reference).describe()
    assert ref_desc.typed_search_attributes.get(OPERATOR_SESSION) is None
