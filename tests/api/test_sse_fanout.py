"""SSE fan-out (issue 15 item 9): many streams on one live run share one store reader and each gets every event
exactly once, in seq order; resuming is gapless; a bad Last-Event-ID is a 422; a stalled stream neither grows the
API's memory nor holds the others up.

Correctness only: the timing goals (200 streams, tail under 2 s, run reads under 50 ms) are measured by
``python3 dev.py bench sse``, not asserted here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.main import create_app
from api.sse import SseHub
from benchwright.errors import Unavailable
from benchwright.stack.devstack import free_port
from benchwright.store.db import make_engine
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import TERMINAL, launch
from tests.conftest import SAMPLE, DevModels, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
SSE = {"Accept": "text/event-stream"}


def _dataset(path: Path, n: int) -> dict[str, str]:
    answers = {}
    with path.open("w") as f:
        for i in range(n):
            q = f"What is {i} minus 1? (item {i})"
            answers[q] = str(i - 1)
            f.write(json.dumps({"question": q, "answer": answers[q]}) + "\n")
    return answers


@asynccontextmanager
async def _api(stack: Stack) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """A second API process-alike on the session's store and Temporal, whose hub the test can look at."""
    app = create_app(stack.settings)
    port = free_port()
    server, task = await serve_app(app, port)
    try:
        async with stack.http() as http:
            http.base_url = httpx.URL(f"http://127.0.0.1:{port}")
            yield app, http
    finally:
        server.should_exit = True
        await task


async def _live_run(stack: Stack, dev_models: DevModels, http: httpx.AsyncClient, tmp_path: Path,
                    *, tasks: int, concurrency: int = 4) -> str:
    """Launch a run of ``tasks`` tasks that takes a couple of seconds (25 ms per call, 4 in flight)."""
    answers = _dataset(tmp_path / "tasks.jsonl", tasks)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=25))
    run = await launch(http, {"dataset": str(tmp_path / "tasks.jsonl"), "concurrency": concurrency,
                              "model": {"identifier": "openai/dev", "api_base": url}})
    return str(run["id"])


async def _frames(resp: httpx.Response) -> AsyncIterator[tuple[int, str, dict[str, Any]]]:
    """(id, event, data) of each SSE frame; keep-alive comments skipped."""
    fields: dict[str, str] = {}
    async for line in resp.aiter_lines():
        if line == "":
            if "data" in fields:
                yield int(fields["id"]), fields["event"], json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


async def _read_stream(http: httpx.AsyncClient, run_id: str, *, headers: dict[str, str] | None = None,
                       seen: list[int] | None = None, stop_at: int | None = None) -> list[dict[str, Any]]:
    """Every event of one stream until it closes (or until seq ``stop_at``), checking id = seq and event = type."""
    events: list[dict[str, Any]] = []
    async with http.stream("GET", f"/v1/runs/{run_id}/events", headers={**SSE, **(headers or {})},
                           timeout=httpx.Timeout(120)) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for seq, kind, data in _frames(resp):
            assert (seq, kind) == (data["seq"], data["type"])
            events.append(data)
            if seen is not None:
                seen.append(seq)
            if stop_at is not None and seq >= stop_at:
                break
    return events


