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
``idle_timeout_s`` → closed), so a slow or stalled client only ever holds its own connection. It runs under
uvloop as well as the default loop.

Modules: this one serves connections and applies policy; :mod:`~benchwright.proxy.egress_http` frames HTTP/1.1
(``httptools``, like :mod:`benchwright.llm.httpclient`); :mod:`~benchwright.proxy.egress_target` parses request
targets; :mod:`~benchwright.proxy.egress_stream` holds the connection plumbing (watchdog, closes);
:mod:`~benchwright.proxy.egress_log` records refused hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any

from benchwright.proxy.addresses import endpoint_allowed, internal_reason
from benchwright.proxy.egress_http import (
    CHUNK,
    ClientError,
    End,
    Head,
    HeadTooLarge,
    MessageReader,
    PeerError,
    RequestRefused,
    Tunnel,
    chunk,
    error_response,
    filtered_headers,
    last_chunk,
    serialize_head,
)
from benchwright.proxy.egress_log import BlockedHostRecorder, InMemoryBlockedLog
from benchwright.proxy.egress_stream import IdleWatchdog, abort, close, lingering_close, write
from benchwright.proxy.egress_target import parse_authority, parse_http_uri
from benchwright.proxy.policy import HostPolicy, decide

__all__ = ["BlockedHostRecorder", "EgressProxy", "InMemoryBlockedLog"]

_log = logging.getLogger(__name__)

