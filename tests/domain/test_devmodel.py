"""Tests of the dev-model test double, over real HTTP (httpx and raw sockets) against its asyncio server on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import string
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.testkit.devmodel import (
    UNKNOWN_REPLY,
    DevModelConfig,
    DevModelServer,
    is_answered_correctly,
    load_answers,
    start_server,
    wrong_answer,
)

ANSWERS = {
    "What is the capital of France?": "Paris",
    "What is 6 times 7?": "42",
    "Is the sky blue?": "yes",
    "Which option is correct?": "C",
    "Who wrote Hamlet?": "William Shakespeare",
    "What is pi to two decimals?": "3.14",
}


def _normalize(text: str) -> str:
    kept = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(kept.split())


@asynccontextmanager
async def serving(config: DevModelConfig) -> AsyncIterator[DevModelServer]:
    """Run the dev-model server on a free loopback port for the duration of the block."""
    server = await start_server(config)
    try:
        yield server
    finally:
        await asyncio.wait_for(server.close(), timeout=10)


@asynccontextmanager
async def running(config: DevModelConfig) -> AsyncIterator[httpx.AsyncClient]:
    """Serve ``config`` on a free port; yield an httpx client pointed at the server's root."""
    async with (
        serving(config) as server,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client,
    ):
        yield client


def _chat_body(content: Any, *, model: str = "dev", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def _ask(client: httpx.AsyncClient, content: Any, **extra: Any) -> str:
    response = await client.post("/v1/chat/completions", json=_chat_body(content, **extra))
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


# --------------------------------------------------------------------------------------------------
# Answering
# --------------------------------------------------------------------------------------------------


async def test_accuracy_one_answers_every_question_correctly() -> None:
    async with running(DevModelConfig(answers=ANSWERS, accuracy=1.0)) as client:
        for question, answer in ANSWERS.items():
            assert await _ask(client, question) == answer


async def test_accuracy_zero_never_gives_the_answer() -> None:
    async with running(DevModelConfig(answers=ANSWERS, accuracy=0.0)) as client:
        for question, answer in ANSWERS.items():
            reply = await _ask(client, question)
            assert reply != UNKNOWN_REPLY
            assert _normalize(reply) != _normalize(answer), (question, reply)


async def test_half_accuracy_is_about_half_and_deterministic() -> None:
    answers = {f"Question number {i}: what is {i} plus {i}?": str(2 * i) for i in range(400)}

    async with running(DevModelConfig(answers=answers, accuracy=0.5)) as client:

        # Bounded concurrency: httpx's pool gets slow with hundreds of requests queued on it.
        gate = asyncio.Semaphore(8)

        async def ask(question: str) -> str:
            async with gate:
                return await _ask(client, question)

        async def verdicts() -> list[bool]:
            replies = await asyncio.gather(*(ask(q) for q in answers))
            return [reply == answer for reply, answer in zip(replies, answers.values(), strict=True)]

        first = await verdicts()
        second = await verdicts()

    assert first == second
    fraction = sum(first) / len(first)
    # Binomial(400, 0.5) has sd 0.025: +/-0.1 is four sd, and the hash makes it fixed anyway.
    assert 0.4 <= fraction <= 0.6, fraction
    assert first == [is_answered_correctly(q, 0.5) for q in answers]


async def test_list_of_parts_content() -> None:
    parts = [{"type": "text", "text": "What is the capital of France?"}]
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        assert await _ask(client, parts) == "Paris"


async def test_question_found_inside_longer_prompt_prefers_longest() -> None:
    answers = {"capital of France?": "Lyon", "What is the capital of France?": "Paris"}
    prompt = "Answer briefly.\n\nQuestion: What is the capital of France?\nAnswer:"
    async with running(DevModelConfig(answers=answers)) as client:
        assert await _ask(client, prompt) == "Paris"
        assert await _ask(client, "Tell me the capital of France? Thanks.") == "Lyon"


async def test_last_user_message_is_the_one_answered() -> None:
    body = {
        "model": "dev",
        "messages": [
            {"role": "system", "content": "You are a quiz bot."},
            {"role": "user", "content": "Who wrote Hamlet?"},
            {"role": "assistant", "content": "William Shakespeare"},
            {"role": "user", "content": "What is 6 times 7?"},
        ],
    }
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.json()["choices"][0]["message"]["content"] == "42"


async def test_numeric_answers_in_a_programmatic_table() -> None:
    answers: dict[str, Any] = {"What is 6 times 7?": 42}
    async with running(DevModelConfig(answers=answers, accuracy=0.0)) as client:
        assert await _ask(client, "What is 6 times 7?") == "43"


async def test_unknown_question() -> None:
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        assert await _ask(client, "What is the airspeed of an unladen swallow?") == UNKNOWN_REPLY


async def test_response_is_an_openai_chat_completion_with_consistent_usage() -> None:
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        response = await client.post(
            "/chat/completions",
            json=_chat_body("Who wrote Hamlet?", model="gpt-4o-mini"),
            headers={"Authorization": "Bearer sk-anything"},
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    data = response.json()
    assert data["id"].startswith("chatcmpl-")
    assert data["object"] == "chat.completion"
    assert isinstance(data["created"], int)
    assert data["model"] == "gpt-4o-mini"
    choice = data["choices"][0]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "William Shakespeare"
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] == 5  # ceil(len("William Shakespeare") / 4)


async def test_models_and_health() -> None:
    async with running(DevModelConfig(answers=ANSWERS, model_name="dev-7b")) as client:
        for path in ("/v1/models", "/models"):
            response = await client.get(path)
            assert response.status_code == 200
            assert response.json()["object"] == "list"
            [model] = response.json()["data"]
            assert model["id"] == "dev-7b"
            assert model["object"] == "model"
            assert model["owned_by"] == "benchwright-dev"
        health = await client.get("/health")
    assert health.json() == {"ok": True}


async def test_unknown_route_and_wrong_method_get_openai_errors() -> None:
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        missing = await client.post("/v1/embeddings", json={"input": "x"})
        wrong_method = await client.get("/v1/chat/completions")
    assert missing.status_code == 404
    assert wrong_method.status_code == 405
    for response in (missing, wrong_method):
        assert isinstance(response.json()["error"]["message"], str)


async def test_streaming_reassembles_to_the_same_text() -> None:
    question = "Who wrote Hamlet?"
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        plain = await _ask(client, question)
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json=_chat_body(question, stream=True, stream_options={"include_usage": True}),
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines() if line]

    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
    )
    assert text == plain
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop"
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


