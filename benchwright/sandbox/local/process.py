"""The handle of a command running in a local sandbox (``LocalBackend.spawn``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from typing import Any

from benchwright.sandbox.base import (
    ExecLimits,
)

# ------------------------------------------------------------------------------------------------------ process ---


class LocalProcess:
    """A command running in a local sandbox; the handle ``LocalBackend.spawn`` returns.

    Shaped like ``asyncio.subprocess.Process`` (``stdin``/``stdout``/``stderr`` streams, ``pid``, ``returncode``,
    ``wait``, ``communicate``, ``kill``, ``terminate``). ``pid`` is the host PID of the sandbox helper that owns the
    command; ``kill()`` and ``terminate()`` both end every process of the command at once (SIGKILL: a command's
    processes live in their own PID namespace, whose PID 1 ignores polite signals). After ``wait()``,
    ``timed_out``, ``killed_reason`` and ``cpu_seconds`` say how it ended.
    """

    def __init__(self, proc: asyncio.subprocess.Process, status: asyncio.StreamReader,
                 status_transport: asyncio.BaseTransport, *, limits: ExecLimits, on_done: Callable[[], None],
                 started_at: float) -> None:
        self._proc = proc
        self._status = status
        self._status_transport = status_transport
        self._limits = limits
        self._on_done = on_done
        self._started_at = started_at
        self._returncode: int | None = None
        self._forced_reason: str | None = None
        self._done_lock = asyncio.Lock()
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.pid = proc.pid
        self.timed_out = False
        self.killed_reason: str | None = None
        self.cpu_seconds: float | None = None
        self.duration_s = 0.0
        self.cgroup_dirs: list[str] = []
        """The command's cgroups (one per v1 hierarchy, or its v2 leaf); empty without cgroup limits."""

    @property
    def returncode(self) -> int | None:
        """The command's exit code, or minus the signal that killed it; None until ``wait()`` saw it end."""
        return self._returncode

    async def wait(self) -> int:
        """Wait for the command (and the helper that owns it) to end; returns its return code."""
        async with self._done_lock:
            if self._returncode is not None:
                return self._returncode
            await self._proc.wait()
            self.duration_s = time.monotonic() - self._started_at
            final: dict[str, Any] = {}
            try:
                async with asyncio.timeout(2.0):
                    while line := await self._status.readline():
                        with contextlib.suppress(ValueError):
                            event = json.loads(line)
                            if event.get("event") == "final":
                                final = event
            except TimeoutError:
                pass
            self._status_transport.close()
            await asyncio.to_thread(self._on_done)
            self._finish(final)
            assert self._returncode is not None
            return self._returncode

    def _finish(self, final: dict[str, Any]) -> None:
        helper_rc = self._proc.returncode if self._proc.returncode is not None else -signal.SIGKILL
        rc = int(final.get("returncode", helper_rc))
        reason = self._forced_reason or final.get("reason")
        self.cpu_seconds = final.get("cpu_seconds")
        if reason is None and rc != 0:
            if not final.get("init_alive", True) and rc < 0:
                reason = "sandbox_killed"
            elif final.get("oom_kills", 0) > 0:
                reason = "memory"
            elif rc == -signal.SIGXCPU or (
                    rc == -signal.SIGKILL and (self.cpu_seconds or 0) >= self._limits.cpu_seconds - 0.05):
                reason = "cpu"
            elif rc == -signal.SIGXFSZ:
                reason = "file_size"
            elif rc < 0:
                try:
                    reason = f"signal {signal.Signals(-rc).name}"
                except ValueError:
                    reason = f"signal {-rc}"
        self.killed_reason = reason
        self.timed_out = reason == "wall_clock"
        self._returncode = rc

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        """Like ``asyncio.subprocess.Process.communicate`` (no output cap: prefer ``LocalBackend.exec``)."""
        out, err = await self._proc.communicate(input)
        await self.wait()
        return out, err

    def _signal_helper(self, reason: str) -> None:
        if self._proc.returncode is None:
            self._forced_reason = self._forced_reason or reason
            with contextlib.suppress(ProcessLookupError):
                # The helper turns SIGTERM into SIGKILL of the command's whole PID namespace and reports it.
                self._proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End every process of the command now."""
        self._signal_helper("terminated")

    def terminate(self) -> None:
        """Same as ``kill()`` (see the class docstring)."""
        self._signal_helper("terminated")

    def _hard_kill(self, reason: str) -> None:
        """Kill the helper itself (it did not end in time); PDEATHSIG takes the command's namespace with it."""
        self._forced_reason = self._forced_reason or reason
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()

