"""A sick provider, met through the real SUT client against the dev-model double's fault modes on loopback:
429/5xx retried with ``Retry-After`` honoured and bounded, fatal answers classified and explained in plain words,
the Attach probe, and the Materialize breaker."""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from benchwright.errors import Unavailable
from benchwright.llm.breaker import SutBreaker
from benchwright.llm.prices import Prices
from benchwright.llm.sut import SutClient, SutError, make_sut, probe, retry_after_s
from benchwright.schemas import ModelSpec
from benchwright.testkit.devmodel import DevModelConfig, DevModelServer, Fault, start_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

ASK = [{"role": "user", "content": "What is 2 + 2?"}]
PRICES = Prices(input_cost_per_token=0.0, output_cost_per_token=0.0)


@asynccontextmanager
async def dev_model(**config: Any) -> AsyncIterator[DevModelServer]:
    server = await start_server(DevModelConfig(answers={"What is 2 + 2?": "4"}, **config))
    try:
        yield server
    finally:
        await server.close()


def _sut(url: str, *, retries: int = 2, budget_s: float | None = None, timeout_s: float = 5.0,
         model: str = "openai/dev") -> SutClient:
    return make_sut(ModelSpec(identifier=model, api_base=url), prices=PRICES, api_key="sk-test", concurrency=4,
                    timeout_s=timeout_s, retries=retries, budget_s=budget_s)