async def test_streaming_without_usage_option_sends_no_usage_chunk() -> None:
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        response = await client.post(
            "/v1/chat/completions", json=_chat_body("What is 6 times 7?", stream=True)
        )
    events = [line for line in response.text.splitlines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in events[:-1]]
    assert all(c["choices"] and "usage" not in c for c in chunks)


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"model": "dev"}', b'{"messages": "hello"}', b"[1, 2]", b'{"messages": [42]}'],
)
async def test_malformed_request_is_400_with_openai_error(content: bytes) -> None:
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        response = await client.post(
            "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and error["message"]


async def test_latency_is_non_blocking() -> None:
    latency_ms = 300.0
    async with running(DevModelConfig(answers=ANSWERS, latency_ms=latency_ms)) as client:
        started = time.monotonic()
        replies = await asyncio.gather(*(_ask(client, "What is 6 times 7?") for _ in range(10)))
        elapsed = time.monotonic() - started
    assert replies == ["42"] * 10
    # Serial sleeping would take 3 s; concurrent sleeping takes ~0.3 s.
    assert latency_ms / 1000 <= elapsed < 1.5, elapsed


async def test_api_key_is_demanded_when_configured() -> None:
    async with running(DevModelConfig(answers=ANSWERS, api_key="sk-right")) as client:
        body = _chat_body("What is 6 times 7?")
        missing = await client.post("/v1/chat/completions", json=body)
        wrong = await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-wrong"})
        right = await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-right"})
        # The model listing wants the key too, as OpenAI's does (Attach's liveness check relies on it); health not.
        models_missing = await client.get("/v1/models")
        models_right = await client.get("/v1/models", headers={"Authorization": "Bearer sk-right"})
        health = await client.get("/health")
    for response in (missing, wrong, models_missing):
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "invalid_api_key"
    assert right.json()["choices"][0]["message"]["content"] == "42"
    assert models_right.status_code == 200 and models_right.json()["data"][0]["id"] == "dev"
    assert health.status_code == 200


async def test_routing_ignores_query_and_errors_name_method_and_path() -> None:
    async with running(DevModelConfig(answers=ANSWERS)) as client:
        with_query = await client.post("/v1/chat/completions?api-version=1", json=_chat_body("What is 6 times 7?"))
        missing = await client.post("/v1/embeddings?x=1", json={"input": "x"})
        wrong_method = await client.get("/v1/chat/completions")
        models_by_post = await client.post("/models")
        head = await client.head("/health")
        redirect = await client.get("/health/?a=b")
    assert with_query.json()["choices"][0]["message"]["content"] == "42"
    assert missing.json()["error"]["message"] == "Not Found: POST /v1/embeddings"
    assert wrong_method.json()["error"]["message"] == "Method Not Allowed: GET /v1/chat/completions"
    assert models_by_post.status_code == 405
    assert models_by_post.json()["error"]["message"] == "Method Not Allowed: POST /models"
    # HEAD on a GET route, and Starlette's trailing-slash redirect, as the uvicorn/Starlette version had.
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(b'{"ok": true}'))
    assert redirect.status_code == 307
    assert redirect.headers["location"].endswith("/health?a=b")


