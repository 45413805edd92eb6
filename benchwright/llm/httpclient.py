"""A lean HTTP/1.1 client for the model-call hot path: POSTs to one origin over kept-alive connections.

Why not aiohttp here: a sweep makes one model call per trial, and the call is the worker's per-task hot path.
Measured against the dev model at 128 calls in flight, aiohttp's request machinery cost ~130 µs of worker CPU
per call; this client, an ``asyncio.Protocol`` around ``httptools``' C parser (llhttp, the parser uvicorn uses)
that writes each request in one ``write``, costs a fraction of that (see ``bench/httpclient.py``). It does only
what the OpenAI-compatible route needs: ``POST`` with a body, ``http``/``https``, keep-alive reuse,
``Content-Length``/chunked/read-until-close bodies, gzip/deflate content coding. No redirects, no proxies (the
aiohttp session it replaces followed neither for these calls).

Callers bound the number of requests in flight (the SUT client's semaphore); the pool opens a connection per
concurrent request and keeps up to ``max_idle`` of them for reuse.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

MAX_BODY_BYTES = 64 * 1024 * 1024
"""A response body larger than this is refused (a model reply is kilobytes; this bounds a broken endpoint)."""


class HttpClientError(Exception):
    """The request failed below HTTP: connection refused or reset, a malformed response, the peer went away."""


class HttpConnectError(HttpClientError):
    """No connection could be made (refused, host unknown, connect timed out): nothing was sent."""


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    """Header names in lower case; a repeated header keeps its last value."""
    body: bytes


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self.received_any = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[HttpResponse] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._headers_done = False

    # -- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the connection's state is unknown, never reuse it
            self.close()
            return
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:  # httptools wraps what a callback raises in one of these
            too_large = self._body_size > MAX_BODY_BYTES
            self._fail(HttpClientError(f"response body exceeds {MAX_BODY_BYTES // 2**20} MiB" if too_large
                                       else f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        delimited = "content-length" in self._headers or "chunked" in self._headers.get("transfer-encoding", "")
        if self._headers_done and not delimited:
            self.keep_alive = False
            self.on_message_complete()  # a body delimited by the end of the connection (HTTP/1.0 style)
        else:
            detail = f": {exc}" if exc else ""
            self._fail(HttpClientError(f"the server closed the connection before the response was complete{detail}"))

    # -- httptools callbacks -----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None or self._waiter.done():
            self.keep_alive = False  # a response nobody asked for: the connection is not reused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > MAX_BODY_BYTES:
            raise OverflowError("response body too large")  # stops the parser; reported in data_received
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._reset()
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            self._reset()
            return
        self.keep_alive = self.keep_alive and self._parser.should_keep_alive()
        body = b"".join(self._body)
        encoding = self._headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS)
            try:
                body = inflater.decompress(body, MAX_BODY_BYTES)
                unfinished = bool(inflater.unconsumed_tail)
            except zlib.error as exc:
                self._fail(HttpClientError(f"response body is not valid {encoding}: {exc}"))
                self.close()
                return
            if unfinished:  # a small compressed body that inflates past the limit
                self._fail(HttpClientError(f"response body exceeds {MAX_BODY_BYTES // 2**20} MiB once decompressed"))
                self.close()
                return
        waiter.set_result(HttpResponse(status=status, headers=self._headers, body=body))
        self._reset()

    # -- the request -------------------------------------------------------------------------------------------

    async def exchange(self, request: bytes, deadline: float | None = None) -> HttpResponse:
        """Send ``request`` and wait for its response; past ``deadline`` (the loop's clock) raise TimeoutError.

        One timer handle per exchange: ``asyncio.timeout`` around the call cost ~5 % of a busy worker's CPU
        (its Timeout object, the task's cancel and uncancel) for a bound that almost never fires."""
        assert self.transport is not None and self._waiter is None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self.received_any = False
        timer = None if deadline is None else loop.call_at(deadline, self._expire)
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _reset(self) -> None:
        self._headers = {}
        self._body = []
        self._body_size = 0
        self._headers_done = False

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def _expire(self) -> None:
        self._fail(TimeoutError())


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s


Origin = tuple[str, str, int, str]
"""Where a connection goes and how it was checked: (its TLS, the address connected to, the port, the host name it
was opened for). The TLS part is empty for plain HTTP, ``default`` for the system's trust store, and names the
caller's own ``SSLContext`` otherwise: a connection verified under one context is never handed to a pool that would
have verified it under another."""


class ConnectionShelf:
    r"""Idle keep-alive connections that closed ``HttpPool``\ s left, for the next pool to the same origin (on the
    same event loop).

    A worker's Materialize batches all call its credential proxy, each batch through a pool of its own, and each
    pool opened its connections afresh: 128 connects at C=128, ~15 ms of the worker's event loop at every batch's
    start (its own start waiting behind them) and as much of the proxy's. A connection carries nothing of the pool
    that opened it (every request sends its own headers), so a pool to the same origin may use it. At most
    ``per_origin`` are kept, each for at most ``keep_s`` (well below the proxy's own idle limit, 75 s); one the server
    closed meanwhile is skipped, and a request that finds it closed anyway is resent once on a fresh connection, as
    on any reused connection (``HttpPool.post``). What expires is closed by a timer, whether or not a pool comes back
    to its origin: the credential proxy's shelf holds its providers' connections, and a sweep over many endpoints
    (each an origin of its own) left up to ``per_origin`` sockets open for good per endpoint.
    """

    def __init__(self, *, per_origin: int = 512, keep_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._per_origin = per_origin
        self._keep_s = keep_s
        self._clock = clock
        self._kept: dict[Origin, list[tuple[float, _Connection]]] = {}
        self._closed = False
        self._expiry: asyncio.TimerHandle | None = None

    def take(self, origin: Origin, count: int) -> list[_Connection]:
        """Up to ``count`` open connections to ``origin``, the most recently kept first."""
        kept = self._kept.get(origin)
        taken: list[_Connection] = []
        now = self._clock()
        while kept and len(taken) < count:
            since, conn = kept.pop()
            if conn.closed:
                continue
            if now - since > self._keep_s:
                conn.close()
                continue
            taken.append(conn)
        return taken

    def put(self, origin: Origin, conns: list[_Connection]) -> None:
        """Keep ``conns`` (idle, between requests) for the next pool to ``origin``; close what is not kept."""
        if self._closed:
            for conn in conns:
                conn.close()
            return
        kept = self._kept.setdefault(origin, [])
        now = self._clock()
        stale = 0
        while stale < len(kept) and (kept[stale][1].closed or now - kept[stale][0] > self._keep_s):
            kept[stale][1].close()
            stale += 1
        del kept[:stale]
        for conn in conns:
            if conn.closed:
                continue
            if len(kept) < self._per_origin:
                kept.append((now, conn))
            else:
                conn.close()
        if not kept:
            del self._kept[origin]
        self._arm()

    def _arm(self) -> None:
        """A timer for when the oldest kept connection expires (none while nothing is kept, or one is set)."""
        if self._expiry is not None or self._closed:
            return
        oldest = min((kept[0][0] for kept in self._kept.values() if kept), default=None)
        if oldest is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # put from outside a loop: what expires is closed when next looked at
            return
        self._expiry = loop.call_later(max(0.0, oldest + self._keep_s - self._clock()) + 0.01, self._expire)

    def _expire(self) -> None:
        """Close every kept connection past ``keep_s`` (or closed by its server), then set the timer for the next."""
        self._expiry = None
        now = self._clock()
        for origin, kept in list(self._kept.items()):
            fresh = [(since, conn) for since, conn in kept if not conn.closed and now - since <= self._keep_s]
            for since, conn in kept:
                if conn.closed or now - since > self._keep_s:
                    conn.close()
            if fresh:
                self._kept[origin] = fresh
            else:
                del self._kept[origin]
        self._arm()

    def kept(self, origin: Origin) -> int:
        """How many connections to ``origin`` are kept (closed ones included until they are looked at)."""
        return len(self._kept.get(origin, ()))

    def close(self) -> None:
        """Close every kept connection; later ones are closed as they come."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for kept in self._kept.values():
            for _, conn in kept:
                conn.close()
        self._kept.clear()


class HttpPool:
    """Keep-alive connections to one origin (``scheme://host[:port]``).

    Args:
        base_url: The origin, optionally with a path prefix that request paths are appended to.
        headers: Sent with every request (e.g. ``Authorization``).
        max_idle: Connections kept open between requests.
        ssl_context: For ``https``; the system's default trust store if not given.
        connect_timeout_s: Bound on establishing a connection (the caller bounds the whole request).
        connect_address: Connect to this IP address instead of resolving the URL's host (an address a policy
            check approved); the ``Host`` header and the TLS server name stay the URL's.
        shelf: Where the pool takes idle connections to its origin from before it opens any (``warm``, and a
            request finding none idle), and where ``aclose`` leaves its idle ones (``ConnectionShelf``); None: each
            pool opens and closes its own.
    """

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, max_idle: int = 128,
                 ssl_context: ssl.SSLContext | None = None, connect_timeout_s: float = 30.0,
                 connect_address: str | None = None, shelf: ConnectionShelf | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = parts.hostname
        self._connect_to = connect_address or parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        tls = "" if self._ssl is None else "default" if ssl_context is None else f"context-{id(ssl_context)}"
        self._prefix = parts.path.rstrip("/")
        default_port = self._port == (443 if parts.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if default_port else f"{host}:{self._port}"
        fixed = {"Host": authority, "User-Agent": "benchwright", "Accept": "application/json",
                 "Accept-Encoding": "gzip, deflate", **(headers or {})}
        for name, value in fixed.items():
            if any(c in f"{name}{value}" for c in "\r\n"):
                raise ValueError(f"header {name!r} contains a line break")
        self._fixed_headers = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._max_idle = max_idle
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._closed = False
        self._shelf = shelf
        self.origin: Origin = (tls, self._connect_to, self._port, self._host)

    async def post(self, path: str, body: bytes, *, content_type: str = "application/json",
                   timeout_s: float | None = None) -> HttpResponse:
        """POST ``body`` to ``path`` (appended to the base URL's path) and return the whole response.

        A request that fails on a reused connection before any byte of the answer came back (the server closed
        it while it sat idle) is sent once more on a fresh connection.

        Args:
            timeout_s: Bound on the whole request, connecting and that one resend included; None: unbounded
                (but for ``connect_timeout_s``).

        Raises:
            HttpClientError: the connection failed or the response was malformed.
            TimeoutError: ``timeout_s`` passed first (the connection it was on is closed).
        """
        return await self._send((f"POST {self._prefix}{path} HTTP/1.1\r\n{self._fixed_headers}Content-Type: "
                                 f"{content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode("latin-1") + body,
                                _deadline(timeout_s))

    async def get(self, path: str, *, timeout_s: float | None = None) -> HttpResponse:
        """GET ``path`` (appended to the base URL's path); the same connection reuse, bound and errors as ``post``."""
        return await self._send(f"GET {self._prefix}{path} HTTP/1.1\r\n{self._fixed_headers}\r\n".encode("latin-1"),
                                _deadline(timeout_s))

    async def _send(self, request: bytes, deadline: float | None) -> HttpResponse:
        if self._closed:
            raise HttpClientError("the HTTP pool is closed")
        if not self._idle and self._shelf is not None:
            self._idle.extend(self._shelf.take(self.origin, 1))
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, request, deadline)
            except HttpClientError:
                if conn.received_any:
                    raise
                break  # stale keep-alive connection: one more try on a new connection
        return await self._exchange(await self._connect(deadline), request, deadline)

    async def _exchange(self, conn: _Connection, request: bytes, deadline: float | None) -> HttpResponse:
        try:
            response = await conn.exchange(request, deadline)
        except BaseException:
            conn.close()  # a failed or cancelled exchange leaves the connection mid-response: never reuse it
            raise
        if conn.keep_alive and not conn.closed and not self._closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def _connect(self, deadline: float | None = None) -> _Connection:
        loop = asyncio.get_running_loop()
        connect_by = loop.time() + self._connect_timeout_s
        try:
            async with asyncio.timeout_at(connect_by if deadline is None else min(connect_by, deadline)):
                _, conn = await loop.create_connection(
                    _Connection, self._connect_to, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None)
        except TimeoutError:
            if deadline is not None and deadline < connect_by:
                raise  # the request's own bound, not the connect's: the caller's timeout
            raise HttpConnectError(f"connecting to {self._host}:{self._port} timed out") from None
        except OSError as exc:
            raise HttpConnectError(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        return conn

    async def warm(self, count: int) -> int:
        """Open connections ahead of the requests until ``count`` (at most ``max_idle``) are idle; returns how
        many were opened (those taken from the pool's shelf not counted). Failures are not raised: the requests that
        follow will report them."""
        want = min(count, self._max_idle) - len(self._idle)
        if self._shelf is not None and want > 0:
            self._idle.extend(self._shelf.take(self.origin, want))
            want = min(count, self._max_idle) - len(self._idle)
        results = await asyncio.gather(*(self._connect() for _ in range(max(0, want))), return_exceptions=True)
        for conn in results:
            if isinstance(conn, _Connection):
                if self._closed or len(self._idle) >= self._max_idle:
                    conn.close()
                else:
                    self._idle.append(conn)
        return sum(isinstance(c, _Connection) for c in results)

    async def aclose(self) -> None:
        """Close the pool: its idle connections go to its shelf (if it has one) or are closed; a connection in use
        is closed when its exchange ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        if self._shelf is not None:
            self._shelf.put(self.origin, idle)
            return
        for conn in idle:
            conn.close()
