"""Calling the system under test (§8).

Two routes, one interface (``SutClient.complete``):

* ``openai``: model strings LiteLLM routes as OpenAI-compatible (``openai/<name>``, with or without ``api_base``)
  are called directly over a pooled httpx client speaking the same chat-completions protocol. Measured here,
  ``litellm.acompletion`` spends ~8.8 ms of CPU per call (1,000 calls at 128 in flight: 8.9 s wall against a 50 ms
  endpoint, where the physical limit is 0.4 s), so it cannot sit on the per-task path of a fast sweep.
* ``litellm``: every other provider goes through ``litellm.acompletion``, imported on first use only.

Both return the reply text, the token usage and the cost in USD from the run's prices (``benchwright.prices``).
Transient faults (connection errors, 429, 5xx, timeouts) are retried with backoff; anything else fails the call.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

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
    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply: ...

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
    return LiteLLMSut(spec, prices=prices, api_key=api_key, timeout_s=timeout_s, retries=retries)


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
        self._http = httpx.AsyncClient(
            base_url=base, timeout=timeout_s, headers={"Authorization": f"Bearer {key}"},
            limits=httpx.Limits(max_connections=max(concurrency, 1), max_keepalive_connections=max(concurrency, 1)),
        )

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        body = {**self._params, **params, "model": self._model, "messages": messages}
        body.pop("stream", None)
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                resp = await self._http.post("/chat/completions", json=body)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                if last:
                    raise SutError(f"model endpoint unreachable: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(_backoff(attempt))
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                if last:
                    raise SutError(f"model endpoint answered HTTP {resp.status_code}: {resp.text[:300]}")
                await asyncio.sleep(_backoff(attempt))
                continue
            if resp.status_code >= 400:
                raise SutError(f"model endpoint answered HTTP {resp.status_code}: {resp.text[:300]}")
            return self._reply(resp)
        raise AssertionError("unreachable")

    def _reply(self, resp: httpx.Response) -> SutReply:
        try:
            data = resp.json()
            text = data["choices"][0]["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SutError(f"model endpoint sent a reply that is not a chat completion: {resp.text[:300]}") from exc
        usage = {k: int(v) for k, v in (data.get("usage") or {}).items() if isinstance(v, int)}
        return SutReply(text=text, usage=usage, cost_usd=self._prices.cost(usage))

    async def aclose(self) -> None:
        await self._http.aclose()


class LiteLLMSut:
    def __init__(self, spec: ModelSpec, *, prices: Prices, api_key: str | None, timeout_s: float,
                 retries: int) -> None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm  # slow import (seconds): only runs that need a non-OpenAI route pay it, once per worker

        self._litellm = litellm
        self._spec = spec
        self._prices = prices
        self._kwargs: dict[str, Any] = {"timeout": timeout_s, "num_retries": retries}
        if spec.api_base:
            self._kwargs["api_base"] = spec.api_base
        if api_key:
            self._kwargs["api_key"] = api_key

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        try:
            resp = await self._litellm.acompletion(
                model=self._spec.identifier, messages=messages, **self._kwargs, **{**self._spec.params, **params}
            )
        except Exception as exc:  # litellm raises many provider-specific types; all mean the call failed
            raise SutError(f"{type(exc).__name__}: {exc}") from exc
        text = resp.choices[0].message.content or ""
        raw_usage = getattr(resp, "usage", None)
        usage = {k: int(getattr(raw_usage, k, 0) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        return SutReply(text=text, usage=usage, cost_usd=self._prices.cost(usage))

    async def aclose(self) -> None:
        return None
