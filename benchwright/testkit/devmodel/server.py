"""Running the dev model: :class:`DevModelServer` and :func:`start_server` in an event loop, :func:`serve` as a
process (signals, ready file)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Self

from benchwright.llm.httpserver import BACKLOG, Connection, url_host
from benchwright.testkit.devmodel.config import DevModelConfig
from benchwright.testkit.devmodel.protocol import _SHUTDOWN_GRACE_S, _Handler


class DevModelServer:
    """A dev-model server listening in the running event loop; see :func:`start_server`.

    Attributes:
        host: The interface it is bound to.
        port: The port it listens on (the OS-chosen one when 0 was asked for).
    """

    def __init__(self, server: asyncio.Server, handler: _Handler, host: str) -> None:
        self._server = server
        self._handler = handler
        self.host = host
        self.port: int = server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API, ``http://HOST:PORT/v1`` (wildcard host -> loopback)."""
        return f"http://{url_host(self.host)}:{self.port}/v1"

    @property
    def chat_statuses(self) -> dict[int, int]:
        """How many chat-completions requests were answered with each status so far."""
        return dict(self._handler.chat_statuses)

    @property
    def connections_opened(self) -> int:
        """How many connections clients have opened to it so far."""
        return self._handler.counted.opened

    async def close(self) -> None:
        """Stop listening and close every connection once its in-flight answer has been sent.

        Idle keep-alive connections are closed at once; answers still waiting out their latency
        are sent first (for at most the latency plus a few seconds), as uvicorn's graceful shutdown
        did.
        """
        handler = self._handler
        if not handler.closing:
            handler.closing = True
            self._server.close()
            for connection in list(handler.connections):
                connection.shutdown()
        if handler.connections:
            if handler.all_closed is None:
                handler.all_closed = handler.loop.create_future()
            try:
                await asyncio.wait_for(
                    asyncio.shield(handler.all_closed), handler.delay + _SHUTDOWN_GRACE_S
                )
            except TimeoutError:
                for connection in list(handler.connections):
                    connection.transport.abort()
        await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_server(config: DevModelConfig, host: str = "127.0.0.1", port: int = 0) -> DevModelServer:
    """Start the dev-model server in the running event loop (a test double of an OpenAI-compatible provider).

    All replies are decided here, once, so a request costs an HTTP parse, a JSON parse, a dict
    lookup and a JSON dump.

    Args:
        config: Answers, accuracy, latency and advertised model name.
        host: Interface to bind (one socket, IPv6 when the host contains ``:``, like uvicorn).
        port: Port to bind; 0 lets the OS pick a free one (read it from ``.port``).

    Returns:
        The listening server; ``await server.close()`` (or ``async with``) stops it.
    """
    loop = asyncio.get_running_loop()
    handler = _Handler(config, loop)
    # IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections, as on any real server (proto 0 skips it).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        server = await loop.create_server(lambda: Connection(handler), sock=sock, backlog=BACKLOG)
    except BaseException:
        sock.close()
        raise
    return DevModelServer(server, handler, host)


# --------------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------------


def serve(
    config: DevModelConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ready_file: str | None = None,
) -> None:
    """Run the dev-model server until stopped. Blocking.

    SIGTERM shuts the server down gracefully and makes this function return; SIGINT does the same
    and then raises ``KeyboardInterrupt``, as Python programs do. Runs on uvloop when it is
    installed, else on asyncio's default loop.

    Args:
        config: The dev-model configuration.
        host: Interface to bind.
        port: Port to bind; 0 lets the OS pick a free one (use ``ready_file`` to learn it).
        ready_file: If given, once the server is listening, ``{"url": "http://HOST:PORT/v1",
            "port": PORT}`` is written there atomically (a wildcard host is reported as
            127.0.0.1 so the URL is usable). The file is removed again on shutdown, so it never
            advertises a dead server.
    """
    stop = _StopRequest()
    written: list[str] = []
    # Installed before the loop exists, so a SIGTERM during start-up is not lost (the default action
    # would kill the process before the `finally` below removes the ready file). SIGINT is left to
    # asyncio.Runner: it cancels the main task (graceful close in its `finally`) and raises
    # KeyboardInterrupt.
    restore_sigterm = False
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, stop.request)
        restore_sigterm = True
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve_until_stopped(config, host, port, ready_file, written, stop))
    finally:
        if restore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for path in written:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (what uvicorn's "auto" picked), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class _StopRequest:
    """SIGTERM handler that asks :func:`_serve_until_stopped` to return, whenever it arrives."""

    def __init__(self) -> None:
        self.requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def request(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        """Return once a stop has been requested (possibly already, before the loop started)."""
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if not self.requested:
            await self._event.wait()


async def _serve_until_stopped(
    config: DevModelConfig,
    host: str,
    port: int,
    ready_file: str | None,
    written: list[str],
    stop: _StopRequest,
) -> None:
    """Serve until ``stop``; once listening, publish the address to ``ready_file`` and record it."""
    server = await start_server(config, host, port)
    try:
        if ready_file is not None:
            _write_ready_file(ready_file, url_host(host), server.port)
            written.append(ready_file)
        await stop.wait()
    finally:
        await server.close()


def _write_ready_file(path: str, host: str, port: int) -> None:
    """Write the ready file atomically, so a poller never reads half a JSON document."""
    target = Path(path)
    payload = json.dumps({"url": f"http://{host}:{port}/v1", "port": port})
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
