"""The credential proxy as a real process in front of real dev-model servers: per-run keys, revocation, two runs'
routes apart, the provider's failures classified as if called directly, LiteLLM's prices, and the linger exit."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from benchwright.llm.httpclient import ConnectionShelf
from benchwright.llm.prices import Prices
from benchwright.llm.sut import SutError, listed_at_proxy, run_sut
from benchwright.proxy.model_proxy import (
    ProxyGone,
    ProxyHandle,
    control_call,
    keep_proxies_ready,
    load_handle,
    reap_model_proxies,
    start_model_proxy,
    stop_model_proxy,
    stop_owned_proxies,
)
from benchwright.schemas import ModelSpec
from benchwright.stack.devstack import free_port
from benchwright.stack.procreg import ProcessRegistry, proc_starttime
from benchwright.testkit.devmodel import DevModelConfig, DevModelServer, start_server

pytestmark = pytest.mark.asyncio
KEY_A = "sk-real-a-" + "1" * 24
KEY_B = "sk-real-b-" + "2" * 24
QUESTION = "What is 2 + 3?"


@pytest_asyncio.fixture
async def models() -> AsyncIterator[tuple[DevModelServer, DevModelServer]]:
    answers = {QUESTION: "5"}
    a = await start_server(DevModelConfig(answers=answers, api_key=KEY_A), port=free_port())
    b = await start_server(DevModelConfig(answers=answers, api_key=KEY_B), port=free_port())
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ProcessRegistry]:
    reg = ProcessRegistry(tmp_path / "data")
    yield reg
    stop_owned_proxies(reg)


def _register(tmp_path: Path, run_id: str, spec: ModelSpec, secret: str | None, registry: ProcessRegistry,
              linger_s: float = 30.0) -> ProxyHandle:
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return start_model_proxy(run_dir=run_dir, spec=spec, secret_value=secret, registry=registry, linger_s=linger_s)


async def _chat(handle: ProxyHandle, key: str, model: str | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{handle.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                               json={"model": model or handle.model_name,
                                     "messages": [{"role": "user", "content": QUESTION}]})


async def test_per_run_keys_route_apart_and_die_with_the_run(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, b = models
    spec_a = ModelSpec(identifier="openai/dev", api_base=a.url, input_cost_per_token=1e-6, output_cost_per_token=2e-6)
    spec_b = ModelSpec(identifier="openai/dev", api_base=b.url, input_cost_per_token=3e-6, output_cost_per_token=4e-6)
    run_a = await asyncio.to_thread(_register, tmp_path, "run-a", spec_a, KEY_A, registry)
    run_b = await asyncio.to_thread(_register, tmp_path, "run-b", spec_b, KEY_B, registry)
    assert (run_a.pid, run_a.port) == (run_b.pid, run_b.port), "one proxy process serves both runs"
    assert run_a.fake_key != run_b.fake_key

    got_a, got_b = await _chat(run_a, run_a.fake_key), await _chat(run_b, run_b.fake_key)
    assert got_a.status_code == got_b.status_code == 200, (got_a.text, got_b.text)
    for got, spec in ((got_a, spec_a), (got_b, spec_b)):
        usage = got.json()["usage"]
        assert got.json()["choices"][0]["message"]["content"] == "5"
        expected = usage["prompt_tokens"] * spec.input_cost_per_token + usage["completion_tokens"] * \
            spec.output_cost_per_token
        assert float(got.headers["x-litellm-response-cost"]) == pytest.approx(expected), "each run's own prices"
    assert (await _chat(run_a, "sk-guessed")).status_code == 401
    assert (await _chat(run_a, KEY_A)).status_code == 401, "the real key is no key at the proxy"
    assert (await _chat(run_a, run_a.fake_key, model="gpt-4o")).status_code == 404, "only the run's own model"
    environ = Path(f"/proc/{run_a.pid}/environ").read_bytes() + Path(f"/proc/{run_a.pid}/cmdline").read_bytes()
    assert KEY_A.encode() not in environ and KEY_B.encode() not in environ, "keys travel over the control socket"
    assert KEY_A.encode() not in Path("/proc/self/environ").read_bytes()

    revoked = await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "run-a")
    assert revoked is not None and revoked.calls == 1 and not revoked.idle, "run-b still holds a route"
    assert revoked.cost_usd == pytest.approx(float(got_a.headers["x-litellm-response-cost"])), "the proxy's meter"
    assert (await _chat(run_a, run_a.fake_key)).status_code == 401, "a run's key dies with the run"
    assert (await _chat(run_b, run_b.fake_key)).status_code == 200, "the other run goes on"
    last = await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "run-b")
    assert last is not None and last.idle and last.calls == 2
    assert a.chat_statuses == {200: 1} and b.chat_statuses == {200: 2}, "each provider saw only its own run"


async def test_runs_take_over_kept_connections_to_the_proxy_and_each_request_carries_its_own_runs_key(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, b = models
    spec_a = ModelSpec(identifier="openai/dev", api_base=a.url)
    spec_b = ModelSpec(identifier="openai/dev", api_base=b.url)
    run_a = await asyncio.to_thread(_register, tmp_path, "run-a", spec_a, KEY_A, registry)
    run_b = await asyncio.to_thread(_register, tmp_path, "run-b", spec_b, KEY_B, registry)
    shelf = ConnectionShelf()  # a worker's: every batch's client takes from it and leaves to it
    proxy = ("", "127.0.0.1", run_a.port, "127.0.0.1")
    messages = [{"role": "user", "content": QUESTION}]

    sut_a = run_sut(spec_a, prices=Prices(), proxy=run_a, concurrency=2, timeout_s=5, retries=0, shelf=shelf)
    await sut_a.warm(2)
    assert [r.text for r in await asyncio.gather(*(sut_a.complete(messages, {}) for _ in range(2)))] == ["5", "5"]
    await sut_a.aclose()
    assert shelf.kept(proxy) == 2, "run-a's batch left its connections to the proxy open"
    await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "run-a")

    sut_b = run_sut(spec_b, prices=Prices(), proxy=run_b, concurrency=2, timeout_s=5, retries=0, shelf=shelf)
    await sut_b.warm(2)
    assert shelf.kept(proxy) == 0, "run-b's batch took them over instead of connecting"
    assert [r.text for r in await asyncio.gather(*(sut_b.complete(messages, {}) for _ in range(2)))] == ["5", "5"]
    await sut_b.aclose()
    # On the very connections run-b used, run-a's key is refused: a connection carries no run, each request its key.
    late_a = run_sut(spec_a, prices=Prices(), proxy=run_a, concurrency=2, timeout_s=5, retries=0, shelf=shelf)
    await late_a.warm(2)
    assert shelf.kept(proxy) == 0
    with pytest.raises(SutError) as refused:
        await late_a.complete(messages, {})
    await late_a.aclose()
    assert refused.value.status == 401
    assert a.chat_statuses == {200: 2} and b.chat_statuses == {200: 2}, "each provider saw only its own run"
    shelf.close()


async def test_a_run_after_another_to_the_same_provider_calls_it_on_the_connections_the_first_left(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    spec = ModelSpec(identifier="openai/dev", api_base=a.url)
    first = await asyncio.to_thread(_register, tmp_path, "run-1", spec, KEY_A, registry)
    got = await asyncio.gather(*(_chat(first, first.fake_key) for _ in range(3)))
    assert [g.status_code for g in got] == [200] * 3
    opened = a.connections_opened  # one to three, as the proxy's pool reused them
    assert opened >= 1
    await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "run-1")
    second = await asyncio.to_thread(_register, tmp_path, "run-2", spec, KEY_A, registry)
    assert second.port == first.port, "the same proxy (it lingers between runs)"
    for _ in range(3):  # one at a time: each needs one connection, and run-1 left at least one
        assert (await _chat(second, second.fake_key)).status_code == 200
    assert a.connections_opened == opened, "run-2's calls went out on run-1's connections to the provider"
    assert a.chat_statuses == {200: 6}
    assert (await _chat(first, first.fake_key)).status_code == 401, "run-1's key died with run-1 all the same"


async def test_the_worker_side_client_classifies_the_providers_failures_through_the_proxy(
        tmp_path: Path, registry: ProcessRegistry) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    spec = ModelSpec(identifier="openai/dev", api_base=dead)
    handle = await asyncio.to_thread(_register, tmp_path, "run-dead", spec, None, registry)
    sut = run_sut(spec, prices=Prices(), proxy=handle, concurrency=1, timeout_s=5, retries=1)
    try:
        with pytest.raises(SutError) as caught:
            await sut.complete([{"role": "user", "content": QUESTION}], {})
    finally:
        await sut.aclose()
    assert caught.value.kind == "unreachable" and caught.value.detail == "connection refused"


async def test_a_priced_model_costs_what_litellms_cost_map_says(
        tmp_path: Path, registry: ProcessRegistry) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    server = await start_server(DevModelConfig(answers={QUESTION: "5"}, model_name="gpt-4o-mini"), port=free_port())
    try:
        spec = ModelSpec(identifier="openai/gpt-4o-mini", api_base=server.url)
        handle = await asyncio.to_thread(_register, tmp_path, "run-priced", spec, None, registry)
        got = await _chat(handle, handle.fake_key)
    finally:
        await server.close()
    usage = got.json()["usage"]
    prompt, completion = litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=usage["prompt_tokens"],
                                                completion_tokens=usage["completion_tokens"])
    assert prompt + completion > 0
    assert float(got.headers["x-litellm-response-cost"]) == pytest.approx(prompt + completion)


async def test_an_idle_proxy_exits_after_its_linger_and_the_next_run_starts_another(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    spec = ModelSpec(identifier="openai/dev", api_base=a.url)
    first = await asyncio.to_thread(_register, tmp_path, "run-1", spec, KEY_A, registry, 0.3)
    start = proc_starttime(first.pid)
    await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "run-1")
    deadline = time.monotonic() + 20
    while proc_starttime(first.pid) == start:
        assert time.monotonic() < deadline, "the idle proxy outlived its linger"
        await asyncio.sleep(0.05)
    assert not Path(first.control or "").exists(), "its control socket went with it"
    second = await asyncio.to_thread(_register, tmp_path, "run-2", spec, KEY_A, registry, 0.3)
    assert second.pid != first.pid
    assert (await _chat(second, second.fake_key)).status_code == 200
    assert json.loads((tmp_path / "runs" / "run-2" / "proxy.json").read_text())["fake_key"] == second.fake_key
    assert oct((tmp_path / "runs" / "run-2" / "proxy.json").stat().st_mode & 0o777) == "0o600"


async def _hello_of_a_new_proxy(registry: ProcessRegistry, *, not_pid: int | None = None) -> dict[str, Any]:
    """The ``hello`` of the registry's live credential proxy (other than ``not_pid``), waited for."""
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "no new credential proxy came up"
        for entry in registry.live(kinds=("model_proxy",)):
            if entry.pid != not_pid:
                try:
                    return await asyncio.to_thread(control_call, entry.detail["control"], {"op": "hello"})
                except ProxyGone:  # recorded as it was spawned: its control socket comes up a moment later
                    pass
        await asyncio.sleep(0.02)