# --------------------------------------------------------------------------------------------------
# HTTP/1.1 behaviour of the raw server
# --------------------------------------------------------------------------------------------------


def _request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: test\r\n{headers}{length}\r\n".encode() + body


def _chat_bytes(question: str) -> bytes:
    return json.dumps(_chat_body(question)).encode()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one Content-Length-framed response (every response of the dev model is)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=10)
    return int(status_line.split()[1]), headers, body


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), timeout=10) == b""


def _content(body: bytes) -> str:
    return json.loads(body)["choices"][0]["message"]["content"]


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=server.url, timeout=10, limits=limits) as client:
            local_ports = set()
            for question, answer in ANSWERS.items():
                async with client.stream("POST", "/chat/completions", json=_chat_body(question)) as response:
                    local_ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
                    assert _content(await response.aread()) == answer
                    assert "connection" not in response.headers
    assert len(local_ports) == 1  # one TCP connection carried every request


async def test_connection_close_and_http_1_0_close_after_the_response() -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_request("POST", "/v1/chat/completions", _chat_bytes("Who wrote Hamlet?"),
                              "Connection: close\r\n"))
        status, headers, body = await _read_response(reader)
        assert (status, headers["connection"], _content(body)) == (200, "close", "William Shakespeare")
        assert await _closed_by_server(reader)
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /health HTTP/1.0\r\n\r\n")
        status, headers, body = await _read_response(reader)
        assert (status, headers["connection"], body) == (200, "close", b'{"ok": true}')
        assert await _closed_by_server(reader)
        writer.close()


