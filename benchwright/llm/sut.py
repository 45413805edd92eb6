"""Calling the system under test (§8).

A run's calls go through its credential proxy (``run_sut``; ``benchwright.proxy.model_proxy``), which speaks
OpenAI's chat-completions protocol for every provider: the worker's side of every run is the ``openai`` client
below, pointed at the proxy with the run's per-run key. The proxy answers a failure of the provider's own (no
connection, no answer in time) with a 502/504 naming it (``x-benchwright-failure``), classified here as if the
provider had been called directly. ``make_sut`` calls a model directly, by either route:

* ``openai``: model strings LiteLLM routes as OpenAI-compatible (``openai/<name>``, with or without ``api_base``)
  are called directly, speaking the same chat-completions protocol over ``benchwright.llm.httpclient``'s keep-alive
  pool. Measured here, ``litellm.acompletion`` spends ~8.8 ms of CPU per call (1,000 calls at 128 in flight: 8.9 s
  wall against a 50 ms endpoint, where the physical limit is 0.4 s), so it cannot sit on the per-task path of a
  fast sweep. httpx is not used either: its connection pool rescans every connection per request (O(in-flight) per
  call), which cost 28 s of CPU for the same 1,000 calls at 128 in flight; aiohttp cost ~160 µs of CPU per call,
  the lean pool ~60 µs.
* ``litellm``: every other provider goes through ``litellm.acompletion``, imported on first use only.

Both return the reply text, the token usage and the cost in USD from the run's prices (``benchwright.llm.prices``).
Transient faults (connection errors, 429, 5xx, timeouts) are retried with exponential backoff and jitter; a 429 or
503's ``Retry-After`` (seconds or an HTTP date) is honoured: the next try waits at least that long. Retries stop
after ``retries`` of them, or as soon as the next wait would outlast ``budget_s`` (the trial attempt's duration
limit): the call then fails with the last answer. Anything else fails the call at once. A failure is a
``SutError`` whose ``kind`` says what went wrong, so the Attach probe (``probe``) and the Materialize breaker
(``benchwright.llm.breaker``) can put it in plain words (``explain``).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from benchwright import fastjson
from benchwright.errors import Unavailable
from benchwright.llm.httpclient import ConnectionShelf, HttpClientError, HttpConnectError, HttpPool
from benchwright.llm.prices import Prices
from benchwright.schemas import ModelSpec

if TYPE_CHECKING:
    from benchwright.proxy.model_proxy import ProxyHandle

OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"

SutFailure = Literal["unreachable", "auth", "not_found", "rate_limited", "server", "timeout", "rejected",
                     "bad_reply"]
"""What a failed call ran into: ``unreachable`` (no connection could be made), ``auth`` (401/403), ``not_found``
(404: the model, or the endpoint's path), ``rate_limited`` (429 after the retries), ``server`` (5xx after the
retries, or the connection broke mid-answer), ``timeout`` (no answer in time), ``rejected`` (another 4xx: this
request's fault), ``bad_reply`` (a 2xx that is not a chat completion)."""

FAILURE_HEADER = "x-benchwright-failure"
"""Set by the credential proxy on a 502/504 of its own (``benchwright.proxy.credential_proxy``)."""
_PROXY_FAILURES: dict[str, SutFailure] = {"unreachable": "unreachable", "timeout": "timeout", "server": "server"}
_PROXY_FAILURE_WORDS: dict[SutFailure, str] = {"unreachable": "is unreachable", "timeout": "gave no answer in time",
                                               "server": "broke off the answer"}

FATAL_FAILURES: frozenset[SutFailure] = frozenset({"unreachable", "auth", "not_found"})
"""Failures no later call can escape (every call shares the endpoint, the key and the model name): the kinds the
Materialize breaker counts."""


class SutError(Exception):
    """A model call failed for good.

    Attributes:
        kind: What went wrong (``SutFailure``).
        status: The HTTP status of the last answer, when there was one.
        endpoint: The base URL that was called.
        detail: The provider's own words (its error message), or the transport's.
    """

    def __init__(self, message: str, *, kind: SutFailure = "rejected", status: int | None = None,
                 endpoint: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.kind: SutFailure = kind
        self.status = status
        self.endpoint = endpoint
        self.detail = detail


@dataclass
class SutReply:
    text: str
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    tool_calls: list[dict[str, Any]] | None = None
    """The reply's ``tool_calls`` as OpenAI sends them, when the request carried ``tools`` and the model called."""
    reasoning: str | None = None
    """The reasoning a reasoning model sent beside the text (``reasoning_content`` from DeepSeek, vLLM and Qwen
    servers, ``reasoning`` from OpenRouter): shown with the trial's output, never scored."""


def reasoning_text(message: dict[str, Any]) -> str | None:
    """The reasoning field of a chat-completion message, as reasoning models send it beside the text:
    ``reasoning_content`` (DeepSeek, vLLM, Qwen) or ``reasoning`` (OpenRouter); None when there is none."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


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
             retries: int, budget_s: float | None = None) -> SutClient:
    """The client for ``spec``'s route, sized for ``concurrency`` calls in flight.

    Args:
        timeout_s: Bound on one try of a call.
        retries: Most retries of one call after a transient fault (connection, 429, 5xx, timeout).
        budget_s: Bound on one call with its retries' waits (the attempt duration limit); None: no bound beyond
            ``retries`` (and a ``Retry-After`` longer than ``timeout_s`` is then not waited for).
    """
    if route_for(spec.identifier) == "openai":
        return OpenAICompatibleSut(spec, prices=prices, api_key=api_key, concurrency=concurrency,
                                   timeout_s=timeout_s, retries=retries, budget_s=budget_s)
    return LiteLLMSut(spec, prices=prices, api_key=api_key, concurrency=concurrency, timeout_s=timeout_s,
                      retries=retries)


def run_sut(model: ModelSpec, *, prices: Prices, proxy: ProxyHandle | None, concurrency: int, timeout_s: float,
            retries: int, budget_s: float | None = None, shelf: ConnectionShelf | None = None) -> SutClient:
    """The run's model route, the one place it is decided: through the run's credential proxy with its per-run
    key (every run has one since Attach registers every run; ``None`` calls the model directly, for callers
    outside a run). The Attach probe and every Materialize batch use it, so the probe proves exactly the path the
    scorer's calls will take. ``shelf``: the worker's idle connections to its proxy, used and added to by the
    route's client (``benchwright.llm.httpclient.ConnectionShelf``; a direct route never shares them)."""
    if proxy is not None:
        via_proxy = ModelSpec(identifier=f"openai/{proxy.model_name}", api_base=proxy.base_url, params=model.params)
        # Errors name the model's own endpoint: the proxy's loopback address means nothing to a reader.
        shown = model.api_base or (OPENAI_DEFAULT_BASE if route_for(model.identifier) == "openai" else model.identifier)
        return OpenAICompatibleSut(via_proxy, prices=prices, api_key=proxy.fake_key, concurrency=concurrency,
                                   timeout_s=timeout_s, retries=retries, budget_s=budget_s, shown_as=shown,
                                   shelf=shelf)
    return make_sut(model, prices=prices, api_key=None, concurrency=concurrency, timeout_s=timeout_s,
                    retries=retries, budget_s=budget_s)


def _backoff(attempt: int) -> float:
    return min(0.25 * 2.0**attempt, 4.0) * (0.5 + random.random() / 2)


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (RFC 9110: delay-seconds or an HTTP date), None if absent or
    unreadable. A date in the past means 0."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT by definition
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _provider_message(raw: bytes) -> str:
    """The provider's own error message (OpenAI's ``{"error": {"message"}}`` shape), else the body's start."""
    try:
        data = json.loads(raw)
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
        if isinstance(message, str) and message.strip():
            return message.strip()[:300]
    except ValueError:
        pass
    return raw[:300].decode(errors="replace").strip()


def _status_kind(status: int) -> SutFailure:
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status == 429:
        return "rate_limited"
    return "server" if status >= 500 else "rejected"


def _connect_reason(exc: HttpClientError) -> str:
    cause = exc.__cause__
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, socket.gaierror):
        return "host not found"
    return str(exc)


def explain(exc: SutError, *, spec: ModelSpec) -> str:
    """``exc`` in plain words for a person, naming what to check (the secret, the model name, the URL)."""
    endpoint = spec.api_base or exc.endpoint or "the provider"
    said = f": {exc.detail}" if exc.detail else ""
    if exc.kind == "unreachable":
        return f"model endpoint {endpoint} is unreachable ({exc.detail or 'no connection'})"
    if exc.kind == "auth":
        check = (f"check the secret '{spec.secret}'" if spec.secret
                 else "the model names no secret: add one (model.secret) holding the provider's key")
        return f"the provider refused the key (HTTP {exc.status}): {check}{said}"
    if exc.kind == "not_found":
        return f"the provider does not know model '{spec.identifier}' (HTTP 404){said}"
    if exc.kind in ("rate_limited", "server"):
        return f"model endpoint {endpoint} keeps answering HTTP {exc.status}{said}"
    if exc.kind == "timeout":
        return f"model endpoint {endpoint} did not answer in time{said}"
    return str(exc)


PROBE_MESSAGES = [{"role": "user", "content": "Reply with one word: ready"}]
PROBE_PARAMS: dict[str, Any] = {"max_tokens": 1}


LISTING_TIMEOUT_S = 15.0


async def listed_at_proxy(proxy: ProxyHandle) -> bool:
    """Whether the provider lists the run's model when its credential proxy asks with the real key (the proxy's
    ``/v1/benchwright/listing``): one ``GET /models`` round trip, no tokens spent, none of a completion's latency.
    A yes proves what the probe is for (the endpoint answers, takes the key, knows the model); anything else
    (no listing, an error, a LiteLLM-routed provider, the proxy itself not answering) is a no, and the caller
    falls back to ``probe``'s completion, whose error is the one to report."""
    pool = HttpPool(f"http://127.0.0.1:{proxy.port}", headers={"Authorization": f"Bearer {proxy.fake_key}"},
                    max_idle=1)
    try:
        resp = await asyncio.wait_for(pool.get("/v1/benchwright/listing"), LISTING_TIMEOUT_S)
        return resp.status == 200 and json.loads(resp.body).get("listed") is True
    except (HttpClientError, TimeoutError, ValueError, AttributeError):
        return False
    finally:
        await pool.aclose()


async def probe(sut: SutClient, *, spec: ModelSpec) -> None:
    """One cheap completion (``max_tokens=1``) through ``sut``: proof that the model is live before a run spends
    anything on it. The client's own retries cover 429/5xx at probe time. (Attach first asks
    ``listed_at_proxy``, which answers the same question without a completion for providers that list models.)

    A ``rejected`` answer (400/422: e.g. a model that wants ``max_completion_tokens``) passes: the endpoint
    answered, took the key and knows the model, which is all the probe is for.

    Raises:
        Unavailable: the model is not usable, in plain words (``explain``).
    """
    try:
        await sut.complete(PROBE_MESSAGES, PROBE_PARAMS)
    except SutError as exc:
        if exc.kind == "rejected":
            return
        raise Unavailable(explain(exc, spec=spec), code="model_unavailable") from exc


class OpenAICompatibleSut:
    def __init__(self, spec: ModelSpec, *, prices: Prices, api_key: str | None, concurrency: int, timeout_s: float,
                 retries: int, budget_s: float | None = None, shown_as: str | None = None,
                 shelf: ConnectionShelf | None = None) -> None:
        self._model = spec.identifier.split("/", 1)[1]
        self._params = spec.params
        self._prices = prices
        self._retries = retries
        self._budget_s = budget_s
        base = (spec.api_base or OPENAI_DEFAULT_BASE).rstrip("/")

        self._shown = (shown_as or base).rstrip("/")
        key = api_key or os.environ.get("OPENAI_API_KEY") or "benchwright-no-key"
        self._timeout_s = timeout_s
        self._limit = max(concurrency, 1)
        self._slots = asyncio.Semaphore(self._limit)
        self._pool = HttpPool(base, headers={"Authorization": f"Bearer {key}"}, max_idle=max(concurrency, 1),
                              shelf=shelf)

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        body = {**self._params, **params, "model": self._model, "messages": messages}
        body.pop("stream", None)
        payload = fastjson.dumps_bytes(body)
        started = time.monotonic()
        for attempt in range(self._retries + 1):
            try:
                async with self._slots:
                    resp = await self._pool.post("/chat/completions", payload, timeout_s=self._timeout_s)
            except HttpConnectError as exc:
                error = self._error(f"is unreachable ({_connect_reason(exc)})", "unreachable", None,
                                    _connect_reason(exc))
                wait = _backoff(attempt)
            except HttpClientError as exc:  # the connection broke mid-exchange: the endpoint's fault, transient
                error = self._error(f"broke off the answer: {exc}", "server", None, str(exc))
                wait = _backoff(attempt)
            except TimeoutError:
                error = self._error(f"gave no answer within {self._timeout_s:g} s", "timeout", None, "")
                wait = _backoff(attempt)
            else:
                status, raw = resp.status, resp.body
                if status < 400:
                    # Behind the run's LiteLLM proxy, the cost it reports is the one recorded (§4: the proxy meters
                    # the SUT).
                    return self._reply(raw, resp.headers.get("x-litellm-response-cost"))
                said = _provider_message(raw)
                failure = _PROXY_FAILURES.get(resp.headers.get(FAILURE_HEADER, ""))
                if failure is not None:  # the proxy could not reach the provider: as if we had called it
                    error = self._error(f"{_PROXY_FAILURE_WORDS[failure]} ({said})", failure, None, said)
                else:
                    error = self._error(f"answered HTTP {status}: {said}", _status_kind(status), status, said)
                if error.kind not in ("rate_limited", "server", "unreachable", "timeout"):
                    raise error
                asked = retry_after_s(resp.headers.get("retry-after"))
                wait = max(asked * (1 + random.random() / 10), _backoff(attempt)) if asked is not None \
                    else _backoff(attempt)
                if asked is not None and self._budget_s is None and asked > self._timeout_s:
                    raise error  # asked to come back later than any one call may take: report it now
            if attempt == self._retries:
                raise error
            if self._budget_s is not None and time.monotonic() - started + wait > self._budget_s:
                raise error  # the wait would outlast the attempt: its duration limit would fail it anyway
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    def _error(self, what: str, kind: SutFailure, status: int | None, detail: str) -> SutError:
        return SutError(f"model endpoint {self._shown} {what}", kind=kind, status=status, endpoint=self._shown,
                        detail=detail)

    async def warm(self, calls: int) -> None:
        """Open the connections the first ``calls`` calls will use (at most the concurrency), so the first wave of
        a batch does not pay 128 connects at once (it took ~40 ms to get 128 calls going without, ~10 ms with)."""
        await self._pool.warm(min(calls, self._limit))

    def _reply(self, raw: bytes, reported_cost: str | None = None) -> SutReply:
        try:
            data = fastjson.loads(raw)
            message = data["choices"][0]["message"]
            text = message.get("content") or ""
            tool_calls = message.get("tool_calls") or None
            reasoning = reasoning_text(message)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise SutError("model endpoint sent a reply that is not a chat completion: "
                           f"{raw[:300].decode(errors='replace')}", kind="bad_reply", endpoint=self._shown) from exc
        usage = {k: int(v) for k, v in (data.get("usage") or {}).items() if isinstance(v, int)}
        try:
            cost = float(reported_cost) if reported_cost is not None else self._prices.cost(usage)
        except ValueError:
            cost = self._prices.cost(usage)
        return SutReply(text=text, usage=usage, cost_usd=cost, tool_calls=tool_calls, reasoning=reasoning)

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
            raise _litellm_error(exc, self._spec.api_base or "") from exc
        text = resp.choices[0].message.content or ""
        calls = getattr(resp.choices[0].message, "tool_calls", None)
        raw_usage = getattr(resp, "usage", None)
        usage = {k: int(getattr(raw_usage, k, 0) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        message = resp.choices[0].message
        reasoning = reasoning_text({k: getattr(message, k, None) for k in ("reasoning_content", "reasoning")})
        return SutReply(text=text, usage=usage, cost_usd=self._prices.cost(usage),
                        tool_calls=[c.model_dump() for c in calls] if calls else None, reasoning=reasoning)

    async def warm(self, calls: int) -> None:
        return None  # litellm keeps its own connection pools

    async def aclose(self) -> None:
        return None


def _litellm_error(exc: Exception, endpoint: str) -> SutError:
    """A litellm exception as a ``SutError`` of the right kind (litellm retried it already, ``num_retries``).
    Its exceptions carry the provider's HTTP status as ``status_code``; a connection that could not be made shows
    only down the exception chain (litellm reports it as a 500: measured with litellm 1.x against a closed port,
    InternalServerError <- httpx.ConnectError <- aiohttp ClientConnectorError <- ConnectionRefusedError)."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    detail = str(getattr(exc, "message", "") or exc)[:300]
    connect = _connect_failure(exc)
    if connect is not None:
        kind: SutFailure = "unreachable"
        detail = connect
    elif "Timeout" in name:
        kind = "timeout"
    elif name == "APIConnectionError":
        kind = "unreachable"
    elif isinstance(status, int):
        kind = _status_kind(status)
    else:
        kind = "rejected"
    return SutError(f"{name}: {exc}", kind=kind, status=status if isinstance(status, int) else None,
                    endpoint=endpoint, detail=detail)


def _connect_failure(exc: BaseException) -> str | None:
    """Why no connection could be made, if that is what lies down ``exc``'s chain."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, ConnectionRefusedError):
            return "connection refused"
        if isinstance(link, socket.gaierror):
            return "host not found"
        link = link.__cause__ or link.__context__
    return None
