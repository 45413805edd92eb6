"""The sandbox backend protocol: what every place that runs untrusted code (scorers, drivers, task commands) offers.

A *sandbox* is a filesystem (a work directory the commands see as their cwd) plus the processes run in it, with a
role (``ROLES``), the run it belongs to, and an instance size for cost accounting. Backends:

* ``local`` (:class:`benchwright.sandbox.local.LocalBackend`): Linux namespaces + cgroups/rlimits on this machine.
* ``sandbox0`` (Kubernetes pods) and ``e2b`` (hosted micro-VMs): later. The protocol is shaped for them already:
  sandbox ids are opaque strings, snapshots are opaque ids the backend can restore on another host, ``spawn``
  returns a handle with asyncio-style pipes (a pod exec or an e2b process stream can be wrapped into one), and
  ``reap`` works from persisted state (pod labels / e2b metadata play the part of ``meta.json``) after a crash.

Every method is ``async``; a backend never blocks the event loop for long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

ROLES: tuple[str, ...] = ("driver", "work", "proxy", "task", "template_probe", "harbor_orchestrator",
                          "harbor_task_env")
"""What a sandbox is for; recorded in its metadata as ``benchwright_role``."""
TEMPLATE_KEY = "template"
"""``metadata["template"]`` of a remote backend's ``create``: the E2B template (``e2b``) or image (``sandbox0``) this
sandbox starts from instead of the backend's configured one (a harbor task environment's mapped ``FROM``)."""

MiB = 1024 * 1024


class SandboxError(Exception):
    """A sandbox operation failed (unknown sandbox, bad path, the backend could not do what was asked)."""


class IsolationUnavailable(SandboxError):
    """The backend cannot isolate sandboxes on this host (the kernel or the privileges forbid what it needs)."""


class SandboxNotFound(SandboxError):
    """No live sandbox has that id (never created, or killed)."""


class SandboxPathError(SandboxError, ValueError):
    """A path given to ``read_file``/``write_file`` would leave the sandbox's work directory (``..``, symlinks)."""


@dataclass(frozen=True)
class ExecLimits:
    """Resource limits of one ``exec``/``spawn`` (all its processes together where the backend can do that).

    Attributes:
        cpu_seconds: CPU time (user + system) before the command is killed.
        memory_mb: Memory ceiling; beyond it allocations fail (MemoryError) or the command is OOM-killed.
        wall_seconds: Wall-clock time before the whole command (every process it started) is killed.
        max_processes: Processes *and threads* alive at once; further fork/clone calls fail.
        max_output_bytes: Per stream (stdout, stderr) kept by ``exec``; the rest is read and dropped.
        max_file_mb: Largest file a process may write (RLIMIT_FSIZE).
        cpu_cores: CPU *rate*: how many cores' worth of CPU time per wall-clock second the command's processes may
            use together (0.5 = half a core, 2 = two cores busy). Throttled, not killed: beyond it the processes
            simply wait for their next share. ``cpu_seconds`` still bounds the total. ``<= 0`` (or ``inf``) means
            no rate cap. Where the backend has no way to cap the rate it is not enforced (the local backend says so
            in ``limit_mechanism``).
    """

    cpu_seconds: int = 60
    memory_mb: int = 1024
    wall_seconds: float = 600
    max_processes: int = 64
    max_output_bytes: int = 10 * MiB
    max_file_mb: int = 512
    cpu_cores: float = 1.0


@dataclass
class SandboxInfo:
    """What a backend knows about one sandbox.

    Attributes:
        sandbox_id: Opaque id, unique per backend.
        role: One of ``ROLES``.
        backend: The backend's name (``"local"``, ``"sandbox0"``, ``"e2b"``).
        created_at: Epoch seconds (``time.time()``), so it means the same in another process after a restart.
        metadata: Free-form, always with ``benchwright_role`` and ``benchwright_run_id``; the local backend adds
            ``isolation`` (``"namespaces"`` or ``"none"``) and, when egress is configured, ``egress_proxy``.
        root: Where the sandbox's work directory is on this host, if it is on this host (None for remote ones).
        instance_size: The size class billed for it, e.g. ``"local-2cpu-1gb"``.
    """

    sandbox_id: str
    role: str
    backend: str
    created_at: float
    metadata: dict[str, Any]
    root: Path | None
    instance_size: str


