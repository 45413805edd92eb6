"""A TEST DOUBLE of Anthropic's Messages API (``POST /v1/messages``), for metering tests of LiteLLM-routed models.

This is **not a language model**. It answers each request with the answer its question has in a table (the same
question-matching as ``benchwright devmodel``: the longest known question contained in the last user message),
and reports the ``usage`` it was configured with (e.g. 100,000 input and 20,000 output tokens per call), so a test
can assert that a provider's reported tokens are priced. LiteLLM's ``anthropic/<model>`` provider reaches it with
``api_base`` pointed here: it speaks the wire format that provider sends and reads.

Wire format (Anthropic Messages, version 2023-06-01):

* request: ``{"model", "max_tokens", "messages": [{"role", "content": str | [{"type": "text", "text"}]}],
  "system"?, ...}`` with ``x-api-key`` and ``anthropic-version`` headers;
* answer: ``{"id": "msg_…", "type": "message", "role": "assistant", "model", "content": [{"type": "text",
  "text"}], "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens", "output_tokens"}}``;
* errors: ``{"type": "error", "error": {"type": "invalid_request_error" | "authentication_error", "message"}}``.

A request without the configured ``x-api-key`` answers 401 (so a test sees the real key reached the provider).
Every request is recorded (``requests``). Endpoints: ``POST /v1/messages`` (and ``/messages``), ``GET /health``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchwright.stack.devstack import free_port


@dataclass
class AnthropicDoubleConfig:
    answers: dict[str, str]
    """Question -> answer (``benchwright.testkit.devmodel.load_answers``)."""
    input_tokens: int = 10
    """What every answer reports as ``usage.input_tokens``."""
    output_tokens: int = 5
    api_key: str | None = None
    """When set, the ``x-api-key`` every request must carry."""
    reply_model: str | None = None
    """The ``model`` every answer names (default: the request's), like a gateway that serves another model than
    the one asked for, or an endpoint that says it is a cheap one: the reply's word is not what prices the call."""


@dataclass
class AnthropicDouble:
    config: AnthropicDoubleConfig
    url: str = ""
    """``http://127.0.0.1:<port>``: the ``api_base`` to give LiteLLM (it appends ``/v1/messages``)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def reply_for(self, text: str) -> str:
        found = [q for q in self.config.answers if q.strip() and q.strip() in text]
        return self.config.answers[max(found, key=len)] if found else "I don't know."

    async def messages(self, request: Request) -> JSONResponse:
        if self.config.api_key is not None and request.headers.get("x-api-key") != self.config.api_key:
            return _error(401, "authentication_error", "invalid x-api-key")
        try:
            body = json.loads(await request.body())
            messages = body["messages"]
            assert isinstance(messages, list) and messages and isinstance(body.get("max_tokens"), int)
        except (ValueError, KeyError, TypeError, AssertionError):
            return _error(400, "invalid_request_error", "a Messages request needs model, max_tokens and messages")
        self.requests.append({"headers": dict(request.headers), "body": body})
        last = messages[-1].get("content")
        text = last if isinstance(last, str) else "\n".join(
            part.get("text", "") for part in last if isinstance(part, dict)) if isinstance(last, list) else ""
        return JSONResponse({
            "id": f"msg_double_{next(self._ids):06d}", "type": "message", "role": "assistant",
            "model": self.config.reply_model or body.get("model"),
            "content": [{"type": "text", "text": self.reply_for(text)}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": self.config.input_tokens, "output_tokens": self.config.output_tokens},
        })

    async def start(self) -> AnthropicDouble:
        app = Starlette(routes=[Route("/v1/messages", self.messages, methods=["POST"]),
                                Route("/messages", self.messages, methods=["POST"]),
                                Route("/health", lambda _: JSONResponse({"ok": True}))])
        port = free_port()
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                     access_log=False, lifespan="off"))
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


async def start_anthropic_double(config: AnthropicDoubleConfig) -> AnthropicDouble:
    """Start the double on a free loopback port in the running event loop."""
    return await AnthropicDouble(config).start()
