"""The alert webhook is untrusted egress: host policy, internal-address refusal, the operator's allow-list."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchwright.comparison.webhook import check_webhook_url, post_webhook
from benchwright.errors import InvalidInput
from benchwright.proxy.policy import HostPolicy, HostRule


async def _receiver() -> tuple[asyncio.Server, int, list[dict[str, object]]]:
    got: list[dict[str, object]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length"))
        got.append(json.loads(await reader.readexactly(length)))
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got


@pytest.mark.asyncio(loop_scope="session")
async def test_internal_address_refused_unless_the_operator_listed_it() -> None:
    server, port, got = await _receiver()
    url = f"http://127.0.0.1:{port}/hook"
    refused: list[str] = []
    try:
        with pytest.raises(InvalidInput, match="internal address") as exc:
            await post_webhook(url=url, payload={"x": 1}, policy=HostPolicy(), internal_allowed=frozenset(),
                               on_refused=refused.append)
        assert exc.value.code == "webhook_blocked" and refused == ["127.0.0.1"] and got == []
        status = await post_webhook(url=url, payload={"x": 1}, policy=HostPolicy(),
                                    internal_allowed=frozenset({("127.0.0.1", port)}))
        assert status == 204 and got == [{"x": 1}]
        blocked = HostPolicy(rules=[HostRule(pattern="127.0.0.1", action="block")])
        with pytest.raises(InvalidInput, match="host policy"):
            await post_webhook(url=url, payload={"x": 2}, policy=blocked,
                               internal_allowed=frozenset({("127.0.0.1", port)}))
        assert got == [{"x": 1}]
    finally:
        server.close()


def test_webhook_url_syntax() -> None:
    assert check_webhook_url("https://hooks.example.com/x") == ("hooks.example.com", 443)
    with pytest.raises(InvalidInput, match="scheme"):
        check_webhook_url("ftp://example.com/x")