def _closed_port_url() -> str:
    import socket

    with socket.socket() as s:  # bound, never listening: connecting to it is refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_000_000.0
    assert retry_after_s("3", now=now) == 3.0
    assert retry_after_s(" 0.5 ", now=now) == 0.5
    assert retry_after_s(email.utils.formatdate(now + 7, usegmt=True), now=now) == pytest.approx(7.0)
    assert retry_after_s(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0  # in the past
    assert retry_after_s("-4", now=now) == 0.0
    assert retry_after_s("soon", now=now) is None
    assert retry_after_s(None) is None


async def test_429_waits_at_least_retry_after_then_succeeds() -> None:
    async with dev_model(faults=(Fault(429, count=1, retry_after="1"),)) as server:
        sut = _sut(server.url)
        try:
            started = time.monotonic()
            reply = await sut.complete(ASK, {})
            elapsed = time.monotonic() - started
        finally:
            await sut.aclose()
        assert reply.text == "4"
        assert server.chat_statuses == {429: 1, 200: 1}
    assert elapsed >= 1.0  # the backoff alone would have waited 0.125-0.25 s


async def test_503_with_an_http_date_retry_after_is_honoured() -> None:
    when = email.utils.formatdate(time.time() + 2, usegmt=True)  # whole seconds: at least ~1 s from now
    async with dev_model(faults=(Fault(503, count=1, retry_after=when),)) as server:
        sut = _sut(server.url)
        try:
            started = time.time()
            reply = await sut.complete(ASK, {})
            finished = time.time()
        finally:
            await sut.aclose()
        assert reply.text == "4" and server.chat_statuses == {503: 1, 200: 1}
    assert finished >= email.utils.parsedate_to_datetime(when).timestamp()
    assert finished - started >= 0.9


async def test_retries_stop_at_the_limit_and_the_call_fails_with_the_last_status() -> None:
    async with dev_model(faults=(Fault(503),)) as server:
        sut = _sut(server.url, retries=2)
        try:
            with pytest.raises(SutError) as caught:
                await sut.complete(ASK, {})
        finally:
            await sut.aclose()
        assert server.chat_statuses == {503: 3}  # one try and two retries
    assert caught.value.kind == "server" and caught.value.status == 503
    assert "HTTP 503" in str(caught.value) and "overloaded" in caught.value.detail


async def test_a_retry_after_longer_than_the_attempt_budget_is_not_waited_for() -> None:
    async with dev_model(faults=(Fault(429, retry_after="30"),)) as server:
        sut = _sut(server.url, retries=5, budget_s=2.0)
        try:
            started = time.monotonic()
            with pytest.raises(SutError, match="HTTP 429") as caught:
                await sut.complete(ASK, {})
            elapsed = time.monotonic() - started
        finally:
            await sut.aclose()
        assert server.chat_statuses == {429: 1}
    assert caught.value.kind == "rate_limited" and elapsed < 2.0


@pytest.mark.parametrize(("status", "kind"), [(401, "auth"), (403, "auth")])
async def test_refused_keys_fail_at_once(status: int, kind: str) -> None:
    async with dev_model(faults=(Fault(status),)) as server:
        sut = _sut(server.url)
        try:
            with pytest.raises(SutError) as caught:
                await sut.complete(ASK, {})
        finally:
            await sut.aclose()
        assert server.chat_statuses == {status: 1}  # not retried
    assert caught.value.kind == kind and caught.value.status == status


async def test_probe_explains_what_is_wrong_in_plain_words() -> None:
    url = _closed_port_url()
    sut = _sut(url, retries=0)
    try:
        with pytest.raises(Unavailable, match=re.escape(f"model endpoint {url} is unreachable (connection refused)")):
            await probe(sut, spec=ModelSpec(identifier="openai/dev", api_base=url))
    finally:
        await sut.aclose()

    async with dev_model(api_key="sk-real") as server:
        sut = _sut(server.url)  # sends sk-test
        try:
            spec = ModelSpec(identifier="openai/dev", api_base=server.url, secret="OPENAI_KEY")
            with pytest.raises(Unavailable, match=r"refused the key \(HTTP 401\): check the secret 'OPENAI_KEY'"):
                await probe(sut, spec=spec)
        finally:
            await sut.aclose()

    async with dev_model(known_models_only=True) as server:
        sut = _sut(server.url, model="openai/gpt-9")
        try:
            with pytest.raises(Unavailable, match=r"does not know model 'openai/gpt-9' \(HTTP 404\)"):
                await probe(sut, spec=ModelSpec(identifier="openai/gpt-9", api_base=server.url))
        finally:
            await sut.aclose()

    async with dev_model(faults=(Fault(503),)) as server:
        sut = _sut(server.url, retries=1)
        try:
            with pytest.raises(Unavailable, match=r"keeps answering HTTP 503"):
                await probe(sut, spec=ModelSpec(identifier="openai/dev", api_base=server.url))
        finally:
            await sut.aclose()
        assert server.chat_statuses == {503: 2}


async def test_probe_passes_a_live_model_with_one_call() -> None:
    async with dev_model() as server:
        sut = _sut(server.url)
        try:
            await probe(sut, spec=ModelSpec(identifier="openai/dev", api_base=server.url))
        finally:
            await sut.aclose()
        assert server.chat_statuses == {200: 1}


async def test_breaker_trips_once_after_consecutive_fatal_failures_and_holds_later_calls() -> None:
    trips: list[str] = []
    async with dev_model(faults=(Fault(401, first=1),)) as server:  # the first call succeeds, then the key is refused

        async def on_trip(reason: str) -> None:
            trips.append(reason)

        spec = ModelSpec(identifier="openai/dev", api_base=server.url, secret="PROVIDER")
        sut = SutBreaker(_sut(server.url), spec=spec, threshold=3, on_trip=on_trip)
        try:
            assert (await sut.complete(ASK, {})).text == "4"
            for _ in range(2):
                with pytest.raises(SutError):
                    await sut.complete(ASK, {})
            third = asyncio.create_task(sut.complete(ASK, {}))  # the tripping call: held, never reported as err
            deadline = time.monotonic() + 5
            while not trips and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            later = asyncio.create_task(sut.complete(ASK, {}))  # after the trip: never sent
            done, _ = await asyncio.wait({third, later}, timeout=0.3)
            assert not done and len(trips) == 1
            assert server.chat_statuses == {200: 1, 401: 3}
            third.cancel()
            later.cancel()
            await asyncio.gather(third, later, return_exceptions=True)
        finally:
            await sut.aclose()
    assert trips[0].startswith("sut_unavailable: the provider refused the key (HTTP 401): check the secret "
                               "'PROVIDER'")
    assert "3 model calls in a row" in trips[0]


async def test_breaker_streak_is_reset_by_a_success_and_ignores_transient_faults() -> None:
    trips: list[str] = []

    async def on_trip(reason: str) -> None:
        trips.append(reason)

    # calls: 401, 401, ok, 401, 503 (transient: neither counts nor resets), 401, 401 -> trips at the third fatal
    # failure since the success
    faults = (Fault(401, first=0, count=2), Fault(401, first=3, count=1), Fault(503, first=4, count=1),
              Fault(401, first=5))
    async with dev_model(faults=faults) as server:
        spec = ModelSpec(identifier="openai/dev", api_base=server.url)
        sut = SutBreaker(_sut(server.url, retries=0), spec=spec, threshold=3, on_trip=on_trip)
        try:
            outcomes = []
            for _ in range(6):
                try:
                    await sut.complete(ASK, {})
                    outcomes.append("ok")
                except SutError as exc:
                    outcomes.append(exc.kind)
            assert outcomes == ["auth", "auth", "ok", "auth", "server", "auth"] and trips == []
            held = asyncio.create_task(sut.complete(ASK, {}))
            deadline = time.monotonic() + 5
            while not trips and time.monotonic() < deadline:  # poll; the held call itself never returns
                await asyncio.sleep(0.01)
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
        finally:
            await sut.aclose()
    assert len(trips) == 1 and "HTTP 401" in trips[0]


async def test_the_litellm_route_classifies_failures_the_same_way() -> None:
    # "hosted_vllm/..." is not OpenAI-routed here, so it goes through litellm.acompletion (imported on first use).
    for config, kind in [({"faults": (Fault(401),)}, "auth"), ({"known_models_only": True}, "not_found"),
                         ({"faults": (Fault(503),)}, "server")]:
        async with dev_model(**config) as server:
            sut = make_sut(ModelSpec(identifier="hosted_vllm/other", api_base=server.url), prices=PRICES,
                           api_key=None, concurrency=1, timeout_s=5.0, retries=0)
            with pytest.raises(SutError) as caught:
                await sut.complete(ASK, {})
            assert caught.value.kind == kind, caught.value
    url = _closed_port_url()
    sut = make_sut(ModelSpec(identifier="hosted_vllm/other", api_base=url), prices=PRICES, api_key=None,
                   concurrency=1, timeout_s=5.0, retries=0)
    with pytest.raises(Unavailable, match=re.escape(f"model endpoint {url} is unreachable (connection refused)")):
        await probe(sut, spec=ModelSpec(identifier="hosted_vllm/other", api_base=url))
