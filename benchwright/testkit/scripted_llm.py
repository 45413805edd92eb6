"""``benchwright scripted-llm``: a TEST DOUBLE for an OpenAI-compatible chat-completions provider that plays a
Driver's part from a script.

This is **not a language model**. It replays scripted assistant turns (text and/or ``tool_calls``) so the LLM
driver's tool-calling loop can be exercised end to end, offline and deterministically, and it records every
request it receives so tests can assert what the Driver sent (and that no credential leaked into it).

How it answers:

* A script maps a model name (the ``model`` field of the request, i.e. what follows ``<provider>://`` in the
  driver string) to a list of conversations; each conversation is a list of turns played in order.
* A conversation is recognised by its opening: the messages before the first assistant message (the Driver's
  system prompt and first user message). The first request with an opening it has not seen takes the model's
  next unused conversation; a request carrying *n* assistant messages gets turn *n* of it. Answers depend only on
  the request, so a retried request gets the same turn again.
* Past its last turn a conversation answers 400 ``script_exhausted`` (a test whose Driver talks longer than its
  script fails loudly), unless it is marked ``repeat_last`` (the last turn forever: how budget tests run a Driver
  that never finishes).
* Every reply reports ``usage``: the turn's scripted ``usage`` if given, else ~4 characters per token of the
  request's messages and of the reply, so spend can be computed.

Script file (JSON or YAML)::

    {"scorer-author": [                      # model name -> conversations
        [                                    # a conversation as a bare list of turns
          {"tool_calls": [{"name": "read_samples", "arguments": {"limit": 3}}]},
          {"content": "Done.", "tool_calls": [{"name": "finish_phase", "arguments": {"summary": "ok"}}],
           "usage": {"prompt_tokens": 120, "completion_tokens": 30}}
        ],
        {"turns": [{"tool_calls": [{"name": "read_context", "arguments": {}}]}], "repeat_last": true}
    ]}

Endpoints: ``POST /v1/chat/completions`` (and ``/chat/completions``), ``GET /v1/models``, ``GET /health``, and
``GET /_scripted/requests`` (the recorded requests, for a double run from the CLI). ``stream: true`` is refused:
the Driver does not stream. It is a small Starlette app on uvicorn: it answers a handful of requests per test, so
its speed is not measured (the dev model's hand-written server exists because benchmarks measure it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from pydantic import BaseModel, Field, TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


class ScriptedToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedUsage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class ScriptedTurn(BaseModel):
    """One assistant reply: text, tool calls, or both."""

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    usage: ScriptedUsage | None = None
    """Reported as-is when given (tests that price spend exactly); else estimated from the text sizes."""


class ScriptedConversation(BaseModel):
    turns: list[ScriptedTurn] = Field(min_length=1)
    repeat_last: bool = False
    """Answer every request past the end with the last turn (a Driver that never finishes)."""


_CONVERSATIONS = TypeAdapter(dict[str, list[ScriptedConversation | list[ScriptedTurn]]])


def parse_script(data: Any) -> dict[str, list[ScriptedConversation]]:
    """A script as loaded from JSON/YAML: ``{model: [conversation | [turn, ...], ...]}``.

    Raises:
        pydantic.ValidationError: the script is not of that shape.
    """
    parsed = _CONVERSATIONS.validate_python(data)
    return {model: [c if isinstance(c, ScriptedConversation) else ScriptedConversation(turns=c) for c in convs]
            for model, convs in parsed.items()}


def load_script(path: Path) -> dict[str, list[ScriptedConversation]]:
    """Read a script file (JSON, or YAML by its suffix)."""
    text = path.read_text()
    return parse_script(yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text))


@dataclass
class RecordedRequest:
    """One chat-completions request as received, with what it was answered."""

    model: str
    body: dict[str, Any]
    headers: dict[str, str]
    conversation: int | None
    turn: int | None
    status: int
    response: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    def text(self) -> str:
        """Everything the request carried (headers and body) as one string, for leak checks."""
        return json.dumps({"headers": self.headers, "body": self.body}, ensure_ascii=False)


def _opening(messages: list[dict[str, Any]]) -> str:
    prefix: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant":
            break
        prefix.append(m)
    return hashlib.sha256(json.dumps(prefix, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "code": code}}


@dataclass
class ScriptedLlm:
    """The double's state: scripts by model, which opening took which conversation, and every request seen."""

    scripts: dict[str, list[ScriptedConversation]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    gate: asyncio.Event | None = None
    """While set to an Event, chat requests wait for it before they are answered (a slow provider a test releases)."""
    _assigned: dict[tuple[str, str], int] = field(default_factory=dict)
    _next: dict[str, int] = field(default_factory=dict)

    def add(self, model: str, conversations: list[ScriptedConversation]) -> None:
        """Script (or re-script) a model; tests give each scenario its own model name."""
        self.scripts[model] = conversations
        self._next[model] = 0
        for key in [k for k in self._assigned if k[0] == model]:
            del self._assigned[key]

    def requests_for(self, model: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.model == model]

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """The reply to one request (status, JSON body); the request is recorded either way."""
        model = str(body.get("model", ""))
        conversation = turn = None
        messages = body.get("messages")
        if body.get("stream"):
            status, reply = _error(400, "stream_unsupported", "the scripted LLM does not stream")
        elif not isinstance(messages, list) or not messages:
            status, reply = _error(400, "invalid_messages", "messages must be a non-empty list")
        elif model not in self.scripts:
            status, reply = _error(404, "model_not_found", f"no script for model {model!r}; scripted: "
                                   f"{', '.join(sorted(self.scripts)) or 'none'}")
        else:
            key = (model, _opening(messages))
            if key not in self._assigned:
                self._assigned[key] = self._next.get(model, 0)
                self._next[model] = self._assigned[key] + 1
            conversation = self._assigned[key]
            turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
            status, reply = self._play(model, conversation, turn, messages)
        self.requests.append(RecordedRequest(model=model, body=body, headers=headers, conversation=conversation,
                                             turn=turn, status=status, response=reply))
        return status, reply

    def _play(self, model: str, conversation: int, turn: int,
              messages: list[Any]) -> tuple[int, dict[str, Any]]:
        convs = self.scripts[model]
        if conversation >= len(convs):
            return _error(400, "script_exhausted", f"model {model!r} has {len(convs)} scripted conversations; a "
                          f"request opened conversation {conversation + 1}")
        script = convs[conversation]
        if turn >= len(script.turns) and not script.repeat_last:
            return _error(400, "script_exhausted", f"conversation {conversation + 1} of model {model!r} has "
                          f"{len(script.turns)} turns; the request asks for turn {turn + 1}")
        scripted = script.turns[min(turn, len(script.turns) - 1)]
        tool_calls = [{"id": f"call_{conversation}_{turn}_{i}", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                      for i, c in enumerate(scripted.tool_calls)]
        message: dict[str, Any] = {"role": "assistant", "content": scripted.content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        usage = scripted.usage or ScriptedUsage(
            prompt_tokens=_tokens(json.dumps(messages, ensure_ascii=False)),
            completion_tokens=_tokens((scripted.content or "") + json.dumps(tool_calls)))
        return 200, {
            "id": f"chatcmpl-scripted-{conversation}-{turn}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                      "total_tokens": usage.prompt_tokens + usage.completion_tokens},
        }

    def app(self) -> Starlette:
        async def chat(request: Request) -> JSONResponse:
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse(_error(400, "invalid_json", "the body is not JSON")[1], status_code=400)
            if not isinstance(body, dict):
                return JSONResponse(_error(400, "invalid_json", "the body must be a JSON object")[1], status_code=400)
            if self.gate is not None:
                await self.gate.wait()
            status, reply = self.answer(body, dict(request.headers))
            return JSONResponse(reply, status_code=status)

        async def models(_: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "owned_by": "scripted"}
                                                            for m in sorted(self.scripts)]})

        async def health(_: Request) -> JSONResponse:
            return JSONResponse({"ok": True})

        async def recorded(_: Request) -> JSONResponse:
            return JSONResponse([{"model": r.model, "conversation": r.conversation, "turn": r.turn,
                                  "status": r.status, "body": r.body, "headers": r.headers, "response": r.response}
                                 for r in self.requests])

        return Starlette(routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]), Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models), Route("/models", models), Route("/health", health),
            Route("/_scripted/requests", recorded),
        ])


