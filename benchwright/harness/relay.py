"""The harness's model endpoint: a per-batch OpenAI-compatible relay in the worker, in front of the run's SUT route.

A harness speaks HTTP chat completions; Benchwright's model route is ``benchwright.llm.sut.run_sut`` (through the run's
LiteLLM proxy with its fake key when Attach started one, else straight to a keyless endpoint). The relay joins the
two: it listens on the worker's loopback, accepts ``POST /v1/chat/completions`` only with its own per-batch key
(``Bearer <key>``, fresh random, never the provider's and never the proxy's), and forwards each call through the
run's ``SutClient``, so the harness gets exactly the route, prices, retries and breaker a scorer gets, and every
call's usage and cost are metered here. The harness reaches it only through its sandbox's egress proxy, which
admits this one ``127.0.0.1:<port>`` endpoint (``internal_allowed``).

Seam: once every run has its own model proxy with a per-run key (issue 12), the bridge can point the harness at
that proxy instead (``BridgeEndpoint`` is all it needs: a base URL and a key) and this relay only meters.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Generator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchwright.llm.sut import SutClient, SutError
from benchwright.stack.devstack import free_port

PASSED_PARAMS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "logit_bias", "n", "response_format")
"""Request fields forwarded to the model; everything else a harness sends (``stream``, ``logprobs`` options a
keyless dev endpoint would refuse, the model name) stays here: the run's model is fixed at launch."""
_STATUS = {"unreachable": 502, "auth": 502, "not_found": 502, "rate_limited": 429, "server": 502, "timeout": 504,
           "rejected": 400, "bad_reply": 502}
"""What the harness is told when the model call failed for good (``SutFailure``): never 401, which would blame
the harness's own key."""


@dataclass(frozen=True)
class BridgeEndpoint:
    """Where the harness sends its chat completions and the key it presents."""

    base_url: str
    """``http://127.0.0.1:<port>/v1`` on the worker's loopback (reached through the sandbox's egress proxy)."""
    key: str
    port: int


@dataclass
class Meter:
    """Usage and cost of the calls relayed so far (the bridge attributes them to samples)."""

    calls: int = 0
    failed: int = 0
    cost_usd: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)

    def add(self, usage: dict[str, int], cost_usd: float) -> None:
        self.calls += 1
        self.cost_usd += cost_usd
        for name, value in usage.items():
            self.usage[name] = self.usage.get(name, 0) + int(value)


class _QuietServer(uvicorn.Server):
    """uvicorn inside the worker: the worker's own signal handling stays as it is."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Relay:
    """Serve chat completions for one harness process; ``async with Relay(sut) as endpoint: ...``."""

    def __init__(self, sut: SutClient) -> None:
        self.sut = sut
        self.meter = Meter()
        self.key = "bw-harness-" + secrets.token_urlsafe(24)
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def _completions(self, request: Request) -> JSONResponse:
        if request.headers.get("authorization", "") != f"Bearer {self.key}":
            return _error(401, "invalid_api_key", "this endpoint takes only the key the bridge gave the harness")
        try:
            body = await request.json()
            messages = body["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
        except ClientDisconnect:  # the harness was stopped mid-request: nobody is left to answer
            return _error(499, "client_closed", "the harness went away")
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "invalid_request_error", f"not a chat completion request: {exc}")
        params = {name: body[name] for name in PASSED_PARAMS if body.get(name) is not None}
        try:
            reply = await self.sut.complete(messages, params)
        except SutError as exc:
            self.meter.failed += 1
            return _error(_STATUS.get(exc.kind, 502), exc.kind, str(exc))
        self.meter.add(reply.usage, reply.cost_usd)
        prompt, completion = reply.usage.get("prompt_tokens", 0), reply.usage.get("completion_tokens", 0)
        return JSONResponse({
            "id": f"chatcmpl-bw-{self.meter.calls}", "object": "chat.completion", "created": int(time.time()),
            "model": str(body.get("model", "")),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        })

    async def __aenter__(self) -> BridgeEndpoint:
        port = free_port()
        app = Starlette(routes=[Route("/v1/chat/completions", self._completions, methods=["POST"]),
                                Route("/chat/completions", self._completions, methods=["POST"])])
        self._server = _QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                   access_log=False, lifespan="off"))
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:  # binding a loopback port: a few ms
            if self._task.done():
                self._task.result()
                raise RuntimeError("the harness relay stopped while starting")
            await asyncio.sleep(0.005)
        return BridgeEndpoint(base_url=f"http://127.0.0.1:{port}/v1", key=self.key, port=port)

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": code, "code": code}}, status_code=status)
