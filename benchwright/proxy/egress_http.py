"""HTTP/1.1 message framing for the egress proxy: ``httptools`` (llhttp, as in :mod:`benchwright.llm.httpclient`)
parses, this module turns its callbacks into a pull API and serialises what the proxy sends on.

:class:`MessageReader` reads requests (client side) or responses (upstream side) from an ``asyncio`` stream and
yields :class:`Head`, body ``bytes`` (de-framed), :class:`End` (with trailers) and, after ``CONNECT``,
:class:`Tunnel` (the bytes already read behind the head). It bounds what a peer can make it buffer: a head over
``max_head`` bytes raises :class:`HeadTooLarge`, chunk-size lines and trailers over :data:`MAX_TRAILER` raise
:class:`PeerError`; it reads at most :data:`CHUNK` bytes at a time and only when the caller asks for an event.

llhttp replaced a hand-written parser (issue 24) and is stricter in a few corners, each refused with 400 (or 502
from a target) where the old parser passed it on: bare-LF line ends, methods llhttp does not know (``FOO``,
lower-case ``get``), a repeated identical Content-Length; an explicit ``HTTP/0.9`` is 400, not 505. It accepts
one thing the old parser refused: extra spaces between request-line parts (the proxy re-serialises canonically).
Error bodies keep the old wording but quote llhttp's reason instead of the offending line.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httptools

__all__ = [
    "CHUNK", "ClientError", "End", "Head", "HeadTooLarge", "MessageReader", "PeerError", "RequestRefused", "Tunnel",
    "chunk", "error_response", "filtered_headers", "last_chunk", "serialize_head",
]

CHUNK = 64 * 1024
MAX_TRAILER = 64 * 1024
"""Bytes a chunked body may spend on chunk-size lines and trailers without any body data in between."""

# Hop-by-hop headers (RFC 9110 §7.6.1) plus the legacy Proxy-Connection. Transfer-Encoding and Trailer stay:
# chunked bodies are relayed chunked (re-framed), so the encoding is end-to-end as far as this proxy is concerned.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "upgrade"}
)

_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}

Side = Literal["client", "upstream"]


class ClientError(Exception):
    """The request cannot be served; answer ``status`` with ``message`` and close the connection."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class PeerError(Exception):
    """The peer broke HTTP framing (truncated or malformed head/body); ``side`` says which peer."""

    def __init__(self, side: Side, message: str) -> None:
        super().__init__(message)
        self.side = side


class HeadTooLarge(Exception):
    """The head exceeds the reader's ``max_head`` bytes."""


class RequestRefused(Exception):
    """A request head llhttp refused for a reason the proxy answers in its own words (no "malformed" prefix)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(slots=True)
class Head:
    """A request or response head; header names keep their case, values are latin-1 decoded.

    ``start`` is the start line as the proxy re-serialises it; ``method``/``target`` are set for requests,
    ``status`` for responses; ``version`` is ``"1.1"``-style.
    """

    start: bytes
    version: str
    headers: list[tuple[str, str]]
    method: str = ""
    target: str = ""
    status: int = 0

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]

    def tokens(self, name: str) -> set[str]:
        """Comma-separated tokens of all ``name`` headers, lower-cased (Connection, Transfer-Encoding)."""
        return {t.strip().lower() for value in self.values(name) for t in value.split(",") if t.strip()}


@dataclass(slots=True)
class End:
    """The end of a message's body, with its trailer fields (chunked bodies only)."""

    trailers: list[tuple[str, str]]


@dataclass(slots=True)
class Tunnel:
    """The head was a ``CONNECT``: ``rest`` are the bytes the client sent right behind it (an eager ClientHello)."""

    rest: bytes


Event = Head | bytes | End | Tunnel


# llhttp's reasons mapped onto the proxy's own wording; a RequestRefused entry answers without the prefix.
_DESCRIBE: tuple[tuple[str, str, bool], ...] = (
    ("Transfer-Encoding can't be present with Content-Length", "both Transfer-Encoding and Content-Length", True),
    ("Content-Length", "invalid Content-Length", True),
    ("Transfer-Encoding", "request Transfer-Encoding must end in chunked", True),
    ("Unexpected space after start line", "obsolete line folding in header block", False),
    ("Unexpected whitespace after header value", "obsolete line folding in header block", False),
    ("header value char", "invalid characters in header", False),
    ("LF after header value", "invalid characters in header", False),
    ("header token", "malformed header line", False),
    ("chunk", "malformed chunk size", False),
)


