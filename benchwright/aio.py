"""Cancellation-safe waiting: the few places where a cancelled caller must still see work through to its end (a
sandbox's kill and its SandboxKilled, a batch's tasks before its activity reports), so that nothing a run started
outlives the event that says the run ended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def uncancellable(work: Awaitable[T]) -> T:
    """Run ``work`` to its end even when the caller is cancelled meanwhile (once or many times); the caller's
    cancellation is raised after it (``work``'s result is then dropped). ``work``'s own exception, or its own
    cancellation, is raised as usual."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            cancelled = True
    result = task.result()
    if cancelled:
        raise asyncio.CancelledError
    return result


async def wait_out(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended, whatever its outcome (its result or exception stays on it), even when the
    caller is cancelled meanwhile; the caller's cancellation is raised after it."""
    await uncancellable(_ended(task))


async def _ended(task: asyncio.Future[Any]) -> None:
    await asyncio.wait({task})
