"""The dev model's canned tool calls: an OpenAI-shaped assistant message (and stream) when the request offers tools,
the answer table's reply when it does not."""

from __future__ import annotations

import json

import httpx
import pytest

from benchwright.testkit.devmodel import DevModelConfig, start_server

TOOLS = [{"type": "function", "function": {"name": "weather_get", "parameters": {"type": "object"}}}]
CALLS = {"Weather in Paris?": [{"name": "weather_get", "arguments": {"city": "Paris"}}]}


@pytest.mark.asyncio
async def test_tool_calls_only_when_tools_are_offered() -> None:
    config = DevModelConfig(answers={"Weather in Paris?": "Sunny."}, tool_calls=CALLS)
    async with await start_server(config) as server, httpx.AsyncClient(base_url=server.url) as http:
        ask = {"model": "dev", "messages": [{"role": "user", "content": "Please: Weather in Paris?"}]}
        called = (await http.post("/chat/completions", json={**ask, "tools": TOOLS})).json()
        plain = (await http.post("/chat/completions", json=ask)).json()
        stream = (await http.post("/chat/completions", json={**ask, "tools": TOOLS, "stream": True})).text
    choice = called["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "weather_get" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert called["usage"]["completion_tokens"] > 0
    assert plain["choices"][0]["message"]["content"] == "Sunny." and "tool_calls" not in plain["choices"][0]["message"]
    chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "weather_get"
    assert chunks[0]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and stream.rstrip().endswith("data: [DONE]")
