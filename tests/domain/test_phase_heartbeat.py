"""The phase activities' background heartbeat (``activities.common.heartbeating``), on the SDK's own activity
environment: it beats while the phase works, every beat after ``send`` carries the phase's details (a cache hit's
``{"cache_hit": ...}`` stays visible instead of being clobbered by the next empty beat), and a cancellation the
heartbeat brings back lands in the phase."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities import common
from activities.common import heartbeating

HIT = {"cache_hit": {"source_run_id": "r-1", "phase": "setup", "input_hash": "abc"}}


async def test_every_beat_after_send_resends_the_latest_details(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "HEARTBEAT_EVERY_S", 0.001)
    beats: list[tuple[Any, ...]] = []
    enough = asyncio.Event()

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        if len(beats) >= 3 and details == (HIT,) and beats.count((HIT,)) >= 4:
            enough.set()

    async def phase_work() -> None:
        async with heartbeating() as heartbeat:
            await asyncio.wait_for(_until(lambda: len(beats) >= 2), 10)  # the background beat runs on its own
            heartbeat.send(HIT)
            await asyncio.wait_for(enough.wait(), 10)

    env = ActivityEnvironment()
    env.on_heartbeat = on_heartbeat
    await env.run(phase_work)
    first_hit = beats.index((HIT,))
    assert all(b == () for b in beats[:first_hit]), "before send the beat carries no details"
    assert all(b == (HIT,) for b in beats[first_hit:]), "after send every beat carries the cache hit"


async def test_a_cancellation_lands_in_the_phase_and_the_beat_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "HEARTBEAT_EVERY_S", 0.001)
    beats: list[tuple[Any, ...]] = []
    cancelled = asyncio.Event()
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *d: beats.append(d)

    async def phase_work() -> None:
        async with heartbeating():
            try:
                await asyncio.Event().wait()  # a phase blocked on its work
            except asyncio.CancelledError:
                cancelled.set()
                raise

    task = asyncio.create_task(env.run(phase_work))
    await asyncio.wait_for(_until(lambda: len(beats) >= 2), 10)
    beat = next(t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Heartbeat.beat")  # type: ignore[union-attr]
    env.cancel()  # what a halt's cancellation, brought back by a heartbeat, does
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()
    with pytest.raises(asyncio.CancelledError):
        await beat  # the background beat was cancelled with the phase, not left beating


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.001)
