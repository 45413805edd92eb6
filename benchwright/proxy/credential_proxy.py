"""The credential proxy (§4, §11): one long-lived process per worker holding the provider keys, one route per run.

A run's route is registered by Attach over the proxy's control socket: the run's model (identifier, ``api_base``,
``params``, per-token prices) with its real key, under a per-run key the proxy made up for it. The scorer side and
the worker's own model calls present only the per-run key; the proxy looks the route up by it, puts the real key on
the upstream request and answers in OpenAI's chat-completions shape with the call's cost in the
``x-litellm-response-cost`` header (what LiteLLM's proxy reports, so ``cost.model`` is the proxy's figure). When
the run ends its route is revoked: the per-run key is refused from then on (401) and the real key is dropped.

Two ways upstream, chosen per route:

* ``openai`` (model strings LiteLLM routes as OpenAI-compatible, ``openai/<name>``): the request body is forwarded
  as it came, model name swapped, over ``benchwright.llm.httpclient``'s keep-alive pool. ~0.15 ms of proxy CPU per call
  (see docs/performance.md, keyed runs), against 4-12 ms for LiteLLM's proxy, whose per-call CPU made a keyed run
  14x slower.
* ``litellm`` (every other provider): ``litellm.acompletion`` inside this process with the route's key. litellm is
  imported on the first such route only (~2 s, ~150 MB once per worker).

Both price each call the same way (``benchwright.llm.prices``): its reported usage at the route's per-token prices,
which Attach took from the launch or from LiteLLM's cost map for the launch's model string.

Served on loopback by ``benchwright.llm.httpserver``'s HTTP/1.1 protocol for the model calls (httptools, one write per
answer: 17-20 % less of this process's CPU per call than under uvicorn, docs/performance.md).
Controlled by JSON lines on a Unix socket in a 0700 directory that only this uid may use (checked with
``SO_PEERCRED``): ``hello``, ``register``, ``revoke``. The process exits on its own once it has had no route for
``--linger`` seconds (the warm window that spares back-to-back runs its start-up), on SIGTERM, and (started through
``_lifeline.py``) with the worker that started it. A ``--spare`` (a worker's proxy started ahead of any run, so that a
run after a quiet spell does not wait ~0.1-0.2 s for one: ``benchwright.proxy.model_proxy.keep_a_proxy_ready``)
starts its linger only once its first route is gone.

Run as a script (``python credential_proxy.py --control PATH --linger S``), not as ``-m benchwright.proxy...``: the
package's ``__init__`` imports the egress proxy (~150 ms, ~10 MB) that this process never uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchwright import fastjson
from benchwright.llm import httpserver
from benchwright.llm.httpclient import ConnectionShelf, HttpClientError, HttpConnectError, HttpPool
from benchwright.llm.prices import Prices

UPSTREAM_TIMEOUT_S = 600.0
"""Bound on one upstream call; the caller's own per-try timeout is normally far shorter (it retries on its side)."""
MAX_REQUEST_BYTES = 16 * 1024 * 1024
CHAT_PATHS = (b"/v1/chat/completions", b"/chat/completions")
MODELS_PATHS = (b"/v1/models", b"/models")
LISTING_PATH = b"/v1/benchwright/listing"
"""Attach's cheap liveness check (``benchwright.llm.sut.listed_at_proxy``): whether the provider, asked with the real
key, lists the route's model (its ``GET /models``: one round trip, no tokens, no generation latency)."""
LISTING_TIMEOUT_S = 10.0
FAILURE_HEADER = "x-benchwright-failure"
"""Set on a 502/504 the proxy answers itself: ``unreachable``, ``server`` or ``timeout`` (the upstream's fault, not
the proxy's), so the caller classifies it as if it had called the provider directly."""
COST_HEADER = "x-litellm-response-cost"
IDLE_S = 75.0
"""A kept-alive connection with no request for this long is closed (uvicorn's ``timeout_keep_alive`` here before)."""
REQUEST_S = 60.0
"""A request whose head and body are not all in within this long of its first byte is cut off (a slow trickle too)."""
SWEEP_EVERY_S = 5.0
SHUTDOWN_GRACE_S = 2.0
"""On SIGTERM or the linger's end, answers being made get this long before their connections are cut."""
_WANTED_HEADERS = frozenset((b"authorization", b"content-length", b"expect"))
_JSON = b"application/json"


