"""Calling the system under test (§8).

Two routes, one interface (``SutClient.complete``):

* ``openai``: model strings LiteLLM routes as OpenAI-compatible (``openai/<name>``, with or without ``api_base``)
  are called directly, speaking the same chat-completions protocol over ``benchwright.httpclient``'s keep-alive
  pool. Measured here, ``litellm.acompletion`` spends ~8.8 ms of CPU per call (1,000 calls at 128 in flight: 8.9 s
  wall against a 50 ms endpoint, where the physical limit is 0.4 s), so it cannot sit on the per-task path of a
  fast sweep. httpx is not used either: its connection pool rescans every connection per request (O(in-flight) per
  call), which cost 28 s of CPU for the same 1,000 calls at 128 in flight; aiohttp cost ~160 µs of CPU per call,
  the lean pool ~60 µs.
* ``litellm``: every other provider goes through ``litellm.acompletion``, imported on first use only.

Both return the reply text, the token usage and the cost in USD from the run's prices (``benchwright.prices``).
Transient faults (connection errors, 429, 5xx, timeouts) are retried with backoff; anything else fails the call.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from benchwright.httpclient import HttpClientError, HttpPool
from benchwright.prices import Prices
from benchwright.schemas import ModelSpec

OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"


class SutError(Exception):
    """A model call failed for good."""


@dataclass
class SutReply:
    text: str
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0


class SutClient(Protocol):
    """Makes model calls, at most ``concurrency`` of them in flight at once (callers may ask for more: the rest
    queue here, so a caller can keep work ready for the moment a slot frees up)."""

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply: ...

    async def warm(self, calls: int) -> None:
        """Get ready for about ``calls`` calls (e.g. open connections) while the caller prepares its work."""

    async def aclose(self) -> None: ...


def route_for(identifier: str) -> str:
    """``openai`` for OpenAI-compatible model strings, else ``litellm``."""
    return "openai" if identifier.startswith("openai/") else "litellm"


def make_sut(spec: ModelSpec, *, prices: Prices, api_key: str | None, concurrency: int, timeout_s: float,
             retries: int) -> SutClient:
    """The client for ``spec``'s route, sized for ``concurrency`` calls in flight."""
    if route_for(spec.identifier) == "openai":
        return OpenAICompatibleSut(spec, prices=prices, api_key=api_key, concurrency=concurrency,
                                   timeout_s=timeout_s, retries=retries)
    return LiteLLMSut(spec, prices=prices, api_key=api_key, concurrency=concurrency, timeout_s=timeout_s,
                      retries=retries)


def _backoff(attempt: int) -> float:
    return min(0.25 * 2**attempt, 4.0) * (0.5 + random.random() / 2)


class OpenAICompatibleSut:
    def __init__(self, spec: ModelSpec, *, prices: Prices, api_key: str | None, concurrency: int, timeout_s: float,
                 retries: int) -> None:
        self._model = spec.identifier.split("/", 1)[1]
        self._params = spec.params
        self._prices = prices
        self._retries = retries
        base = (spec.api_base or OPENAI_DEFAULT_BASE).rstrip("/")
        key = api_key or os.environ.get("OPENAI_API_KEY") or "benchwright-no-key"
        self._timeout_s = timeout_s
        self._limit = max(concurrency, 1)
        self._slots = asyncio.Semaphore(self._limit)
        self._pool = HttpPool(base, headers={"Authorization": f"Bearer {key}"}, max_idle=max(concurrency, 1))

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        body = {**self._params, **params, "model": self._model, "messages": messages}
        body.pop("stream", None)
        payload = json.dumps(body).encode()
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                async with self._slots, asyncio.timeout(self._timeout_s):
                    resp = await self._pool.post("/chat/completions", payload)
            except (HttpClientError, TimeoutError) as exc:
                if last:
                    what = f"no answer within {self._timeout_s:g} s" if isinstance(exc, TimeoutError) else str(exc)
                    raise SutError(f"model endpoint unreachable: {what}") from exc
                await asyncio.sleep(_backoff(attempt))
                continue
            status, raw = resp.status, resp.body
            if status == 429 or status >= 500:
                if last:
                    raise SutError(f"model endpoint answered HTTP {status}: {raw[:300].decode(errors='replace')}")
                await asyncio.sleep(_backoff(attempt))
                continue
            if status >= 400:
                raise SutError(f"model endpoint answered HTTP {status}: {raw[:300].decode(errors='replace')}")
            # Behind the run's LiteLLM proxy, the cost it reports is the one recorded (§4: the proxy meters the SUT).
            return self._reply(raw, resp.headers.get("x-litellm-response-cost"))
        raise AssertionError("unreachable")

    async def warm(self, calls: int) -> None:
        """Open the connections the first ``calls`` calls will use (at most the concurrency), so the first wave of
        a batch does not pay 128 connects at once (it took ~40 ms to get 128 calls going without, ~10 ms with)."""
        await self._pool.warm(min(calls, self._limit))

    def _reply(self, raw: bytes, reported_cost: str | None = None) -> SutReply:
        try:
            data = json.loads(raw)
            text = data["choices"][0]["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise SutError("model endpoint sent a reply that is not a chat completion: "
                           f"{raw[:300].decode(errors='replace')}") from exc
        usage = {k: int(v) for k, v in (data.get("usage") or {}).items() if isinstance(v, int)}
        try:
            cost = float(reported_cost) if reported_cost is not None else self._prices.cost(usage)
        except ValueError:
            cost = self._prices.cost(usage)
        return SutReply(text=text, usage=usage, cost_usd=cost)

    async def aclose(self) -> None:
        await self._pool.aclose()


class LiteLLMSut:
    def __init__(self, spec: ModelSpec, *, prices: Prices, api_key: str | None, concurrency: int, timeout_s: float,
                 retries: int) -> None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm  # slow import (seconds): only runs that need a non-OpenAI route pay it, once per worker

        self._litellm = litellm
        self._spec = spec
        self._prices = prices
        self._slots = asyncio.Semaphore(max(concurrency, 1))
        self._kwargs: dict[str, Any] = {"timeout": timeout_s, "num_retries": retries}
        if spec.api_base:
            self._kwargs["api_base"] = spec.api_base
        if api_key:
            self._kwargs["api_key"] = api_key

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        try:
            async with self._slots:
                resp = await self._litellm.acompletion(
                    model=self._spec.identifier, messages=messages, **self._kwargs, **{**self._spec.params, **params}
                )
        except Exception as exc:  # litellm raises many provider-specific types; all mean the call failed
            raise SutError(f"{type(exc).__name__}: {exc}") from exc
        text = resp.choices[0].message.content or ""
        raw_usage = getattr(resp, "usage", None)
        usage = {k: int(getattr(raw_usage, k, 0) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        return SutReply(text=text, usage=usage, cost_usd=self._prices.cost(usage))

    async def warm(self, calls: int) -> None:
        return None  # litellm keeps its own connection pools

    async def aclose(self) -> None:
        return None
