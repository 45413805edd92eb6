"""Egress proxy end to end over real loopback sockets: an origin HTTP server, a TCP echo server and the proxy,
all started by the tests on free ports (or a Unix socket) and stopped by them.

All targets are loopback, so ``localhost`` and ``127.0.0.1`` serve as two different host strings: the default
policy here allows ``localhost`` and blocks everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.proxy import EgressProxy, HostPolicy, HostRule, InMemoryBlockedLog

Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


# ------------------------------------------------------------------------------------------------ test servers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while True:
        size = int((await reader.readline()).split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            return body
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"


@dataclass
class Origin:
    """A small HTTP/1.1 origin: echoes requests as JSON and serves a few framings on special paths."""

    ssl_context: ssl.SSLContext | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    port: int = 0
    _server: asyncio.AbstractServer | None = None

    async def start(self) -> Origin:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[:-2]
        method, target, version = head[0].split(" ")
        headers = [tuple(line.split(": ", 1)) for line in head[1:]]
        lower = {k.lower(): v for k, v in headers}
        if lower.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "content-length" in lower:
            body = await reader.readexactly(int(lower["content-length"]))
        elif lower.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader)
        else:
            body = b""
        self.requests.append({"method": method, "target": target, "version": version, "headers": headers, "body": body})
        close = lower.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        conn = b"Connection: close\r\n" if close else b""
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if target.startswith("/slow"):
                await asyncio.sleep(0.2)
            if target == "/chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + conn + b"\r\n")
                writer.write(b"6;ext=1\r\nhello \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")
            elif target == "/close":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil eof")
                await writer.drain()
                return False
            elif target.startswith("/bytes/"):
                n = int(target.rsplit("/", 1)[1])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (n, conn))
                block = b"x" * 65536
                while n > 0:
                    writer.write(block[: min(n, len(block))])
                    n -= min(n, len(block))
                    await writer.drain()
            else:
                payload = json.dumps(
                    {"method": method, "target": target, "headers": headers, "body": body.decode("latin-1")}
                ).encode()
                extra = b"X-Origin: yes\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s%s\r\n" % (len(payload), extra, conn))
                if method != "HEAD":
                    writer.write(payload)
            await writer.drain()
        finally:
            self.active -= 1
        return not close


@dataclass
class Echo:
    """A raw TCP echo server; on the client's EOF it half-closes too."""

    port: int = 0
    _server: asyncio.AbstractServer | None = None

    async def start(self) -> Echo:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @staticmethod
    async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()
        except ConnectionError:
            pass
        finally:
            writer.close()


@dataclass
class PolicyBox:
    """Mutable holder the proxy's policy_provider reads on every request."""

    policy: HostPolicy


@dataclass
class Env:
    proxy: EgressProxy
    box: PolicyBox
    log: InMemoryBlockedLog

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.proxy.port)


def _localhost_only() -> HostPolicy:
    return HostPolicy(default="block", rules=[HostRule(pattern="localhost", action="allow")])


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    server = await Origin().start()
    yield server
    await server.stop()


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    server = await Echo().start()
    yield server
    await server.stop()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    box = PolicyBox(_localhost_only())
    log = InMemoryBlockedLog()
    proxy = EgressProxy(allow_internal=True, policy_provider=lambda: box.policy, recorder=log)
    await proxy.start()
    yield Env(proxy, box, log)
    await proxy.stop()
    assert not proxy._connections  # stop() leaves no connection task behind


# ------------------------------------------------------------------------------------------------ raw client


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False) -> Response:
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[:-2]
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    if head_only or 100 <= status < 200 or status in (204, 304) or lines[0].endswith("Connection Established"):
        body = b""
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.read()
    return Response(status, headers, body)


async def exchange(connect: Connector, request: bytes) -> Response:
    reader, writer = await connect()
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), 10)
    finally:
        writer.close()


def get(url: str, *headers: str, method: str = "GET") -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"{method} {url} HTTP/1.1\r\nHost: ignored.example\r\nConnection: close\r\n{extra}\r\n".encode()


async def open_tunnel(
    connect: Connector, target: str, eager: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Response]:
    reader, writer = await connect()
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode() + eager)
    await writer.drain()
    return reader, writer, await asyncio.wait_for(read_response(reader), 10)


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------------------ policy + log