async def test_pipelined_requests_are_answered_in_order() -> None:
    # With latency, each answer waits for its own latency, and still none overtakes an earlier one.
    async with serving(DevModelConfig(answers=ANSWERS, latency_ms=50)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        questions = list(ANSWERS)
        pipeline = [_request("POST", "/v1/chat/completions", _chat_bytes(q)) for q in questions[:3]]
        pipeline.insert(1, _request("GET", "/health"))
        pipeline.append(_request("GET", "/nope"))
        writer.write(b"".join(pipeline))
        replies = [await _read_response(reader) for _ in pipeline]
        writer.close()
    assert [status for status, _, _ in replies] == [200, 200, 200, 200, 404]
    assert _content(replies[0][2]) == ANSWERS[questions[0]]
    assert replies[1][2] == b'{"ok": true}'
    assert [_content(body) for _, _, body in replies[2:4]] == [ANSWERS[q] for q in questions[1:3]]


async def test_malformed_request_gets_400_and_the_connection_closed() -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"THIS IS NOT HTTP\r\n\r\n")
        status, headers, _ = await _read_response(reader)
        assert (status, headers["connection"]) == (400, "close")
        assert await _closed_by_server(reader)
        writer.close()

        # Requests before the malformed one on the same connection are still answered, in order.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_request("GET", "/health") + b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n")
        assert (await _read_response(reader))[0] == 200
        assert (await _read_response(reader))[0] == 400
        assert await _closed_by_server(reader)
        writer.close()

        # The server itself is unaffected.
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            assert (await client.get("/models")).status_code == 200


async def test_chunked_request_body() -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = _chat_bytes("What is pi to two decimals?")
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head)
        for start in range(0, len(body), 7):
            piece = body[start : start + 7]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        status, _, reply = await _read_response(reader)
        writer.close()
    assert (status, _content(reply)) == (200, "3.14")


async def test_expect_100_continue_gets_an_interim_response() -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = _chat_bytes("Is the sky blue?")
        writer.write(_request("POST", "/v1/chat/completions", headers="Expect: 100-continue\r\n").replace(
            b"Content-Length: 0", b"Content-Length: %d" % len(body)))
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        status, _, reply = await _read_response(reader)
        writer.close()
    assert (status, _content(reply)) == (200, "yes")


async def test_oversized_body_gets_413_and_the_connection_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        # Announced by Content-Length: refused before any of the body is read; the bytes the client
        # keeps sending are drained, so the 413 is not lost to a connection reset.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n"
                     % (64 * 2**20 + 1))
        writer.write(b"x" * 2**18)
        status, headers, body = await _read_response(reader)
        assert (status, headers["connection"]) == (413, "close")
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
        assert await _closed_by_server(reader)
        writer.close()

        # Chunked: refused once the received body passes the limit (lowered here to keep the test small).
        monkeypatch.setattr(server._handler, "max_body", 1000)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (600, b"x" * 600) * 2)
        assert (await _read_response(reader))[0] == 413
        assert await _closed_by_server(reader)
        writer.close()


async def test_a_request_that_crashes_the_handler_gets_500_and_the_server_survives() -> None:
    async with serving(DevModelConfig(answers=ANSWERS)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        # json.loads raises RecursionError (not a ValueError) on absurd nesting; uvicorn answered 500 too.
        writer.write(_request("POST", "/v1/chat/completions", b"[" * 100_000) + _request("GET", "/health"))
        status, headers, _ = await _read_response(reader)
        assert (status, headers["connection"]) == (500, "close")
        assert await _closed_by_server(reader)
        writer.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            assert await _ask(client, "What is 6 times 7?") == "42"


async def test_client_disconnect_during_latency_is_harmless(caplog: pytest.LogCaptureFixture) -> None:
    async with serving(DevModelConfig(answers=ANSWERS, latency_ms=200)) as server:
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(_request("POST", "/v1/chat/completions", _chat_bytes("Who wrote Hamlet?")))
            await writer.drain()
            await asyncio.sleep(0.02)  # the request is parsed and its answer is waiting out the latency
            writer.transport.abort()
        await asyncio.sleep(0.3)  # past the latency: the abandoned answers would have been written now
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            assert await _ask(client, "Who wrote Hamlet?") == "William Shakespeare"
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


async def test_close_lets_in_flight_answers_finish() -> None:
    server = await start_server(DevModelConfig(answers=ANSWERS, latency_ms=300))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
        pending = asyncio.create_task(_ask(client, "What is 6 times 7?"))
        await asyncio.sleep(0.1)
        await asyncio.wait_for(server.close(), timeout=10)
        assert await pending == "42"
        with pytest.raises(httpx.ConnectError):
            await client.get("/health")


# --------------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("41", "42"), ("-3", "-2"), ("1,000", "1,001"), ("yes", "no"), ("True", "False"), ("A", "B")],
)
def test_wrong_answer_is_plausible(answer: str, expected: str) -> None:
    assert wrong_answer(answer) == expected