async def test_a_worker_keeps_a_spare_proxy_that_lingers_only_once_its_first_route_is_gone(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    """With no linger at all (0 s), a proxy started for nobody would exit at once; the worker's spare waits for its
    first run, which finds it up (no start-up on the run's path), then exits as that run's route goes, and the
    worker starts another."""
    a, _ = models
    stop = asyncio.Event()
    keeper = asyncio.create_task(keep_proxies_ready(registry=registry, linger_s=0.0, every_s=0.05, stop=stop))
    try:
        spare = await _hello_of_a_new_proxy(registry)
        assert spare["spare"] is True and spare["routes"] == 0 and spare["ok"] is True
        spec = ModelSpec(identifier="openai/dev", api_base=a.url)
        handle = await asyncio.to_thread(_register, tmp_path, "run-1", spec, KEY_A, registry, 0.0)
        assert handle.pid == spare["pid"], "the run's route went to the spare, no proxy was started for it"
        assert (await _chat(handle, handle.fake_key)).status_code == 200
        await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "run-1")
        again = await _hello_of_a_new_proxy(registry, not_pid=spare["pid"])
        assert again["spare"] is True and again["routes"] == 0
        assert proc_starttime(spare["pid"]) is None, "the served proxy lingered (0 s) and exited"
    finally:
        stop.set()
        await keeper
    assert len(registry.live(kinds=("model_proxy",))) == 1, "one proxy at a time, none started after the stop"