async def test_allowed_name_reaches_origin_and_blocked_ip_is_refused_and_recorded(env: Env, origin: Origin) -> None:
    async with httpx.AsyncClient(proxy=env.proxy.url, trust_env=False) as client:
        ok = await client.get(f"http://localhost:{origin.port}/hello?x=1")
        assert ok.status_code == 200
        assert ok.json()["target"] == "/hello?x=1"
        assert env.log.entries() == []

        blocked = await client.get(f"http://127.0.0.1:{origin.port}/hello")
        assert blocked.status_code == 403
        assert blocked.headers["x-benchwright-blocked"] == "127.0.0.1"
        assert "127.0.0.1 is blocked by the account's host policy" in blocked.text
        [first] = env.log.entries()
        assert first["host"] == "127.0.0.1" and first["seen_count"] == 1
        assert first["first_seen"] == first["last_seen"]
        assert first["first_seen"].utcoffset() == timedelta(0)  # timezone-aware UTC

        await asyncio.sleep(0.01)
        again = await client.get(f"http://127.0.0.1:{origin.port}/other")
        assert again.status_code == 403
        [second] = env.log.entries()
        assert second["seen_count"] == 2
        assert second["first_seen"] == first["first_seen"]
        assert second["last_seen"] > first["last_seen"]
    assert len(origin.requests) == 1  # the refused requests never reached the origin


async def test_policy_changes_apply_to_the_next_request_without_restart(env: Env, origin: Origin) -> None:
    url = f"http://localhost:{origin.port}/"
    assert (await exchange(env.connect, get(url))).status == 200
    env.box.policy = HostPolicy(default="allow", rules=[HostRule(pattern="localhost", action="block")])
    assert (await exchange(env.connect, get(url))).status == 403
    assert (await exchange(env.connect, get(f"http://127.0.0.1:{origin.port}/"))).status == 200
    env.box.policy = HostPolicy()  # fresh account: allow
    assert (await exchange(env.connect, get(url))).status == 200
    assert [(e["host"], e["seen_count"]) for e in env.log.entries()] == [("localhost", 1)]


