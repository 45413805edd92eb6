"""``benchwright dev-model``: a TEST DOUBLE for an OpenAI-compatible chat-completions provider.

This is **not a language model**. It is a tiny, deterministic HTTP server that speaks enough of
the OpenAI chat-completions API for Benchwright to run end to end with no internet and no API key:
the offline demo, the integration tests and the throughput benchmarks all point at it.

How it answers:

* It is given a table ``question -> correct answer`` (usually from a JSONL file, see
  :func:`load_answers`) and an ``accuracy`` P in [0, 1].
* For each request it takes the last ``user`` message, finds the question in it (exact match of the
  stripped text first, else the longest known question contained in the text), and replies with the
  correct answer for a hash-chosen fraction P of the questions and with a deterministic, plausible
  wrong answer (:func:`wrong_answer`) for the rest. The verdict depends only on the question text
  (:func:`is_answered_correctly`), so a run's score is reproducible and ≈ P.
* An unknown question gets ``"I don't know."``.

Endpoints: ``POST /v1/chat/completions`` (and ``/chat/completions``; ``stream: true`` supported),
``GET /v1/models`` (and ``/models``), ``GET /health``. Authentication is not required unless
``api_key`` is configured; otherwise any ``Authorization`` header is accepted and ignored.

Fault modes, for tests of how callers meet a sick provider: ``known_models_only`` answers 404
``model_not_found`` for a model other than ``model_name`` (as OpenAI does), and ``faults`` make a
window of chat requests (counted from 0 in arrival order) answer 401, 403, 429 (with ``Retry-After``),
500 or 503 in OpenAI's error shape. ``DevModelServer.chat_statuses`` counts what was answered.

The server is a raw ``asyncio.Protocol`` HTTP/1.1 server on ``httptools`` (uvicorn's C parser), not
a framework app, because its CPU per request is what benchmarks measure: they drive it at 128+
concurrent requests on small machines, and a single-threaded server that spends 100 µs per request
answers a wave of 128 simultaneous requests over ~13 ms instead of at once, inflating the baseline.
Every reply is decided at start-up; a request's answer bytes are built as soon as it is parsed and
written by a ``loop.call_later`` timer once the latency has passed (no task or coroutine per
request). Measured with 128 requests in flight and 50 ms latency on 2 cores (uvloop): ~40 µs of
server CPU per request, against ~75-125 µs for the Starlette-on-uvicorn version it replaced. The HTTP
behaviour is that version's: keep-alive, pipelined requests answered in order, ``Expect:
100-continue``, chunked bodies, HEAD on GET routes, the trailing-slash redirect, and 404/405 in
OpenAI's error shape; a malformed request gets 400 and a body over 64 MiB 413, both closing the
connection. :func:`serve` runs it as a process, :func:`start_server` in a running event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from http import HTTPStatus
from pathlib import Path
from types import FrameType
from typing import Any, Self
from urllib.parse import quote, unquote_to_bytes

import httptools

__all__ = [
    "UNKNOWN_REPLY",
    "DevModelConfig",
    "DevModelServer",
    "Fault",
    "is_answered_correctly",
    "load_answers",
    "serve",
    "start_server",
    "wrong_answer",
]

_log = logging.getLogger(__name__)

#: Reply for a prompt that contains no known question.
UNKNOWN_REPLY = "I don't know."

# Rough OpenAI accounting: every message costs a few framing tokens, and the assistant reply is
# primed with a few more. Exactness does not matter; plausibility (and total = prompt + completion)
# does, because cost/usage code downstream is exercised against these numbers.
_TOKENS_PER_MESSAGE = 4
_TOKENS_REPLY_PRIMING = 3

# Bound on the memo of "prompt text -> matched question". Benchmarks send the same templated
# prompts again and again (retries, repeated runs), so memoising the linear substring fallback
# makes it O(1) in practice; the bound keeps memory flat under adversarial or unique prompts.
_MATCH_CACHE_MAX = 8192

_JSON_CONTENT_TYPE = b"application/json"
_SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
# One preconfigured encoder: skips json.dumps' per-call argument handling and the circular-reference
# bookkeeping, which matter on a path that runs thousands of times a second.
_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":"))
_SYSTEM_FINGERPRINT = "fp_benchwright_dev"

# Decoys for wrong answers to free-text questions: plausible quiz-style answers, so a wrong reply
# looks like a confident mistake rather than an obvious sentinel.
_DECOYS = (
    "Paris",
    "Mercury",
    "William Shakespeare",
    "Photosynthesis",
    "Oxygen",
    "Jupiter",
    "Albert Einstein",
    "The Amazon River",
    "Mount Everest",
    "Carbon dioxide",
    "Leonardo da Vinci",
    "The Pacific Ocean",
)
_YES_NO_FLIPS = {"yes": "no", "no": "yes", "true": "false", "false": "true"}


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


# --------------------------------------------------------------------------------------------------
# Answer table
# --------------------------------------------------------------------------------------------------


def load_answers(path: str | Path) -> dict[str, str]:
    """Load a ``question -> answer`` table from a JSONL file.

    Each non-blank line must be a JSON object with a non-empty string ``"question"`` and an
    ``"answer"`` that is a string or a number (numbers are converted with ``str``, so GSM8K-style
    numeric answers load as-is). Questions are stripped of surrounding whitespace. When a question
    occurs more than once the first occurrence wins, since real datasets do contain duplicates.

    Args:
        path: Path of the JSONL file (UTF-8, a leading BOM is tolerated).

    Returns:
        The table, in file order.

    Raises:
        ValueError: A line is not valid JSON or lacks a usable question/answer; the message names
            the file and the 1-based line number.
        OSError: The file cannot be read.
    """
    path = Path(path)
    answers: dict[str, str] = {}
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            question = record.get("question")
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f'{where}: "question" must be a non-empty string')
            answer = record.get("answer")
            # bool is an int subclass, but "True" as an answer is almost certainly a data mistake.
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise ValueError(f'{where}: "answer" must be a string or a number')
            answers.setdefault(question.strip(), str(answer))
    return answers


# --------------------------------------------------------------------------------------------------
# Deterministic verdicts and wrong answers
# --------------------------------------------------------------------------------------------------


def is_answered_correctly(question: str, accuracy: float, seed: str = "") -> bool:
    """Decide, deterministically, whether the double answers ``question`` correctly.

    The first 8 bytes of ``sha256(question)`` are read as a number u uniform in [0, 1); the question
    is answered correctly iff ``u < accuracy``. The same question therefore always gets the same
    verdict (across calls, processes and machines), and over many questions the fraction answered
    correctly is ≈ ``accuracy``. Raising the accuracy only ever turns wrong verdicts into right ones.

    Args:
        question: The question text (as stored in the answer table).
        accuracy: Target fraction of correct answers, in [0, 1].
        seed: Prefixed to the question before hashing (``DevModelConfig.seed``).

    Returns:
        True when the correct answer should be given.

    Raises:
        ValueError: ``accuracy`` is outside [0, 1].
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")
    digest = hashlib.sha256((seed + question).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < accuracy


def rows_answered_correctly(path: str | Path, accuracy: float, seed: str = "") -> tuple[int, int]:
    """How many rows of a JSONL dataset a dev model with this ``accuracy`` answers correctly, and how many rows
    there are: :func:`is_answered_correctly` applied to each row's question (the hash decides per question, so on
    a small set the count differs from ``accuracy`` x rows; the demo prints it beside the score)."""
    right = total = 0
    with Path(path).open(encoding="utf-8-sig") as fh:
        for line in fh:
            if line.strip():
                total += 1
                right += is_answered_correctly(str(json.loads(line)["question"]).strip(), accuracy, seed)
    return right, total


def wrong_answer(answer: str) -> str:
    """Return a deterministic, plausible wrong answer for ``answer``.

    * integers (``"41"``, ``"-3"``, ``"1,000"``) -> the integer + 1, same style;
    * decimals (``"2.5"``) -> the number + 1;
    * yes/no and true/false -> the opposite;
    * a single letter (a multiple-choice option) -> the next option letter;
    * anything else -> a hash-chosen quiz-style decoy.

    The result never equals ``answer`` after normalising case, whitespace and punctuation, and for
    free text it also neither contains nor is contained in it, so lenient "contains" graders cannot
    score it as correct by accident.

    Args:
        answer: The correct answer.

    Returns:
        A wrong answer.
    """
    target = _normalize(answer)
    for candidate in _wrong_candidates(answer.strip()):
        if _clearly_differs(_normalize(candidate), target):
            return candidate
    # Unreachable in practice (the decoy stream is unbounded), kept so the contract is explicit.
    raise AssertionError(f"no wrong answer found for {answer!r}")  # pragma: no cover


def _normalize(text: str) -> str:
    """Lower-case, drop punctuation, collapse whitespace: the comparison the contract promises."""
    kept = "".join(ch if ch.isalnum() or ch.isspace() else "" for ch in text.lower())
    return " ".join(kept.split())


def _clearly_differs(candidate: str, target: str) -> bool:
    """True when ``candidate`` cannot be mistaken for ``target`` by exact or contains matching."""
    if not candidate or candidate == target:
        return False
    if not target:
        return True
    return target not in candidate and candidate not in target


def _wrong_candidates(answer: str) -> Iterable[str]:
    """Yield wrong-answer candidates for ``answer``, most plausible first (may be unbounded)."""
    # +1 is the plausible off-by-one; +2 covers the rare sign flip that normalises equal (-0.5 -> 0.5).
    for delta in (1, 2):
        numeric = _shift_number(answer, delta)
        if numeric is not None:
            yield numeric
    flipped = _YES_NO_FLIPS.get(answer.lower().rstrip("."))
    if flipped is not None:
        yield _match_case(flipped, answer)
    if len(answer) == 1 and answer.isascii() and answer.isalpha():
        yield _next_option_letter(answer)
    seed = int.from_bytes(hashlib.sha256(answer.encode("utf-8")).digest()[:8], "big")
    for i in range(len(_DECOYS)):
        yield _DECOYS[(seed + i) % len(_DECOYS)]
    # Every decoy collided (the answer mentions them all): fall back to numbered decoys, which
    # eventually are longer than, and so cannot be contained in, any finite answer.
    n = 2
    while True:
        yield f"{_DECOYS[seed % len(_DECOYS)]} {n}"
        n += 1


def _shift_number(answer: str, delta: int) -> str | None:
    """Return the number in ``answer`` plus ``delta`` in the same style, or None if not a number."""
    grouped = "," in answer
    digits = answer.replace(",", "") if grouped else answer
    try:
        if digits.lstrip("+-").isdigit():
            shifted: int | Decimal = int(digits) + delta
        else:
            value = Decimal(digits)
            if not value.is_finite():
                return None
            shifted = value + delta
    except (ValueError, InvalidOperation):
        return None
    return f"{shifted:,}" if grouped else str(shifted)


def _next_option_letter(letter: str) -> str:
    """Next multiple-choice letter: cycles A-D (the usual option set), else the next in A-Z."""
    base = "A" if letter.isupper() else "a"
    index = ord(letter) - ord(base)
    span = 4 if index < 4 else 26
    return chr(ord(base) + (index + 1) % span)


def _match_case(word: str, like: str) -> str:
    """Give ``word`` the capitalisation style of ``like`` (YES / Yes / yes)."""
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word.capitalize()
    return word


# --------------------------------------------------------------------------------------------------
# Request handling
# --------------------------------------------------------------------------------------------------


class _Responder:
    """Precomputed reply table plus the question matcher for one app instance."""

    def __init__(self, config: DevModelConfig) -> None:
        self.config = config
        # Replies are decided once here so the request path is a dict lookup, not a sha256.
        self.replies: dict[str, str] = {}
        for question, answer in config.answers.items():
            key = question.strip()
            if not key or key in self.replies:
                continue
            answer = str(answer)  # tolerate numeric answers in a programmatically built table
            correct = is_answered_correctly(key, config.accuracy, config.seed)
            self.replies[key] = answer if correct else wrong_answer(answer)
        # Longest first, so the first contained question found is the longest match.
        self.by_length = sorted(self.replies, key=lambda q: (-len(q), q))
        self.match_cache: dict[str, str | None] = {}

    def find_question(self, text: str) -> str | None:
        """Return the known question in ``text``: exact match, else the longest contained one."""
        stripped = text.strip()
        if stripped in self.replies:
            return stripped
        try:
            return self.match_cache[stripped]
        except KeyError:
            pass
        found: str | None = None
        limit = len(stripped)
        for question in self.by_length:
            if len(question) <= limit and question in stripped:
                found = question
                break
        if len(self.match_cache) >= _MATCH_CACHE_MAX:
            self.match_cache.clear()
        self.match_cache[stripped] = found
        return found

    def reply_for(self, text: str) -> str:
        """The assistant reply for the user text ``text``."""
        question = self.find_question(text)
        return UNKNOWN_REPLY if question is None else self.replies[question]

    def tool_calls_for(self, text: str, turn: int = 0) -> list[dict[str, Any]] | None:
        """The canned tool calls for the question in ``text`` (exact, else contained), in OpenAI's shape: from
        ``tool_calls``, else turn ``turn`` of its ``agent_scripts`` entry."""
        canned = self.config.tool_calls
        question = _canned_question(canned, text)
        if question is not None:
            calls, salt = canned[question], question
        else:
            question = _canned_question(self.config.agent_scripts, text)
            if question is None or not self.config.agent_scripts[question]:
                return None
            script = self.config.agent_scripts[question]
            calls, salt = script[min(turn, len(script) - 1)], f"{question}:{turn}"
        return [{"id": f"call_{hashlib.sha256(f'{salt}:{i}'.encode()).hexdigest()[:24]}",
                 "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"] if isinstance(call["arguments"], str)
                              else json.dumps(call["arguments"])}}
                for i, call in enumerate(calls)] or None


