"""The egress proxy every outbound request from a work/task sandbox passes through (product concept §11).

Scorers run untrusted, so the sandbox's only way out is this HTTP proxy, which enforces the account's
:class:`~benchwright.proxy.policy.HostPolicy` per request:

* ``CONNECT host:port`` (HTTPS and anything else tunnelled): decide, then open TCP to the target, answer
  ``200 Connection Established`` and splice bytes both ways until both sides are done. No TLS inspection.
* Absolute-URI plain HTTP (``GET http://host:port/path HTTP/1.1``): decide, then forward the request in origin-form
  over a fresh upstream connection (``Connection: close`` upstream), dropping hop-by-hop headers, and stream the
  response back. Bodies are framed (Content-Length / chunked) in both directions, so the client connection can be
  kept alive and every request on it is decided on its own.
* Refusals answer ``403`` with ``X-Benchwright-Blocked: <host>`` and are recorded through a
  :class:`BlockedHostRecorder` *before* the answer is sent, so a client that saw the 403 can rely on the record.

Error statuses: malformed or non-proxy requests (origin-form ``GET /path``, ``https://`` absolute URIs, userinfo in
the URI, invalid hosts) → 400; header block over ``max_header_bytes`` → 431; headers not completed within
``header_timeout_s`` → 408; target unreachable or answering garbage → 502; the policy provider failing → 503
(fail closed, not recorded as a blocked host).

Each client connection is its own task, guarded by an idle watchdog (no bytes moved in either direction for
``idle_timeout_s`` → closed), so a slow or stalled client only ever holds its own connection. The proxy itself
uses the standard library only; it runs under uvloop as well as the default loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
import socket
import stat
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from benchwright.proxy.addresses import endpoint_allowed, internal_reason
from benchwright.proxy.policy import HostPolicy, decide, normalize_host

__all__ = ["BlockedHostRecorder", "EgressProxy", "InMemoryBlockedLog"]

_log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
# StreamReader limit: bounds a single header/chunk-size line and sets flow control (reading pauses at 2x this).
_READ_LIMIT = 64 * 1024
# Upstream response heads are bounded independently of max_header_bytes (which guards against clients).
_MAX_RESPONSE_HEAD = 256 * 1024
# After an error answer, read and discard what the client still sends for a moment: closing a socket with unread
# input makes the kernel send RST, which can destroy the answer before the client reads it.
_LINGER_S = 1.0
_LINGER_MAX_BYTES = 1024 * 1024
# How long a finished response waits for the request-body copy to finish before giving up on keep-alive.
_BODY_SETTLE_S = 1.0

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN_RE = re.compile(rb"^" + _TOKEN + rb"$")
_REQUEST_LINE_RE = re.compile(rb"^(" + _TOKEN + rb") ([!-~]+) (HTTP/[0-9]\.[0-9])$")
_STATUS_LINE_RE = re.compile(rb"^HTTP/1\.[01] ([0-9]{3})(?: [\t !-~\x80-\xff]*)?$")
_CHUNK_SIZE_RE = re.compile(rb"^([0-9A-Fa-f]{1,16})[ \t]*(?:;.*)?$")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")

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


# --------------------------------------------------------------------------------------------------- recording


@runtime_checkable
class BlockedHostRecorder(Protocol):
    """Receives every host the proxy refused. ``record`` may be a plain or an ``async`` method.

    The proxy passes the canonical host (see :func:`~benchwright.proxy.policy.normalize_host`) without port, and
    awaits the result when it is awaitable. A sync implementation runs on the proxy's event loop, so it must not
    block (hand slow work to a thread or make ``record`` async). Exceptions are logged; the request is refused
    regardless.
    """

    def record(self, host: str) -> Awaitable[None] | None:
        """Record one refusal of ``host``."""
        ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


class InMemoryBlockedLog:
    """A :class:`BlockedHostRecorder` keeping one entry per host in memory (tests, dev, reference semantics).

    Thread-safe, so a test or API thread may read :meth:`entries` while the proxy records.
    """

    def __init__(self, *, clock: Callable[[], datetime] = _utcnow) -> None:
        """Create an empty log.

        Args:
            clock: Returns the current time; must be timezone-aware (UTC). Injectable for tests.
        """
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}

    def record(self, host: str) -> None:
        """Count one refusal of ``host``: creates the entry or bumps ``seen_count`` and ``last_seen``."""
        try:
            host = normalize_host(host)
        except ValueError:
            pass  # record what we were given; a refusal must never go unrecorded because the name is odd
        now = self._clock()
        with self._lock:
            entry = self._entries.get(host)
            if entry is None:
                self._entries[host] = {"host": host, "seen_count": 1, "first_seen": now, "last_seen": now}
            else:
                entry["seen_count"] += 1
                entry["last_seen"] = now

    def entries(self) -> list[dict[str, Any]]:
        """Snapshot of the log in first-seen order.

        Returns:
            Copies of ``{"host", "seen_count", "first_seen", "last_seen"}`` dicts (aware UTC datetimes).
        """
        with self._lock:
            return [dict(entry) for entry in self._entries.values()]

    def clear(self) -> None:
        """Forget all entries."""
        with self._lock:
            self._entries.clear()


# --------------------------------------------------------------------------------------------------- internals


class _ClientError(Exception):
    """The request cannot be served; answer ``status`` with ``message`` and close the connection."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class _PeerError(Exception):
    """The peer broke HTTP framing (truncated or malformed head/body); ``side`` says which peer."""

    def __init__(self, side: Literal["client", "upstream"], message: str) -> None:
        super().__init__(message)
        self.side = side


