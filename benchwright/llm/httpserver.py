"""A lean HTTP/1.1 server protocol on ``httptools`` (llhttp, uvicorn's C parser): the dev model's and the credential
proxy's, the two servers on the model-call hot path.

Why not uvicorn there: every model call of a run passes through the credential proxy, and uvicorn's cycle around
each request (a dict scope, messages through ``receive``/``send``, a keep-alive timer, the head and the body in two
writes) costs CPU beside the call's own work: on this protocol the proxy uses 17-20 % less CPU per call
(docs/performance.md, session 18). It parses with the same C parser, keeps only the headers its handler asks for,
and writes each answer in one ``write``.

A :class:`Connection` serves one client: requests are answered in order, one at a time (keep-alive, pipelining,
``Expect: 100-continue``, HTTP/1.0, body limits, back-pressure). Its :class:`Handler` answers each request with an
:data:`Answer` at once, after a latency (the dev model's, by a timer, not a task), or through a coroutine (the
proxy's upstream call). A malformed request gets 400, a head over ``MAX_HEAD_BYTES`` 431, an oversized body 413, a
handler that raises 500; each closes the connection after the answers still owed. ``sweep`` closes connections idle
or stalled mid-request past their bounds (a client on the far side of the proxy is untrusted code).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Coroutine
from functools import lru_cache
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

import httptools

_log = logging.getLogger(__name__)

MAX_QUEUED = 16
"""Pipelined requests held per connection before the server stops reading from it (back-pressure)."""
LINGER_S = 1.0
"""After an error response that closes the connection, how long unread request bytes are drained."""
BACKLOG = 2048
"""Listen backlog: callers open a connection per concurrent call (hundreds at once in a bench)."""
MAX_HEAD_BYTES = 64 * 1024
"""A request line and headers longer than this get 431 (httptools would buffer a header of any length)."""

#: (status, content type or None, body, extra header lines, latency in s) of one answer.
Answer = tuple[int, bytes | None, bytes, bytes, float]
#: (method, request target, body, keep-alive, HTTP/1.0, wanted headers) of one parsed request.
Request = tuple[bytes, bytes, bytes, bool, bool, dict[bytes, bytes]]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
CLOSE = b"connection: close\r\n"
KEEP_ALIVE = b"connection: keep-alive\r\n"


@lru_cache(maxsize=128)
def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <phrase>\\r\\n`` (an unknown status, e.g. one a provider made up, has no phrase)."""
    try:
        phrase = HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


def response(status: int, content_type: bytes | None, body: bytes, extra: bytes, connection: bytes,
             head: bool) -> bytes:
    """Serialise one response: status line, minimal headers, then the body (none for HEAD)."""
    header = b"%s%scontent-length: %d\r\n%s%s\r\n" % (
        status_line(status), b"content-type: " + content_type + b"\r\n" if content_type is not None else b"",
        len(body), extra, connection)
    return header if head else header + body


def error_response(status: int, content_type: bytes, body: bytes) -> bytes:
    """A response after which the connection is closed (malformed or oversized request)."""
    return response(status, content_type, body, b"", CLOSE, False)


BAD_REQUEST = error_response(400, b"text/plain; charset=utf-8", b"Invalid HTTP request received.")
HEAD_TOO_LARGE = error_response(431, b"text/plain; charset=utf-8",
                                b"Request line and headers over %d bytes." % MAX_HEAD_BYTES)
INTERNAL_ERROR = error_response(500, b"text/plain; charset=utf-8", b"Internal Server Error")


def header_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``name: value\\r\\n`` lines; a header whose name or value holds CR, LF or NUL is dropped (a value taken from
    an upstream answer must not split this one). The credential proxy makes these for every answer (its cost header):
    one search of each, where testing each character apart was ~4 % of that process's CPU (py-spy, session 40)."""
    return b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers
                    if _UNSAFE(name) is None and _UNSAFE(value) is None)


_UNSAFE = re.compile(rb"[\r\n\0]").search


def split_target(target: bytes) -> tuple[bytes, bytes]:
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


