"""The dev model's HTTP/1.1 protocol on ``httptools``: routes, precomputed responses and one ``asyncio.Protocol`` per
connection (keep-alive, pipelining, ``Expect: 100-continue``, body limits)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import deque
from http import HTTPStatus
from urllib.parse import quote, unquote_to_bytes

import httptools

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
# HTTP/1.1 server
# --------------------------------------------------------------------------------------------------

_log = logging.getLogger(__name__)

_MAX_BODY_BYTES = 64 * 1024 * 1024
# Pipelined requests held per connection before the server stops reading from it (back-pressure).
_MAX_QUEUED = 16
# After an error response that closes the connection, how long unread request bytes are drained.
_LINGER_S = 1.0
# How long close() waits, beyond the configured latency, for in-flight answers before cutting them off.
_SHUTDOWN_GRACE_S = 5.0
_BACKLOG = 2048  # uvicorn's default: benchmarks open hundreds of connections at once
# The only request headers looked at; the rest are dropped as they are parsed.
_WANTED_HEADERS = frozenset((b"authorization", b"content-length", b"expect", b"host"))

_STATUS_LINES = {
    status: b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())
    for status in (200, 307, 400, 401, 403, 404, 405, 413, 429, 500, 503)
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"connection: close\r\n"
_KEEP_ALIVE = b"connection: keep-alive\r\n"
_NO_CACHE = b"cache-control: no-cache\r\n"
_POST = frozenset((b"POST",))
_GET = frozenset((b"GET", b"HEAD"))  # Starlette answered HEAD on every GET route; so does this
# Starlette's RedirectResponse quoting of the Location URL.
_LOCATION_SAFE = ":/%#?=@[]!$&'()*+,;"

#: (method, request target, body, keep-alive, HTTP/1.0, wanted headers) of one parsed request.
_Request = tuple[bytes, bytes, bytes, bool, bool, dict[bytes, bytes]]
#: (status, content type or None, body, extra header lines, latency in s) of one answer.
_Answer = tuple[int, bytes | None, bytes, bytes, float]


class _TooLarge(Exception):
    """Raised from a parser callback to stop reading a request whose body exceeds the limit."""


def _response(
    status: int, content_type: bytes | None, body: bytes, extra: bytes, connection: bytes, head: bool
) -> bytes:
    """Serialise one response: status line, minimal headers, then the body (none for HEAD)."""
    header = b"%s%scontent-length: %d\r\n%s%s\r\n" % (
        _STATUS_LINES[status],
        b"content-type: " + content_type + b"\r\n" if content_type is not None else b"",
        len(body),
        extra,
        connection,
    )
    return header if head else header + body


def _error_response(status: int, content_type: bytes, body: bytes) -> bytes:
    """A response after which the connection is closed (malformed or oversized request)."""
    return _response(status, content_type, body, b"", _CLOSE, False)


_BAD_REQUEST = _error_response(400, b"text/plain; charset=utf-8", b"Invalid HTTP request received.")
_TOO_LARGE = _error_response(
    413, _JSON_CONTENT_TYPE, _error_body(f"Request body exceeds the {_MAX_BODY_BYTES // 2**20} MiB limit.")
)
_INTERNAL_ERROR = _error_response(500, b"text/plain; charset=utf-8", b"Internal Server Error")


def _split_target(target: bytes) -> tuple[bytes, bytes]:
    """(path, query) of a request target; the path is percent-decoded for routing, as uvicorn did."""
    if target[:1] == b"/":
        path, _, query = target.partition(b"?")
        if b"#" in path:
            path = path.partition(b"#")[0]
    else:
        # Absolute form (``GET http://host/path``), or something no route will match.
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            return target, b""
        path, query = url.path or b"/", url.query or b""
    if b"%" in path:
        path = unquote_to_bytes(path)
    return path, query


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
        self.connections: set[_Connection] = set()
        self.closing = False
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
    ) -> _Answer:
        """Route one request and build its answer."""
        path, query = _split_target(target)
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

    def _chat_answer(self, body: bytes, headers: dict[bytes, bytes]) -> _Answer:
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
    ) -> _Answer:
        """404, or Starlette's 307 to the same path with/without a trailing slash when that is a route."""
        other = path.rstrip(b"/") if path.endswith(b"/") else path + b"/"
        if path != b"/" and other in self.routes:
            host = headers.get(b"host")
            if host is not None:
                netloc = host.decode("latin-1")
            else:
                address = transport.get_extra_info("sockname")
                netloc = f"{_url_host(address[0])}:{address[1]}"
            location = f"http://{netloc}{other.decode('utf-8', 'replace')}"
            if query:
                location += f"?{query.decode('latin-1')}"
            extra = b"location: %s\r\n" % quote(location, safe=_LOCATION_SAFE).encode("latin-1")
            return 307, None, b"", extra, 0.0
        return 404, _JSON_CONTENT_TYPE, _route_error("Not Found", method, path), b"", 0.0

    def chat(self, raw: bytes) -> _Answer:
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

    def connection_closed(self, connection: _Connection) -> None:
        """Forget ``connection``; wake up a shutdown waiting for the last one."""
        self.connections.discard(connection)
        if not self.connections and self.all_closed is not None and not self.all_closed.done():
            self.all_closed.set_result(None)