async def _poll_all(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = -1
    while True:
        body = (await http.get(f"/v1/runs/{run_id}/events", params={"after": after, "limit": 5000})).json()
        out += body["events"]
        if not body["events"]:
            return out
        after = body["next_after"]


async def _until(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _upto_terminal(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    end = next(i for i, e in enumerate(log) if e["type"] == TERMINAL)
    return log[: end + 1]


async def test_fifty_streams_on_a_live_run_each_get_every_event_once_in_order(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    async with _api(stack) as (app, http):
        run_id = await _live_run(stack, dev_models, http, tmp_path, tasks=300)
        seen: list[list[int]] = [[] for _ in range(50)]
        streams = [asyncio.create_task(_read_stream(http, run_id, seen=s)) for s in seen]
        await _until(lambda: all(seen), "every stream's first event")
        # The streams joined a live run: the fan-out, not a replay of a finished log, is under test.
        assert (await http.get(f"/v1/runs/{run_id}")).json()["status"] == "running", "the run ended too soon"
        feed = app.state.bw.sse.feed(run_id)
        assert feed is not None and feed.streams == 50, "one feed (one store reader) serves every stream"
        results = await asyncio.wait_for(asyncio.gather(*streams), 120)
        log = _upto_terminal(await _poll_all(http, run_id))
        assert log[-1]["seq"] > 600, "a run of 300 tasks has over 600 events"
        for events in results:
            assert events == log  # every event exactly once, in seq order, the same data; closed after the terminal
        await _until(lambda: app.state.bw.sse.feed(run_id) is None, "the feed to go with its last stream")


async def test_resume_with_last_event_id_mid_run_has_no_gap_or_duplicate(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    async with _api(stack) as (_, http):
        run_id = await _live_run(stack, dev_models, http, tmp_path, tasks=200)
        first = await _read_stream(http, run_id, stop_at=40)
        assert (await http.get(f"/v1/runs/{run_id}")).json()["status"] == "running", "the run ended too soon"
        rest = await _read_stream(http, run_id, headers={"Last-Event-ID": str(first[-1]["seq"])})
        assert [e["seq"] for e in first + rest] == list(range(rest[-1]["seq"] + 1))
        assert first + rest == _upto_terminal(await _poll_all(http, run_id))
        # Resuming at the terminal event: only what the log gained after it (the proxy's SandboxKilled, a linger)
        # is sent, in order, and the stream closes; a poll taken afterwards holds the same events.
        terminal = rest[-1]["seq"]
        appendix = await _read_stream(http, run_id, headers={"Last-Event-ID": str(terminal)})
        later = [e for e in await _poll_all(http, run_id) if e["seq"] > terminal]
        assert appendix == later[: len(appendix)] and TERMINAL not in [e["type"] for e in appendix]


async def test_stream_behind_the_window_catches_up_from_the_store_across_the_seam(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    """A hub whose window is a few blocks: streams that start at -1 once the window moved on read the store in
    pages, then join the window; a stream already at the tail stays on the window."""
    async with _api(stack) as (app, http):
        app.state.bw.sse = SseHub(app.state.bw.engine, buffer_bytes=4096, block_bytes=1024, catchup_page=7)
        run_id = await _live_run(stack, dev_models, http, tmp_path, tasks=150)
        seen: list[int] = []
        leader = asyncio.create_task(_read_stream(http, run_id, seen=seen))
        await _until(lambda: len(seen) > 60, "the leading stream to pass seq 60")
        late = [asyncio.create_task(_read_stream(http, run_id)) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(leader, *late), 120)
        log = _upto_terminal(await _poll_all(http, run_id))
        for events in results:
            assert events == log
        assert app.state.bw.sse.catchups > 0, "the late streams read the store: the window had moved on"


async def test_bad_last_event_id_is_a_422_naming_the_range(stack: Stack) -> None:
    async with stack.http() as http:
        run_id = (await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"),
                                      "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}))["id"]
        events = await _read_stream(http, run_id)
        await stack.client.get_workflow_handle(run_id).result()  # the proxy's linger events are in the log too
        last = (await http.get(f"/v1/runs/{run_id}")).json()
        log = await _poll_all(http, run_id)
        last_seq = log[-1]["seq"]
        assert last["status"] == "ok" and events == _upto_terminal(log)
        for bad in ("abc", "1e3", "9" * 30, "-2", str(last_seq + 1), "1.5"):
            resp = await http.get(f"/v1/runs/{run_id}/events", headers={**SSE, "Last-Event-ID": bad})
            assert resp.status_code == 422, (bad, resp.text)
            err = resp.json()["error"]
            assert err["code"] == "validation_error" and err["details"][0]["loc"] == ["header", "last-event-id"]
            assert f"from -1 to {last_seq}" in err["message"], err["message"]
        resp = await http.get(f"/v1/runs/{run_id}/events", headers=SSE, params={"after": last_seq + 1})
        assert resp.status_code == 422 and resp.json()["error"]["details"][0]["loc"] == ["query", "after"]
        # An empty Last-Event-ID is no Last-Event-ID; one within range resumes after it.
        assert await _read_stream(http, run_id, headers={"Last-Event-ID": ""}) == events
        assert await _read_stream(http, run_id, headers={"Last-Event-ID": "3"}) == events[4:]
        # Polling is unchanged by the header.
        page = (await http.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "abc"})).json()
        assert page["events"] == log[: len(page["events"])]


async def test_a_stalled_stream_neither_grows_memory_nor_holds_up_the_others(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    """A stream whose client reads nothing (its generator is not advanced, as when the server's send waits on a full
    socket): the others finish, the shared window stays within its bound, and when the stream moves again it still
    gets every event once (it fell behind the window and caught up from the store)."""
    async with _api(stack) as (app, http):
        hub = app.state.bw.sse = SseHub(app.state.bw.engine, buffer_bytes=16 << 10, block_bytes=2 << 10)
        run_id = await _live_run(stack, dev_models, http, tmp_path, tasks=600)
        stalled = hub.stream(log_id=run_id, after=-1, finished=False)
        received = [await anext(stalled)]  # joined the run's feed, then stalls
        others = [asyncio.create_task(_read_stream(http, run_id)) for _ in range(10)]
        peak = 0

        def sample() -> bool:
            nonlocal peak
            feed = hub.feed(run_id)
            peak = max(peak, feed.size if feed else 0)
            return all(t.done() for t in others)

        await _until(sample, "the other streams to finish", timeout=120)
        log = _upto_terminal(await _poll_all(http, run_id))
        assert sum(len(json.dumps(e)) for e in log) > 16 * (16 << 10), "the log outgrows the window"
        for task in others:
            assert task.result() == log
        assert 0 < peak <= 16 << 10, peak
        feed = hub.feed(run_id)
        assert feed is not None and feed.streams == 1, "the stalled stream keeps the feed"
        assert feed.terminal == log[-1]["seq"], "the reader read to the terminal event, past the stalled stream"
        catchups = hub.catchups
        received += [chunk async for chunk in stalled]
        ids = [int(line[4:]) for line in b"".join(received).split(b"\n") if line.startswith(b"id: ")]
        assert ids == [e["seq"] for e in log]
        assert hub.catchups > catchups, "the stalled stream fell behind the window and caught up from the store"
        assert hub.feed(run_id) is None, "the feed went with its last stream"


async def test_a_failing_store_read_ends_the_streams_and_drops_the_feed(tmp_path: Path) -> None:
    """A store the reader cannot read (here: no tables): the stream ends with Unavailable instead of waiting forever,
    and the next stream on the run gets a fresh feed."""
    hub = SseHub(make_engine(f"sqlite:///{tmp_path / 'empty.db'}"), poll_s=0.01)
    for _ in range(2):
        with pytest.raises(Unavailable, match="the event feed of run r1 failed"):
            await anext(hub.stream(log_id="r1", after=-1, finished=False))
        assert hub.feed("r1") is None


async def test_a_session_that_ended_without_its_terminal_event_sends_its_log_and_closes(tmp_path: Path) -> None:
    """The session hub (SESSION_LOG): a session whose workflow could not start is ``failed`` with no SessionAnswered;
    its stream sends what the log holds and closes, instead of waiting for an event that never comes."""
    from api.sse import SESSION_LOG
    from benchwright.operator.goals import SessionCreate
    from benchwright.operator.store import create_session, set_status
    from benchwright.store.accounts import create_account
    from benchwright.store.db import migrate

    engine = make_engine(f"sqlite:///{tmp_path / 'sessions.db'}")
    migrate(engine)
    account, _ = create_account(engine, name="watcher")
    create_session(engine, session_id="s1", account_id=account.id, req=SessionCreate.model_validate(
        {"goal": {"question": "regressed", "reference_run": "r0"}}))
    set_status(engine, session_id="s1", status="failed")
    hub = SseHub(engine, log=SESSION_LOG, poll_s=0.01, keepalive_s=0.05)

    async def whole(after: int) -> list[bytes]:  # a stream that never closes fails here rather than hanging
        return await asyncio.wait_for(_collect(hub.stream(log_id="s1", after=after, finished=True)), 60)

    assert b"".join(await whole(-1)).startswith(b"id: 0\nevent: SessionStarted\ndata: ")
    assert await whole(0) == []
    assert hub.feed("s1") is None


async def _collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]
