"""Warm sandboxes: namespaced sandboxes made before anyone asks, each with a scorer runtime waiting in it (issue 25).

Every Materialize batch opened a work sandbox and started the scorer runtime in it before its first model call:
~31 ms for the namespaced init (a helper process, the namespaces, the mounts, ``pivot_root``) and ~63 ms for the
runtime (the exec helper, then ``python runner.py`` starting and importing), a third of a one-task run's time to its
first call. A worker (``worker.run_worker``) keeps ``size`` sandboxes of its local backend ready instead:

1. **Made** by the pool's own backend (``LocalBackend.create_warm``): a namespaced sandbox of no run (role
   ``warm``, owned by the worker's PID like any other, so the worker's shutdown and the next worker's start reap it;
   and tied to the worker by a lifeline, so that should the worker die, even by SIGKILL, before a run claims it, its
   supervisor kills it at once: ``WarmSandbox.release``),
   its work directory empty, its egress relay bound but without a target (every connection is closed at once).
2. **A runtime waiting**: ``python runner.py --wait`` under the runtime's limits, started from a ``runner.py`` the
   pool put in the work directory and removed as soon as the runtime said ``waiting`` (it has read and imported
   it), so the directory is empty again. Nothing untrusted runs: the runtime loads no scorer until it is told to.
3. **Claimed** by ``LocalBackend.create`` for a run (``adopt``): the run's snapshot restored into the work
   directory, the relay pointed at the run's own egress proxy, the sandbox's metadata and ``created_at`` (its cost
   starts now) the run's. The pool makes the next one in the background. A sandbox is claimed once and killed with
   its run's sandbox, never returned.
4. **The runtime handed over** by ``LocalBackend.spawn`` when the run asks for a runtime it can stand for
   (:meth:`WaitingRuntime.claim`): same interpreter and script, the same environment apart from ``PYTHONPATH`` and
   the variables a program reads when it uses them (the run's egress and model proxy), the same limits apart from
   the process count (the cgroup's ``pids.max`` is rewritten before the hand-over). It gets ``{"op": "go", "args":
   [...], "env": {...}}`` and carries on as if it had been started with them. Anything else (another interpreter,
   limits that differ, a runtime older than ``MAX_AGE_S``) kills it and the run's runtime starts cold as before.

The wall clock of a waiting runtime counts from its start, so it is started with ``MAX_AGE_S`` more than the
runtime's ``wall_seconds`` and is used only while it is younger than that: the run's backstop then falls between
its ``wall_seconds`` and ``MAX_AGE_S`` later (the scorer host enforces the batch's own ceiling itself). The pool
replaces runtimes that grew too old while waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from benchwright.sandbox.base import ExecLimits, IsolationUnavailable, SandboxError
from benchwright.sandbox.local.process import LocalProcess
from benchwright.sandbox.local.relay import _EgressRelay

if TYPE_CHECKING:
    from benchwright.sandbox.local.backend import LocalBackend, _Meta

log = logging.getLogger(__name__)

WARM_ROLE = "warm"
"""A warm sandbox's role until a run claims it (``benchwright_role`` in its metadata)."""
MAX_AGE_S = 30.0
"""A waiting runtime older than this is not handed over (its wall clock started at its own start); the pool
replaces it."""
WAIT_TIMEOUT_S = 30.0
"""How long a starting runtime may take to say it is waiting."""
_REFRESH_EVERY_S = MAX_AGE_S / 2
_LATE_VARIABLES = ("PYTHONPATH",)
"""Interpreter variables a waiting runtime applies itself when it is handed over (``runner.py``'s ``--wait``)."""


@dataclass(frozen=True)
class RuntimeSpec:
    """The runtime a warm sandbox has waiting: ``argv`` (the interpreter and ``runner.py``) started with ``--wait``
    from ``source`` (runner.py's bytes) in the work directory, with ``env`` and ``limits``."""

    argv: tuple[str, ...]
    source: bytes
    env: Mapping[str, str]
    limits: ExecLimits
    prime: bytes = b""
    """Python the runtime runs before it says it is waiting (``runner.py --prime``; errors ignored): the builtin
    templates' module bodies (``benchwright.drivers.templates.prime_source``), so a scorer rendered from one loads
    with its imports and regular expressions ready."""


@dataclass
class WaitingRuntime:
    """A runtime started ahead in a warm sandbox, waiting for its ``go``."""

    process: LocalProcess
    spec: RuntimeSpec
    started: float = field(default_factory=time.monotonic)

    def stale(self) -> bool:
        return self.process.returncode is not None or time.monotonic() - self.started > MAX_AGE_S

    def fits(self, argv: Sequence[str], env: Mapping[str, str], limits: ExecLimits, *, pids: bool) -> bool:
        """Whether it can stand for ``argv`` started with ``env`` and ``limits`` (module docstring, step 4).
        ``pids``: the process count can be changed after the start (a ``pids`` cgroup)."""
        spec = self.spec
        if self.stale() or tuple(argv[: len(spec.argv)]) != spec.argv:
            return False
        if any(env.get(k) != v for k, v in spec.env.items()):
            return False
        for name in env:
            if name not in spec.env and name not in _LATE_VARIABLES and (
                    name.startswith(("PYTHON", "LC_")) or name == "LANG"):
                return False  # read by the interpreter as it starts: too late to apply
        if replace(limits, max_processes=0) != replace(spec.limits, max_processes=0):
            return False
        return limits.max_processes == spec.limits.max_processes or (pids and bool(self.process.cgroup_dirs))

    async def claim(self, argv: Sequence[str], env: Mapping[str, str], limits: ExecLimits, *,
                    pids: bool) -> LocalProcess | None:
        """The runtime, told to go on as ``argv`` with ``env``, if it fits; else it is killed and None returned."""
        if not self.fits(argv, env, limits, pids=pids):
            await self.discard()
            return None
        proc = self.process
        try:
            if limits.max_processes != self.spec.limits.max_processes:
                await asyncio.to_thread(_set_pids_max, proc.cgroup_dirs, limits.max_processes)
            assert proc.stdin is not None
            go = {"op": "go", "args": list(argv[len(self.spec.argv):]), "env": dict(env)}
            proc.stdin.write(json.dumps(go).encode() + b"\n")
            await proc.stdin.drain()
        except (OSError, SandboxError) as exc:
            log.warning("a waiting scorer runtime could not be handed over (%s); starting one", exc)
            await self.discard()
            return None
        return proc

    async def discard(self) -> None:
        self.process.kill()
        with contextlib.suppress(Exception):
            await self.process.wait()


def _set_pids_max(dirs: Sequence[str], value: int) -> None:
    written = 0
    for d in dirs:
        path = Path(d) / "pids.max"
        if path.exists():
            path.write_text(str(value))
            written += 1
    if not written:
        raise SandboxError("the runtime's cgroup has no pids.max")


@dataclass
class WarmSandbox:
    """A namespaced sandbox of no run yet, and what only its maker holds: the supervisor's handle, its egress
    relay (no target until claimed), the runtime waiting in it and its lifeline (the write end of a pipe whose read
    end its supervisor watches: should this worker die, even by SIGKILL, before a run claims the sandbox, the end
    of file makes the supervisor kill it, so a killed worker leaves no warm sandbox running)."""

    meta: _Meta
    supervisor: subprocess.Popen[bytes]
    relay: _EgressRelay
    runtime: WaitingRuntime | None
    lifeline: int | None = None

    def release(self, *, claimed: bool) -> None:
        """Let go of the lifeline: ``claimed`` tells the supervisor the sandbox is a run's now (it then outlives this
        worker like any run's sandbox); otherwise it is killed at the end of file."""
        if self.lifeline is None:
            return
        fd, self.lifeline = self.lifeline, None
        try:
            if claimed:
                os.write(fd, b"c")
        except OSError as exc:  # the supervisor is gone: the sandbox with it, which the run's commands will say
            log.warning("a claimed warm sandbox's supervisor did not take the claim: %s", exc)
        finally:
            os.close(fd)


