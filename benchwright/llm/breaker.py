"""The Materialize circuit breaker: a run whose model calls keep failing the same fatal way halts, once.

A dead endpoint, a revoked key or a wrong model name fails every call the same way; without a breaker each of the
run's remaining tasks would be tried (with retries) and recorded as ``err``, and the run would end ``ok`` with
nothing measured. ``SutBreaker`` wraps the batch's SUT client and counts fatal failures (``FATAL_FAILURES``:
unreachable, 401/403, 404) with no success in between; at ``threshold`` it calls ``on_trip`` once with the halt
reason ``sut_unavailable: <plain words>`` (the activity writes the halt on the run row, and the batch's halt watcher
stops the batch as for any halt). Calls made after the trip are never sent: they wait for that cancellation, so no
task is recorded as ``err`` for an endpoint already known to be dead.

Transient failures (429, 5xx, timeouts) do not count, and neither do they reset the streak: they say nothing about
whether the endpoint, key and model are usable. A success resets it, and so does a 4xx refusal of one request (the
endpoint answered, took the key and knew the model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from benchwright.llm.sut import FATAL_FAILURES, SutClient, SutError, SutReply, explain
from benchwright.runs.halts import HaltKind, HaltReason
from benchwright.schemas import ModelSpec


class SutBreaker:
    """A ``SutClient`` that trips after ``threshold`` consecutive fatal failures.

    Args:
        inner: The client that makes the calls.
        spec: The run's model as launched (names the secret and the model in the halt reason).
        threshold: Consecutive fatal failures that trip it (>= 1).
        on_trip: Called once with the halt reason; it must halt the run (the calls waiting here are released
            only by the batch's cancellation).
    """

    def __init__(self, inner: SutClient, *, spec: ModelSpec, threshold: int,
                 on_trip: Callable[[str], Awaitable[None]]) -> None:
        if threshold < 1:
            raise ValueError(f"the breaker threshold must be >= 1, got {threshold}")
        self._inner = inner
        self._spec = spec
        self._threshold = threshold
        self._on_trip = on_trip
        self._streak = 0
        self.reason: str | None = None
        """The halt reason once tripped."""
        self._halting = asyncio.Event()

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        if self.reason is not None:
            await self._halting.wait()  # never set: the batch is cancelled by the halt it is waiting for
        try:
            reply = await self._inner.complete(messages, params)
        except SutError as exc:
            if exc.kind == "rejected":
                self._streak = 0  # the endpoint answered, took the key and knew the model: it is usable
            elif exc.kind in FATAL_FAILURES:
                self._streak += 1
                if self._streak >= self._threshold and self.reason is None:
                    self.reason = HaltReason(HaltKind.SUT_UNAVAILABLE, f"{explain(exc, spec=self._spec)} "
                                             f"({self._streak} model calls in a row failed)").wire()
                    await self._on_trip(self.reason)
                if self.reason is not None:  # tripped: this failure is the halt's, not the task's
                    await self._halting.wait()
            raise
        self._streak = 0
        return reply

    async def warm(self, calls: int) -> None:
        await self._inner.warm(calls)

    async def aclose(self) -> None:
        await self._inner.aclose()