async def test_each_request_on_a_kept_alive_connection_is_decided(env: Env, origin: Origin) -> None:
    reader, writer = await env.connect()
    try:
        for path in ("/one", "/two"):
            writer.write(f"GET http://localhost:{origin.port}{path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            response = await read_response(reader)
            assert response.status == 200 and response.json()["target"] == path
            assert "connection" not in response.headers
        writer.write(f"GET http://127.0.0.1:{origin.port}/three HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        refused = await read_response(reader)
        assert refused.status == 403 and refused.headers["connection"] == "close"
        assert await reader.read() == b""  # closed after the refusal
    finally:
        writer.close()
    assert [r["target"] for r in origin.requests] == ["/one", "/two"]


# ------------------------------------------------------------------------------------------------ plain HTTP


async def test_request_is_rewritten_to_origin_form_without_hop_by_hop_headers(env: Env, origin: Origin) -> None:
    response = await exchange(
        env.connect,
        get(
            f"http://LocalHost:{origin.port}/p/a?q=1#fragment",
            "Proxy-Connection: keep-alive",
            "Proxy-Authorization: Basic c2VjcmV0",
            "Connection: X-Hop",
            "X-Hop: 1",
            "TE: trailers",
            "X-Kept: yes",
        ),
    )
    assert response.status == 200
    seen = origin.requests[0]
    assert seen["target"] == "/p/a?q=1"
    names = [name.lower() for name, _ in seen["headers"]]
    assert dict(seen["headers"])["Host"] == f"LocalHost:{origin.port}"  # from the URI, not the client's Host
    assert names.count("host") == 1
    assert {"proxy-connection", "proxy-authorization", "x-hop", "te"}.isdisjoint(names)
    assert dict(seen["headers"])["X-Kept"] == "yes"
    assert dict(seen["headers"])["Connection"] == "close"
    # hop-by-hop response headers are not passed back either
    assert response.headers["x-origin"] == "yes"
    assert "keep-alive" not in response.headers and "proxy-authenticate" not in response.headers


async def test_request_bodies_are_forwarded(env: Env, origin: Origin) -> None:
    url = f"http://localhost:{origin.port}/post"
    sized = await exchange(env.connect, get(url, "Content-Length: 5", method="POST") + b"hello")
    assert sized.json()["body"] == "hello"
    chunked = await exchange(
        env.connect, get(url, "Transfer-Encoding: chunked", method="POST") + b"3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    assert chunked.json()["body"] == "abcde"

    async def stream() -> AsyncIterator[bytes]:
        for part in (b"x" * 100_000, b"y" * 100_000):
            yield part

    async with httpx.AsyncClient(proxy=env.proxy.url, trust_env=False) as client:
        response = await client.post(url, content=stream())
        assert response.json()["body"] == "x" * 100_000 + "y" * 100_000


async def test_expect_100_continue_is_relayed(env: Env, origin: Origin) -> None:
    reader, writer = await env.connect()
    try:
        writer.write(
            f"PUT http://localhost:{origin.port}/up HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
        )
        interim = await asyncio.wait_for(read_response(reader), 5)
        assert interim.status == 100
        writer.write(b"data")
        final = await asyncio.wait_for(read_response(reader), 5)
        assert final.status == 200 and final.json()["body"] == "data"
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("path", "method", "body"),
    [("/chunked", "GET", b"hello world"), ("/close", "GET", b"until eof"), ("/", "HEAD", b"")],
)
async def test_response_framings_are_relayed(env: Env, origin: Origin, path: str, method: str, body: bytes) -> None:
    async with httpx.AsyncClient(proxy=env.proxy.url, trust_env=False) as client:
        response = await client.request(method, f"http://localhost:{origin.port}{path}")
        assert response.status_code == 200
        assert response.content == body


async def test_sync_httpx_client_through_the_proxy(env: Env, origin: Origin) -> None:
    def fetch() -> httpx.Response:
        with httpx.Client(proxy=env.proxy.url, trust_env=False) as client:
            return client.get(f"http://localhost:{origin.port}/sync")

    response = await asyncio.to_thread(fetch)
    assert response.status_code == 200 and response.json()["target"] == "/sync"


async def test_unreachable_target_is_502(env: Env) -> None:
    port = _closed_port()
    response = await exchange(env.connect, get(f"http://localhost:{port}/"))
    assert response.status == 502 and b"cannot reach localhost" in response.body
    _, writer, tunnel = await open_tunnel(env.connect, f"localhost:{port}")
    writer.close()
    assert tunnel.status == 502


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"garbage\r\n\r\n", 400, b"malformed request line"),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, b"not a proxy request"),
        (b"GET https://localhost/ HTTP/1.1\r\n\r\n", 400, b"CONNECT"),
        (b"GET ftp://localhost/ HTTP/1.1\r\n\r\n", 400, b"unsupported URI scheme"),
        (b"GET http://localhost@127.0.0.1/ HTTP/1.1\r\n\r\n", 400, b"userinfo"),
        (b"GET http:///x HTTP/1.1\r\n\r\n", 400, b"no host"),
        (b"GET http://127.1/ HTTP/1.1\r\n\r\n", 400, b"not a canonical IPv4"),
        (b"GET http://localhost:99999/ HTTP/1.1\r\n\r\n", 400, b"invalid port"),
        (b"CONNECT localhost HTTP/1.1\r\n\r\n", 400, b"must be host:port"),
        (b"CONNECT ::1:443 HTTP/1.1\r\n\r\n", 400, b"brackets"),
        (b"GET http://localhost/ HTTP/1.1\r\nNo colon here\r\n\r\n", 400, b"malformed header line"),
        (b"GET http://localhost/ HTTP/1.1\r\n folded: x\r\n\r\n", 400, b"line folding"),
        (b"GET http://localhost/ HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400, b"invalid characters"),
        (b"POST http://localhost/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
         b"both Transfer-Encoding and Content-Length"),
        (b"POST http://localhost/ HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n", 400, b"invalid Content-Length"),
        (b"POST http://localhost/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400, b"must end in chunked"),
        (b"GET http://localhost/ HTTP/2.0\r\n\r\n", 505, b"not supported"),
        ("GET http://b\u00fccher.example/ HTTP/1.1\r\n\r\n".encode(), 400, b"malformed request line"),
    ],
)
async def test_malformed_requests_get_400(env: Env, request_bytes: bytes, status: int, message: bytes) -> None:
    response = await exchange(env.connect, request_bytes)
    assert response.status == status
    assert message in response.body
    assert response.headers["connection"] == "close"
    assert env.log.entries() == []