def _describe(exc: httptools.HttpParserError, side: Side) -> Exception:
    reason = str(exc)
    if side == "client" and isinstance(exc, (httptools.HttpParserInvalidMethodError,
                                             httptools.HttpParserInvalidURLError)):
        return RequestRefused(f"malformed request line ({reason})")
    for needle, message, refused in _DESCRIBE:
        if needle in reason:
            if refused and side == "client":
                return RequestRefused(message)
            return PeerError(side, f"{message} ({reason})")
    if side == "client" and any(word in reason for word in ("version", "method", "URL", "url", "Expected HTTP/")):
        return RequestRefused(f"malformed request line ({reason})")
    return PeerError(side, reason)


class MessageReader:
    """Pull-style events from an ``httptools`` parser fed from ``reader`` (see the module docstring)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        *,
        side: Side,
        max_head: int,
        touch: Callable[[], None],
        head_only: Callable[[], bool] = lambda: False,
    ) -> None:
        """Args:
        side: ``"client"`` reads requests, ``"upstream"`` responses.
        max_head: Bound on a head's size (start line plus fields).
        touch: Called whenever bytes arrive (the idle watchdog).
        head_only: Asked at each response head: True means the answer has no body (a ``HEAD`` request's).
        """
        self._reader = reader
        self._side: Side = side
        self._max_head = max_head
        self._touch = touch
        self._head_only = head_only
        self._events: deque[Event] = deque()
        self._parser = self._new_parser()
        self._leftover = b""
        self._in_message = False
        self._in_head = False
        self._head_bytes = 0
        self._noise = 0  # chunked-body bytes since the last body data (chunk-size lines, trailers)
        self._url = bytearray()
        self._reason = bytearray()
        self._headers: list[tuple[str, str]] = []
        self._trailers: list[tuple[str, str]] = []
        self._ignore_rest = False
        self._connect = False
        self._request: Head | None = None
        self._synthetic = False
        self._error: Exception | None = None
        self._trailer_bytes = 0

    def _new_parser(self) -> httptools.HttpRequestParser | httptools.HttpResponseParser:
        if self._side == "client":
            parser = httptools.HttpRequestParser(self)
            parser.set_dangerous_leniencies(lenient_version=True)  # any HTTP/d.d parses; the proxy answers 505
            return parser
        return httptools.HttpResponseParser(self)

    @property
    def stream(self) -> asyncio.StreamReader:
        """The underlying stream (a tunnel pumps it directly once the CONNECT head is read)."""
        return self._reader

    @property
    def head_started(self) -> bool:
        """Whether part of a head has arrived (a timeout now is a stalled request, not an idle connection)."""
        return self._in_head and self._head_bytes > 0

    async def next(self) -> Event | None:
        """The next event; None when the peer closed between messages or inside a body (the caller decides).

        Raises:
            HeadTooLarge: the head exceeds ``max_head``.
            PeerError: malformed framing, or the connection closed inside a head.
            RequestRefused: (client side) a request llhttp refused that the proxy answers in its own words.
        """
        while not self._events:
            if self._error is not None:
                raise self._error
            if self._leftover:
                data, self._leftover = self._leftover, b""
            else:
                data = await self._reader.read(CHUNK)
                if not data:
                    if self._in_head:
                        raise PeerError(self._side, "connection closed inside the header block")
                    return None
                self._touch()
            self._feed(data)
        return self._events.popleft()

    def take_end(self) -> bool:
        """Consume the message's :class:`End` if it is the next event already parsed (never reads)."""
        if self._events and isinstance(self._events[0], End):
            self._events.popleft()
            return True
        return False

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` into events; an error is raised once the events parsed before it are consumed (so a
        body broken after a good head still reaches the caller as a head, then the error)."""
        if self._ignore_rest:
            return
        in_head_before = self._in_head
        self._noise += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            rest = data[int(exc.args[0]):]
            if self._connect:
                self._events.append(Tunnel(rest))
                self._ignore_rest = True
            elif self._side == "client":
                # An ``Upgrade`` request the proxy forwards as a plain one (the header is hop-by-hop): parse on.
                # llhttp skipped its body, so a body is parsed behind a synthetic head of the same framing.
                self._parser, self._leftover = self._new_parser(), rest
                if self._request is not None and (framing := _framing_field(self._request)):
                    if self._events and isinstance(self._events[-1], End):
                        self._events.pop()
                    self._synthetic = True
                    self._leftover = b"POST / HTTP/1.1\r\n" + framing + b"\r\n\r\n" + rest
            else:
                self._ignore_rest = True  # a 101 answer: the proxy refuses it, nothing behind it is read
        except httptools.HttpParserError as exc:
            error = _describe(exc, self._side)
            if isinstance(error, RequestRefused) and self._events and isinstance(self._events[-1], Head):
                self._events.pop()  # llhttp judged the framing right after the head: refuse the head itself
            self._fail(error)
        if self._in_head:
            self._head_bytes = self._head_bytes + len(data) if in_head_before else len(data)
            if self._head_bytes > self._max_head:
                self._fail(HeadTooLarge())
        elif self._in_message and self._noise > MAX_TRAILER:
            self._fail(PeerError(self._side, "malformed chunked trailer"))

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._ignore_rest = True

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._head_bytes = 0
        self._url.clear()
        self._reason.clear()
        self._headers, self._trailers = [], []
        self._trailer_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        field = (name.decode("latin-1"), value.strip(b" \t").decode("latin-1"))
        if self._in_head:
            self._headers.append(field)
        else:
            self._trailers.append(field)
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > MAX_TRAILER:
                self._fail(PeerError(self._side, "malformed chunked trailer"))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._noise = 0
        if self._synthetic:  # the stand-in head for an Upgrade request's body: its events are the body's
            self._synthetic = False
            return
        version = self._parser.get_http_version()
        size = sum(len(n) + len(v) + 4 for n, v in self._headers) + 2
        if isinstance(self._parser, httptools.HttpRequestParser):
            method = self._parser.get_method().decode("ascii")
            target = self._url.decode("latin-1")
            start = f"{method} {target} HTTP/{version}".encode("latin-1")
            head = self._request = Head(start, version, self._headers, method=method, target=target)
            self._connect = method == "CONNECT"
        else:
            status = self._parser.get_status_code()
            reason = b" " + bytes(self._reason) if self._reason else b""
            start = b"HTTP/%s %d%s" % (version.encode("ascii"), status, reason)
            head = Head(start, version, self._headers, status=status)
        if size + len(start) + 2 > self._max_head:
            self._fail(HeadTooLarge())
            return
        if head.method and version == "0.9":  # llhttp's reading of a request line without a version
            self._fail(RequestRefused(f"malformed request line {start[:100]!r}"))
            return
        self._events.append(head)
        if head.status >= 200 and self._head_only():
            self._events.append(End([]))
            self._ignore_rest = True  # one response per upstream connection: nothing after it is read

    def on_body(self, body: bytes) -> None:
        if self._ignore_rest:
            return
        self._noise = 0
        self._events.append(body)

    def on_message_complete(self) -> None:
        if self._ignore_rest or self._connect:
            return  # a CONNECT's end is its Tunnel event
        self._in_message = False
        if isinstance(self._parser, httptools.HttpRequestParser) or self._parser.get_status_code() >= 200:
            self._events.append(End(self._trailers))


# --------------------------------------------------------------------------------------------- serialisation


def _framing_field(head: Head) -> bytes:
    """The body-framing header field of a request llhttp has validated (empty when it has no body)."""
    if head.values("transfer-encoding"):
        return b"Transfer-Encoding: chunked"
    length = head.values("content-length")
    return b"Content-Length: " + length[0].encode("ascii") if length and length[0] != "0" else b""


def filtered_headers(head: Head, *, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones, those the Connection header names, and ``drop``."""
    named = head.tokens("connection") | head.tokens("proxy-connection")
    return [
        (name, value)
        for name, value in head.headers
        if (low := name.lower()) not in _HOP_BY_HOP and low not in named and low not in drop
    ]


def serialize_head(start: bytes, headers: list[tuple[str, str]]) -> bytes:
    parts = [start]
    parts.extend(f"{name}: {value}".encode("latin-1") for name, value in headers)
    parts.append(b"")
    parts.append(b"")
    return b"\r\n".join(parts)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body, framed canonically (size in hex, no extensions, CRLF)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def last_chunk(trailers: list[tuple[str, str]]) -> bytes:
    return b"0\r\n" + b"".join(f"{n}: {v}\r\n".encode("latin-1") for n, v in trailers) + b"\r\n"


def error_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    body = (message.rstrip("\n") + "\n").encode("utf-8", "replace")
    head = [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
        *headers,
        ("Connection", "close"),
    ]
    start = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}".encode("ascii")
    return serialize_head(start, head) + body
