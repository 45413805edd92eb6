"""The dev model's HTTP/1.1 routes and precomputed responses, served by ``benchwright.llm.httpserver``'s protocol
(one ``asyncio.Protocol`` per connection: keep-alive, pipelining, ``Expect: 100-continue``, body limits)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from urllib.parse import quote

from benchwright.llm.httpserver import Answer, Connection, error_response, split_target, url_host
from benchwright.testkit.devmodel.config import _FAULT_ERRORS, UNKNOWN_REPLY, DevModelConfig
from benchwright.testkit.devmodel.replies import (
    _ENCODER,
    _JSON_CONTENT_TYPE,
    _SSE_CONTENT_TYPE,
    _BadRequest,
    _completion_body,
    _content_text,
    _error_body,
    _parse_request,
    _Responder,
    _stream_body,
    _usage,
)

# --------------------------------------------------------------------------------------------------
# HTTP/1.1 server (the protocol: benchwright.llm.httpserver, shared with the credential proxy)
# --------------------------------------------------------------------------------------------------

_MAX_BODY_BYTES = 64 * 1024 * 1024
# How long close() waits, beyond the configured latency, for in-flight answers before cutting them off.
_SHUTDOWN_GRACE_S = 5.0
# The only request headers looked at; the rest are dropped as they are parsed.
_WANTED_HEADERS = frozenset((b"authorization", b"content-length", b"expect", b"host"))

_NO_CACHE = b"cache-control: no-cache\r\n"
_POST = frozenset((b"POST",))
_GET = frozenset((b"GET", b"HEAD"))  # Starlette answered HEAD on every GET route; so does this
# Starlette's RedirectResponse quoting of the Location URL.
_LOCATION_SAFE = ":/%#?=@[]!$&'()*+,;"


class _CountedSet(set[Connection]):
    """The live connections, counting every one ever added (``DevModelServer.connections_opened``)."""

    opened = 0

    def add(self, connection: Connection) -> None:
        self.opened += 1
        super().add(connection)


def _too_large(limit: int) -> bytes:
    return error_response(413, _JSON_CONTENT_TYPE,
                          _error_body(f"Request body exceeds the {limit // 2**20} MiB limit."))


class _Handler:
    """What one server answers: routes, precomputed bodies and replies; plus its live connections."""

    def __init__(self, config: DevModelConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.responder = _Responder(config)
        self.loop = loop
        self.delay = config.latency_ms / 1000.0
        self.expected_auth = None if config.api_key is None else f"Bearer {config.api_key}".encode()
        models_body = json.dumps(
            {
                "object": "list",
                "data": [
                    {"id": config.model_name, "object": "model", "created": 0, "owned_by": "benchwright-dev"}
                ],
            }
        ).encode()
        # path -> (allowed methods, static body, or None for chat completions)
        self.routes: dict[bytes, tuple[frozenset[bytes], bytes | None]] = {
            b"/v1/chat/completions": (_POST, None),
            b"/chat/completions": (_POST, None),
            b"/v1/models": (_GET, models_body),
            b"/models": (_GET, models_body),
            b"/health": (_GET, b'{"ok": true}'),
        }
        self.counted = _CountedSet()
        self.connections: set[Connection] = self.counted
        self.closing = False
        self.max_body = _MAX_BODY_BYTES
        self.wanted_headers = _WANTED_HEADERS
        self.too_large = _too_large(_MAX_BODY_BYTES)
        self.all_closed: asyncio.Future[None] | None = None
        self.config = config
        self.chat_requests = 0
        self.chat_statuses: dict[int, int] = {}

    def answer(
        self,
        method: bytes,
        target: bytes,
        body: bytes,
        headers: dict[bytes, bytes],
        transport: asyncio.Transport,
    ) -> Answer:
        """Route one request and build its answer."""
        path, query = split_target(target)
        route = self.routes.get(path)
        if route is None:
            return self._unrouted(method, path, query, headers, transport)
        methods, static_body = route
        if method not in methods:
            return 405, _JSON_CONTENT_TYPE, _route_error("Method Not Allowed", method, path), b"", 0.0
        if static_body is not None:
            if (path != b"/health" and self.expected_auth is not None
                    and headers.get(b"authorization") != self.expected_auth):
                # OpenAI's model listing wants the key too (what Attach's listing check relies on)
                return 401, _JSON_CONTENT_TYPE, _error_body("Incorrect API key provided.", "invalid_api_key"), b"", 0.0
            return 200, _JSON_CONTENT_TYPE, static_body, b"", 0.0
        answer = self._chat_answer(body, headers)
        self.chat_statuses[answer[0]] = self.chat_statuses.get(answer[0], 0) + 1
        return answer

    def _chat_answer(self, body: bytes, headers: dict[bytes, bytes]) -> Answer:
        """A chat request's answer: its fault window's error, a refused key, an unknown model, or the reply."""
        n, self.chat_requests = self.chat_requests, self.chat_requests + 1
        for fault in self.config.faults:
            if fault.covers(n):
                message, kind, code = _FAULT_ERRORS[fault.status]
                error = {"error": {"message": message, "type": kind, "param": None, "code": code}}
                extra = b"retry-after: %s\r\n" % fault.retry_after.encode("latin-1") if fault.retry_after else b""
                return fault.status, _JSON_CONTENT_TYPE, _ENCODER.encode(error).encode(), extra, self.delay
        if self.expected_auth is not None and headers.get(b"authorization") != self.expected_auth:
            body = _error_body("Incorrect API key provided.", "invalid_api_key")
            return 401, _JSON_CONTENT_TYPE, body, b"", 0.0
        if self.config.known_models_only:
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError):
                model = None  # malformed: chat() answers 400
            if isinstance(model, str) and model != self.config.model_name:
                error = {"error": {"message": f"The model `{model}` does not exist or you do not have access to it.",
                                   "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
                return 404, _JSON_CONTENT_TYPE, _ENCODER.encode(error).encode(), b"", 0.0
        return self.chat(body)

    def _unrouted(
        self,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: dict[bytes, bytes],
        transport: asyncio.Transport,
    ) -> Answer:
        """404, or Starlette's 307 to the same path with/without a trailing slash when that is a route."""
        other = path.rstrip(b"/") if path.endswith(b"/") else path + b"/"
        if path != b"/" and other in self.routes:
            host = headers.get(b"host")
            if host is not None:
                netloc = host.decode("latin-1")
            else:
                address = transport.get_extra_info("sockname")
                netloc = f"{url_host(address[0])}:{address[1]}"
            location = f"http://{netloc}{other.decode('utf-8', 'replace')}"
            if query:
                location += f"?{query.decode('latin-1')}"
            extra = b"location: %s\r\n" % quote(location, safe=_LOCATION_SAFE).encode("latin-1")
            return 307, None, b"", extra, 0.0
        return 404, _JSON_CONTENT_TYPE, _route_error("Not Found", method, path), b"", 0.0

    def chat(self, raw: bytes) -> Answer:
        """Answer one chat-completions request body (authentication already checked)."""
        try:
            payload, messages = _parse_request(raw)
            texts = [_content_text(message.get("content")) for message in messages]
        except _BadRequest as exc:
            return 400, _JSON_CONTENT_TYPE, _error_body(str(exc)), b"", 0.0

        user_text: str | None = None
        turn = 0  # assistant messages since the last user message: an agent loop's turn
        for message, text in zip(reversed(messages), reversed(texts), strict=True):
            if message["role"] == "user":
                user_text = text
                break
            turn += message["role"] == "assistant"
        reply = UNKNOWN_REPLY if user_text is None else self.responder.reply_for(user_text)
        calls = (self.responder.tool_calls_for(user_text, turn) if user_text is not None and payload.get("tools")
                 else None)
        if calls:
            reply = json.dumps([call["function"] for call in calls])  # what the usage counts as completion

        model = payload.get("model")
        if not isinstance(model, str) or not model:
            model = self.responder.config.model_name
        usage = _usage(texts, reply)
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        created = int(time.time())

        if payload.get("stream") is True:
            options = payload.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            body = _stream_body(completion_id, created, model, reply, usage if include_usage else None, calls)
            return 200, _SSE_CONTENT_TYPE, body, _NO_CACHE, self.delay
        config = self.responder.config
        question = None if user_text is None or not config.reasoning else self.responder.find_question(user_text)
        thought = config.reasoning.get(question) if question is not None else None
        body = _completion_body(completion_id, created, model, reply, usage, calls,
                                (config.reasoning_key, thought) if thought else None)
        return 200, _JSON_CONTENT_TYPE, body, b"", self.delay

    def connection_closed(self, connection: Connection) -> None:
        """Forget ``connection``; wake up a shutdown waiting for the last one."""
        self.connections.discard(connection)
        if not self.connections and self.all_closed is not None and not self.all_closed.done():
            self.all_closed.set_result(None)


def _route_error(detail: str, method: bytes, path: bytes) -> bytes:
    """404/405 body, in OpenAI's error shape so SDK error messages stay readable."""
    return _error_body(f"{detail}: {method.decode('latin-1')} {path.decode('utf-8', 'replace')}")