@dataclass
class Route:
    """One run's way to its model, and the real key it needs (held here only)."""

    run_id: str
    model_name: str
    """The name callers use (the launch's model identifier)."""
    identifier: str
    api_base: str | None
    params: dict[str, Any]
    input_cost_per_token: float
    output_cost_per_token: float
    launch_prices: bool
    """Whether the prices are the launch's own (else LiteLLM's cost map's, and the litellm route asks LiteLLM)."""
    secret: str | None = field(repr=False)
    registered_at: float = field(default_factory=time.time)
    calls: int = 0
    cost_usd: float = 0.0
    pool: HttpPool | None = None

    @property
    def kind(self) -> str:
        return "openai" if self.identifier.startswith("openai/") else "litellm"

    @property
    def upstream_model(self) -> str:
        """The provider's own name of the model (``openai/gpt-4o`` → ``gpt-4o``); an identifier without a provider
        (the API refuses those, an older run may hold one) is its own name, never an exception."""
        _, slash, name = self.identifier.partition("/")
        return name if slash and name else self.identifier

    def accepts(self, model: object) -> bool:
        return model is None or model in (self.model_name, self.upstream_model)

    def price(self, usage: object) -> float:
        """The call's cost: its reported usage at the route's prices (``benchwright.llm.prices``), every provider."""
        return Prices(self.input_cost_per_token, self.output_cost_per_token).cost(usage)