@pytest.mark.parametrize("shape", ["many headers", "one huge header"])
async def test_oversized_headers_get_431(env: Env, origin: Origin, shape: str) -> None:
    url = f"http://localhost:{origin.port}/"
    if shape == "many headers":
        extra = [f"X-Filler-{i}: {'v' * 100}" for i in range(700)]
    else:
        extra = [f"X-Huge: {'v' * 100_000}"]
    response = await exchange(env.connect, get(url, *extra))
    assert response.status == 431
    assert origin.requests == []


async def test_incomplete_headers_time_out_with_408() -> None:
    proxy = EgressProxy(allow_internal=True, policy_provider=HostPolicy, recorder=InMemoryBlockedLog(),
                        header_timeout_s=0.3)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET http://localhost/ HTTP/1.1\r\nX-Slow: ")
        response = await asyncio.wait_for(read_response(reader), 5)
        assert response.status == 408
        writer.close()
        # an idle connection that never sent anything is simply closed
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await proxy.stop()


# ------------------------------------------------------------------------------------------------ CONNECT


async def test_connect_tunnel_echoes_bytes_both_ways(env: Env, echo: Echo) -> None:
    # The first payload rides in the same segment as the CONNECT head, like an eager TLS ClientHello.
    reader, writer, established = await open_tunnel(env.connect, f"localhost:{echo.port}", eager=b"early|")
    try:
        assert established.status == 200
        payload = os.urandom(3 * 1024 * 1024 + 7)
        writer.write(payload)
        await writer.drain()
        writer.write_eof()  # half-close: the echo server still answers, then closes its side
        echoed = await asyncio.wait_for(reader.read(-1), 10)
        assert echoed == b"early|" + payload
    finally:
        writer.close()


async def test_connect_to_a_blocked_host_is_403_and_recorded(env: Env, echo: Echo) -> None:
    _reader, writer, refused = await open_tunnel(env.connect, f"127.0.0.1:{echo.port}")
    writer.close()
    assert refused.status == 403
    assert refused.headers["x-benchwright-blocked"] == "127.0.0.1"
    assert b"blocked by the account's host policy" in refused.body
    assert [(e["host"], e["seen_count"]) for e in env.log.entries()] == [("127.0.0.1", 1)]


async def test_connect_port_rules_are_enforced(env: Env, echo: Echo) -> None:
    env.box.policy = HostPolicy(
        default="allow", rules=[HostRule(pattern=f"localhost:{echo.port}", action="block")]
    )
    _, writer, refused = await open_tunnel(env.connect, f"localhost:{echo.port}")
    writer.close()
    assert refused.status == 403
    assert refused.headers["x-benchwright-blocked"] == "localhost"


@pytest.fixture
def tls_files() -> Iterator[tuple[Path, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    directory = Path(tempfile.mkdtemp(prefix="bw-tls-"))
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True,
    )
    yield cert, key
    shutil.rmtree(directory)


async def test_https_through_the_connect_tunnel_with_httpx(env: Env, tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    tls_origin = await Origin(ssl_context=server_ctx).start()
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))

        def fetch() -> httpx.Response:
            with httpx.Client(proxy=env.proxy.url, verify=client_ctx, trust_env=False) as client:
                return client.get(f"https://localhost:{tls_origin.port}/secure")

        response = await asyncio.to_thread(fetch)
        assert response.status_code == 200 and response.json()["target"] == "/secure"
    finally:
        await tls_origin.stop()


