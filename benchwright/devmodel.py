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
``GET /v1/models`` (and ``/models``), ``GET /health``. Authentication is not required; any
``Authorization`` header is accepted and ignored.

It is written to be cheap per request (plain Starlette routes, stdlib ``json``, all replies
precomputed at start-up) because benchmarks drive it at hundreds of concurrent requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

__all__ = [
    "UNKNOWN_REPLY",
    "DevModelConfig",
    "build_app",
    "is_answered_correctly",
    "load_answers",
    "serve",
    "wrong_answer",
]

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
_JSON_HEADERS = {"content-type": _JSON_CONTENT_TYPE.decode()}
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


@dataclass(frozen=True)
class DevModelConfig:
    """Configuration of the dev-model test double.

    Attributes:
        answers: Question text -> correct answer. Keys are matched after stripping whitespace.
        accuracy: Fraction P in [0, 1] of questions answered correctly (hash-chosen per question).
        latency_ms: Non-blocking latency added to every chat-completions request, in milliseconds.
        model_name: Id listed by ``/v1/models``. Requests naming any model are answered anyway.
        api_key: When set, chat completions demand ``Authorization: Bearer <api_key>`` and answer 401 otherwise,
            like a real provider (so tests can tell who holds the real key).
    """

    answers: dict[str, str]
    accuracy: float = 1.0
    latency_ms: float = 0.0
    model_name: str = "dev"
    api_key: str | None = None

    def __post_init__(self) -> None:
        # NaN fails both comparisons, so it is rejected too.
        if not 0.0 <= self.accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {self.accuracy!r}")
        if not self.latency_ms >= 0.0 or math.isinf(self.latency_ms):
            raise ValueError(f"latency_ms must be a finite number >= 0, got {self.latency_ms!r}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")


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