async def test_a_spare_that_cannot_start_is_logged_and_tried_again_not_the_workers_end(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The data directory's parent is a file: no proxy can start there (its log cannot be opened). The keeper says
    why and keeps going, and stops when asked."""
    (tmp_path / "not-a-dir").write_text("")
    broken = ProcessRegistry(tmp_path / "not-a-dir" / "data")
    sockets_dirs = set(Path(tempfile.gettempdir()).glob(f"bw-cp-{os.getpid()}-*"))
    stop = asyncio.Event()
    keeper = asyncio.create_task(keep_proxies_ready(registry=broken, linger_s=1.0, every_s=0.05, stop=stop))
    deadline = time.monotonic() + 30
    while "could not start a spare credential proxy" not in caplog.text:
        assert time.monotonic() < deadline and not keeper.done(), "the failure was not logged, or ended the keeper"
        await asyncio.sleep(0.02)
    assert not keeper.done()
    stop.set()
    await asyncio.wait_for(keeper, 5)
    assert keeper.exception() is None
    assert set(Path(tempfile.gettempdir()).glob(f"bw-cp-{os.getpid()}-*")) == sockets_dirs, "no failed start left one"


async def test_a_non_openai_provider_goes_through_litellm_inside_the_proxy(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    # hosted_vllm is a LiteLLM provider of its own (not the proxy's OpenAI fast path): litellm makes the call.
    spec = ModelSpec(identifier="hosted_vllm/dev", api_base=a.url, input_cost_per_token=1e-6,
                     output_cost_per_token=2e-6)
    handle = await asyncio.to_thread(_register, tmp_path, "run-litellm", spec, KEY_A, registry)
    got = await _chat(handle, handle.fake_key)
    assert got.status_code == 200, got.text
    usage = got.json()["usage"]
    assert got.json()["choices"][0]["message"]["content"] == "5" and a.chat_statuses == {200: 1}, "with the key"
    assert float(got.headers["x-litellm-response-cost"]) == pytest.approx(
        usage["prompt_tokens"] * 1e-6 + usage["completion_tokens"] * 2e-6)


async def test_the_reaper_revokes_routes_of_ended_runs_and_stops_the_proxy_with_the_stack(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    spec = ModelSpec(identifier="openai/dev", api_base=a.url)
    ended = await asyncio.to_thread(_register, tmp_path, "ended", spec, KEY_A, registry)
    running = await asyncio.to_thread(_register, tmp_path, "running", spec, KEY_A, registry)
    finished = {"ended": time.time() - 1, "running": None}
    runs = tmp_path / "runs"

    live = await asyncio.to_thread(reap_model_proxies, registry=registry, runs_dir=runs,
                                   finished_at=finished.__getitem__, linger_s=30)

    assert live == 1, "the ended run's route (its workflow never revoked it, say it was terminated)"
    assert (await _chat(ended, ended.fake_key)).status_code == 401 and load_handle(runs / "ended") is None
    assert (await _chat(running, running.fake_key)).status_code == 200, "a running run keeps its route"
    assert await asyncio.to_thread(reap_model_proxies, registry=registry, runs_dir=runs,
                                   finished_at=finished.__getitem__, linger_s=30, everything=True) == 1
    assert proc_starttime(running.pid) is None and list(runs.glob("*/proxy.json")) == []
    assert not Path(running.control or "").parent.exists(), "its control directory is gone too"


async def test_the_listing_check_asks_the_provider_with_the_real_key_and_spends_no_completion(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    listed = ModelSpec(identifier="openai/dev", api_base=a.url)
    cases = {
        "listed": (listed, KEY_A, True),
        "wrong-key": (listed, KEY_B, False),  # the provider answers the listing 401
        "no-key": (listed, None, False),
        "unlisted-model": (ModelSpec(identifier="openai/gpt-nope", api_base=a.url), KEY_A, False),
        "dead-endpoint": (ModelSpec(identifier="openai/dev", api_base=f"http://127.0.0.1:{free_port()}/v1"), KEY_A,
                          False),
    }
    for run_id, (spec, secret, expected) in cases.items():
        handle = await asyncio.to_thread(_register, tmp_path, run_id, spec, secret, registry)
        assert await listed_at_proxy(handle) is expected, run_id
    assert a.chat_statuses == {}, "the check is a listing, not a completion"
    handle = await asyncio.to_thread(_register, tmp_path, "ended", listed, KEY_A, registry)
    await asyncio.to_thread(stop_model_proxy, tmp_path / "runs" / "ended")
    assert await listed_at_proxy(handle) is False, "a revoked route lists nothing"


async def test_the_route_connects_to_the_address_the_endpoint_check_approved(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    # A name that resolves nowhere: the calls can only reach the dev model through the pinned, checked address
    # (the Host header keeps the name).
    port = a.url.rsplit(":", 1)[1].split("/", 1)[0]
    spec = ModelSpec(identifier="openai/dev", api_base=f"http://model.invalid:{port}/v1")
    run_dir = tmp_path / "runs" / "pinned"
    run_dir.mkdir(parents=True)
    handle = await asyncio.to_thread(lambda: start_model_proxy(
        run_dir=run_dir, spec=spec, secret_value=KEY_A, registry=registry, linger_s=30.0,
        connect_address="127.0.0.1"))
    got = await _chat(handle, handle.fake_key)
    assert got.status_code == 200, got.text
    unpinned = await asyncio.to_thread(_register, tmp_path, "unpinned", spec, KEY_A, registry)
    assert (await _chat(unpinned, unpinned.fake_key)).status_code == 502, "the name itself does not resolve"


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


async def test_the_model_call_server_speaks_http_1_1_to_a_hostile_caller(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    """The proxy's own HTTP/1.1 server (benchwright.llm.httpserver) faces the scorer's untrusted code: pipelined
    calls answered in order on one connection, a chunked body, HTTP/1.0, an oversized body refused before it is
    read, and garbage answered 400 and closed, while other connections carry on."""
    a, _ = models
    spec = ModelSpec(identifier="openai/dev", api_base=a.url, input_cost_per_token=1e-6, output_cost_per_token=2e-6)
    handle = await asyncio.to_thread(_register, tmp_path, "run-h", spec, KEY_A, registry)
    chat = json.dumps({"model": handle.model_name, "messages": [{"role": "user", "content": QUESTION}]}).encode()
    auth = f"Authorization: Bearer {handle.fake_key}\r\n".encode()

    def post(body: bytes, extra: bytes = b"") -> bytes:
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\n" + auth + extra
                + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    reader, writer = await asyncio.open_connection("127.0.0.1", handle.port)
    writer.write(post(chat) + b"GET /v1/models HTTP/1.1\r\nHost: p\r\n" + auth + b"\r\n" + post(b"[1]"))
    first, second, third = [await _read_answer(reader) for _ in range(3)]
    assert first[0] == 200 and json.loads(first[2])["choices"][0]["message"]["content"] == "5"
    assert float(first[1]["x-litellm-response-cost"]) > 0
    assert (second[0], json.loads(second[2])["data"][0]["id"]) == (200, handle.model_name)
    assert (third[0], json.loads(third[2])["error"]["code"]) == (400, "invalid_json")

    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chat[i:i + 7]), chat[i:i + 7]) for i in range(0, len(chat), 7))
    writer.write(b"POST /chat/completions HTTP/1.1\r\nHost: p\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n"
                 + chunks + b"0\r\n\r\n")
    status, _, body = await _read_answer(reader)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "5"

    # An oversized body is refused on its announced length, the connection closed; nothing of it is buffered.
    writer.write(post(b"").replace(b"Content-Length: 0", b"Content-Length: %d" % (16 * 2**20 + 1)))
    status, headers, body = await _read_answer(reader)
    assert (status, headers["connection"], json.loads(body)["error"]["code"]) == (413, "close", "payload_too_large")
    assert await reader.read() == b""
    writer.close()

    # Headers without end are cut off, not buffered (httptools would keep a header of any length).
    reader, writer = await asyncio.open_connection("127.0.0.1", handle.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: p\r\nX-Pad: ")
    for _ in range(40):
        writer.write(b"a" * 4096)
        await writer.drain()
    status, headers, _ = await _read_answer(reader)
    assert (status, headers["connection"]) == (431, "close")
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", handle.port)
    writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")  # e.g. a TLS hello
    status, headers, _ = await _read_answer(reader)
    assert (status, headers["connection"]) == (400, "close")
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", handle.port)
    writer.write(post(chat).replace(b"HTTP/1.1", b"HTTP/1.0"))
    status, headers, body = await _read_answer(reader)
    assert (status, headers["connection"]) == (200, "close")
    assert await reader.read() == b""
    writer.close()
    assert (await _chat(handle, handle.fake_key)).status_code == 200, "the server carries on"


async def test_a_head_over_the_bound_sent_in_one_burst_gets_431(
        models: tuple[DevModelServer, DevModelServer]) -> None:
    """The head's bound holds when the whole head arrives in the server's first read of it: the client writes it in
    one call and only then yields to the server, which shares its loop, so the server reads it at once. It used to be
    counted from the next read on only, and the parser buffered the head whole and waited for more."""
    from benchwright.llm.httpserver import MAX_HEAD_BYTES

    a, _ = models
    reader, writer = await asyncio.open_connection("127.0.0.1", a.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: p\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES + 4096))
    status, headers, _ = await asyncio.wait_for(_read_answer(reader), 10)
    assert (status, headers["connection"]) == (431, "close")
    writer.close()


async def test_a_streamed_answer_passes_as_a_stream_and_is_priced_from_its_usage_chunk(
        tmp_path: Path, models: tuple[DevModelServer, DevModelServer], registry: ProcessRegistry) -> None:
    a, _ = models
    spec = ModelSpec(identifier="openai/dev", api_base=a.url, input_cost_per_token=1e-6, output_cost_per_token=2e-6)
    handle = await asyncio.to_thread(_register, tmp_path, "run-s", spec, KEY_A, registry)
    async with httpx.AsyncClient(timeout=10) as http:
        got = await http.post(f"{handle.base_url}/chat/completions",
                              headers={"Authorization": f"Bearer {handle.fake_key}"},
                              json={"model": handle.model_name, "stream": True,
                                    "stream_options": {"include_usage": True},
                                    "messages": [{"role": "user", "content": QUESTION}]})
    assert got.status_code == 200 and got.headers["content-type"] == "text/event-stream"
    chunks = [json.loads(line[5:]) for line in got.text.splitlines()
              if line.startswith("data:") and line.strip() != "data: [DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "5"
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert float(got.headers["x-litellm-response-cost"]) == pytest.approx(
        usage["prompt_tokens"] * 1e-6 + usage["completion_tokens"] * 2e-6)


async def test_connections_idle_or_stalled_mid_request_are_closed() -> None:
    """httpserver.sweep: a kept-alive connection idle past its bound and one whose request is not all in past its
    bound since its first byte (slowloris, however recently it sent a byte) are closed; one within those bounds is
    left alone."""
    from benchwright.llm import httpserver
    from benchwright.proxy.credential_proxy import CredentialProxy

    proxy = CredentialProxy(linger_s=60)
    server = await asyncio.get_running_loop().create_server(lambda: httpserver.Connection(proxy), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        idle = await asyncio.open_connection("127.0.0.1", port)
        idle[1].write(b"GET /health HTTP/1.1\r\nHost: p\r\n\r\n")
        assert (await _read_answer(idle[0]))[0] == 200
        stalled = await asyncio.open_connection("127.0.0.1", port)
        stalled[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Length: 100\r\n\r\n{")
        fresh = await asyncio.open_connection("127.0.0.1", port)
        fresh[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Length: 100\r\n\r\n{")
        await asyncio.gather(idle[1].drain(), stalled[1].drain(), fresh[1].drain())
        for _ in range(10_000):  # loop turns until the server has read what was sent
            if len(proxy.connections) == 3 and sum(c.in_message for c in proxy.connections) == 2:
                break
            await asyncio.sleep(0)
        else:
            pytest.fail("the server did not read the requests")
        by_port = {c.transport.get_extra_info("peername")[1]: c for c in proxy.connections}
        now = asyncio.get_running_loop().time()
        by_port[idle[1].get_extra_info("sockname")[1]].last_active = now - 80
        by_port[stalled[1].get_extra_info("sockname")[1]].message_started = now - 65  # its last byte: just now
        by_port[fresh[1].get_extra_info("sockname")[1]].message_started = now - 30
        assert httpserver.sweep(proxy.connections, idle_s=75, request_s=60) == 2
        assert await idle[0].read() == b"" and await stalled[0].read() == b""
        assert len(proxy.connections) == 1
        fresh[1].write(b"}" + b" " * 98)  # the rest of its body: answered (no route for it: 401)
        assert (await _read_answer(fresh[0]))[0] == 401
        for _, writer in (idle, stalled, fresh):
            writer.close()
    finally:
        server.close()
        await proxy.close_connections(1.0)


async def test_an_upstream_header_cannot_split_the_answer() -> None:
    from benchwright.llm.httpserver import header_lines

    assert header_lines([(b"retry-after", b"3"), (b"retry-after", b"1\r\nset-cookie: x=1"), (b"x-a", b"b\0")]) \
        == b"retry-after: 3\r\n"
