"""Connection plumbing for the egress proxy: the idle watchdog, writes that wait for the peer, closing and
aborting, and the lingering close that keeps an error answer from being destroyed by a RST."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from benchwright.proxy.egress_http import CHUNK

__all__ = ["IdleWatchdog", "abort", "close", "lingering_close", "write"]

# After an error answer, read and discard what the client still sends for a moment: closing a socket with unread
# input makes the kernel send RST, which can destroy the answer before the client reads it.
_LINGER_S = 1.0
_LINGER_MAX_BYTES = 1024 * 1024


class IdleWatchdog:
    """Cancels a connection's task once no bytes moved for ``timeout`` seconds.

    ``touch()`` is a float store, so calling it per 64 KiB chunk costs nothing; a single timer re-arms itself
    lazily instead of being rescheduled on every chunk.
    """

    __slots__ = ("_handle", "_last", "_loop", "_task", "_timeout", "expired")

    def __init__(self, timeout: float, task: asyncio.Task[Any]) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._task = task
        self._last = self._loop.time()
        self.expired = False
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout, self._check)

    def touch(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        idle = self._loop.time() - self._last
        if idle >= self._timeout:
            self._handle = None
            self.expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_later(self._timeout - idle, self._check)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None



async def write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()



def abort(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.transport.abort()


def close(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.close()


async def lingering_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close and swallow the client's remaining input briefly, so an error answer is not lost to a RST."""
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(_LINGER_S):
            discarded = 0
            while discarded < _LINGER_MAX_BYTES and (data := await reader.read(CHUNK)):
                discarded += len(data)