# StreamReader limit (flow control: reading pauses at 2x this).
_READ_LIMIT = 64 * 1024
# Upstream response heads are bounded independently of max_header_bytes (which guards against clients).
_MAX_RESPONSE_HEAD = 256 * 1024
# How long a finished response waits for the request-body copy to finish before giving up on keep-alive.
_BODY_SETTLE_S = 1.0


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
            abort(writer)
            return
        self._connections.add(task)
        watchdog = IdleWatchdog(self._idle_timeout_s, task)
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
        except (ConnectionError, OSError, PeerError) as exc:
            _log.debug("egress proxy: connection ended: %r", exc)
        except Exception:  # noqa: BLE001 - one connection's bug is logged; it never takes the proxy down
            _log.exception("egress proxy: unexpected error on a client connection")
        finally:
            watchdog.close()
            if graceful:
                close(writer)
            else:
                abort(writer)
            self._connections.discard(task)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watchdog: IdleWatchdog
    ) -> None:
        """Serve requests on one client connection until it closes or a request ends keep-alive."""
        requests = MessageReader(reader, side="client", max_head=self._max_header_bytes, touch=watchdog.touch)
        while True:
            try:
                async with asyncio.timeout(self._header_timeout_s):
                    head = await requests.next()
            except TimeoutError:
                if requests.head_started:
                    await self._refuse(reader, writer, 408, "timed out waiting for the request headers")
                return
            except HeadTooLarge:
                await self._refuse(
                    reader, writer, 431, f"request headers exceed {self._max_header_bytes} bytes"
                )
                return
            except RequestRefused as exc:
                await self._refuse(reader, writer, 400, exc.message)
                return
            except PeerError as exc:
                await self._refuse(reader, writer, 400, f"malformed request: {exc}")
                return
            if head is None:
                return
            assert isinstance(head, Head), head  # between messages the reader yields heads only
            try:
                keep_alive = await self._serve_request(head, requests, writer, watchdog)
            except ClientError as exc:
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
            await write(writer, error_response(status, message, headers))
            await lingering_close(reader, writer)

    async def _serve_request(
        self, head: Head, requests: MessageReader, writer: asyncio.StreamWriter, watchdog: IdleWatchdog
    ) -> bool:
        """Handle one request; returns whether the client connection may carry another request."""
        if head.version not in ("1.0", "1.1"):
            raise ClientError(505, f"HTTP/{head.version} is not supported; use HTTP/1.1")
        if head.method == "CONNECT":
            host, port = parse_authority(head.target, None)
            await self._enforce(host, port)
            tunnel = await requests.next()
            assert isinstance(tunnel, Tunnel), tunnel  # the reader ends a CONNECT with its tunnel bytes
            await self._tunnel(host, port, tunnel.rest, requests, writer, watchdog)
            return False
        host, port, authority, path = parse_http_uri(head.target)
        await self._enforce(host, port)
        return await self._forward(head, host, port, authority, path, requests, writer, watchdog)

    async def _enforce(self, host: str, port: int) -> None:
        """Apply the current policy to ``host:port``; raises ClientError(403) (after recording) or (503)."""
        try:
            policy = self._policy_provider()
            if inspect.isawaitable(policy):
                policy = await policy
        except Exception as exc:
            _log.exception("egress proxy: policy provider failed; refusing %s", host)
            raise ClientError(503, "the account's host policy is unavailable; refusing to connect") from exc
        if not isinstance(policy, HostPolicy):
            _log.error("egress proxy: policy provider returned %r, not a HostPolicy", type(policy))
            raise ClientError(503, "the account's host policy is unavailable; refusing to connect")
        allowed, reason = decide(policy, host, port)
        if allowed:
            _log.debug("egress proxy: %s:%s %s", host, port, reason)
            return
        _log.info("egress proxy: refused %s:%s (%s)", host, port, reason)
        await self._record(host)
        raise ClientError(
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
            raise ClientError(502, f"connecting to {host}:{port} timed out after {self._connect_timeout_s}s") from None
        except OSError as exc:
            raise ClientError(502, f"cannot reach {host}:{port}: {exc.strerror or exc}") from None

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
                raise ClientError(403, f"Benchwright egress proxy: {host} resolves to an internal address "
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
        self,
        host: str,
        port: int,
        early: bytes,
        requests: MessageReader,
        writer: asyncio.StreamWriter,
        watchdog: IdleWatchdog,
    ) -> None:
        up_reader, up_writer = await self._open_upstream(host, port)
        try:
            await write(writer, b"HTTP/1.1 200 Connection Established\r\n\r\n")
            # Bytes the client sent right behind the CONNECT head (an eager TLS ClientHello) go first.
            if early:
                up_writer.write(early)
            await asyncio.gather(
                self._pump(requests.stream, up_writer, watchdog, (writer, up_writer)),
                self._pump(up_reader, writer, watchdog, (writer, up_writer)),
            )
        finally:
            close(up_writer)

    @staticmethod
    async def _pump(
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        watchdog: IdleWatchdog,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        """Copy ``src`` to ``dst`` until EOF, then half-close ``dst``; on a socket error abort both sides."""
        try:
            while data := await src.read(CHUNK):
                dst.write(data)
                watchdog.touch()
                await dst.drain()
            # Half-close so a peer that signals "done" by EOF (and still expects the answer) keeps working.
            if dst.can_write_eof() and not dst.is_closing():
                dst.write_eof()
        except (ConnectionError, OSError, RuntimeError):
            # The other pump is blocked on a read from a healthy socket; aborting both ends it too.
            abort(*both)

    # -- plain HTTP ------------------------------------------------------------------------------------------

    async def _forward(
        self,
        head: Head,
        host: str,
        port: int,
        authority: str,
        path: str,
        requests: MessageReader,
        writer: asyncio.StreamWriter,
        watchdog: IdleWatchdog,
    ) -> bool:
        """Forward one absolute-URI request over a fresh upstream connection; returns keep-alive for the client."""
        up_reader, up_writer = await self._open_upstream(host, port)
        body_task: asyncio.Task[None] | None = None
        try:
            # Upstream speaks the client's HTTP version (so an HTTP/1.0 client never gets a chunked answer) and
            # closes after one response: one upstream connection per request keeps per-request policy simple.
            headers = filtered_headers(head, drop=frozenset({"host"}))
            headers.insert(0, ("Host", authority))
            headers.append(("Connection", "close"))
            start = f"{head.method} {path} HTTP/{head.version}".encode("ascii")
            try:
                await write(up_writer, serialize_head(start, headers))
            except (ConnectionError, OSError) as exc:
                raise ClientError(502, f"the target {host}:{port} dropped the connection: {exc}") from None
            # Concurrent with the response: a 100 Continue must reach the client while the body is pending, and
            # an origin may answer early (413) without reading the body.
            if not requests.take_end():  # a body follows (a request without one has ended already)
                chunked = bool(head.values("transfer-encoding"))
                body_task = asyncio.create_task(_copy_body(requests, up_writer, chunked=chunked))

                def _abort_on_failure(t: asyncio.Task[Any]) -> None:
                    if not t.cancelled() and t.exception() is not None:
                        abort(up_writer)

                body_task.add_done_callback(_abort_on_failure)
            client_keep_alive = (
                head.version == "1.1"
                and "close" not in head.tokens("connection")
                and "close" not in head.tokens("proxy-connection")
            )
            keep_alive = await self._relay_response(head, client_keep_alive, up_reader, writer, watchdog)
            if body_task is None:
                return keep_alive
            done, _ = await asyncio.wait({body_task}, timeout=_BODY_SETTLE_S)
            if not done or body_task.cancelled() or body_task.exception() is not None:
                keep_alive = False  # the rest of the request body is unread: the connection is out of sync
            return keep_alive
        finally:
            if body_task is not None and not body_task.done():
                body_task.cancel()
                await asyncio.wait({body_task})  # unlike `await body_task`, never swallows our own cancellation
            close(up_writer)

    async def _relay_response(
        self,
        request: Head,
        client_keep_alive: bool,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        watchdog: IdleWatchdog,
    ) -> bool:
        """Relay interim and final response heads and the body; returns keep-alive for the client."""
        responses = MessageReader(up_reader, side="upstream", max_head=_MAX_RESPONSE_HEAD, touch=watchdog.touch,
                                  head_only=lambda: request.method == "HEAD")
        while True:
            try:
                head = await responses.next()
            except HeadTooLarge:
                raise ClientError(502, "the target's response headers are too large") from None
            except (PeerError, ConnectionError, OSError) as exc:
                raise ClientError(502, f"the target broke the connection: {exc}") from None
            if head is None:
                raise ClientError(502, "the target closed the connection without answering")
            assert isinstance(head, Head), head
            if head.version not in ("1.0", "1.1"):
                raise ClientError(502, "the target answered with a malformed status line")
            if head.status == 101:
                raise ClientError(502, "the target switched protocols, which this proxy does not relay")
            if head.status >= 200:
                break
            if request.version == "1.1":  # HTTP/1.0 clients must not see interim (1xx) responses
                await write(writer, serialize_head(head.start, filtered_headers(head)))
        framing = _response_framing(head, request.method)
        keep_alive = client_keep_alive and framing != "close"
        # Content-Length next to Transfer-Encoding is dropped (RFC 9112 §6.3) since the body is relayed chunked.
        drop = frozenset({"content-length"}) if framing == "chunked" else frozenset()
        headers = filtered_headers(head, drop=drop)
        if not keep_alive:
            headers.append(("Connection", "close"))
        writer.write(serialize_head(head.start, headers))
        # From here on the client has a response in progress: failures can only abort the connection.
        try:
            while not isinstance(event := await responses.next(), End):
                if event is None:
                    if framing != "close":
                        raise PeerError("upstream", "connection closed inside a body")
                    break
                assert isinstance(event, bytes), event
                writer.write(chunk(event) if framing == "chunked" else event)
                await writer.drain()
            if framing == "chunked":
                writer.write(last_chunk(event.trailers if isinstance(event, End) else []))
            await writer.drain()
        except (PeerError, HeadTooLarge) as exc:
            raise ConnectionError(f"target response broken mid-body: {exc}") from None
        return keep_alive


def _response_framing(head: Head, method: str) -> str:
    """How an upstream response's body is delimited (RFC 9112 §6.3): none, length, chunked or close.

    llhttp has validated Content-Length already; a Transfer-Encoding not ending in chunked reads until close.
    """
    if method == "HEAD" or head.status in (204, 304):
        return "none"
    if codings := [t.strip().lower() for v in head.values("transfer-encoding") for t in v.split(",") if t.strip()]:
        return "chunked" if codings[-1] == "chunked" else "close"
    return "length" if head.values("content-length") else "close"


async def _copy_body(requests: MessageReader, dst: asyncio.StreamWriter, *, chunked: bool) -> None:
    """Relay a request body to the target (re-framed canonically when chunked) until its end."""
    while not isinstance(event := await requests.next(), End):
        if event is None:
            raise PeerError("client", "connection closed inside a body")
        assert isinstance(event, bytes), event
        dst.write(chunk(event) if chunked else event)
        await dst.drain()
    if chunked:
        dst.write(last_chunk(event.trailers))
        await dst.drain()
