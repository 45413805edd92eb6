"""The dev model's configuration: :class:`DevModelConfig`, the :class:`Fault` windows and the reply for an unknown
question."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Reply for a prompt that contains no known question.
UNKNOWN_REPLY = "I don't know."

_FAULT_ERRORS: dict[int, tuple[str, str, str]] = {
    # status -> (message, type, code), as OpenAI words them
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to sample from this model.", "invalid_request_error", "permission_denied"),
    429: ("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request.", "server_error", "internal_error"),
    503: ("The engine is currently overloaded, please try again later.", "server_error", "overloaded"),
}


@dataclass(frozen=True)
class Fault:
    """Chat requests ``first <= n < first + count`` (``count`` None: all from ``first`` on) answer ``status``.

    Attributes:
        status: One of 401, 403, 429, 500, 503.
        first: The first affected chat request, counted from 0 in arrival order.
        count: How many requests are affected; None for every one from ``first`` on.
        retry_after: A ``Retry-After`` header value to send with the answer (seconds or an HTTP date).
    """

    status: int
    first: int = 0
    count: int | None = None
    retry_after: str | None = None

    def __post_init__(self) -> None:
        if self.status not in _FAULT_ERRORS:
            raise ValueError(f"fault status must be one of {sorted(_FAULT_ERRORS)}, got {self.status!r}")
        if self.first < 0 or (self.count is not None and self.count < 0):
            raise ValueError("fault first and count must be >= 0")
        if self.retry_after is not None and any(c in self.retry_after for c in "\r\n"):
            raise ValueError("retry_after must not contain a line break")

    def covers(self, n: int) -> bool:
        return n >= self.first and (self.count is None or n < self.first + self.count)


@dataclass(frozen=True)
class DevModelConfig:
    """Configuration of the dev-model test double.

    Attributes:
        answers: Question text -> correct answer. Keys are matched after stripping whitespace.
        accuracy: Fraction P in [0, 1] of questions answered correctly (hash-chosen per question).
        latency_ms: Non-blocking latency added to every chat-completions request, in milliseconds.
        model_name: Id listed by ``/v1/models``. Requests naming any model are answered anyway.
        api_key: When set, chat completions and the model listing demand ``Authorization: Bearer <api_key>`` and
            answer 401 otherwise, like a real provider (so tests can tell who holds the real key).
        known_models_only: Answer 404 ``model_not_found`` to a chat request naming a model other than
            ``model_name`` (the ``openai/`` prefix a caller routes by is never sent).
        faults: Windows of chat requests that answer an error status instead (see ``Fault``); the first
            window covering a request wins.
        seed: Mixed into the hash that picks which questions are answered correctly, so two doubles with the
            same accuracy and different seeds get different questions right (two "models" of equal skill). The
            default "" keeps the historical choice.
        tool_calls: Question text -> the calls to answer with (``{"name": ..., "arguments": {...}}`` each) when
            the request offers ``tools``: the reply is an assistant message with ``tool_calls`` (content null,
            finish_reason ``tool_calls``), as OpenAI sends it. Canned, so ``accuracy`` does not apply to them;
            a request without ``tools`` gets the answer table's reply.
        agent_scripts: Question text -> the tool calls of each turn of an agent loop (the product runner's), when
            the request offers ``tools``: turn n, counted as the assistant messages after the last user message,
            answers with the n-th list (shaped as in ``tool_calls``); past the end the last list repeats, so a
            script that never calls ``finish`` is a runaway agent. An empty list answers with plain text.
        reasoning: Question text -> the reasoning to send beside the reply, in the message's ``reasoning_key``
            field, as reasoning models' servers do (non-streamed replies only).
        reasoning_key: ``reasoning_content`` (DeepSeek, vLLM, Qwen) or ``reasoning`` (OpenRouter).
    """

    answers: dict[str, str]
    accuracy: float = 1.0
    latency_ms: float = 0.0
    model_name: str = "dev"
    api_key: str | None = None
    known_models_only: bool = False
    faults: tuple[Fault, ...] = ()
    seed: str = ""
    tool_calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    agent_scripts: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)
    reasoning: dict[str, str] = field(default_factory=dict)
    reasoning_key: str = "reasoning_content"

    def __post_init__(self) -> None:
        # NaN fails both comparisons, so it is rejected too.
        if not 0.0 <= self.accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {self.accuracy!r}")
        if not self.latency_ms >= 0.0 or math.isinf(self.latency_ms):
            raise ValueError(f"latency_ms must be a finite number >= 0, got {self.latency_ms!r}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.reasoning_key not in ("reasoning_content", "reasoning"):
            raise ValueError(f"reasoning_key must be reasoning_content or reasoning, got {self.reasoning_key!r}")