@dataclass
class ScriptedLlmServer:
    """A running double inside the caller's event loop."""

    llm: ScriptedLlm
    url: str
    """Base URL ending in ``/v1`` (what ``api_base`` takes)."""
    _server: uvicorn.Server
    _task: asyncio.Task[None]

    async def close(self) -> None:
        self._server.should_exit = True
        await self._task


async def start_scripted_llm(llm: ScriptedLlm, *, port: int, host: str = "127.0.0.1",
                             start_timeout_s: float = 10.0) -> ScriptedLlmServer:
    """Serve ``llm`` on ``host:port`` in the running event loop; returns once it accepts connections."""
    server = uvicorn.Server(uvicorn.Config(llm.app(), host=host, port=port, log_level="warning", access_log=False,
                                           lifespan="off"))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"the scripted LLM on {host}:{port} stopped while starting")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the scripted LLM on {host}:{port} did not start within {start_timeout_s} s")
        await asyncio.sleep(0.01)
    return ScriptedLlmServer(llm=llm, url=f"http://{host}:{port}/v1", _server=server, _task=task)


def serve(llm: ScriptedLlm, *, host: str, port: int) -> None:
    """Run the double in the foreground (the CLI command) until interrupted."""
    uvicorn.run(llm.app(), host=host, port=port, log_level="warning", access_log=False, lifespan="off")
