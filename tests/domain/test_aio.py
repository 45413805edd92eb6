"""benchwright.aio: work that must end even when its caller is cancelled (a sandbox's kill, a batch's tasks)."""

from __future__ import annotations

import asyncio

import pytest

from benchwright.aio import uncancellable, wait_out


async def test_uncancellable_work_ends_before_the_callers_cancellation_is_raised() -> None:
    release, ended = asyncio.Event(), []

    async def dispose() -> None:
        await release.wait()
        ended.append("killed")

    caller = asyncio.create_task(uncancellable(dispose()))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)
    caller.cancel()  # a second cancellation (a task group tearing down siblings) changes nothing
    await asyncio.sleep(0)
    assert not caller.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert ended == ["killed"]


async def test_uncancellable_raises_the_works_own_error() -> None:
    async def broken() -> None:
        raise ValueError("kill failed")

    with pytest.raises(ValueError, match="kill failed"):
        await uncancellable(broken())


async def test_uncancellable_gives_the_works_result_when_nobody_cancelled() -> None:
    async def start() -> dict[str, int]:
        return {"init_pid": 42}

    assert await uncancellable(start()) == {"init_pid": 42}
    assert await uncancellable(asyncio.to_thread(lambda: "started in a thread")) == "started in a thread"


async def test_wait_out_waits_for_a_cancelled_task_to_finish_its_cleanup() -> None:
    release, ended = asyncio.Event(), []

    async def batch() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await uncancellable(release.wait())
            ended.append("sandbox killed")

    work = asyncio.create_task(batch())
    await asyncio.sleep(0)
    work.cancel()
    waiter = asyncio.create_task(wait_out(work))
    await asyncio.sleep(0)
    waiter.cancel()  # the activity itself cancelled by Temporal
    await asyncio.sleep(0)
    assert not waiter.done() and ended == []
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert ended == ["sandbox killed"] and work.cancelled()
