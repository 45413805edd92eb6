"""A phase's first reads beside its opening (``activities.common.started``): the read runs while the block does, the
block gets its result or its error where it awaits it, and a block that leaves first leaves no read behind (it is
cancelled and waited out, its error dropped, nothing logged as never retrieved)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from activities.common import started


async def test_the_read_runs_beside_the_block_and_the_block_awaits_its_result() -> None:
    opened = asyncio.Event()
    order: list[str] = []

    async def read() -> str:
        order.append("read begins")
        await opened.wait()  # still running while the block opens the phase
        order.append("read ends")
        return "policy"

    async with started(read()) as reading:
        await asyncio.sleep(0)  # the read has begun before the block's own first round trip
        order.append("phase opened")
        opened.set()
        assert await reading == "policy"
    assert order == ["read begins", "phase opened", "read ends"]


async def test_a_failed_read_raises_where_the_block_awaits_it() -> None:
    async def read() -> str:
        raise LookupError("no FetchArtifact in the log")

    with pytest.raises(LookupError, match="no FetchArtifact"):
        async with started(read()) as reading:
            await reading


async def test_a_block_that_leaves_first_cancels_the_read_and_drops_its_error() -> None:
    cancelled = asyncio.Event()
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))

    async def slow_read() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def failing_read() -> str:
        raise LookupError("a read the block never needed")

    with pytest.raises(RuntimeError, match="the opening failed"):
        async with started(slow_read()) as slow, started(failing_read()) as failing:
            await asyncio.sleep(0)
            raise RuntimeError("the opening failed")
    assert cancelled.is_set() and slow.cancelled()
    assert failing.done() and isinstance(failing.exception(), LookupError)
    del slow, failing
    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []
