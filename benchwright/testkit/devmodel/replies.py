"""What the dev model answers a chat-completions request: question matching, request parsing, token usage and the
JSON and server-sent-event bodies, as OpenAI shapes them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from benchwright.testkit.devmodel.answers import is_answered_correctly, wrong_answer
from benchwright.testkit.devmodel.config import UNKNOWN_REPLY, DevModelConfig

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