class _HeadTooLarge(Exception):
    pass


@dataclass(slots=True)
class _Head:
    """A parsed request or response head; header names keep their case, values are latin-1 decoded."""

    start: bytes
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]

    def tokens(self, name: str) -> set[str]:
        """Comma-separated tokens of all ``name`` headers, lower-cased (Connection, Transfer-Encoding)."""
        return {t.strip().lower() for value in self.values(name) for t in value.split(",") if t.strip()}


class _IdleWatchdog:
    """Cancels a connection's task once no bytes moved for ``timeout`` seconds.

    ``touch()`` is a float store, so calling it per 64 KiB chunk costs nothing; a single timer re-arms itself
    lazily instead of being rescheduled on every chunk.
    """

    __slots__ = ("_handle", "_last", "_loop", "_task", "_timeout", "expired")

    def __init__(self, timeout: float, task: asyncio.Task[Any]) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._task = task
        self._last = self._loop.time()
        self.expired = False
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout, self._check)

    def touch(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        idle = self._loop.time() - self._last
        if idle >= self._timeout:
            self._handle = None
            self.expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_later(self._timeout - idle, self._check)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


@dataclass(slots=True)
class _Progress:
    bytes_read: int = 0


async def _read_head(
    reader: asyncio.StreamReader,
    max_bytes: int,
    watchdog: _IdleWatchdog,
    side: Literal["client", "upstream"],
    progress: _Progress | None = None,
) -> _Head | None:
    """Read a start line and header fields up to the blank line; None on EOF before the first byte.

    Accepts CRLF or bare LF line ends (RFC 9112 §2.2) but re-serializes with CRLF, so nothing ambiguous passes on.

    Raises:
        _HeadTooLarge: the head exceeds ``max_bytes`` (or one line exceeds the stream limit).
        _PeerError: EOF inside the head, or a malformed header field.
    """
    total = 0
    start: bytes | None = None
    headers: list[tuple[str, str]] = []
    while True:
        try:
            line = await reader.readline()
        except ValueError as exc:  # LimitOverrunError surfaces as ValueError from readline()
            raise _HeadTooLarge() from exc
        if not line:
            if total == 0:
                return None
            raise _PeerError(side, "connection closed inside the header block")
        watchdog.touch()
        total += len(line)
        if progress is not None:
            progress.bytes_read = total
        if total > max_bytes:
            raise _HeadTooLarge()
        if not line.endswith(b"\n"):
            raise _PeerError(side, "connection closed inside the header block")
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if start is None:
            if not line and total <= 8:
                continue  # RFC 9112 §2.2: ignore a few empty lines before the request line
            start = line
            continue
        if not line:
            return _Head(start, headers)
        if line[:1] in (b" ", b"\t"):
            raise _PeerError(side, "obsolete line folding in header block")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN_RE.match(name):
            raise _PeerError(side, f"malformed header line {line[:80]!r}")
        value = value.strip(b" \t")
        if b"\r" in value or b"\x00" in value:
            raise _PeerError(side, f"invalid characters in header {name.decode('latin-1')!r}")
        headers.append((name.decode("latin-1"), value.decode("latin-1")))


def _parse_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` / ``[v6][:port]`` → (canonical host, port); raises _ClientError(400)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise _ClientError(400, f"invalid authority {text!r}")
        host_text, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise _ClientError(400, f"invalid authority {text!r}")
        port_text: str | None = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise _ClientError(400, f"invalid authority {text!r} (IPv6 literals must be in brackets)")
        host_text, sep, after = text.partition(":")
        port_text = after if sep else None
    if not port_text:  # absent, or "host:" which RFC 3986 reads as the default port
        if default_port is None:
            raise _ClientError(400, f"CONNECT target {text!r} must be host:port")
        port = default_port
    elif not _PORT_RE.match(port_text) or not 1 <= int(port_text) <= 65535:
        raise _ClientError(400, f"invalid port in {text!r}")
    else:
        port = int(port_text)
    try:
        host = normalize_host(host_text)
    except ValueError as exc:
        raise _ClientError(400, f"invalid host: {exc}") from exc
    return host, port


def _parse_http_uri(target: str) -> tuple[str, int, str, str]:
    """An absolute ``http://`` request target → (canonical host, port, authority as given, origin-form path)."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise _ClientError(
            400, f"not a proxy request: the target {target[:200]!r} must be an absolute http:// URI (or use CONNECT)"
        )
    if scheme.lower() == "https":
        raise _ClientError(400, "https:// URIs must be tunnelled with CONNECT host:443")
    if scheme.lower() != "http":
        raise _ClientError(400, f"unsupported URI scheme {scheme[:20]!r}")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        # Userinfo is a classic way to make "allowed.com@evil.com" look like the allowed host; refuse it outright.
        raise _ClientError(400, "userinfo in the request URI is not allowed")
    if not authority:
        raise _ClientError(400, "the request URI has no host")
    host, port = _parse_authority(authority, 80)
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return host, port, authority, path


@dataclass(slots=True, frozen=True)
class _Framing:
    kind: Literal["none", "length", "chunked", "close"]
    length: int = 0


def _request_framing(head: _Head) -> _Framing:
    """Body framing of a client request (RFC 9112 §6.3); ambiguous framing is refused (request smuggling)."""
    te = head.values("transfer-encoding")
    cl = head.values("content-length")
    if te:
        if cl:
            raise _ClientError(400, "both Transfer-Encoding and Content-Length")
        codings = [t.strip().lower() for v in te for t in v.split(",") if t.strip()]
        if not codings or codings[-1] != "chunked" or codings.count("chunked") != 1:
            raise _ClientError(400, "request Transfer-Encoding must end in chunked")
        return _Framing("chunked")
    if cl:
        values = {v.strip() for item in cl for v in item.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit() or len(next(iter(values))) > 18:
            raise _ClientError(400, "invalid Content-Length")
        length = int(values.pop())
        return _Framing("length", length) if length else _Framing("none")
    return _Framing("none")


def _response_framing(head: _Head, status: int, method: str) -> _Framing:
    """Body framing of an upstream response (RFC 9112 §6.3); raises _PeerError on an invalid Content-Length."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return _Framing("none")
    if head.values("transfer-encoding"):
        codings = [t.strip().lower() for v in head.values("transfer-encoding") for t in v.split(",") if t.strip()]
        return _Framing("chunked") if codings and codings[-1] == "chunked" else _Framing("close")
    cl = head.values("content-length")
    if cl:
        values = {v.strip() for item in cl for v in item.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit() or len(next(iter(values))) > 18:
            raise _PeerError("upstream", "invalid Content-Length in response")
        length = int(values.pop())
        return _Framing("length", length) if length else _Framing("none")
    return _Framing("close")


def _filtered_headers(head: _Head, *, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones, those the Connection header names, and ``drop``."""
    named = head.tokens("connection") | head.tokens("proxy-connection")
    return [
        (name, value)
        for name, value in head.headers
        if (low := name.lower()) not in _HOP_BY_HOP and low not in named and low not in drop
    ]


def _serialize_head(start: bytes, headers: list[tuple[str, str]]) -> bytes:
    parts = [start]
    parts.extend(f"{name}: {value}".encode("latin-1") for name, value in headers)
    parts.append(b"")
    parts.append(b"")
    return b"\r\n".join(parts)


def _error_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    body = (message.rstrip("\n") + "\n").encode("utf-8", "replace")
    head = [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
        *headers,
        ("Connection", "close"),
    ]
    start = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}".encode("ascii")
    return _serialize_head(start, head) + body


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def _copy_exact(
    src: asyncio.StreamReader,
    dst: asyncio.StreamWriter,
    n: int,
    watchdog: _IdleWatchdog,
    side: Literal["client", "upstream"],
) -> None:
    while n > 0:
        data = await src.read(min(_CHUNK, n))
        if not data:
            raise _PeerError(side, "connection closed inside a body")
        watchdog.touch()
        dst.write(data)
        await dst.drain()
        n -= len(data)


async def _copy_until_eof(src: asyncio.StreamReader, dst: asyncio.StreamWriter, watchdog: _IdleWatchdog) -> None:
    while data := await src.read(_CHUNK):
        watchdog.touch()
        dst.write(data)
        await dst.drain()


async def _copy_chunked(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, watchdog: _IdleWatchdog, side: Literal["client", "upstream"]
) -> None:
    """Relay a chunked body, re-framing it canonically (sizes in hex, no extensions, CRLF line ends)."""

    async def line() -> bytes:
        try:
            raw = await src.readline()
        except ValueError as exc:
            raise _PeerError(side, "chunked framing line too long") from exc
        if not raw.endswith(b"\n"):
            raise _PeerError(side, "connection closed inside a chunked body")
        watchdog.touch()
        return raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]

    while True:
        match = _CHUNK_SIZE_RE.match(await line())
        if match is None:
            raise _PeerError(side, "malformed chunk size")
        size = int(match.group(1), 16)
        dst.write(b"%x\r\n" % size)
        if size == 0:
            trailer_bytes = 0
            while trailer := await line():
                trailer_bytes += len(trailer)
                name, sep, _ = trailer.partition(b":")
                if not sep or not _TOKEN_RE.match(name) or b"\r" in trailer or trailer_bytes > _READ_LIMIT:
                    raise _PeerError(side, "malformed chunked trailer")
                dst.write(trailer + b"\r\n")
            dst.write(b"\r\n")
            await dst.drain()
            return
        await _copy_exact(src, dst, size, watchdog, side)
        if await line() != b"":
            raise _PeerError(side, "missing CRLF after chunk data")
        dst.write(b"\r\n")


async def _copy_body(
    framing: _Framing,
    src: asyncio.StreamReader,
    dst: asyncio.StreamWriter,
    watchdog: _IdleWatchdog,
    side: Literal["client", "upstream"],
) -> None:
    if framing.kind == "length":
        await _copy_exact(src, dst, framing.length, watchdog, side)
    elif framing.kind == "chunked":
        await _copy_chunked(src, dst, watchdog, side)
    elif framing.kind == "close":
        await _copy_until_eof(src, dst, watchdog)


def _abort(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.transport.abort()


def _close(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.close()


async def _lingering_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close and swallow the client's remaining input briefly, so an error answer is not lost to a RST."""
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(_LINGER_S):
            discarded = 0
            while discarded < _LINGER_MAX_BYTES and (data := await reader.read(_CHUNK)):
                discarded += len(data)


# ------------------------------------------------------------------------------------------------------- proxy


class EgressProxy:
    """An HTTP forward proxy that enforces an account's host policy (module docstring has the behaviour).

    Usage::

        proxy = EgressProxy(policy_provider=lambda: policy, recorder=InMemoryBlockedLog())
        port = await proxy.start()          # or: async with proxy: ...
        ...                                 # sandbox uses HTTP(S)_PROXY=proxy.url
        await proxy.stop()
    """

    def __init__(
        self,
        *,
        policy_provider: Callable[[], HostPolicy | Awaitable[HostPolicy]],
        recorder: BlockedHostRecorder,
        host: str = "127.0.0.1",
        port: int = 0,
        uds_path: str | os.PathLike[str] | None = None,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float = 300.0,
        max_header_bytes: int = 64 * 1024,
        header_timeout_s: float = 30.0,
        internal_allowed: frozenset[tuple[str, int]] = frozenset(),
        allow_internal: bool = False,
    ) -> None:
        """Configure the proxy; nothing is bound until :meth:`start`.

        Args:
            policy_provider: Returns the account's current policy (or an awaitable of it). Called once per request,
                so policy changes apply to the next request without a restart. Called on the event loop: it must
                be cheap (return a cached object) or be async.
            recorder: Receives every refused host.
            host: Address to listen on (TCP mode).
            port: Port to listen on; 0 picks a free one (TCP mode).
            uds_path: Listen on this Unix domain socket path instead of TCP (for a socket bind-mounted into the
                sandbox). A stale socket file at the path is replaced; the file is removed on :meth:`stop`.
            connect_timeout_s: Limit for resolving and connecting to a target; exceeded → 502.
            idle_timeout_s: A connection (request, response or tunnel) with no bytes moving in either direction
                for this long is closed.
            max_header_bytes: Limit for a request's start line plus headers; exceeded → 431.
            header_timeout_s: Limit for receiving a complete request head (also how long an idle keep-alive
                client connection is kept); exceeded mid-head → 408. Guards against slowloris-style clients.
            internal_allowed: ``(host or address, port)`` endpoints on internal addresses the platform lets
                sandboxes reach (the run's model proxy). Every other loopback/private/link-local target is
                refused whatever the account's policy says.
            allow_internal: Skip the internal-address check altogether (only for a proxy whose clients are the
                platform's own, e.g. tests of the proxy itself on loopback).

        Raises:
            ValueError: both ``uds_path`` and ``port`` are given, or ``max_header_bytes`` is below 1024.
        """
        if uds_path is not None and port != 0:
            raise ValueError("give either uds_path or port, not both")
        if max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")
        self._policy_provider = policy_provider
        self._recorder = recorder
        self._internal_allowed = internal_allowed
        self._allow_internal = allow_internal
        self._host = host
        self._port = port
        self._uds_path = os.fspath(uds_path) if uds_path is not None else None
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._max_header_bytes = max_header_bytes
        self._header_timeout_s = header_timeout_s
        self._read_limit = max(_READ_LIMIT, max_header_bytes)
        self._server: asyncio.AbstractServer | None = None
        self._bound_port: int | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind and start serving.

        Returns:
            The bound TCP port, or 0 in Unix-socket mode.

        Raises:
            RuntimeError: already started.
            OSError: the address or socket path cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("EgressProxy is already started")
        self._stopping = False
        if self._uds_path is not None:
            self._server = await asyncio.start_unix_server(
                self._on_client, path=self._uds_path, limit=self._read_limit, backlog=1024
            )
            self._bound_port = 0
        else:
            self._server = await asyncio.start_server(
                self._on_client, self._host, self._port, limit=self._read_limit, backlog=1024
            )
            self._bound_port = self._server.sockets[0].getsockname()[1]
        _log.info("egress proxy listening on %s", self._uds_path or f"{self._host}:{self._bound_port}")
        return self._bound_port

    async def stop(self) -> None:
        """Stop listening, close every client and upstream connection, and remove the Unix socket file.

        Idempotent.
        """
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping = True
        server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
        if self._uds_path is not None:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.stat(self._uds_path).st_mode):
                    os.unlink(self._uds_path)

    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The bound TCP port (0 in Unix-socket mode). Raises RuntimeError before :meth:`start`."""
        if self._bound_port is None:
            raise RuntimeError("EgressProxy is not started")
        return self._bound_port

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` for ``HTTP_PROXY``/``HTTPS_PROXY`` (TCP mode only)."""
        if self._uds_path is not None:
            raise RuntimeError(f"EgressProxy serves the Unix socket {self._uds_path}; it has no TCP URL")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def uds_path(self) -> str | None:
        """The Unix socket path in Unix-socket mode, else None."""
        return self._uds_path

    # -- per connection --------------------------------------------------------------------------------------

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._stopping:
            _abort(writer)
            return
        self._connections.add(task)
        watchdog = _IdleWatchdog(self._idle_timeout_s, task)
        graceful = False
        try:
            await self._serve_connection(reader, writer, watchdog)
            graceful = True
        except asyncio.CancelledError:
            # This is a root task that nothing but stop() awaits, so ending it normally on cancellation (the
            # watchdog's, stop()'s, or loop shutdown's) is safe; and it has to end normally on 3.11, where the
            # streams machinery's done-callback calls task.exception() and logs an error for cancelled tasks.
            if watchdog.expired:
                _log.debug("egress proxy: closing connection idle for %ss", self._idle_timeout_s)
        except (ConnectionError, OSError, _PeerError) as exc:
            _log.debug("egress proxy: connection ended: %r", exc)
        except Exception:  # noqa: BLE001 - one connection's bug is logged; it never takes the proxy down
            _log.exception("egress proxy: unexpected error on a client connection")
        finally:
            watchdog.close()
            if graceful:
                _close(writer)
            else:
                _abort(writer)
            self._connections.discard(task)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watchdog: _IdleWatchdog
    ) -> None:
        """Serve requests on one client connection until it closes or a request ends keep-alive."""
        while True:
            progress = _Progress()
            try:
                async with asyncio.timeout(self._header_timeout_s):
                    head = await _read_head(reader, self._max_header_bytes, watchdog, "client", progress)
            except TimeoutError:
                if progress.bytes_read:
                    await self._refuse(reader, writer, 408, "timed out waiting for the request headers")
                return
            except _HeadTooLarge:
                await self._refuse(
                    reader, writer, 431, f"request headers exceed {self._max_header_bytes} bytes"
                )
                return
            except _PeerError as exc:
                await self._refuse(reader, writer, 400, f"malformed request: {exc}")
                return
            if head is None:
                return
            try:
                keep_alive = await self._serve_request(head, reader, writer, watchdog)
            except _ClientError as exc:
                await self._refuse(reader, writer, exc.status, exc.message, exc.headers)
                return
            if not keep_alive:
                return

    async def _refuse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        status: int,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await _write(writer, _error_response(status, message, headers))
            await _lingering_close(reader, writer)

    async def _serve_request(
        self, head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watchdog: _IdleWatchdog
    ) -> bool:
        """Handle one request; returns whether the client connection may carry another request."""
        match = _REQUEST_LINE_RE.match(head.start)
        if match is None:
            raise _ClientError(400, f"malformed request line {head.start[:100]!r}")
        method, target, version = (part.decode("ascii") for part in match.groups())
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _ClientError(505, f"{version} is not supported; use HTTP/1.1")
        if method == "CONNECT":
            host, port = _parse_authority(target, None)
            await self._enforce(host, port)
            await self._tunnel(host, port, reader, writer, watchdog)
            return False
        host, port, authority, path = _parse_http_uri(target)
        framing = _request_framing(head)
        await self._enforce(host, port)
        return await self._forward(
            head, method, version, host, port, authority, path, framing, reader, writer, watchdog
        )

    async def _enforce(self, host: str, port: int) -> None:
        """Apply the current policy to ``host:port``; raises _ClientError(403) (after recording) or (503)."""
        try:
            policy = self._policy_provider()
            if inspect.isawaitable(policy):
                policy = await policy
        except Exception as exc:
            _log.exception("egress proxy: policy provider failed; refusing %s", host)
            raise _ClientError(503, "the account's host policy is unavailable; refusing to connect") from exc
        if not isinstance(policy, HostPolicy):
            _log.error("egress proxy: policy provider returned %r, not a HostPolicy", type(policy))
            raise _ClientError(503, "the account's host policy is unavailable; refusing to connect")
        allowed, reason = decide(policy, host, port)
        if allowed:
            _log.debug("egress proxy: %s:%s %s", host, port, reason)
            return
        _log.info("egress proxy: refused %s:%s (%s)", host, port, reason)
        await self._record(host)
        raise _ClientError(
            403,
            f"Benchwright egress proxy: {host} is blocked by the account's host policy ({reason}).",
            (("X-Benchwright-Blocked", host),),
        )

    async def _open_upstream(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        connect_host = host[1:-1] if host.startswith("[") else host
        options: dict[str, Any] = {"limit": _READ_LIMIT}
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                address = await self._resolve_public(host, connect_host, port)
                return await asyncio.open_connection(address, port, **options)
        except TimeoutError:
            raise _ClientError(502, f"connecting to {host}:{port} timed out after {self._connect_timeout_s}s") from None
        except OSError as exc:
            raise _ClientError(502, f"cannot reach {host}:{port}: {exc.strerror or exc}") from None

    async def _resolve_public(self, host: str, connect_host: str, port: int) -> str:
        """Resolve once and connect to that address (no second lookup to rebind), refusing addresses inside the
        platform (:func:`~benchwright.proxy.addresses.internal_reason`: the worker's own services, cloud
        metadata) unless the platform allowed that exact endpoint (the run's model proxy). The account's policy
        cannot open these: a host name is the account's to allow, the platform's own network is not."""
        infos = await asyncio.get_running_loop().getaddrinfo(connect_host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"{host} did not resolve")
        address = str(infos[0][4][0])
        if self._allow_internal or endpoint_allowed(self._internal_allowed, host=connect_host, address=address,
                                                    port=port):
            return address
        for info in infos:
            reason = internal_reason(str(info[4][0]))
            if reason is not None:
                await self._record(host)
                raise _ClientError(403, f"Benchwright egress proxy: {host} resolves to an internal address "
                                        f"({info[4][0]}: {reason}); sandboxes cannot reach the platform's own "
                                        "network.", (("X-Benchwright-Blocked", host),))
        return address

    async def _record(self, host: str) -> None:
        try:
            result = self._recorder.record(host)
            if inspect.isawaitable(result):
                await result
        except Exception:  # noqa: BLE001 - recording is best effort: the refusal stands either way
            _log.exception("egress proxy: recording the blocked host %s failed", host)

    # -- CONNECT ---------------------------------------------------------------------------------------------

    async def _tunnel(
        self, host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watchdog: _IdleWatchdog
    ) -> None:
        up_reader, up_writer = await self._open_upstream(host, port)
        try:
            await _write(writer, b"HTTP/1.1 200 Connection Established\r\n\r\n")
            # Bytes the client sent right behind the CONNECT head (an eager TLS ClientHello) are still in
            # `reader`'s buffer, so the client→target pump forwards them first.
            await asyncio.gather(
                self._pump(reader, up_writer, watchdog, (writer, up_writer)),
                self._pump(up_reader, writer, watchdog, (writer, up_writer)),
            )
        finally:
            _close(up_writer)

    @staticmethod
    async def _pump(
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        watchdog: _IdleWatchdog,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        """Copy ``src`` to ``dst`` until EOF, then half-close ``dst``; on a socket error abort both sides."""
        try:
            while data := await src.read(_CHUNK):
                dst.write(data)
                watchdog.touch()
                await dst.drain()
            # Half-close so a peer that signals "done" by EOF (and still expects the answer) keeps working.
            if dst.can_write_eof() and not dst.is_closing():
                dst.write_eof()
        except (ConnectionError, OSError, RuntimeError):
            # The other pump is blocked on a read from a healthy socket; aborting both ends it too.
            _abort(*both)

    # -- plain HTTP ------------------------------------------------------------------------------------------

    async def _forward(
        self,
        head: _Head,
        method: str,
        version: str,
        host: str,
        port: int,
        authority: str,
        path: str,
        framing: _Framing,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        watchdog: _IdleWatchdog,
    ) -> bool:
        """Forward one absolute-URI request over a fresh upstream connection; returns keep-alive for the client."""
        up_reader, up_writer = await self._open_upstream(host, port)
        body_task: asyncio.Task[None] | None = None
        try:
            # Upstream speaks the client's HTTP version (so an HTTP/1.0 client never gets a chunked answer) and
            # closes after one response: one upstream connection per request keeps per-request policy simple.
            headers = _filtered_headers(head, drop=frozenset({"host"}))
            headers.insert(0, ("Host", authority))
            headers.append(("Connection", "close"))
            try:
                await _write(up_writer, _serialize_head(f"{method} {path} {version}".encode("ascii"), headers))
            except (ConnectionError, OSError) as exc:
                raise _ClientError(502, f"the target {host}:{port} dropped the connection: {exc}") from None
            if framing.kind != "none":
                # Concurrent with the response: a 100 Continue must reach the client while the body is pending,
                # and an origin may answer early (413) without reading the body.
                body_task = asyncio.create_task(_copy_body(framing, reader, up_writer, watchdog, "client"))
                def _abort_on_failure(t: asyncio.Task[Any]) -> None:
                    if not t.cancelled() and t.exception() is not None:
                        _abort(up_writer)

                body_task.add_done_callback(_abort_on_failure)
            client_keep_alive = (
                version == "HTTP/1.1"
                and "close" not in head.tokens("connection")
                and "close" not in head.tokens("proxy-connection")
            )
            keep_alive = await self._relay_response(method, version, client_keep_alive, up_reader, writer, watchdog)
            if body_task is not None:
                done, _ = await asyncio.wait({body_task}, timeout=_BODY_SETTLE_S)
                if not done or body_task.cancelled() or body_task.exception() is not None:
                    keep_alive = False  # the rest of the request body is unread: the connection is out of sync
            return keep_alive
        finally:
            if body_task is not None and not body_task.done():
                body_task.cancel()
                await asyncio.wait({body_task})  # unlike `await body_task`, never swallows our own cancellation
            _close(up_writer)

    async def _relay_response(
        self,
        method: str,
        version: str,
        client_keep_alive: bool,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        watchdog: _IdleWatchdog,
    ) -> bool:
        """Relay interim and final response heads and the body; returns keep-alive for the client."""
        while True:
            try:
                head = await _read_head(up_reader, _MAX_RESPONSE_HEAD, watchdog, "upstream")
            except _HeadTooLarge:
                raise _ClientError(502, "the target's response headers are too large") from None
            except (_PeerError, ConnectionError, OSError) as exc:
                raise _ClientError(502, f"the target broke the connection: {exc}") from None
            if head is None:
                raise _ClientError(502, "the target closed the connection without answering")
            status_match = _STATUS_LINE_RE.match(head.start)
            if status_match is None:
                raise _ClientError(502, "the target answered with a malformed status line")
            status = int(status_match.group(1))
            if status == 101:
                raise _ClientError(502, "the target switched protocols, which this proxy does not relay")
            if status >= 200:
                break
            if version == "HTTP/1.1":  # HTTP/1.0 clients must not see interim (1xx) responses
                await _write(writer, _serialize_head(head.start, _filtered_headers(head)))
        try:
            framing = _response_framing(head, status, method)
        except _PeerError as exc:
            raise _ClientError(502, str(exc)) from None
        keep_alive = client_keep_alive and framing.kind != "close"
        # Content-Length next to Transfer-Encoding is dropped (RFC 9112 §6.3) since the body is relayed chunked.
        drop = frozenset({"content-length"}) if framing.kind == "chunked" else frozenset()
        headers = _filtered_headers(head, drop=drop)
        if not keep_alive:
            headers.append(("Connection", "close"))
        writer.write(_serialize_head(head.start, headers))
        # From here on the client has a response in progress: failures can only abort the connection.
        try:
            await _copy_body(framing, up_reader, writer, watchdog, "upstream")
            await writer.drain()
        except _PeerError as exc:
            raise ConnectionError(f"target response broken mid-body: {exc}") from None
        return keep_alive