@dataclass
class Answer:
    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def error_answer(status: int, message: str, *, code: str, failure: str | None = None) -> Answer:
    """An error in OpenAI's shape (what SDKs and ``benchwright.llm.sut`` read)."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else "api_error",
                                 "code": code}}).encode()
    headers = [(FAILURE_HEADER.encode(), failure.encode())] if failure else []
    return Answer(status, body, headers)


def _stream_usage(body: bytes) -> object:
    """The ``usage`` of a streamed answer (its last chunk carries it when ``stream_options.include_usage``)."""
    for line in reversed(body.splitlines()):
        if line.startswith(b"data:") and b'"usage"' in line:
            with contextlib.suppress(ValueError):
                chunk = json.loads(line[5:])
                if isinstance(chunk, dict) and chunk.get("usage"):
                    return chunk["usage"]
    return None


def _wire(answer: Answer) -> httpserver.Answer:
    """The protocol's answer: the content type (JSON unless the answer names another), the other headers, no
    latency."""
    content_type = _JSON
    extra = []
    for name, value in answer.headers:
        if name == b"content-type":
            content_type = value
        else:
            extra.append((name, value))
    return answer.status, content_type, answer.body, httpserver.header_lines(extra), 0.0


_TOO_LARGE = httpserver.error_response(413, _JSON, error_answer(
    413, f"request body over {MAX_REQUEST_BYTES} bytes", code="payload_too_large").body)


class CredentialProxy:
    """The routes, the model-call server's handler (``benchwright.llm.httpserver.Handler``) and the control
    socket's (module docstring)."""

    max_body = MAX_REQUEST_BYTES
    wanted_headers = _WANTED_HEADERS
    too_large = _TOO_LARGE

    def __init__(self, *, linger_s: float, loop: asyncio.AbstractEventLoop | None = None, spare: bool = False) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self.spare = spare
        """Started ahead of any run: no linger until a route has come and gone (then as any proxy)."""
        self.connections: set[httpserver.Connection] = set()
        self._all_closed: asyncio.Future[None] | None = None
        self.linger_s = linger_s
        self.routes: dict[str, Route] = {}
        """Per-run key -> route."""
        self.keys: dict[str, str] = {}
        """Run id -> per-run key."""
        self.closing = False
        self.port = 0
        self.on_idle: Callable[[], None] = lambda: None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._registering = 0
        """Registrations under way (a litellm route's import takes seconds): the proxy is not idle meanwhile."""
        self._litellm: Any = None
        self.upstream = ConnectionShelf()
        """Idle connections to providers that ended routes left, for the next route to the same origin (the same
        approved address, host, port and trust store): each request carries its own route's key, so the next run's
        first calls need not open their connections afresh (~0.1 ms of this process each, 128 at C=128)."""

    # -- model calls (benchwright.llm.httpserver) ----------------------------------------------------------------

    def answer(self, method: bytes, target: bytes, body: bytes, headers: dict[bytes, bytes],
               transport: asyncio.Transport) -> httpserver.Answer | Coroutine[Any, Any, httpserver.Answer]:
        """One request's answer: at once for what needs no upstream call, else the coroutine that makes the call."""
        path = httpserver.split_target(target)[0]
        if path == b"/health":
            return _wire(Answer(200, b'{"status":"ok"}'))
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        route = self.routes.get(token.strip() if scheme.lower() == "bearer" else "")
        if route is None:
            return _wire(error_answer(401, "invalid key: not a key of a running run (a run's key stops working "
                                           "when the run ends)", code="invalid_api_key"))
        if path == LISTING_PATH and method == b"GET":
            return self._wired(self._listing(route))
        if path in MODELS_PATHS and method == b"GET":
            return _wire(Answer(200, json.dumps({"object": "list", "data": [
                {"id": route.model_name, "object": "model", "owned_by": "benchwright"}]}).encode()))
        shown = f"{method.decode('latin-1')} {path.decode('utf-8', 'replace')}"
        if path not in CHAT_PATHS:
            return _wire(error_answer(404, f"the proxy serves POST /v1/chat/completions, not {shown}",
                                      code="not_found"))
        if method != b"POST":
            return _wire(error_answer(405, f"{shown} is not allowed", code="method_not_allowed"))
        try:
            request = fastjson.loads(body)
        except (ValueError, RecursionError):
            return _wire(error_answer(400, "the request body is not JSON", code="invalid_json"))
        if not isinstance(request, dict):
            return _wire(error_answer(400, "the request body is not a JSON object", code="invalid_json"))
        if not route.accepts(request.get("model")):
            return _wire(error_answer(404, f"model '{request.get('model')}' is not this run's model "
                                           f"('{route.model_name}')", code="model_not_found"))
        return self._call(route, request)

    async def _call(self, route: Route, request: dict[str, Any]) -> httpserver.Answer:
        call = self._openai if route.kind == "openai" else self._via_litellm
        answer = await call(route, request)
        route.calls += 1
        return _wire(answer)

    @staticmethod
    async def _wired(made: Coroutine[Any, Any, Answer]) -> httpserver.Answer:
        return _wire(await made)

    def connection_closed(self, connection: httpserver.Connection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._all_closed is not None and not self._all_closed.done():
            self._all_closed.set_result(None)

    async def close_connections(self, grace_s: float) -> None:
        """Close idle connections now and the others once their answer is out, or after ``grace_s``."""
        for connection in list(self.connections):
            connection.shutdown()
        if self.connections:
            self._all_closed = self.loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed, grace_s)
        for connection in list(self.connections):
            connection.transport.abort()

    async def _listing(self, route: Route) -> Answer:
        """``{"listed": bool, "status": int | None}``: whether the provider's ``GET /models`` (asked with the real
        key) answered 200 and named the route's model. ``listed: false`` says nothing about why (no such route, a
        refused key, an unknown model, a provider without a listing, a LiteLLM-routed provider): the caller then
        spends a one-token completion, whose error is the one worth reporting."""
        if route.kind != "openai" or route.pool is None:
            return Answer(200, b'{"listed": false, "status": null}')
        try:
            resp = await asyncio.wait_for(route.pool.get("/models"), LISTING_TIMEOUT_S)
        except (HttpClientError, TimeoutError):
            return Answer(200, b'{"listed": false, "status": null}')
        listed = False
        if resp.status == 200:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                data = json.loads(resp.body).get("data")
                listed = any(isinstance(m, dict) and m.get("id") == route.upstream_model for m in data)
        return Answer(200, json.dumps({"listed": listed, "status": resp.status}).encode())

    async def _openai(self, route: Route, request: dict[str, Any]) -> Answer:
        assert route.pool is not None
        payload = fastjson.dumps_bytes({**route.params, **request, "model": route.upstream_model})
        try:
            resp = await route.pool.post("/chat/completions", payload, timeout_s=UPSTREAM_TIMEOUT_S)
        except HttpConnectError as exc:
            reason = "connection refused" if isinstance(exc.__cause__, ConnectionRefusedError) else str(exc)
            return error_answer(502, reason, code="upstream_unreachable", failure="unreachable")
        except HttpClientError as exc:
            return error_answer(502, f"the provider broke off the answer: {exc}", code="upstream_error",
                                failure="server")
        except TimeoutError:
            return error_answer(504, f"no answer within {UPSTREAM_TIMEOUT_S:g} s", code="upstream_timeout",
                                failure="timeout")
        headers = [(b"retry-after", resp.headers["retry-after"].encode())] if "retry-after" in resp.headers else []
        if resp.status < 400:
            streamed = resp.headers.get("content-type", "").startswith("text/event-stream")
            try:
                usage = _stream_usage(resp.body) if streamed else fastjson.loads(resp.body).get("usage")
            except (ValueError, AttributeError):
                usage = None
            cost = route.price(usage)
            route.cost_usd += cost
            headers.append((COST_HEADER.encode(), repr(cost).encode()))
            if streamed:
                return Answer(resp.status, resp.body, [(b"content-type", b"text/event-stream"), *headers])
        return Answer(resp.status, resp.body, headers)

    async def _via_litellm(self, route: Route, request: dict[str, Any]) -> Answer:
        if request.get("stream"):
            return error_answer(400, f"streaming is served for OpenAI-compatible models only, not "
                                     f"'{route.identifier}'", code="stream_unsupported")
        litellm = self._import_litellm()
        from benchwright.llm.sut import (
            _litellm_error,  # the same classification as a direct litellm call
        )

        kwargs = {**route.params, **{k: v for k, v in request.items() if k != "model"}}
        if route.api_base:
            kwargs["api_base"] = route.api_base
        if route.secret:
            kwargs["api_key"] = route.secret
        try:
            resp = await litellm.acompletion(model=route.identifier, timeout=UPSTREAM_TIMEOUT_S, **kwargs)
        except Exception as exc:  # noqa: BLE001 - litellm raises many provider-specific types: all are failures
            error = _litellm_error(exc, route.api_base or "")
            if error.kind in ("unreachable", "timeout", "server") and error.status is None:
                return error_answer(504 if error.kind == "timeout" else 502, error.detail, code="upstream_error",
                                    failure=error.kind)
            return error_answer(error.status or 400, error.detail, code="upstream_error")
        data = resp.model_dump()
        # The route's prices (the launch's, else LiteLLM's cost map's for the launch's model string), not
        # completion_cost on the reply: the reply's ``model`` is the provider's word, and an unlisted one priced $0.
        cost = route.price(data.get("usage"))
        route.cost_usd += cost
        return Answer(200, json.dumps(data).encode(), [(COST_HEADER.encode(), repr(cost).encode())])

    def _import_litellm(self) -> Any:
        if self._litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm

            self._litellm = litellm
        return self._litellm

    # -- control (JSON lines on the Unix socket) -----------------------------------------------------------------

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            if uid != os.getuid():
                return
            while line := await reader.readline():
                try:
                    reply = await self.command(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    reply = {"ok": False, "error": f"bad command: {type(exc).__name__}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "hello":
            return {"ok": not self.closing, "port": self.port, "pid": os.getpid(), "routes": len(self.routes),
                    "runs": sorted(self.keys), "spare": self.spare}
        if op == "register":
            if self.closing:
                return {"ok": False, "error": "closing"}
            return await self._register(cmd)
        if op == "revoke":
            return await self._revoke(cmd["run_id"])
        return {"ok": False, "error": f"unknown op {op!r}"}

    async def _register(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._registering += 1
        self._arm_idle()
        try:
            return await self._add_route(cmd)
        finally:
            self._registering -= 1
            self._arm_idle()

    async def _add_route(self, cmd: dict[str, Any]) -> dict[str, Any]:
        spec = cmd["route"]
        old = self.keys.get(cmd["run_id"])
        previous = self.routes.pop(old) if old is not None else None
        if previous is not None and previous.pool is not None:
            await previous.pool.aclose()
        route = Route(run_id=cmd["run_id"], model_name=spec["model_name"], identifier=spec["identifier"],
                      api_base=spec.get("api_base"), params=dict(spec.get("params") or {}),
                      input_cost_per_token=float(spec["input_cost_per_token"]),
                      output_cost_per_token=float(spec["output_cost_per_token"]),
                      launch_prices=bool(spec.get("launch_prices")), secret=cmd.get("secret"))
        if previous is not None:
            route.calls, route.cost_usd, route.registered_at = previous.calls, previous.cost_usd, previous.registered_at
        if route.kind == "openai":
            base = (route.api_base or "https://api.openai.com/v1").rstrip("/")
            headers = {"Authorization": f"Bearer {route.secret}"} if route.secret else {}
            # connect_address: the address Attach's endpoint check approved (benchwright.llm.model_access), so the
            # calls cannot be rebound to an internal address by a later DNS answer
            route.pool = HttpPool(base, headers=headers, max_idle=int(spec.get("max_idle", 256)),
                                  connect_address=spec.get("connect_address"), shelf=self.upstream)
        else:
            await asyncio.to_thread(self._import_litellm)  # at Attach, not on the first scored call
        self.routes[cmd["key"]] = route
        self.keys[route.run_id] = cmd["key"]
        self.spare = False  # it serves now: once its routes are gone, it lingers and exits as any proxy
        return {"ok": True}

    async def _revoke(self, run_id: str) -> dict[str, Any]:
        key = self.keys.pop(run_id, None)
        route = self.routes.pop(key, None) if key is not None else None
        if route is not None and route.pool is not None:
            await route.pool.aclose()
        self._arm_idle()
        if route is None:
            return {"ok": True, "found": False, "idle": not self.routes}
        return {"ok": True, "found": True, "calls": route.calls, "cost_usd": route.cost_usd,
                "lifetime_s": time.time() - route.registered_at, "idle": not self.routes}

    def _arm_idle(self) -> None:
        """Exit after ``linger_s`` without a route (re-armed on every change); a spare waits for its first route."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if not self.routes and not self._registering and not self.spare:
            self._idle_timer = asyncio.get_running_loop().call_later(self.linger_s, self._idle_exit)

    def _idle_exit(self) -> None:
        if not self.routes and not self._registering:
            self.closing = True
            self.on_idle()


async def serve(*, control: Path, linger_s: float, spare: bool = False) -> None:
    loop = asyncio.get_running_loop()
    proxy = CredentialProxy(linger_s=linger_s, loop=loop, spare=spare)
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and accepted
    # sockets inherit the listener's. Without it an answer met Nagle and the caller's delayed ACK: +40 ms on every
    # call over a reused connection (1,000 calls at C=32: 3.8 s, not 1.9 s).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    proxy.port = listener.getsockname()[1]
    server = await loop.create_server(lambda: httpserver.Connection(proxy), sock=listener,
                                      backlog=httpserver.BACKLOG)
    stop = asyncio.Event()
    proxy.on_idle = stop.set
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    control_server = await asyncio.start_unix_server(proxy.control, path=str(control))
    control.chmod(0o600)
    proxy._arm_idle()
    sweeper = asyncio.create_task(_sweep_until_cancelled(proxy))
    try:
        await stop.wait()
    finally:
        proxy.closing = True
        sweeper.cancel()
        control_server.close()
        control.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            control.parent.rmdir()
        await _close_server(server, proxy)


async def _sweep_until_cancelled(proxy: CredentialProxy) -> None:
    """Close connections idle past ``IDLE_S`` or stalled mid-request past ``REQUEST_S`` (httpserver.sweep)."""
    while True:
        await asyncio.sleep(SWEEP_EVERY_S)
        httpserver.sweep(proxy.connections, idle_s=IDLE_S, request_s=REQUEST_S)


async def _close_server(server: asyncio.Server, proxy: CredentialProxy) -> None:
    """Stop listening; idle connections close now, the others after their answer or ``SHUTDOWN_GRACE_S``."""
    server.close()
    await proxy.close_connections(SHUTDOWN_GRACE_S)
    for route in list(proxy.routes.values()):
        if route.pool is not None:
            await route.pool.aclose()
    proxy.upstream.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Benchwright's credential proxy (started by a worker).")
    ap.add_argument("--control", type=Path, required=True)
    ap.add_argument("--linger", type=float, required=True)
    ap.add_argument("--spare", action="store_true", help="started ahead of any run: no linger before a first route")
    args = ap.parse_args(argv)
    # asyncio's own loop: with this server uvloop saved nothing measurable (0.25 ms a call either way, session 18).
    asyncio.run(serve(control=args.control, linger_s=args.linger, spare=args.spare))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
