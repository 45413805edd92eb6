"""The OpenAI-compatible SUT route against a loopback chat-completions server: the concurrency cap, retries of
transient faults, timeouts, and where the cost comes from."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from benchwright.llm.prices import Prices
from benchwright.llm.sut import SutError, make_sut
from benchwright.schemas import ModelSpec
from tests.domain.test_httpclient import read_request, response

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Provider:
    """Answers chat completions after ``delay_s``; ``script`` holds statuses to answer with first (then 200)."""

    delay_s: float = 0.02
    script: list[int] = field(default_factory=list)
    cost_header: str | None = None
    in_flight: int = 0
    peak: int = 0
    requests: list[dict] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await read_request(reader)) is not None:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                body = json.loads(req[2])
                self.requests.append({"auth": req[1].get("authorization"), **body})
                await asyncio.sleep(self.delay_s)
                self.in_flight -= 1
                status = self.script.pop(0) if self.script else 200
                if status != 200:
                    writer.write(response(b'{"error": {"message": "busy"}}', status=f"{status} Nope"))
                else:
                    content = f"re: {body['messages'][-1]['content']}"
                    reply = {"choices": [{"message": {"role": "assistant", "content": content}}],
                             "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}}
                    extra = f"x-litellm-response-cost: {self.cost_header}\r\n" if self.cost_header else ""
                    writer.write(response(json.dumps(reply).encode(), extra=extra))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@asynccontextmanager
async def provider(p: Provider) -> AsyncIterator[str]:
    server = await asyncio.start_server(p.handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


PRICES = Prices(input_cost_per_token=2e-6, output_cost_per_token=8e-6)


def _sut(url: str, **kw: object):  # type: ignore[no-untyped-def]
    opts = {"prices": PRICES, "api_key": "sk-test", "concurrency": 4, "timeout_s": 5.0, "retries": 2, **kw}
    return make_sut(ModelSpec(identifier="openai/m1", api_base=url, params={"temperature": 0}), **opts)  # type: ignore[arg-type]


async def test_calls_beyond_the_concurrency_wait_and_every_reply_is_its_own() -> None:
    p = Provider()
    async with provider(p) as url:
        sut = _sut(url)
        try:
            replies = await asyncio.gather(*(sut.complete([{"role": "user", "content": f"q{i}"}], {"seed": i})
                                             for i in range(40)))
        finally:
            await sut.aclose()
    assert p.peak == 4  # 40 calls asked for at once, 4 in flight
    assert [r.text for r in replies] == [f"re: q{i}" for i in range(40)]
    assert replies[0].usage == {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
    assert replies[0].cost_usd == pytest.approx(1000 * 2.0 / 1e6 + 500 * 8.0 / 1e6)  # from the run's prices
    sent = p.requests[0]
    assert sent["auth"] == "Bearer sk-test" and sent["model"] == "m1" and sent["temperature"] == 0
    assert "seed" in sent


async def test_transient_statuses_are_retried_then_reported() -> None:
    p = Provider(script=[503, 429])
    async with provider(p) as url:
        sut = _sut(url)
        try:
            reply = await sut.complete([{"role": "user", "content": "hi"}], {})
            p.script = [500, 500, 500]
            with pytest.raises(SutError, match="HTTP 500"):
                await sut.complete([{"role": "user", "content": "again"}], {})
            p.script = [400]
            before = len(p.requests)
            with pytest.raises(SutError, match="HTTP 400"):
                await sut.complete([{"role": "user", "content": "bad"}], {})
        finally:
            await sut.aclose()
    assert reply.text == "re: hi"
    assert len(p.requests) - before == 1  # a 4xx other than 429 is not retried


async def test_a_silent_endpoint_times_out_and_an_absent_one_is_unreachable() -> None:
    p = Provider(delay_s=1.5)
    async with provider(p) as url:
        sut = _sut(url, timeout_s=0.2, retries=1)
        try:
            with pytest.raises(SutError, match=r"no answer within 0\.2 s"):
                await sut.complete([{"role": "user", "content": "hello?"}], {})
        finally:
            await sut.aclose()
    sut = _sut(url, retries=0)  # the server is gone
    try:
        with pytest.raises(SutError, match=r"is unreachable \(connection refused\)"):
            await sut.complete([{"role": "user", "content": "anyone?"}], {})
    finally:
        await sut.aclose()


async def test_the_proxy_reported_cost_wins_over_the_price_table() -> None:
    p = Provider(cost_header="0.125")
    async with provider(p) as url:
        sut = _sut(url)
        try:
            reply = await sut.complete([{"role": "user", "content": "x"}], {})
        finally:
            await sut.aclose()
    assert reply.cost_usd == 0.125
