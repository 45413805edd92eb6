"""Tests of the dev-model test double, over real HTTP against a real uvicorn server."""

from __future__ import annotations

import asyncio
import json
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
import uvicorn

from benchwright.devmodel import (
    UNKNOWN_REPLY,
    DevModelConfig,
    build_app,
    is_answered_correctly,
    load_answers,
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
async def running(config: DevModelConfig) -> AsyncIterator[httpx.AsyncClient]:
    """Serve ``build_app(config)`` with uvicorn on a free port; yield a client pointed at /v1."""
    server = uvicorn.Server(
        uvicorn.Config(build_app(config), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 10
        # Readiness polling (bounded): uvicorn only exposes a `started` flag.
        while not server.started:
            assert not task.done(), "server exited during startup"
            assert time.monotonic() < deadline, "server did not start within 10 s"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


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
        "from benchwright.devmodel import DevModelConfig, serve\n"
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