class WarmPool:
    """``size`` warm sandboxes of ``backend`` (the pool's own), refilled in the background on the event loop that
    started the pool; ``LocalBackend.create`` claims them on that loop only (their runtimes' pipes belong to it)."""

    def __init__(self, backend: LocalBackend, *, size: int, runtime: RuntimeSpec | None) -> None:
        self.backend = backend
        self.size = size
        self.runtime = runtime
        self.loop = asyncio.get_running_loop()
        self.ready: list[WarmSandbox] = []
        self.claimed = 0
        self._wake = asyncio.Event()
        self._added = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._failures = 0

    def start(self) -> None:
        self._filler = asyncio.create_task(self._fill(), name="warm-sandboxes")

    def take(self) -> WarmSandbox | None:
        """A warm sandbox for the caller to adopt, or None (none ready, or called off the pool's loop)."""
        try:
            if asyncio.get_running_loop() is not self.loop:
                return None
        except RuntimeError:
            return None
        if not self.ready:
            return None
        warm = self.ready.pop(0)
        self.claimed += 1
        self._wake.set()
        return warm

    async def until_ready(self) -> None:
        """Return once ``size`` sandboxes are ready (for tests and benches: a worker never waits for its pool).

        Raises:
            SandboxError: the pool stopped making them (namespaces unavailable here).
        """
        while len(self.ready) < self.size:
            if self._filler is None or self._filler.done():
                raise SandboxError("the warm pool is not making sandboxes (namespaces unavailable?)")
            self._added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), 1.0)  # wakes to re-check that the filler still runs

    async def _fill(self) -> None:
        while True:
            while len(self.ready) < self.size:
                try:
                    self.ready.append(await self.backend.create_warm(self.runtime))
                    self._added.set()
                    self._failures = 0
                except IsolationUnavailable as exc:
                    log.info("no warm sandboxes on this host: %s", exc)  # every sandbox is made on demand
                    return
                except (OSError, SandboxError) as exc:
                    # A host that refuses namespaces, or a passing failure: retried after a pause that grows, so a
                    # broken host costs a log line now and then, not a busy loop.
                    self._failures += 1
                    log.warning("cannot make a warm sandbox (%s); retrying", exc)
                    await asyncio.sleep(min(60.0, 0.5 * 2 ** min(self._failures, 7)))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _REFRESH_EVERY_S)
            await self._refresh()

    async def _refresh(self) -> None:
        """Runtimes that waited longer than ``MAX_AGE_S / 2`` are replaced (one is never handed over past
        ``MAX_AGE_S``)."""
        if self.runtime is None:
            return
        for warm in list(self.ready):
            old = warm.runtime
            if old is not None and time.monotonic() - old.started < _REFRESH_EVERY_S and not old.stale():
                continue
            if warm not in self.ready:
                continue  # claimed meanwhile
            self.ready.remove(warm)  # not claimable while its runtime is swapped
            try:
                if old is not None:
                    await old.discard()
                warm.runtime = await self.backend.start_waiting(warm.meta, self.runtime)
                self.ready.append(warm)
                self._added.set()
            except (OSError, SandboxError) as exc:
                log.warning("cannot restart a warm sandbox's runtime (%s); replacing the sandbox", exc)
                await self.backend.discard_warm(warm)

    async def close(self) -> None:
        """Stop refilling and kill every warm sandbox not claimed."""
        if self._filler is not None:
            self._filler.cancel()
            await asyncio.gather(self._filler, return_exceptions=True)
        ready, self.ready = self.ready, []
        for warm in ready:
            await self.backend.discard_warm(warm)
        await self.backend.close()


_POOLS: dict[Path, WarmPool] = {}


def warm_pool(root_dir: Path) -> WarmPool | None:
    """The pool started for ``root_dir`` (a local backend's root) on the running event loop, if any."""
    pool = _POOLS.get(Path(root_dir).resolve())
    if pool is None:
        return None
    try:
        return pool if asyncio.get_running_loop() is pool.loop else None
    except RuntimeError:
        return None


async def start_warm_pool(backend: LocalBackend, *, size: int, runtime: RuntimeSpec | None) -> WarmPool:
    """Start keeping ``size`` warm sandboxes of ``backend``'s root (the pool owns ``backend``), on this loop;
    ``LocalBackend`` instances on that root claim them from now on. Stop it with :func:`stop_warm_pool`."""
    pool = WarmPool(backend, size=size, runtime=runtime)
    old = _POOLS.get(backend.root_dir)
    _POOLS[backend.root_dir] = pool
    if old is not None:
        await old.close()
    pool.start()
    return pool


async def stop_warm_pool(pool: WarmPool) -> None:
    if _POOLS.get(pool.backend.root_dir) is pool:
        del _POOLS[pool.backend.root_dir]
    await pool.close()


__all__ = ["MAX_AGE_S", "WAIT_TIMEOUT_S", "WARM_ROLE", "RuntimeSpec", "WaitingRuntime", "WarmPool", "WarmSandbox",
           "start_warm_pool", "stop_warm_pool", "warm_pool"]