async def test_idle_tunnel_is_closed_after_idle_timeout(echo: Echo) -> None:
    proxy = EgressProxy(allow_internal=True, policy_provider=HostPolicy, recorder=InMemoryBlockedLog(),
                        idle_timeout_s=0.3)
    await proxy.start()
    try:
        connect: Connector = lambda: asyncio.open_connection("127.0.0.1", proxy.port)  # noqa: E731
        reader, writer, established = await open_tunnel(connect, f"localhost:{echo.port}")
        assert established.status == 200
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy, not by us
        assert 0.2 < time.monotonic() - started < 2
        writer.close()
        await asyncio.sleep(0)
        assert not proxy._connections
    finally:
        await proxy.stop()


async def test_stop_closes_open_tunnels(echo: Echo) -> None:
    proxy = EgressProxy(allow_internal=True, policy_provider=HostPolicy, recorder=InMemoryBlockedLog())
    await proxy.start()
    connect: Connector = lambda: asyncio.open_connection("127.0.0.1", proxy.port)  # noqa: E731
    reader, writer, established = await open_tunnel(connect, f"localhost:{echo.port}")
    assert established.status == 200
    stalled_reader, stalled_writer = await connect()
    stalled_writer.write(b"GET http://localhost/ HTTP/1.1\r\n")  # half a request head
    await asyncio.sleep(0.05)
    assert len(proxy._connections) == 2
    await asyncio.wait_for(proxy.stop(), 5)
    assert not proxy._connections
    for stream in (reader, stalled_reader):
        try:
            leftover = await asyncio.wait_for(stream.read(), 5)
        except ConnectionError:
            leftover = b""  # an abort may surface as a reset; either way the proxy hung up
        assert leftover == b""
    writer.close()
    stalled_writer.close()


# ------------------------------------------------------------------------------------------------ Unix socket


async def test_unix_socket_mode(origin: Origin, echo: Echo) -> None:
    directory = tempfile.mkdtemp(prefix="bw-uds-")  # short path: AF_UNIX paths are limited to ~108 bytes
    path = os.path.join(directory, "egress.sock")
    log = InMemoryBlockedLog()
    proxy = EgressProxy(allow_internal=True, policy_provider=_localhost_only, recorder=log, uds_path=path)
    assert await proxy.start() == 0
    try:
        assert proxy.uds_path == path and os.path.exists(path)
        with pytest.raises(RuntimeError):
            _ = proxy.url
        connect: Connector = lambda: asyncio.open_unix_connection(path)  # noqa: E731
        ok = await exchange(connect, get(f"http://localhost:{origin.port}/via-uds"))
        assert ok.status == 200 and ok.json()["target"] == "/via-uds"
        refused = await exchange(connect, get(f"http://127.0.0.1:{origin.port}/"))
        assert refused.status == 403 and refused.headers["x-benchwright-blocked"] == "127.0.0.1"
        reader, writer, established = await open_tunnel(connect, f"localhost:{echo.port}")
        assert established.status == 200
        writer.write(b"over uds")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"over uds"
        writer.close()
        assert [(e["host"], e["seen_count"]) for e in log.entries()] == [("127.0.0.1", 1)]
    finally:
        await proxy.stop()
        assert not os.path.exists(path)
        os.rmdir(directory)


# ------------------------------------------------------------------------------------------------ recorders


async def test_async_recorder_and_async_policy_provider(origin: Origin) -> None:
    recorded: list[str] = []

    class AsyncRecorder:
        async def record(self, host: str) -> None:
            await asyncio.sleep(0)
            recorded.append(host)

    async def provider() -> HostPolicy:
        return HostPolicy(default="block")

    async with EgressProxy(allow_internal=True, policy_provider=provider, recorder=AsyncRecorder()) as proxy:
        connect: Connector = lambda: asyncio.open_connection("127.0.0.1", proxy.port)  # noqa: E731
        response = await exchange(connect, get(f"http://LOCALHOST.:{origin.port}/"))
    assert response.status == 403
    assert recorded == ["localhost"]


async def test_policy_provider_failure_fails_closed_with_503(origin: Origin) -> None:
    def broken() -> HostPolicy:
        raise RuntimeError("db down")

    log = InMemoryBlockedLog()
    async with EgressProxy(allow_internal=True, policy_provider=broken, recorder=log) as proxy:
        connect: Connector = lambda: asyncio.open_connection("127.0.0.1", proxy.port)  # noqa: E731
        response = await exchange(connect, get(f"http://localhost:{origin.port}/"))
    assert response.status == 503
    assert log.entries() == []  # not a policy refusal, so not a blocked host
    assert origin.requests == []