def url_host(host: str) -> str:
    """Host as it should appear in a URL a client can use."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class Handler(Protocol):
    """What a :class:`Connection` asks of its server."""

    loop: asyncio.AbstractEventLoop
    connections: set[Connection]
    closing: bool
    max_body: int
    """Request bodies over this many bytes get ``too_large``."""
    wanted_headers: frozenset[bytes]
    """The only request headers kept (lower-case names); the rest are dropped as they are parsed."""
    too_large: bytes
    """The full 413 response (with ``connection: close``)."""

    def answer(self, method: bytes, target: bytes, body: bytes, headers: dict[bytes, bytes],
               transport: asyncio.Transport) -> Answer | Coroutine[Any, Any, Answer]:
        """The answer to one request, or a coroutine that makes it."""

    def connection_closed(self, connection: Connection) -> None:
        """``connection`` is gone: forget it."""


class _TooLarge(Exception):
    """Raised from a parser callback to stop reading a request whose body exceeds the limit."""


class Connection(asyncio.Protocol):
    """One client connection: httptools parses the requests, answered in order, one at a time.

    A request's answer is built as soon as it is parsed; one with a latency is written by a ``call_later`` timer (an
    in-flight request costs a timer handle, not a task), one from a coroutine when it finishes. Requests pipelined
    behind it are queued and answered once it has been written.
    """

    transport: asyncio.Transport

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.loop = handler.loop
        self.parser = httptools.HttpRequestParser(self)
        self.last_active = self.loop.time()
        """When the client last sent anything (``sweep``)."""
        self.message_started = 0.0
        """When the request being parsed began (``sweep``)."""
        # The request being parsed.
        self.in_message = False
        self.in_head = False  # its request line and headers are still coming
        self.head_bytes = 0
        self.target = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.body_size = 0
        self.method = b""
        self.keep_alive = True
        self.http10 = False
        self.too_large = False
        # Answering.
        self.pending: asyncio.TimerHandle | asyncio.Task[None] | None = None  # the answer being made
        self.queue: deque[Request] = deque()  # parsed requests waiting for that answer to go out
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
        if self.pending is not None:
            # The client left while its answer was being made: nobody to answer.
            self.pending.cancel()
            self.pending = None
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self.queue.clear()
        self.handler.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        if self.done or self.last_request or self.final is not None:
            return  # nothing more will be answered; drain (a lingering close relies on this)
        was_in_head = self.in_head
        if was_in_head:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._fail(HEAD_TOO_LARGE)
                return
        while True:
            try:
                self.parser.feed_data(data)
                if self.in_head and not was_in_head:
                    # A request began in this chunk and its head is not over. Counted from the next chunk on only,
                    # a head sent in one burst went uncounted and the parser buffered it whole; at most the whole
                    # chunk is that head (a pipelined request's tail before it counts too).
                    self.head_bytes = len(data)
                    if self.head_bytes > MAX_HEAD_BYTES:
                        self._fail(HEAD_TOO_LARGE)
                return
            except httptools.HttpParserUpgrade as exc:
                # Upgrades (h2c, websocket) are not supported: carry on in HTTP/1.1 as if none was asked.
                data = data[exc.args[0]:]
                if not data or self.done or self.last_request:
                    return
            except httptools.HttpParserCallbackError as exc:
                if self.too_large:
                    self._fail(self.handler.too_large)
                else:  # a bug in this module, raised from a parser callback
                    _log.error("request handling failed", exc_info=exc.__context__)
                    self._fail(INTERNAL_ERROR)
                return
            except httptools.HttpParserError:
                if not self.last_request:  # else just bytes after a `Connection: close` request
                    self._fail(BAD_REQUEST)
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
        self.in_head = True
        self.head_bytes = 0
        self.message_started = self.loop.time()
        self.target = b""
        self.headers = {}
        self.body = []
        self.body_size = 0

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in self.handler.wanted_headers:
            self.headers[name] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        self.method = parser.get_method()
        self.keep_alive = parser.should_keep_alive()
        self.http10 = parser.get_http_version() == "1.0"
        headers = self.headers
        length = headers.get(b"content-length")
        if length is not None and int(length) > self.handler.max_body:
            self.too_large = True
            raise _TooLarge
        expect = headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and not self.http10:
            if self.pending is None and not self.queue:
                self.transport.write(_CONTINUE)
            else:
                self.continue_pending = True

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.handler.max_body:  # chunked bodies announce no length
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
        if self.pending is None and not self.queue:
            self._answer(request)
        else:
            self.queue.append(request)
            self._update_reading()

    # Answering -------------------------------------------------------------------------------------

    def _answer(self, request: Request) -> None:
        """Make the answer to ``request`` and write it now, or once its latency or its coroutine is over."""
        method, target, body, keep_alive, http10, headers = request
        try:
            made = self.handler.answer(method, target, body, headers, self.transport)
        except Exception:  # noqa: BLE001 - e.g. RecursionError from absurdly nested JSON; the server must survive it
            _log.exception("request handling failed")
            self._crashed()
            return
        if not isinstance(made, tuple):
            self.pending = self.loop.create_task(self._await(made, method, keep_alive, http10))
            return
        data, keep_alive = self._serialise(made, method, keep_alive, http10)
        if made[4] > 0.0:
            self.pending = self.loop.call_later(made[4], self._deliver, data, keep_alive)
        else:
            self._write(data, keep_alive)

    async def _await(self, made: Coroutine[Any, Any, Answer], method: bytes, keep_alive: bool,
                     http10: bool) -> None:
        try:
            answer = await made
        except Exception:  # noqa: BLE001 - as in _answer: one request's failure is a 500, not the server's end
            _log.exception("request handling failed")
            self.pending = None
            self._crashed()
            return
        self._deliver(*self._serialise(answer, method, keep_alive, http10))

    def _serialise(self, answer: Answer, method: bytes, keep_alive: bool, http10: bool) -> tuple[bytes, bool]:
        status, content_type, payload, extra, _ = answer
        keep_alive = keep_alive and not self.handler.closing
        connection = CLOSE if not keep_alive else KEEP_ALIVE if http10 else b""
        return response(status, content_type, payload, extra, connection, method == b"HEAD"), keep_alive

    def _crashed(self) -> None:
        self.queue.clear()  # answering later requests before this one would break the order
        self.final = INTERNAL_ERROR
        self._write_final()

    def _deliver(self, data: bytes, keep_alive: bool) -> None:
        """The answer is ready (its latency over, its coroutine done): send it, then whatever waited behind it."""
        self.pending = None
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
        """Answer queued requests in order until one is still being made; then an owed error or 100."""
        while self.pending is None and not self.done:
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
        if self.pending is None and not self.queue:
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
            self.linger = self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _update_reading(self) -> None:
        """Stop reading while the client does not read its answers or has too many pipelined."""
        pause = not self.done and (self.write_paused or len(self.queue) >= MAX_QUEUED)
        if pause != self.read_paused and not self.transport.is_closing():
            self.read_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def shutdown(self) -> None:
        """Server shutdown: close now when idle, else right after the answer being made."""
        if self.done or (self.pending is None and not self.in_message):
            self.transport.close()

    def stale(self, now: float, *, idle_s: float, request_s: float) -> bool:
        """Whether the client has sent nothing for ``idle_s`` between requests, or has not sent a whole request
        (its head and body) within ``request_s`` of its first byte, however slowly it trickles. A request being
        answered is never stale: its upstream call has its own bound."""
        if self.pending is not None or self.queue:
            return False
        if self.in_message:
            return now - self.message_started > request_s
        return now - self.last_active > idle_s


def sweep(connections: set[Connection], *, idle_s: float, request_s: float) -> int:
    """Close every stale connection (:meth:`Connection.stale`); returns how many."""
    if not connections:
        return 0
    now = next(iter(connections)).loop.time()
    stale = [c for c in connections if not c.done and c.stale(now, idle_s=idle_s, request_s=request_s)]
    for connection in stale:
        connection.done = True
        connection.transport.close()
    return len(stale)
