"""benchwright.llm.httpclient against real loopback servers that answer the ways HTTP servers do (and misbehave)."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from benchwright.llm.httpclient import ConnectionShelf, HttpClientError, HttpPool

pytestmark = pytest.mark.asyncio(loop_scope="session")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, int]], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes] | None:
    """One request off the connection: (request line, headers, body), or None at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


def response(body: bytes, *, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@asynccontextmanager
async def serving(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[tuple[str, dict]]:
    """A loopback server running ``handler`` per connection; yields its base URL and counters."""
    stats = {"connections": 0, "requests": 0}

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats["connections"] += 1
        try:
            await handler(reader, writer, stats)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}/v1", stats
    finally:
        server.close()
        await server.wait_closed()


async def echo_keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
    while (req := await read_request(reader)) is not None:
        stats["requests"] += 1
        line, headers, body = req
        writer.write(response(f"{line}|{headers.get('authorization')}|{body.decode()}".encode(),
                              extra="X-Litellm-Response-Cost: 0.5\r\n"))
        await writer.drain()


async def test_post_sends_path_headers_and_body_and_reuses_the_connection() -> None:
    async with serving(echo_keep_alive) as (url, stats):
        pool = HttpPool(url, headers={"Authorization": "Bearer k"})
        try:
            first = await pool.post("/chat/completions", b'{"a": 1}')
            second = await pool.post("/chat/completions", b"two")
        finally:
            await pool.aclose()
    assert first.status == 200
    assert first.body == b'POST /v1/chat/completions HTTP/1.1|Bearer k|{"a": 1}'
    assert first.headers["x-litellm-response-cost"] == "0.5"  # names lower-cased
    assert second.body.endswith(b"|two")
    assert stats == {"connections": 1, "requests": 2}


async def test_concurrent_requests_get_their_own_answers() -> None:
    async with serving(echo_keep_alive) as (url, stats):
        pool = HttpPool(url, max_idle=8)
        try:
            bodies = [f"n{i}".encode() for i in range(50)]
            answers = await asyncio.gather(*(pool.post("/x", b) for b in bodies))
            again = await asyncio.gather(*(pool.post("/x", b) for b in bodies[:8]))
        finally:
            await pool.aclose()
    assert [a.body.rsplit(b"|", 1)[1] for a in answers] == bodies
    assert [a.body.rsplit(b"|", 1)[1] for a in again] == bodies[:8]
    assert stats["connections"] == 50  # eight of them were kept and reused for the second round


async def test_chunked_gzip_and_error_statuses() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        while (req := await read_request(reader)) is not None:
            path = req[0].split()[1]
            if path.endswith("/chunked"):
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            elif path.endswith("/gzip"):
                writer.write(response(gzip.compress(b"unzipped"), extra="Content-Encoding: gzip\r\n"))
            else:
                writer.write(response(b'{"error": "slow down"}', status="429 Too Many Requests"))
            await writer.drain()

    async with serving(handler) as (url, stats):
        pool = HttpPool(url)
        try:
            chunked = await pool.post("/chunked", b"")
            zipped = await pool.post("/gzip", b"")
            limited = await pool.post("/other", b"")
        finally:
            await pool.aclose()
    assert chunked.body == b"hello world"
    assert zipped.body == b"unzipped"
    assert (limited.status, limited.body) == (429, b'{"error": "slow down"}')
    assert stats["connections"] == 1


async def test_body_delimited_by_close_and_connection_close_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        await read_request(reader)
        stats["requests"] += 1
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with serving(handler) as (url, stats):
        pool = HttpPool(url)
        try:
            answers = [await pool.post("/x", b"") for _ in range(3)]
        finally:
            await pool.aclose()
    assert [a.body for a in answers] == [b"until the end"] * 3
    assert stats == {"connections": 3, "requests": 3}


async def test_stale_idle_connection_is_replaced_once() -> None:
    """A kept-alive connection the server drops as the next request arrives (its idle timeout raced the request):
    the request goes out again on a fresh connection instead of failing."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        if stats["connections"] == 1:
            await read_request(reader)
            stats["requests"] += 1
            writer.write(response(b"ok"))  # advertises keep-alive...
            await writer.drain()
            await read_request(reader)  # ...but drops the next request unanswered
            return
        while await read_request(reader) is not None:
            stats["requests"] += 1
            writer.write(response(b"ok again"))
            await writer.drain()

    async with serving(handler) as (url, stats):
        pool = HttpPool(url)
        try:
            first = await pool.post("/x", b"")
            second = await pool.post("/x", b"")
        finally:
            await pool.aclose()
    assert (first.body, second.body) == (b"ok", b"ok again")
    assert stats == {"connections": 2, "requests": 2}


async def test_failures_are_http_client_errors_naming_the_problem() -> None:
    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        await read_request(reader)
        writer.write(b"this is not HTTP\r\n\r\n")
        await writer.drain()

    for handler, message in ((cut_short, "closed the connection before the response was complete"),
                             (garbage, "malformed HTTP response")):
        async with serving(handler) as (url, _):
            pool = HttpPool(url)
            try:
                with pytest.raises(HttpClientError, match=message):
                    await pool.post("/x", b"")
            finally:
                await pool.aclose()

    async with serving(echo_keep_alive) as (url, _):
        pass  # closed: nothing listens on that port any more
    pool = HttpPool(url)
    with pytest.raises(HttpClientError, match=r"cannot connect to 127\.0\.0\.1"):
        await pool.post("/x", b"")
    await pool.aclose()
    with pytest.raises(HttpClientError, match="closed"):
        await pool.post("/x", b"")


async def test_cancelled_request_does_not_leave_a_half_read_connection_for_reuse() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        while (req := await read_request(reader)) is not None:
            stats["requests"] += 1
            if req[2] == b"slow":
                await release.wait()
            writer.write(response(req[2]))
            await writer.drain()

    async with serving(handler) as (url, stats):
        pool = HttpPool(url)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await pool.post("/x", b"slow")
            release.set()
            fast = await pool.post("/x", b"fast")
        finally:
            await pool.aclose()
    assert fast.body == b"fast"  # not the late answer to "slow"
    assert stats["connections"] == 2


async def test_timeout_s_bounds_the_request_on_a_fresh_and_a_reused_connection() -> None:
    """``timeout_s`` (the SUT client's per-try bound, one timer per request) raises TimeoutError when the answer is
    late, on a new connection and on a kept-alive one, and the late answer is never read as the next request's."""
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        while (req := await read_request(reader)) is not None:
            stats["requests"] += 1
            if req[2] == b"slow":
                await release.wait()
            writer.write(response(req[2]))
            await writer.drain()

    async with serving(handler) as (url, stats):
        pool = HttpPool(url)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await pool.post("/x", b"slow", timeout_s=0.2)  # a fresh connection
            assert 0.2 <= loop.time() - started < 2.0
            assert (await pool.post("/x", b"warm", timeout_s=5)).body == b"warm"  # now one idle connection
            with pytest.raises(TimeoutError):
                await pool.post("/x", b"slow", timeout_s=0.2)  # on the kept-alive connection
            release.set()
            fast = await pool.post("/x", b"fast", timeout_s=5)
            assert (await pool.post("/x", b"again", timeout_s=5)).body == b"again"  # an answered bound stays quiet
        finally:
            await pool.aclose()
    assert fast.body == b"fast"  # not the late answer to "slow"
    assert stats["connections"] == 3  # each timed-out connection was closed, never reused


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_https_verifies_the_server_certificate(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with serving(echo_keep_alive, server_ctx) as (url, _):
        trusting = HttpPool(url, ssl_context=ssl.create_default_context(cafile=str(cert)))
        default = HttpPool(url)  # the system trust store does not know this self-signed certificate
        try:
            answer = await trusting.post("/chat/completions", b"over tls")
            with pytest.raises(HttpClientError, match="CERTIFICATE_VERIFY_FAILED"):
                await default.post("/chat/completions", b"refused")
        finally:
            await trusting.aclose()
            await default.aclose()
    assert answer.body.endswith(b"|over tls")


async def test_a_shelf_never_hands_a_connection_verified_under_one_trust_store_to_a_pool_of_another(
        tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    shelf = ConnectionShelf()
    trust = ssl.create_default_context(cafile=str(cert))
    async with serving(echo_keep_alive, server_ctx) as (url, stats):
        trusting = HttpPool(url, ssl_context=trust, shelf=shelf)
        assert (await trusting.post("/x", b"over tls")).body.endswith(b"|over tls")
        await trusting.aclose()
        assert shelf.kept(trusting.origin) == 1
        default = HttpPool(url, shelf=shelf)  # the system trust store, which does not know the certificate
        with pytest.raises(HttpClientError, match="CERTIFICATE_VERIFY_FAILED"):
            await default.post("/x", b"refused")
        await default.aclose()
        assert shelf.kept(trusting.origin) == 1, "the verified connection stayed with its own trust store"
        again = HttpPool(url, ssl_context=trust, shelf=shelf)  # the same context: it may take it
        assert await again.warm(1) == 0 and (await again.post("/x", b"reused")).body.endswith(b"|reused")
        await again.aclose()
    shelf.close()
    assert stats["requests"] == 2


async def test_bad_urls_and_header_injection_are_refused() -> None:
    with pytest.raises(ValueError, match="not an http"):
        HttpPool("ftp://example.com")
    with pytest.raises(ValueError, match="line break"):
        HttpPool("http://example.com", headers={"Authorization": "Bearer x\r\nEvil: 1"})


async def test_warm_opens_connections_the_next_requests_use() -> None:
    async with serving(echo_keep_alive) as (url, stats):
        pool = HttpPool(url, max_idle=6)
        try:
            assert await pool.warm(10) == 6  # capped at what the pool keeps
            await asyncio.gather(*(pool.post("/x", b"") for _ in range(6)))
            assert await pool.warm(6) == 0  # all six are back in the pool
        finally:
            await pool.aclose()
    assert stats == {"connections": 6, "requests": 6}
    pool = HttpPool(url)  # nothing listens there any more: warming fails quietly, the request reports it
    assert await pool.warm(3) == 0
    with pytest.raises(HttpClientError, match="cannot connect"):
        await pool.post("/x", b"")
    await pool.aclose()


async def test_a_shelf_hands_a_closed_pools_connections_to_the_next_pool_to_the_same_origin() -> None:
    shelf = ConnectionShelf()
    async with serving(echo_keep_alive) as (url, stats), serving(echo_keep_alive) as (other_url, _):
        first = HttpPool(url, headers={"Authorization": "Bearer run-1"}, max_idle=4, shelf=shelf)
        assert await first.warm(4) == 4
        await asyncio.gather(*(first.post("/x", b"a") for _ in range(4)))
        await first.aclose()  # its four idle connections stay open, on the shelf
        assert shelf.kept(first.origin) == 4 and stats["connections"] == 4
        # The next pool (another run's key) warms from the shelf: no connect, and its requests carry its own headers.
        second = HttpPool(url, headers={"Authorization": "Bearer run-2"}, max_idle=4, shelf=shelf)
        assert await second.warm(4) == 0
        answers = await asyncio.gather(*(second.post("/x", b"b") for _ in range(4)))
        assert {a.body for a in answers} == {b"POST /v1/x HTTP/1.1|Bearer run-2|b"}
        assert stats == {"connections": 4, "requests": 8}
        # Another origin has nothing on the shelf: its pool opens its own.
        elsewhere = HttpPool(other_url, max_idle=2, shelf=shelf)
        assert await elsewhere.warm(2) == 2  # opened by this pool, none taken from the shelf
        await elsewhere.aclose()
        await second.aclose()
        shelf.close()  # the worker's end: every kept connection closed, and any left later too
        assert shelf.kept(first.origin) == 0
        late = HttpPool(url, max_idle=1, shelf=shelf)
        assert await late.warm(1) == 1
        await late.aclose()
        assert shelf.kept(late.origin) == 0


async def test_a_shelf_skips_closed_connections_and_drops_old_and_surplus_ones() -> None:
    async with serving(echo_keep_alive) as (url, _):
        shelf = ConnectionShelf(per_origin=2)
        pool = HttpPool(url, max_idle=3, shelf=shelf)
        assert await pool.warm(3) == 3
        idle = list(pool._idle)
        await pool.aclose()  # three idle connections, two kept: the surplus one is closed
        assert shelf.kept(pool.origin) == 2
        assert [conn.closed for conn in idle] == [False, False, True]
        idle[1].close()  # as when its server closes it while it sits on the shelf (connection_lost)
        taken = shelf.take(pool.origin, 2)
        assert taken == [idle[0]] and shelf.kept(pool.origin) == 0
        for conn in taken:
            conn.close()
        # Kept past keep_s: closed when looked at, never handed out.
        now = [100.0]
        old = ConnectionShelf(keep_s=30.0, clock=lambda: now[0])
        pool = HttpPool(url, max_idle=2, shelf=old)
        assert await pool.warm(2) == 2
        idle = list(pool._idle)
        await pool.aclose()
        now[0] += 30.5
        assert old.take(pool.origin, 2) == []
        assert all(conn.closed for conn in idle)


async def test_a_shelf_closes_what_expires_even_when_no_pool_comes_back_to_its_origin() -> None:
    """A sweep over many endpoints leaves each one's connections on the credential proxy's shelf, and most origins
    never see another pool: those connections are closed once they expire, not held open for good."""
    ended = asyncio.Event()
    closed = 0

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        nonlocal closed
        await echo_keep_alive(reader, writer, stats)  # returns at end of file: the client closed the connection
        closed += 1
        if closed == 3:
            ended.set()

    shelf = ConnectionShelf(keep_s=0.2)
    async with serving(counting) as (url, stats):
        pool = HttpPool(url, max_idle=3, shelf=shelf)
        assert await pool.warm(3) == 3
        await pool.aclose()
        assert shelf.kept(pool.origin) == 3 and closed == 0
        await asyncio.wait_for(ended.wait(), 10)  # no pool takes from or leaves to that origin meanwhile
        assert shelf.kept(pool.origin) == 0 and stats["connections"] == 3
    shelf.close()


async def test_an_oversized_body_and_unsolicited_bytes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import benchwright.llm.httpclient as httpclient

    monkeypatch.setattr(httpclient, "MAX_BODY_BYTES", 1000)

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(5):
            writer.write(b"258\r\n" + b"x" * 600 + b"\r\n")  # 5 x 600 bytes, no Content-Length to refuse up front
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def bomb(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        await read_request(reader)
        writer.write(response(gzip.compress(b"\0" * 5000), extra="Content-Encoding: gzip\r\n"))  # ~40 bytes sent
        await writer.drain()

    for handler, message in ((big, "response body exceeds 0 MiB$"), (bomb, "exceeds 0 MiB once decompressed")):
        async with serving(handler) as (url, _):
            pool = HttpPool(url)
            try:
                with pytest.raises(HttpClientError, match=message):
                    await pool.post("/x", b"")
            finally:
                await pool.aclose()

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]) -> None:
        while await read_request(reader) is not None:
            stats["requests"] += 1
            writer.write(response(b"ok") + (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra"
                                            if stats["requests"] == 1 else b""))
            await writer.drain()

    async with serving(chatty) as (url, _stats):
        pool = HttpPool(url)
        try:
            first = await pool.post("/x", b"")
            second = await pool.post("/x", b"")  # not answered with the stray "extra" response
        finally:
            await pool.aclose()
    assert (first.body, second.body) == (b"ok", b"ok")