@pytest.mark.parametrize(
    "answer",
    [
        "Paris",
        "paris",
        "",
        "?!",
        "-0.5",
        "2.5",
        "D",
        "William Shakespeare",
        "Mercury Jupiter Oxygen",
        "nan",
    ],
)
def test_wrong_answer_always_differs_and_is_deterministic(answer: str) -> None:
    wrong = wrong_answer(answer)
    assert wrong == wrong_answer(answer)
    assert _normalize(wrong) and _normalize(wrong) != _normalize(answer)
    if _normalize(answer):
        assert _normalize(answer) not in _normalize(wrong)


def test_is_answered_correctly_bounds_and_monotonicity() -> None:
    questions = [f"q{i}" for i in range(2000)]
    assert all(is_answered_correctly(q, 1.0) for q in questions)
    assert not any(is_answered_correctly(q, 0.0) for q in questions)
    low = {q for q in questions if is_answered_correctly(q, 0.3)}
    high = {q for q in questions if is_answered_correctly(q, 0.7)}
    assert low <= high
    assert 0.25 <= len(low) / len(questions) <= 0.35
    with pytest.raises(ValueError):
        is_answered_correctly("q", 1.5)


def test_config_rejects_out_of_range_values() -> None:
    with pytest.raises(ValueError):
        DevModelConfig(answers={}, accuracy=-0.1)
    with pytest.raises(ValueError):
        DevModelConfig(answers={}, latency_ms=-1)


def test_load_answers_reads_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "answers.jsonl"
    path.write_text(
        '{"question": "  What is 6 times 7? ", "answer": 42}\n'
        "\n"
        '{"question": "Capital of France?", "answer": "Paris"}\n',
        encoding="utf-8",
    )
    assert load_answers(path) == {"What is 6 times 7?": "42", "Capital of France?": "Paris"}


@pytest.mark.parametrize(
    "bad_line",
    [
        "{not json",
        '["a list"]',
        '{"answer": "x"}',
        '{"question": "q"}',
        '{"question": "", "answer": "x"}',
        '{"question": "q", "answer": true}',
    ],
)
def test_load_answers_error_names_the_line(tmp_path: Path, bad_line: str) -> None:
    path = tmp_path / "answers.jsonl"
    path.write_text('{"question": "ok?", "answer": "yes"}\n\n' + bad_line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3"):
        load_answers(path)


# --------------------------------------------------------------------------------------------------
# serve() in a real process
# --------------------------------------------------------------------------------------------------


def test_serve_writes_ready_file_with_working_url(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    code = (
        "import sys\n"
        "from benchwright.testkit.devmodel import DevModelConfig, serve\n"
        "serve(DevModelConfig(answers={'What is 6 times 7?': '42'}), port=0, ready_file=sys.argv[1])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        # Readiness polling (bounded) for the file the server writes once it is listening.
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "ready file not written within 20 s"
            time.sleep(0.02)
        info = json.loads(ready.read_text(encoding="utf-8"))
        assert info["port"] > 0
        assert info["url"] == f"http://127.0.0.1:{info['port']}/v1"
        with httpx.Client(base_url=info["url"], timeout=10) as client:
            assert client.get("/models").json()["data"][0]["id"] == "dev"
            reply = client.post("/chat/completions", json=_chat_body("What is 6 times 7?"))
            assert reply.json()["choices"][0]["message"]["content"] == "42"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if proc.stderr is not None:
            proc.stderr.close()
    # Graceful shutdown removes the file, so it never advertises a dead server.
    assert not ready.exists()
    assert proc.returncode == 0  # SIGTERM is a graceful shutdown, not a crash
