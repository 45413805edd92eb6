"""Shared steps of the REST tests: launch a run and wait for its terminal event through the API itself."""

from __future__ import annotations

from typing import Any

import httpx

TERMINAL = "PipelineFinished"


async def launch(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = await http.post("/v1/runs", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def wait_terminal(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """Follow the SSE stream until the terminal event (the stream closes after it); returns every event."""
    events: list[dict[str, Any]] = []
    async with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"},
                           timeout=httpx.Timeout(120)) as resp:
        assert resp.status_code == 200
        async for event in parse_sse(resp):
            events.append(event)
    assert events and events[-1]["type"] == TERMINAL, [e["type"] for e in events]
    return events


async def parse_sse(resp: httpx.Response):  # type: ignore[no-untyped-def]
    import json

    data: list[str] = []
    async for line in resp.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []


async def poll_all(http: httpx.AsyncClient, run_id: str, page: int = 7) -> list[dict[str, Any]]:
    """Every event by polling in small pages (exercises ``after`` paging)."""
    out: list[dict[str, Any]] = []
    after = -1
    while True:
        resp = await http.get(f"/v1/runs/{run_id}/events", params={"after": after, "limit": page})
        assert resp.status_code == 200
        body = resp.json()
        out += body["events"]
        if not body["events"]:
            return out
        after = body["next_after"]


async def record_history(stack: Any, workflow_id: str, name: str) -> None:
    """``BW_RECORD_HISTORIES=1`` saves the workflow's history for tests/replay (recorded once, committed), its
    payloads decoded with the stack's codec (the saved histories replay with the plain converter)."""
    import json
    import os
    from pathlib import Path

    if os.environ.get("BW_RECORD_HISTORIES") != "1":
        return
    handle = stack.client.get_workflow_handle(workflow_id)
    await handle.result()
    history = json.loads((await handle.fetch_history()).to_json())
    path = Path(__file__).resolve().parents[1] / "replay" / "histories" / name
    path.write_text(json.dumps(_decoded(stack.client.data_converter.payload_codec, history), indent=2))


def _decoded(codec: Any, node: Any) -> Any:
    from google.protobuf.json_format import MessageToDict, ParseDict
    from temporalio.api.common.v1 import Payload

    if isinstance(node, list):
        return [_decoded(codec, x) for x in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"metadata", "data"} and isinstance(node["metadata"], dict):
        return MessageToDict(codec.decode_one(ParseDict(node, Payload())))
    return {k: _decoded(codec, v) for k, v in node.items()}