def _canned_question(canned: dict[str, Any], text: str) -> str | None:
    stripped = text.strip()
    return stripped if stripped in canned else next(
        (q for q in sorted(canned, key=len, reverse=True) if q.strip() and q.strip() in stripped), None)


class _BadRequest(Exception):
    """The request body is not an acceptable chat-completions request."""


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string, a list of parts, or None (tool-call turns)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    raise _BadRequest("message content must be a string, a list of content parts, or null")


def _parse_request(body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Parse and minimally validate a chat-completions body, returning (payload, messages)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise _BadRequest("We could not parse the JSON body of your request.") from None
    if not isinstance(payload, dict):
        raise _BadRequest("The request body must be a JSON object.")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' is a required property and must be a non-empty array.")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest("Each message must be an object with a string 'role'.")
    return payload, messages


def _approx_tokens(text: str) -> int:
    """≈ tokens in ``text`` at the usual ~4 characters per token."""
    return -(-len(text) // 4)


def _usage(message_texts: list[str], reply: str) -> dict[str, int]:
    """OpenAI-style usage block with plausible counts (total = prompt + completion)."""
    prompt = _TOKENS_REPLY_PRIMING + sum(
        _TOKENS_PER_MESSAGE + _approx_tokens(text) for text in message_texts
    )
    completion = max(1, _approx_tokens(reply))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error_body(message: str, error_type: str = "invalid_request_error") -> bytes:
    """An OpenAI-style error body, which SDKs and litellm know how to surface."""
    error = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    return _ENCODER.encode(error).encode()


def _completion_body(
    completion_id: str, created: int, model: str, reply: str, usage: dict[str, int],
    tool_calls: list[dict[str, Any]] | None = None, reasoning: tuple[str, str] | None = None,
) -> bytes:
    """A ``chat.completion`` object as OpenAI returns it (an assistant message with ``tool_calls`` when given, and
    a reasoning field ``(key, text)`` when given)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply, "refusal": None}
    if tool_calls:
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": tool_calls}
    if reasoning:
        message[reasoning[0]] = reasoning[1]
    payload = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": _SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": usage,
    }
    return _ENCODER.encode(payload).encode()


def _stream_pieces(reply: str) -> list[str]:
    """Split ``reply`` into word-sized deltas (each keeps its leading space), like a real stream."""
    pieces: list[str] = []
    start = 0
    for i in range(1, len(reply)):
        if reply[i] == " " and reply[i - 1] != " ":
            pieces.append(reply[start:i])
            start = i
    pieces.append(reply[start:])
    return [p for p in pieces if p]


def _stream_body(
    completion_id: str, created: int, model: str, reply: str, usage: dict[str, int] | None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> bytes:
    """The whole SSE stream of ``chat.completion.chunk`` events, ending with ``data: [DONE]``.

    The reply is known up front, so the stream is built as one buffer and sent in one write: clients
    parse it exactly like an incremental stream, and it costs a fraction of a StreamingResponse.
    """

    def chunk(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        event: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": _SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if usage is not None:
            # With include_usage, OpenAI sends "usage": null on every chunk but the last one.
            event["usage"] = None
        return event

    events: list[dict[str, Any]]
    if tool_calls:
        deltas = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        events = [chunk({"role": "assistant", "content": None, "tool_calls": deltas}, None),
                  chunk({}, "tool_calls")]
    else:
        events = [chunk({"role": "assistant", "content": "", "refusal": None}, None)]
        events.extend(chunk({"content": piece}, None) for piece in _stream_pieces(reply))
        events.append(chunk({}, "stop"))
    if usage is not None:
        events.append(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": _SYSTEM_FINGERPRINT,
                "choices": [],
                "usage": usage,
            }
        )
    lines = [f"data: {_ENCODER.encode(event)}\n\n" for event in events]
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


# --------------------------------------------------------------------------------------------------
# HTTP/1.1 server
# --------------------------------------------------------------------------------------------------

_MAX_BODY_BYTES = 64 * 1024 * 1024
# Pipelined requests held per connection before the server stops reading from it (back-pressure).
_MAX_QUEUED = 16
# After an error response that closes the connection, how long unread request bytes are drained.
_LINGER_S = 1.0
# How long close() waits, beyond the configured latency, for in-flight answers before cutting them off.
_SHUTDOWN_GRACE_S = 5.0
_BACKLOG = 2048  # uvicorn's default: benchmarks open hundreds of connections at once
# The only request headers looked at; the rest are dropped as they are parsed.
_WANTED_HEADERS = frozenset((b"authorization", b"content-length", b"expect", b"host"))

_STATUS_LINES = {
    status: b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())
    for status in (200, 307, 400, 401, 403, 404, 405, 413, 429, 500, 503)
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"connection: close\r\n"
_KEEP_ALIVE = b"connection: keep-alive\r\n"
_NO_CACHE = b"cache-control: no-cache\r\n"
_POST = frozenset((b"POST",))
_GET = frozenset((b"GET", b"HEAD"))  # Starlette answered HEAD on every GET route; so does this
# Starlette's RedirectResponse quoting of the Location URL.
_LOCATION_SAFE = ":/%#?=@[]!$&'()*+,;"

#: (method, request target, body, keep-alive, HTTP/1.0, wanted headers) of one parsed request.
_Request = tuple[bytes, bytes, bytes, bool, bool, dict[bytes, bytes]]
#: (status, content type or None, body, extra header lines, latency in s) of one answer.
_Answer = tuple[int, bytes | None, bytes, bytes, float]


class _TooLarge(Exception):
    """Raised from a parser callback to stop reading a request whose body exceeds the limit."""


def _response(
    status: int, content_type: bytes | None, body: bytes, extra: bytes, connection: bytes, head: bool
) -> bytes:
    """Serialise one response: status line, minimal headers, then the body (none for HEAD)."""
    header = b"%s%scontent-length: %d\r\n%s%s\r\n" % (
        _STATUS_LINES[status],
        b"content-type: " + content_type + b"\r\n" if content_type is not None else b"",
        len(body),
        extra,
        connection,
    )
    return header if head else header + body


def _error_response(status: int, content_type: bytes, body: bytes) -> bytes:
    """A response after which the connection is closed (malformed or oversized request)."""
    return _response(status, content_type, body, b"", _CLOSE, False)


_BAD_REQUEST = _error_response(400, b"text/plain; charset=utf-8", b"Invalid HTTP request received.")
_TOO_LARGE = _error_response(
    413, _JSON_CONTENT_TYPE, _error_body(f"Request body exceeds the {_MAX_BODY_BYTES // 2**20} MiB limit.")
)
_INTERNAL_ERROR = _error_response(500, b"text/plain; charset=utf-8", b"Internal Server Error")


def _split_target(target: bytes) -> tuple[bytes, bytes]:
    """(path, query) of a request target; the path is percent-decoded for routing, as uvicorn did."""
    if target[:1] == b"/":
        path, _, query = target.partition(b"?")
        if b"#" in path:
            path = path.partition(b"#")[0]
    else:
        # Absolute form (``GET http://host/path``), or something no route will match.
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            return target, b""
        path, query = url.path or b"/", url.query or b""
    if b"%" in path:
        path = unquote_to_bytes(path)
    return path, query


class _Handler:
    """What one server answers: routes, precomputed bodies and replies; plus its live connections."""

    def __init__(self, config: DevModelConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.responder = _Responder(config)
        self.loop = loop
        self.delay = config.latency_ms / 1000.0
        self.expected_auth = None if config.api_key is None else f"Bearer {config.api_key}".encode()
        models_body = json.dumps(
            {
                "object": "list",
                "data": [
                    {"id": config.model_name, "object": "model", "created": 0, "owned_by": "benchwright-dev"}
                ],
            }
        ).encode()
        # path -> (allowed methods, static body, or None for chat completions)
        self.routes: dict[bytes, tuple[frozenset[bytes], bytes | None]] = {
            b"/v1/chat/completions": (_POST, None),
            b"/chat/completions": (_POST, None),
            b"/v1/models": (_GET, models_body),
            b"/models": (_GET, models_body),
            b"/health": (_GET, b'{"ok": true}'),
        }
        self.connections: set[_Connection] = set()
        self.closing = False
        self.all_closed: asyncio.Future[None] | None = None
        self.config = config
        self.chat_requests = 0
        self.chat_statuses: dict[int, int] = {}

    def answer(
        self,
        method: bytes,
        target: bytes,
        body: bytes,
        headers: dict[bytes, bytes],
        transport: asyncio.Transport,
    ) -> _Answer:
        """Route one request and build its answer."""
        path, query = _split_target(target)
        route = self.routes.get(path)
        if route is None:
            return self._unrouted(method, path, query, headers, transport)
        methods, static_body = route
        if method not in methods:
            return 405, _JSON_CONTENT_TYPE, _route_error("Method Not Allowed", method, path), b"", 0.0
        if static_body is not None:
            if (path != b"/health" and self.expected_auth is not None
                    and headers.get(b"authorization") != self.expected_auth):
                # OpenAI's model listing wants the key too (what Attach's listing check relies on)
                return 401, _JSON_CONTENT_TYPE, _error_body("Incorrect API key provided.", "invalid_api_key"), b"", 0.0
            return 200, _JSON_CONTENT_TYPE, static_body, b"", 0.0
        answer = self._chat_answer(body, headers)
        self.chat_statuses[answer[0]] = self.chat_statuses.get(answer[0], 0) + 1
        return answer

    def _chat_answer(self, body: bytes, headers: dict[bytes, bytes]) -> _Answer:
        """A chat request's answer: its fault window's error, a refused key, an unknown model, or the reply."""
        n, self.chat_requests = self.chat_requests, self.chat_requests + 1
        for fault in self.config.faults:
            if fault.covers(n):
                message, kind, code = _FAULT_ERRORS[fault.status]
                error = {"error": {"message": message, "type": kind, "param": None, "code": code}}
                extra = b"retry-after: %s\r\n" % fault.retry_after.encode("latin-1") if fault.retry_after else b""
                return fault.status, _JSON_CONTENT_TYPE, _ENCODER.encode(error).encode(), extra, self.delay
        if self.expected_auth is not None and headers.get(b"authorization") != self.expected_auth:
            body = _error_body("Incorrect API key provided.", "invalid_api_key")
            return 401, _JSON_CONTENT_TYPE, body, b"", 0.0
        if self.config.known_models_only:
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError):
                model = None  # malformed: chat() answers 400
            if isinstance(model, str) and model != self.config.model_name:
                error = {"error": {"message": f"The model `{model}` does not exist or you do not have access to it.",
                                   "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
                return 404, _JSON_CONTENT_TYPE, _ENCODER.encode(error).encode(), b"", 0.0
        return self.chat(body)

    def _unrouted(
        self,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: dict[bytes, bytes],
        transport: asyncio.Transport,
    ) -> _Answer:
        """404, or Starlette's 307 to the same path with/without a trailing slash when that is a route."""
        other = path.rstrip(b"/") if path.endswith(b"/") else path + b"/"
        if path != b"/" and other in self.routes:
            host = headers.get(b"host")
            if host is not None:
                netloc = host.decode("latin-1")
            else:
                address = transport.get_extra_info("sockname")
                netloc = f"{_url_host(address[0])}:{address[1]}"
            location = f"http://{netloc}{other.decode('utf-8', 'replace')}"
            if query:
                location += f"?{query.decode('latin-1')}"
            extra = b"location: %s\r\n" % quote(location, safe=_LOCATION_SAFE).encode("latin-1")
            return 307, None, b"", extra, 0.0
        return 404, _JSON_CONTENT_TYPE, _route_error("Not Found", method, path), b"", 0.0

    def chat(self, raw: bytes) -> _Answer:
        """Answer one chat-completions request body (authentication already checked)."""
        try:
            payload, messages = _parse_request(raw)
            texts = [_content_text(message.get("content")) for message in messages]
        except _BadRequest as exc:
            return 400, _JSON_CONTENT_TYPE, _error_body(str(exc)), b"", 0.0

        user_text: str | None = None
        turn = 0  # assistant messages since the last user message: an agent loop's turn
        for message, text in zip(reversed(messages), reversed(texts), strict=True):
            if message["role"] == "user":
                user_text = text
                break
            turn += message["role"] == "assistant"
        reply = UNKNOWN_REPLY if user_text is None else self.responder.reply_for(user_text)
        calls = (self.responder.tool_calls_for(user_text, turn) if user_text is not None and payload.get("tools")
                 else None)
        if calls:
            reply = json.dumps([call["function"] for call in calls])  # what the usage counts as completion

        model = payload.get("model")
        if not isinstance(model, str) or not model:
            model = self.responder.config.model_name
        usage = _usage(texts, reply)
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        created = int(time.time())

        if payload.get("stream") is True:
            options = payload.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            body = _stream_body(completion_id, created, model, reply, usage if include_usage else None, calls)
            return 200, _SSE_CONTENT_TYPE, body, _NO_CACHE, self.delay
        config = self.responder.config
        question = None if user_text is None or not config.reasoning else self.responder.find_question(user_text)
        thought = config.reasoning.get(question) if question is not None else None
        body = _completion_body(completion_id, created, model, reply, usage, calls,
                                (config.reasoning_key, thought) if thought else None)
        return 200, _JSON_CONTENT_TYPE, body, b"", self.delay

    def connection_closed(self, connection: _Connection) -> None:
        """Forget ``connection``; wake up a shutdown waiting for the last one."""
        self.connections.discard(connection)
        if not self.connections and self.all_closed is not None and not self.all_closed.done():
            self.all_closed.set_result(None)


def _route_error(detail: str, method: bytes, path: bytes) -> bytes:
    """404/405 body, in OpenAI's error shape so SDK error messages stay readable."""
    return _error_body(f"{detail}: {method.decode('latin-1')} {path.decode('utf-8', 'replace')}")


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses the requests, answered in order, one at a time.

    A request's answer is built as soon as it is parsed and written by a ``call_later`` timer after
    the latency, so an in-flight request costs a timer handle, not a task. Requests pipelined behind
    it are queued and answered once it has been written.
    """

    transport: asyncio.Transport

    def __init__(self, handler: _Handler) -> None:
        self.handler = handler
        self.loop = handler.loop
        self.parser = httptools.HttpRequestParser(self)
        # The request being parsed.
        self.in_message = False
        self.target = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.body_size = 0
        self.method = b""
        self.keep_alive = True
        self.http10 = False
        self.too_large = False
        # Answering.
        self.timer: asyncio.TimerHandle | None = None  # the answer waiting out its latency
        self.queue: deque[_Request] = deque()  # parsed requests waiting for that answer to go out
        self.final: bytes | None = None  # error response to send, then close, once the queue is empty
        self.continue_pending = False  # a 100 Continue owed once the earlier answers are out
        self.last_request = False  # a request without keep-alive was parsed: nothing after it counts
        self.done = False  # no more responses on this connection
        self.linger: asyncio.TimerHandle | None = None
        self.read_paused = False
        self.write_paused = False

    # asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.handler.connections.add(self)
        if self.handler.closing:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.done = True
        if self.timer is not None:
            # The client left during the latency: nobody to answer.
            self.timer.cancel()
            self.timer = None
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self.queue.clear()
        self.handler.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        if self.done or self.last_request or self.final is not None:
            return  # nothing more will be answered; drain (a lingering close relies on this)
        while True:
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:
                # Upgrades (h2c, websocket) are not supported: carry on in HTTP/1.1 as if none was asked.
                data = data[exc.args[0] :]
                if not data or self.done or self.last_request:
                    return
            except httptools.HttpParserCallbackError as exc:
                if self.too_large:
                    self._fail(_TOO_LARGE)
                else:  # a bug in this module, raised from a parser callback
                    _log.error("dev-model request handling failed", exc_info=exc.__context__)
                    self._fail(_INTERNAL_ERROR)
                return
            except httptools.HttpParserError:
                if not self.last_request:  # else just bytes after a `Connection: close` request
                    self._fail(_BAD_REQUEST)
                return

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._update_reading()

    # httptools callbacks ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.target = b""
        self.headers = {}
        self.body = []
        self.body_size = 0

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _WANTED_HEADERS:
            self.headers[name] = value

    def on_headers_complete(self) -> None:
        parser = self.parser
        self.method = parser.get_method()
        self.keep_alive = parser.should_keep_alive()
        self.http10 = parser.get_http_version() == "1.0"
        headers = self.headers
        length = headers.get(b"content-length")
        if length is not None and int(length) > _MAX_BODY_BYTES:
            self.too_large = True
            raise _TooLarge
        expect = headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and not self.http10:
            if self.timer is None and not self.queue:
                self.transport.write(_CONTINUE)
            else:
                self.continue_pending = True

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > _MAX_BODY_BYTES:  # chunked bodies announce no length
            self.too_large = True
            raise _TooLarge
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.done:
            return  # the connection failed on an earlier request of this buffer
        self.in_message = False
        self.continue_pending = False
        if not self.keep_alive:
            self.last_request = True
        request = (self.method, self.target, b"".join(self.body), self.keep_alive, self.http10, self.headers)
        if self.timer is None and not self.queue:
            self._answer(request)
        else:
            self.queue.append(request)
            self._update_reading()

    # Answering -------------------------------------------------------------------------------------

    def _answer(self, request: _Request) -> None:
        """Build the answer to ``request`` and write it now, or schedule it after the latency."""
        method, target, body, keep_alive, http10, headers = request
        try:
            status, content_type, payload, extra, delay = self.handler.answer(
                method, target, body, headers, self.transport
            )
        except Exception:  # noqa: BLE001 - e.g. RecursionError from absurdly nested JSON; the server must survive it
            _log.exception("dev-model request handling failed")
            self.queue.clear()  # answering later requests before this one would break the order
            self.final = _INTERNAL_ERROR
            self._write_final()
            return
        keep_alive = keep_alive and not self.handler.closing
        connection = _CLOSE if not keep_alive else _KEEP_ALIVE if http10 else b""
        data = _response(status, content_type, payload, extra, connection, method == b"HEAD")
        if delay > 0.0:
            self.timer = self.loop.call_later(delay, self._deliver, data, keep_alive)
        else:
            self._write(data, keep_alive)

    def _deliver(self, data: bytes, keep_alive: bool) -> None:
        """Timer callback: the latency is over; send the answer, then whatever waited behind it."""
        self.timer = None
        self._write(data, keep_alive)
        if not self.done and (self.queue or self.final is not None or self.continue_pending):
            self._drain()

    def _write(self, data: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport.is_closing():
            self.done = True
            return
        transport.write(data)
        if not keep_alive or self.handler.closing:
            self.done = True
            transport.close()

    def _drain(self) -> None:
        """Answer queued requests in order until one waits out its latency; then an owed error or 100."""
        while self.timer is None and not self.done:
            if self.queue:
                self._answer(self.queue.popleft())
                self._update_reading()
            elif self.final is not None:
                self._write_final()
            else:
                if self.continue_pending and self.in_message:
                    self.transport.write(_CONTINUE)
                self.continue_pending = False
                return

    def _fail(self, response: bytes) -> None:
        """Stop parsing; send ``response`` after the answers still owed, then close."""
        self.final = response
        if self.timer is None and not self.queue:
            self._write_final()

    def _write_final(self) -> None:
        transport = self.transport
        self.done = True
        if transport.is_closing():
            return
        assert self.final is not None
        transport.write(self.final)
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            # Lingering close: the client may still be sending (an oversized body). Closing with unread
            # bytes would reset the connection, which can destroy the response before it is read; so
            # signal EOF and drain until the client closes, for a bounded time.
            transport.write_eof()
            self.linger = self.loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def _update_reading(self) -> None:
        """Stop reading while the client does not read its answers or has too many pipelined."""
        pause = not self.done and (self.write_paused or len(self.queue) >= _MAX_QUEUED)
        if pause != self.read_paused and not self.transport.is_closing():
            self.read_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def shutdown(self) -> None:
        """Server shutdown: close now when idle, else right after the answer being prepared."""
        if self.done or (self.timer is None and not self.in_message):
            self.transport.close()


class DevModelServer:
    """A dev-model server listening in the running event loop; see :func:`start_server`.

    Attributes:
        host: The interface it is bound to.
        port: The port it listens on (the OS-chosen one when 0 was asked for).
    """

    def __init__(self, server: asyncio.Server, handler: _Handler, host: str) -> None:
        self._server = server
        self._handler = handler
        self.host = host
        self.port: int = server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API, ``http://HOST:PORT/v1`` (wildcard host -> loopback)."""
        return f"http://{_url_host(self.host)}:{self.port}/v1"

    @property
    def chat_statuses(self) -> dict[int, int]:
        """How many chat-completions requests were answered with each status so far."""
        return dict(self._handler.chat_statuses)

    async def close(self) -> None:
        """Stop listening and close every connection once its in-flight answer has been sent.

        Idle keep-alive connections are closed at once; answers still waiting out their latency
        are sent first (for at most the latency plus a few seconds), as uvicorn's graceful shutdown
        did.
        """
        handler = self._handler
        if not handler.closing:
            handler.closing = True
            self._server.close()
            for connection in list(handler.connections):
                connection.shutdown()
        if handler.connections:
            if handler.all_closed is None:
                handler.all_closed = handler.loop.create_future()
            try:
                await asyncio.wait_for(
                    asyncio.shield(handler.all_closed), handler.delay + _SHUTDOWN_GRACE_S
                )
            except TimeoutError:
                for connection in list(handler.connections):
                    connection.transport.abort()
        await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_server(config: DevModelConfig, host: str = "127.0.0.1", port: int = 0) -> DevModelServer:
    """Start the dev-model server in the running event loop (a test double of an OpenAI-compatible provider).

    All replies are decided here, once, so a request costs an HTTP parse, a JSON parse, a dict
    lookup and a JSON dump.

    Args:
        config: Answers, accuracy, latency and advertised model name.
        host: Interface to bind (one socket, IPv6 when the host contains ``:``, like uvicorn).
        port: Port to bind; 0 lets the OS pick a free one (read it from ``.port``).

    Returns:
        The listening server; ``await server.close()`` (or ``async with``) stops it.
    """
    loop = asyncio.get_running_loop()
    handler = _Handler(config, loop)
    # IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections, as on any real server (proto 0 skips it).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        server = await loop.create_server(lambda: _Connection(handler), sock=sock, backlog=_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return DevModelServer(server, handler, host)


# --------------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------------


def serve(
    config: DevModelConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ready_file: str | None = None,
) -> None:
    """Run the dev-model server until stopped. Blocking.

    SIGTERM shuts the server down gracefully and makes this function return; SIGINT does the same
    and then raises ``KeyboardInterrupt``, as Python programs do. Runs on uvloop when it is
    installed, else on asyncio's default loop.

    Args:
        config: The dev-model configuration.
        host: Interface to bind.
        port: Port to bind; 0 lets the OS pick a free one (use ``ready_file`` to learn it).
        ready_file: If given, once the server is listening, ``{"url": "http://HOST:PORT/v1",
            "port": PORT}`` is written there atomically (a wildcard host is reported as
            127.0.0.1 so the URL is usable). The file is removed again on shutdown, so it never
            advertises a dead server.
    """
    stop = _StopRequest()
    written: list[str] = []
    # Installed before the loop exists, so a SIGTERM during start-up is not lost (the default action
    # would kill the process before the `finally` below removes the ready file). SIGINT is left to
    # asyncio.Runner: it cancels the main task (graceful close in its `finally`) and raises
    # KeyboardInterrupt.
    restore_sigterm = False
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, stop.request)
        restore_sigterm = True
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve_until_stopped(config, host, port, ready_file, written, stop))
    finally:
        if restore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for path in written:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (what uvicorn's "auto" picked), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class _StopRequest:
    """SIGTERM handler that asks :func:`_serve_until_stopped` to return, whenever it arrives."""

    def __init__(self) -> None:
        self.requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def request(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        """Return once a stop has been requested (possibly already, before the loop started)."""
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if not self.requested:
            await self._event.wait()


async def _serve_until_stopped(
    config: DevModelConfig,
    host: str,
    port: int,
    ready_file: str | None,
    written: list[str],
    stop: _StopRequest,
) -> None:
    """Serve until ``stop``; once listening, publish the address to ``ready_file`` and record it."""
    server = await start_server(config, host, port)
    try:
        if ready_file is not None:
            _write_ready_file(ready_file, _url_host(host), server.port)
            written.append(ready_file)
        await stop.wait()
    finally:
        await server.close()


def _url_host(host: str) -> str:
    """Host as it should appear in a URL a client can use."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _write_ready_file(path: str, host: str, port: int) -> None:
    """Write the ready file atomically, so a poller never reads half a JSON document."""
    target = Path(path)
    payload = json.dumps({"url": f"http://{host}:{port}/v1", "port": port})
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
