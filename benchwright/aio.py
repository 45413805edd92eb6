"""The event loop our long-lived processes run on, and cancellation-safe waiting: the few places where a cancelled
caller must still see work through to its end (a sandbox's kill and its SandboxKilled, a batch's tasks before its
activity reports), so that nothing a run started outlives the event that says the run ended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (a dependency; it does not build on Windows), else asyncio's default.

    The credential proxy and the dev model run on it: a model call through the proxy is mostly socket reads and
    writes in the loop, and the proxy's CPU per call fell from 0.38 to 0.32 ms (``bench/credential_proxy.py``). The
    worker does not: on uvloop it took 12 % less CPU per task, but a full test run with the tests and the in-process
    worker on uvloop stopped for good in the middle, its loop idle (docs/performance.md, session 15), and a worker
    waiting forever is worse than a slower one."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop ``loop_factory`` picks: for a process's main coroutine."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


async def uncancellable(work: Awaitable[None]) -> None:
    """Run ``work`` to its end even when the caller is cancelled meanwhile (once or many times); the caller's
    cancellation is raised after it. ``work``'s own exception, or its own cancellation, is raised as usual."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


async def wait_out(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended, whatever its outcome (its result or exception stays on it), even when the
    caller is cancelled meanwhile; the caller's cancellation is raised after it."""
    await uncancellable(_ended(task))


async def _ended(task: asyncio.Future[Any]) -> None:
    await asyncio.wait({task})