@dataclass
class ExecResult:
    """How a short command ended.

    Attributes:
        returncode: Exit code, or minus the signal number that killed it (like ``subprocess``).
        stdout: At most ``max_output_bytes`` of its standard output.
        stderr: At most ``max_output_bytes`` of its standard error.
        timed_out: The wall-clock limit (or ``timeout_s``) ran out and the command was killed.
        killed_reason: Why the sandbox killed it: ``"wall_clock"``, ``"cpu"``, ``"memory"``, ``"file_size"``,
            ``"sandbox_killed"``, ``"terminated"``, ``"signal SIGxxx"``; None when it exited on its own.
        stdout_truncated: More than ``max_output_bytes`` came on stdout.
        stderr_truncated: More than ``max_output_bytes`` came on stderr.
        duration_s: Wall-clock seconds from start to end.
        cpu_seconds: CPU seconds the command used, where the backend can tell (else None).
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    killed_reason: str | None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    cpu_seconds: float | None = None


@runtime_checkable
class SandboxProcess(Protocol):
    """A long-lived process in a sandbox, shaped like ``asyncio.subprocess.Process``.

    ``stdin`` is an ``asyncio.StreamWriter``, ``stdout``/``stderr`` are ``asyncio.StreamReader``s; ``returncode``
    is None while it runs. ``kill()``/``terminate()`` end every process it started. After ``wait()``,
    ``timed_out`` and ``killed_reason`` tell whether the sandbox's limits ended it (see :class:`ExecResult`).
    """

    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None
    pid: int
    timed_out: bool
    killed_reason: str | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...


@runtime_checkable
class SandboxBackend(Protocol):
    """The operations every sandbox backend implements.

    Paths given to ``read_file``/``write_file`` are relative to the sandbox's work directory (the cwd of its
    commands); a path that would leave it raises :class:`SandboxPathError`.
    """

    name: str

    async def create(self, *, role: str, run_id: str, snapshot_id: str | None = None,
                     metadata: Mapping[str, Any] | None = None) -> SandboxInfo:
        """Start a sandbox, with the files of ``snapshot_id`` in its work directory when given.

        Raises:
            ValueError: ``role`` is not one of ``ROLES``.
            IsolationUnavailable: the backend cannot isolate on this host (and was not allowed to go without).
            SandboxError: the snapshot is unknown or damaged, or the sandbox could not be started.
        """
        ...

    async def exec(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
                   limits: ExecLimits, stdin: bytes | None = None) -> ExecResult:
        """Run a short command to completion; ``env`` is its whole environment.

        The command is killed after ``min(timeout_s, limits.wall_seconds)`` (``timed_out`` is then True).

        Raises:
            SandboxNotFound: no such live sandbox.
            SandboxError: the command could not be started in the sandbox.
        """
        ...

    async def spawn(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str],
                    limits: ExecLimits) -> SandboxProcess:
        """Start a long-lived command with stdin/stdout/stderr pipes (e.g. a JSON-lines protocol process).

        ``limits`` apply as for ``exec`` (the wall clock counts from the start); the caller reads the pipes.

        Raises:
            SandboxNotFound: no such live sandbox.
            SandboxError: the command could not be started in the sandbox.
        """
        ...

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (relative to the work directory), creating parent directories."""
        ...

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        """Read ``path`` (relative to the work directory).

        Raises:
            SandboxPathError: the path leaves the work directory.
            FileNotFoundError: no such file.
        """
        ...

    async def snapshot(self, sandbox_id: str, *, label: str) -> str:
        """Capture the work directory; returns a snapshot id that ``create(snapshot_id=...)`` restores."""
        ...

    async def snapshot_files(self, files: Mapping[str, bytes], *, label: str, base: str | None = None) -> str:
        """The snapshot of ``base`` plus ``files`` (relative path -> content), made without a live sandbox."""
        ...

    async def kill(self, sandbox_id: str) -> float:
        """End every process of the sandbox and release it; returns its lifetime in seconds. Idempotent."""
        ...

    async def list_alive(self) -> list[SandboxInfo]:
        """Every live sandbox of this backend, including those created by another (possibly dead) process."""
        ...

    async def reap(self, is_orphan: Callable[[SandboxInfo], bool]) -> list[str]:
        """Kill every sandbox for which ``is_orphan`` is true (after a worker crash); returns their ids."""
        ...

    async def close(self) -> None:
        """Release what the backend object holds (relays, handles). Sandboxes themselves live on."""
        ...


def proxy_env(info: SandboxInfo) -> dict[str, str]:
    """The variables that point HTTP clients in the sandbox at its egress proxy ({} when it has none).

    The backends never add them on their own (``env`` is a command's whole environment): merge them in where a
    command should have egress.
    """
    url = info.metadata.get("egress_proxy")
    if not url:
        return {}
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": "",
            "no_proxy": ""}


async def read_capped(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bool]:
    """A command's whole output stream, keeping at most ``cap`` bytes; whether more came. Reading goes on past the cap
    (a command must not block on a full pipe), keeping nothing more."""
    if stream is None:
        return b"", False
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(1 << 16):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True
    return bytes(kept), truncated


__all__ = [
    "ROLES",
    "ExecLimits",
    "ExecResult",
    "IsolationUnavailable",
    "SandboxBackend",
    "SandboxError",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxPathError",
    "SandboxProcess",
    "proxy_env",
    "read_capped",
]