# ------------------------------------------------------------------------------------------------ concurrency


async def test_100_concurrent_requests_complete(env: Env, origin: Origin) -> None:
    url = f"http://localhost:{origin.port}/slow"
    started = time.monotonic()
    responses = await asyncio.gather(*(exchange(env.connect, get(f"{url}/{i}")) for i in range(100)))
    elapsed = time.monotonic() - started
    assert [r.status for r in responses] == [200] * 100
    assert sorted(r.json()["target"] for r in responses) == sorted(f"/slow/{i}" for i in range(100))
    assert origin.max_active > 50  # they really were in flight at the same time
    assert elapsed < 5  # 100 x 0.2 s serially would be 20 s


async def test_100_concurrent_httpx_requests_and_tunnels(env: Env, origin: Origin, echo: Echo) -> None:
    async def tunnel(i: int) -> bytes:
        reader, writer, established = await open_tunnel(env.connect, f"localhost:{echo.port}")
        assert established.status == 200
        payload = f"tunnel {i} ".encode() * 1000
        writer.write(payload)
        writer.write_eof()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data == payload

    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(proxy=env.proxy.url, limits=limits, trust_env=False, timeout=20) as client:
        results = await asyncio.gather(
            *(client.get(f"http://localhost:{origin.port}/slow/{i}") for i in range(100)),
            *(tunnel(i) for i in range(100)),
        )
    assert all(r.status_code == 200 for r in results[:100])
    assert all(results[100:])


async def test_a_stalled_client_does_not_block_others(env: Env, origin: Origin, echo: Echo) -> None:
    # One client sends half a head, another opens a tunnel and never reads: neither holds anyone else up.
    _, half_writer = await env.connect()
    half_writer.write(b"GET http://localhost:1/ HTTP/1.1\r\nX-A: ")
    _, stuck_writer, established = await open_tunnel(env.connect, f"localhost:{echo.port}")
    assert established.status == 200
    stuck_writer.write(b"z" * (4 * 1024 * 1024))  # echoed back into a client that never reads
    started = time.monotonic()
    response = await exchange(env.connect, get(f"http://localhost:{origin.port}/fast"))
    assert response.status == 200
    assert time.monotonic() - started < 1
    half_writer.close()
    stuck_writer.transport.abort()


async def test_large_download_through_plain_http_and_tunnel_integrity(env: Env, origin: Origin, echo: Echo) -> None:
    size = 16 * 1024 * 1024
    async with httpx.AsyncClient(proxy=env.proxy.url, trust_env=False) as client:
        response = await client.get(f"http://localhost:{origin.port}/bytes/{size}")
        assert len(response.content) == size

    payload = os.urandom(size)
    reader, writer, established = await open_tunnel(env.connect, f"localhost:{echo.port}")
    assert established.status == 200

    async def send() -> None:
        for i in range(0, size, 1 << 20):
            writer.write(payload[i : i + (1 << 20)])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    digest = hashlib.sha256()
    received = 0
    while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
        digest.update(chunk)
        received += len(chunk)
    await sender
    writer.close()
    assert received == size and digest.digest() == hashlib.sha256(payload).digest()


async def test_http_1_0_client_is_served_and_closed(env: Env, origin: Origin) -> None:
    reader, writer = await env.connect()
    try:
        writer.write(f"GET http://localhost:{origin.port}/old HTTP/1.0\r\n\r\n".encode())
        response = await asyncio.wait_for(read_response(reader), 5)
        assert response.status == 200 and response.headers["connection"] == "close"
        assert await reader.read() == b""
    finally:
        writer.close()
    assert origin.requests[0]["version"] == "HTTP/1.0"


@pytest.mark.parametrize("answer", [b"garbage\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"])
async def test_a_target_that_breaks_http_gives_502(env: Env, answer: bytes) -> None:
    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(bad, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        response = await exchange(env.connect, get(f"http://localhost:{port}/"))
        assert response.status == 502
    finally:
        server.close()
        await server.wait_closed()



async def test_internal_addresses_are_refused_whatever_the_policy_says() -> None:
    """A sandbox must not reach the platform's own services through the proxy, even with default allow:
    loopback names and addresses, private ranges and link-local (cloud metadata) are refused and recorded,
    except an endpoint the platform allowed explicitly (the run's model proxy)."""
    import asyncio as _asyncio

    async def handle(reader: _asyncio.StreamReader, writer: _asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    origin = await _asyncio.start_server(handle, "127.0.0.1", 0)
    port = origin.sockets[0].getsockname()[1]
    log = InMemoryBlockedLog()
    proxy = EgressProxy(policy_provider=HostPolicy, recorder=log, internal_allowed=frozenset({("127.0.0.1", port)}))
    await proxy.start()
    try:
        async with httpx.AsyncClient(proxy=proxy.url) as client:
            allowed = await client.get(f"http://127.0.0.1:{port}/")
            refused = await client.get(f"http://localhost:{port + 1 if port < 65535 else port - 1}/")
            metadata = await client.get("http://169.254.169.254/latest/meta-data/")
    finally:
        await proxy.stop()
        origin.close()
        await origin.wait_closed()
    assert allowed.status_code == 200 and allowed.text == "ok"
    assert refused.status_code == 403 and "internal address" in refused.text
    assert metadata.status_code == 403
    assert {e["host"] for e in log.entries()} == {"localhost", "169.254.169.254"}


# ------------------------------------------------------------------------------------------------ hostile input


@dataclass
class RawTarget:
    """A target that records every byte a connection sends until EOF and answers ``answer`` after the head
    (nothing if None, so the proxy sees the connection close unanswered)."""

    answer: bytes | None = None
    received: bytearray = field(default_factory=bytearray)
    port: int = 0
    _server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> RawTarget:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.answer is not None:
                self.received += await reader.readuntil(b"\r\n\r\n")
                writer.write(self.answer)
                await writer.drain()
            else:
                while data := await reader.read(65536):
                    self.received += data
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize(
    "body",
    [b"zz\r\nabc\r\n0\r\n\r\n", b"ffffffffffffffffff\r\n", b"-1\r\nabc\r\n", b"3\r\nabcXX\r\n0\r\n\r\n",
     b"3\r\nabc\r\n0\r\nX-T: " + b"a" * 100_000 + b"\r\n\r\n"],
    ids=["not hex", "overflow", "negative", "no CRLF after data", "endless trailer"],
)
async def test_bad_chunked_request_bodies_end_the_exchange_and_never_reach_the_target(env: Env, body: bytes) -> None:
    async with RawTarget() as target:
        head = get(f"http://localhost:{target.port}/", "Transfer-Encoding: chunked", method="POST")
        response = await exchange(env.connect, head + body)
    assert response.status == 502  # the proxy abandoned the upstream request, so the target never answered
    forwarded = bytes(target.received)
    assert forwarded.startswith(b"POST / HTTP/1.1\r\n")
    assert b"zz" not in forwarded and b"ffff" not in forwarded and b"XX" not in forwarded and b"-1" not in forwarded
    assert len(forwarded) < 10_000  # not the endless trailer either


@pytest.mark.parametrize(
    "framing",
    ["Content-Length: +5", "Content-Length: 5 5", "Content-Length: 0x5", "Content-Length: 99999999999999999999",
     "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity", "Transfer-Encoding: identity"],
)
async def test_ambiguous_request_framing_is_refused_before_the_target(env: Env, origin: Origin, framing: str) -> None:
    response = await exchange(env.connect, get(f"http://localhost:{origin.port}/", framing, method="POST") + b"hello")
    assert response.status == 400 and response.headers["connection"] == "close"
    assert origin.requests == []


@pytest.mark.parametrize(
    "request_bytes",
    [b"GET http://localhost/ HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", b"GET http://localhost/a b HTTP/1.1\r\n\r\n",
     b"GET http://localhost/ HTTP/1.1\r\nX-A: a\r\n\tX-Injected: b\r\n\r\n", b"GET http://localhost/\r\n\r\n",
     b"GET http://localhost/ HTTP/1.1\r\nX A: b\r\n\r\n"],
    ids=["NUL in value", "space in target", "folded continuation", "no version", "space in name"],
)
async def test_header_injection_attempts_are_refused(env: Env, request_bytes: bytes) -> None:
    response = await exchange(env.connect, request_bytes)
    assert response.status == 400 and response.headers["connection"] == "close"


@pytest.mark.parametrize(
    "answer",
    [b"HTTP/1.1 200 OK\r\nX-Evil: a\rSet-Cookie: b\r\nContent-Length: 0\r\n\r\n",
     b"HTTP/1.1 200 OK\r\nX-Big: " + b"v" * 300_000 + b"\r\nContent-Length: 0\r\n\r\n",
     b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"],
    ids=["CR in a response header", "oversized response head", "conflicting lengths"],
)
async def test_hostile_target_answers_are_not_relayed(env: Env, answer: bytes) -> None:
    async with RawTarget(answer) as target:
        response = await exchange(env.connect, get(f"http://localhost:{target.port}/"))
    assert response.status == 502
    assert "set-cookie" not in response.headers and "x-big" not in response.headers


async def test_an_oversized_request_line_gets_431(env: Env, origin: Origin) -> None:
    response = await exchange(env.connect, get(f"http://localhost:{origin.port}/{'a' * 100_000}"))
    assert response.status == 431
    assert origin.requests == []


async def test_a_trickled_head_is_cut_off_by_the_header_timeout() -> None:
    """Slowloris: bytes keep arriving (so the idle watchdog never fires) but the head never completes."""
    proxy = EgressProxy(allow_internal=True, policy_provider=HostPolicy, recorder=InMemoryBlockedLog(),
                        header_timeout_s=0.5)
    await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(b"GET http://localhost/ HTTP/1.1\r\nX-Slow: ")
            while True:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.02)  # the slow client's pace, not synchronisation

    trickler = asyncio.create_task(trickle())
    try:
        response = await asyncio.wait_for(read_response(reader), 5)
        assert response.status == 408
    finally:
        trickler.cancel()
        writer.close()
        await proxy.stop()


async def test_pipelined_requests_are_answered_in_order(env: Env, origin: Origin) -> None:
    url = f"http://localhost:{origin.port}"
    pipelined = (
        f"POST {url}/one HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".encode()
        + f"POST {url}/two HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;e=1\r\nhi\r\n0\r\n\r\n".encode()
        + f"GET {url}/three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    reader, writer = await env.connect()
    try:
        writer.write(pipelined)
        answers = [await asyncio.wait_for(read_response(reader), 5) for _ in range(3)]
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    assert [(a.status, a.json()["target"], a.json()["body"]) for a in answers] == [
        (200, "/one", "hello"), (200, "/two", "hi"), (200, "/three", "")
    ]


async def test_an_upgrade_request_is_forwarded_plain_and_the_connection_stays_usable(env: Env, origin: Origin) -> None:
    url = f"http://localhost:{origin.port}"
    reader, writer = await env.connect()
    try:
        writer.write(f"GET {url}/a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".encode())
        first = await asyncio.wait_for(read_response(reader), 5)
        writer.write(f"GET {url}/b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        second = await asyncio.wait_for(read_response(reader), 5)
    finally:
        writer.close()
    assert (first.status, second.status) == (200, 200)
    assert [r["target"] for r in origin.requests] == ["/a", "/b"]
    assert all(name.lower() != "upgrade" for name, _ in origin.requests[0]["headers"])


async def test_an_upgrade_request_with_a_body_forwards_the_body(env: Env, origin: Origin) -> None:
    url = f"http://localhost:{origin.port}"
    reader, writer = await env.connect()
    try:
        writer.write(f"POST {url}/a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
                     "Content-Length: 5\r\n\r\nhello".encode()
                     + f"POST {url}/b HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
                     "Upgrade: h2c\r\n\r\n2\r\nhi\r\n0\r\n\r\n".encode())
        first = await asyncio.wait_for(read_response(reader), 5)
        second = await asyncio.wait_for(read_response(reader), 5)
    finally:
        writer.close()
    assert [(first.json()["target"], first.json()["body"]), (second.json()["target"], second.json()["body"])] == [
        ("/a", "hello"), ("/b", "hi")
    ]
