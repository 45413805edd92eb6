"""The scripted-LLM test double, driven by the real LiteLLM client: turns per conversation, retries, recording,
usage, exhaustion and repeat_last, and the CLI command."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.stack.devstack import free_port
from benchwright.testkit.scripted_llm import (
    ScriptedLlm,
    parse_script,
    start_scripted_llm,
)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytestmark = pytest.mark.asyncio

SCRIPT = {
    "author": [
        [{"content": "Looking first.", "tool_calls": [{"name": "readSamples", "arguments": {"limit": 2}}],
          "usage": {"prompt_tokens": 100, "completion_tokens": 7}},
         {"content": "Done."}],
        {"turns": [{"tool_calls": [{"name": "readContext", "arguments": {}}]}], "repeat_last": True},
    ],
}


async def _call(url: str, model: str, messages: list[dict[str, Any]]) -> Any:
    import litellm

    return await litellm.acompletion(model=f"openai/{model}", messages=messages, api_base=url, api_key="sk-driver",
                                     num_retries=0, tools=[{"type": "function", "function": {
                                         "name": "readSamples", "parameters": {"type": "object", "properties": {}}}}])


async def test_turns_replay_in_order_per_conversation_and_every_request_is_recorded() -> None:
    llm = ScriptedLlm(scripts=parse_script(SCRIPT))
    server = await start_scripted_llm(llm, port=free_port())
    try:
        opening = [{"role": "system", "content": "sys"}, {"role": "user", "content": "first conversation"}]
        first = await _call(server.url, "author", opening)
        call = first.choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == ("readSamples", {"limit": 2})
        assert first.choices[0].message.content == "Looking first."
        assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (100, 7)
        again = await _call(server.url, "author", opening)  # a retry of the same request: the same turn
        assert again.choices[0].message.tool_calls[0].id == call.id

        follow = [*opening, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "readSamples", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "rows"}]
        second = await _call(server.url, "author", follow)
        assert second.choices[0].message.content == "Done." and not second.choices[0].message.tool_calls
        assert second.usage.prompt_tokens > 0 and second.usage.completion_tokens > 0, "estimated when unscripted"

        other = [{"role": "system", "content": "sys"}, {"role": "user", "content": "second conversation"}]
        for _ in range(3):  # repeat_last: the last turn forever
            reply = await _call(server.url, "author", other)
            other = [*other, {"role": "assistant", "content": None, "tool_calls": [
                {"id": reply.choices[0].message.tool_calls[0].id, "type": "function",
                 "function": {"name": "readContext", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id, "content": "ctx"}]
            assert reply.choices[0].message.tool_calls[0].function.name == "readContext"

        import litellm

        with pytest.raises(litellm.BadRequestError, match=r"script_exhausted|has 2 scripted conversations"):
            await _call(server.url, "author", [{"role": "user", "content": "a third conversation"}])
        with pytest.raises(litellm.NotFoundError, match="no script for model"):
            await _call(server.url, "nobody", opening)

        recorded = llm.requests_for("author")
        assert [(r.conversation, r.turn, r.status) for r in recorded[:3]] == [(0, 0, 200), (0, 0, 200), (0, 1, 200)]
        assert recorded[0].headers["authorization"] == "Bearer sk-driver"
        assert recorded[0].messages == opening and recorded[0].body["tools"][0]["function"]["name"] == "readSamples"
        assert recorded[-1].status == 400
        async with httpx.AsyncClient() as http:
            listed = (await http.get(server.url.removesuffix("/v1") + "/_scripted/requests")).json()
        assert len(listed) == len(llm.requests)
    finally:
        await server.close()


async def test_cli_serves_a_script_file(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchwright.cli", "scripted-llm", "--script", str(script), "--port", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as http:
            while True:
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.returncode is None, "the scripted-llm command exited"
                assert time.monotonic() < deadline, "the scripted LLM did not come up"
                await asyncio.sleep(0.05)
            models = (await http.get(f"http://127.0.0.1:{port}/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["author"]
        reply = await _call(f"http://127.0.0.1:{port}/v1", "author", [{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.tool_calls[0].function.name == "readSamples"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