def _route_error(detail: str, method: bytes, path: bytes) -> bytes:
    """404/405 body, in OpenAI's error shape so SDK error messages stay readable."""
    return _error_body(f"{detail}: {method.decode('latin-1')} {path.decode('utf-8', 'replace')}")


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses the requests, answered in order, one at a time.

    A request's answer is built as soon as it is parsed and written by a ``call_later`` timer after
    the latency, so an in-flight request costs a timer handle, not a task. Requests pipelined behind
    it are queued and answered once it has been written.
    """

    transport: asyncio.Transport

    def __init__(self, handler: _Handler) -> None:
        self.handler = handler
        self.loop = handler.loop
        self.parser = httptools.HttpRequestParser(self)
        # The request being parsed.
        self.in_message = False
        self.target = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.body_size = 0
        self.method = b""
        self.keep_alive = True
        self.http10 = False
        self.too_large = False
        # Answering.
        self.timer: asyncio.TimerHandle | None = None  # the answer waiting out its latency
        self.queue: deque[_Request] = deque()  # parsed requests waiting for that answer to go out
        self.final: bytes | None = None  # error response to send, then close, once the queue is empty
        self.continue_pending = False  # a 100 Continue owed once the earlier answers are out
        self.last_request = False  # a request without keep-alive was parsed: nothing after it counts
        self.done = False  # no more responses on this connection
        self.linger: asyncio.TimerHandle | None = None
        self.read_paused = False
        self.write_paused = False

    # asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.handler.connections.add(self)
        if self.handler.closing:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.done = True
        if self.timer is not None:
            # The client left during the latency: nobody to answer.
            self.timer.cancel()
            self.timer = None
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self.queue.clear()
        self.handler.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        if self.done or self.last_request or self.final is not None:
            return  # nothing more will be answered; drain (a lingering close relies on this)
        while True:
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:
                # Upgrades (h2c, websocket) are not supported: carry on in HTTP/1.1 as if none was asked.
                data = data[exc.args[0] :]
                if not data or self.done or self.last_request:
                    return
            except httptools.HttpParserCallbackError as exc:
                if self.too_large:
                    self._fail(_TOO_LARGE)
                else:  # a bug in this module, raised from a parser callback
                    _log.error("dev-model request handling failed", exc_info=exc.__context__)
                    self._fail(_INTERNAL_ERROR)
                return
            except httptools.HttpParserError:
                if not self.last_request:  # else just bytes after a `Connection: close` request
                    self._fail(_BAD_REQUEST)
                return

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._update_reading()

    # httptools callbacks ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.target = b""
        self.headers = {}
        self.body = []
        self.body_size = 0

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _WANTED_HEADERS:
            self.headers[name] = value

    def on_headers_complete(self) -> None:
        parser = self.parser
        self.method = parser.get_method()
        self.keep_alive = parser.should_keep_alive()
        self.http10 = parser.get_http_version() == "1.0"
        headers = self.headers
        length = headers.get(b"content-length")
        if length is not None and int(length) > _MAX_BODY_BYTES:
            self.too_large = True
            raise _TooLarge
        expect = headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and not self.http10:
            if self.timer is None and not self.queue:
                self.transport.write(_CONTINUE)
            else:
                self.continue_pending = True

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > _MAX_BODY_BYTES:  # chunked bodies announce no length
            self.too_large = True
            raise _TooLarge
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.done:
            return  # the connection failed on an earlier request of this buffer
        self.in_message = False
        self.continue_pending = False
        if not self.keep_alive:
            self.last_request = True
        request = (self.method, self.target, b"".join(self.body), self.keep_alive, self.http10, self.headers)
        if self.timer is None and not self.queue:
            self._answer(request)
        else:
            self.queue.append(request)
            self._update_reading()

    # Answering -------------------------------------------------------------------------------------

    def _answer(self, request: _Request) -> None:
        """Build the answer to ``request`` and write it now, or schedule it after the latency."""
        method, target, body, keep_alive, http10, headers = request
        try:
            status, content_type, payload, extra, delay = self.handler.answer(
                method, target, body, headers, self.transport
            )
        except Exception:  # noqa: BLE001 - e.g. RecursionError from absurdly nested JSON; the server must survive it
            _log.exception("dev-model request handling failed")
            self.queue.clear()  # answering later requests before this one would break the order
            self.final = _INTERNAL_ERROR
            self._write_final()
            return
        keep_alive = keep_alive and not self.handler.closing
        connection = _CLOSE if not keep_alive else _KEEP_ALIVE if http10 else b""
        data = _response(status, content_type, payload, extra, connection, method == b"HEAD")
        if delay > 0.0:
            self.timer = self.loop.call_later(delay, self._deliver, data, keep_alive)
        else:
            self._write(data, keep_alive)

    def _deliver(self, data: bytes, keep_alive: bool) -> None:
        """Timer callback: the latency is over; send the answer, then whatever waited behind it."""
        self.timer = None
        self._write(data, keep_alive)
        if not self.done and (self.queue or self.final is not None or self.continue_pending):
            self._drain()

    def _write(self, data: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport.is_closing():
            self.done = True
            return
        transport.write(data)
        if not keep_alive or self.handler.closing:
            self.done = True
            transport.close()

    def _drain(self) -> None:
        """Answer queued requests in order until one waits out its latency; then an owed error or 100."""
        while self.timer is None and not self.done:
            if self.queue:
                self._answer(self.queue.popleft())
                self._update_reading()
            elif self.final is not None:
                self._write_final()
            else:
                if self.continue_pending and self.in_message:
                    self.transport.write(_CONTINUE)
                self.continue_pending = False
                return

    def _fail(self, response: bytes) -> None:
        """Stop parsing; send ``response`` after the answers still owed, then close."""
        self.final = response
        if self.timer is None and not self.queue:
            self._write_final()

    def _write_final(self) -> None:
        transport = self.transport
        self.done = True
        if transport.is_closing():
            return
        assert self.final is not None
        transport.write(self.final)
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            # Lingering close: the client may still be sending (an oversized body). Closing with unread
            # bytes would reset the connection, which can destroy the response before it is read; so
            # signal EOF and drain until the client closes, for a bounded time.
            transport.write_eof()
            self.linger = self.loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def _update_reading(self) -> None:
        """Stop reading while the client does not read its answers or has too many pipelined."""
        pause = not self.done and (self.write_paused or len(self.queue) >= _MAX_QUEUED)
        if pause != self.read_paused and not self.transport.is_closing():
            self.read_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def shutdown(self) -> None:
        """Server shutdown: close now when idle, else right after the answer being prepared."""
        if self.done or (self.timer is None and not self.in_message):
            self.transport.close()


def _url_host(host: str) -> str:
    """Host as it should appear in a URL a client can use."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