def is_answered_correctly(question: str, accuracy: float) -> bool:
    """Decide, deterministically, whether the double answers ``question`` correctly.

    The first 8 bytes of ``sha256(question)`` are read as a number u uniform in [0, 1); the question
    is answered correctly iff ``u < accuracy``. The same question therefore always gets the same
    verdict (across calls, processes and machines), and over many questions the fraction answered
    correctly is ≈ ``accuracy``. Raising the accuracy only ever turns wrong verdicts into right ones.

    Args:
        question: The question text (as stored in the answer table).
        accuracy: Target fraction of correct answers, in [0, 1].

    Returns:
        True when the correct answer should be given.

    Raises:
        ValueError: ``accuracy`` is outside [0, 1].
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < accuracy


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
            correct = is_answered_correctly(key, config.accuracy)
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
    completion_id: str, created: int, model: str, reply: str, usage: dict[str, int]
) -> bytes:
    """A ``chat.completion`` object as OpenAI returns it."""
    payload = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": _SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
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
    completion_id: str, created: int, model: str, reply: str, usage: dict[str, int] | None
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

    events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": "", "refusal": None}, None)]
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


class _ChatCompletions:
    """Raw ASGI endpoint for ``POST /v1/chat/completions``, mounted on a plain Starlette ``Route``.

    It is the hot path, so it skips Starlette's Request/Response objects and their per-request
    exception wrapping: it reads the body, builds the reply bytes and sends two ASGI messages.
    """

    def __init__(self, responder: _Responder) -> None:
        self.responder = responder
        self.delay = responder.config.latency_ms / 1000.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # The client went away; there is no one to answer.
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        required = self.responder.config.api_key
        if required is not None and dict(scope.get("headers") or []).get(b"authorization") != \
                f"Bearer {required}".encode():
            status, content_type, body = 401, _JSON_CONTENT_TYPE, _error_body("Incorrect API key provided.",
                                                                              "invalid_api_key")
        else:
            status, content_type, body = await self.respond(b"".join(chunks))
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        if content_type is _SSE_CONTENT_TYPE:
            headers.append((b"cache-control", b"no-cache"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def respond(self, raw: bytes) -> tuple[int, bytes, bytes]:
        """Answer one request body: returns (status, content type, body bytes)."""
        try:
            payload, messages = _parse_request(raw)
            texts = [_content_text(message.get("content")) for message in messages]
        except _BadRequest as exc:
            return 400, _JSON_CONTENT_TYPE, _error_body(str(exc))

        user_text: str | None = None
        for message, text in zip(reversed(messages), reversed(texts)):
            if message["role"] == "user":
                user_text = text
                break
        reply = UNKNOWN_REPLY if user_text is None else self.responder.reply_for(user_text)

        if self.delay > 0:
            # Non-blocking, so N concurrent requests take ~latency in total, not N x latency.
            await asyncio.sleep(self.delay)

        model = payload.get("model")
        if not isinstance(model, str) or not model:
            model = self.responder.config.model_name
        usage = _usage(texts, reply)
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        created = int(time.time())

        if payload.get("stream") is True:
            options = payload.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            body = _stream_body(completion_id, created, model, reply, usage if include_usage else None)
            return 200, _SSE_CONTENT_TYPE, body
        return 200, _JSON_CONTENT_TYPE, _completion_body(completion_id, created, model, reply, usage)


def build_app(config: DevModelConfig) -> Starlette:
    """Build the dev-model ASGI app (a test double of an OpenAI-compatible provider).

    All replies are decided here, once, so a request costs a JSON parse, a dict lookup and a
    JSON dump.

    Args:
        config: Answers, accuracy, latency and advertised model name.

    Returns:
        A Starlette app serving ``/v1/chat/completions``, ``/v1/models`` (each also without the
        ``/v1`` prefix) and ``/health``.
    """
    responder = _Responder(config)
    chat_completions = _ChatCompletions(responder)
    models_body = json.dumps(
        {
            "object": "list",
            "data": [
                {"id": config.model_name, "object": "model", "created": 0, "owned_by": "benchwright-dev"}
            ],
        }
    ).encode()
    health_body = b'{"ok": true}'

    async def models(request: Request) -> Response:
        return Response(models_body, headers=_JSON_HEADERS)

    async def health(request: Request) -> Response:
        return Response(health_body, headers=_JSON_HEADERS)

    async def http_error(request: Request, exc: Exception) -> Response:
        # Keep even 404/405 in OpenAI's error shape, so SDK error messages stay readable.
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "Internal server error"
        body = _error_body(f"{detail}: {request.method} {request.url.path}")
        return Response(body, status_code=status, headers=_JSON_HEADERS)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


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
    and then raises ``KeyboardInterrupt``, as Python programs do.

    Args:
        config: The dev-model configuration.
        host: Interface to bind.
        port: Port to bind; 0 lets the OS pick a free one (use ``ready_file`` to learn it).
        ready_file: If given, once the server is listening, ``{"url": "http://HOST:PORT/v1",
            "port": PORT}`` is written there atomically (a wildcard host is reported as
            127.0.0.1 so the URL is usable). The file is removed again on shutdown, so it never
            advertises a dead server.
    """
    uvicorn_config = uvicorn.Config(
        build_app(config),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(uvicorn_config)
    written: list[str] = []
    # uvicorn shuts down gracefully on SIGTERM and then re-raises it with the previous handler; with
    # the default one the process would die there, before the `finally` below removes the ready
    # file. Our handler instead just asks the server to exit (which also covers a SIGTERM arriving
    # before uvicorn installs its own handler), so serve() returns and the process exits 0.
    restore_sigterm = False
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

            def _on_sigterm(signum: int, frame: FrameType | None) -> None:
                server.should_exit = True

            signal.signal(signal.SIGTERM, _on_sigterm)
            restore_sigterm = True
    try:
        # uvicorn's loop factory picks uvloop when it is installed ("auto"), plain asyncio otherwise.
        with asyncio.Runner(loop_factory=uvicorn_config.get_loop_factory()) as runner:
            runner.run(_serve_until_exit(server, host, ready_file, written))
    finally:
        if restore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for path in written:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


async def _serve_until_exit(
    server: uvicorn.Server, host: str, ready_file: str | None, written: list[str]
) -> None:
    """Run ``server``; once it listens, publish its address to ``ready_file`` and record it."""
    task = asyncio.create_task(server.serve())
    if ready_file is not None:
        # Readiness polling: uvicorn exposes no "started" event, only this flag.
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            bound_port = server.servers[0].sockets[0].getsockname()[1]
            _write_ready_file(ready_file, _url_host(host), bound_port)
            written.append(ready_file)
    await task


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
