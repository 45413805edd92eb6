"""What the remote backends (``sandbox0``, ``e2b``) share: a process handle fed by a stream, ``exec`` built on
``spawn``, the in-sandbox limits wrapper, and the tar framing of files and snapshots.

A remote sandbox runs commands somewhere else (a pod, a micro-VM), so:

* **Limits** are applied where the command runs, by a POSIX ``sh`` wrapper: ``ulimit -t`` (CPU seconds),
  ``ulimit -f`` (file size), ``ulimit -u`` (processes), ``ulimit -v`` (address space, only when the command's
  memory limit is below the sandbox's own: the sandbox's memory limit, a cgroup, bounds everything else), and
  coreutils ``timeout`` for the wall clock (TERM, KILL 2 s later, to the command's whole process group). ``env -i``
  gives the command exactly ``env``. The caller's side enforces the wall clock again (plus a grace) by closing
  the stream, so a sandbox that stops answering never hangs a phase.
* **Files** travel as tar archives over the command stream (``tar -xf -`` / ``tar -cf -``), as ``kubectl cp``
  does; parent directories are archive members, so an existing symlink on the way is replaced, never followed.
* **Snapshots** are tarballs of the work directory in the blob store; the snapshot id is the blob id, so any
  worker on any host restores it from the same store.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import re
import signal
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from benchwright.data.blobs import BlobNotFound, BlobStore
from benchwright.sandbox.base import ROLES, ExecLimits, ExecResult, SandboxError, SandboxPathError, read_capped

_GRACE_S = 5.0
TIMEOUT_RC = 124
"""What coreutils ``timeout`` exits with when the wall clock ran out and TERM ended the command."""
_SIZE = re.compile(r"^(?P<backend>[a-z0-9]+)-(?P<cpu>\d+(?:\.\d+)?)cpu-(?P<mem>\d+)gb$")


async def snapshot_archive(blobs: BlobStore, role: str, snapshot_id: str | None) -> bytes | None:
    """What a remote backend's ``create`` starts from: ``role`` checked, and ``snapshot_id``'s tarball from the blob
    store (None for an empty sandbox).

    Raises:
        ValueError: ``role`` is not one of ``ROLES``.
        SandboxError: no snapshot ``snapshot_id`` in the blob store.
    """
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if snapshot_id is None:
        return None
    try:
        return await blobs.get(snapshot_id)
    except BlobNotFound as exc:
        raise SandboxError(f"unknown snapshot {snapshot_id}: {exc}") from exc


def parse_instance_size(size: str) -> tuple[float, int]:
    """``"<backend>-<cpus>cpu-<memory>gb"`` -> (cores, memory MiB).

    Raises:
        ValueError: any other shape (naming the expected one).
    """
    m = _SIZE.match(size)
    if not m:
        raise ValueError(f"instance size {size!r} is not '<backend>-<cpus>cpu-<memory>gb' (e.g. sandbox0-2cpu-4gb)")
    return float(m["cpu"]), int(m["mem"]) * 1024


def check_relpath(path: str) -> str:
    """``path`` normalized, relative to the work directory.

    Raises:
        SandboxPathError: absolute, empty, or leaving the work directory (``..``).
    """
    if not path or path.startswith("/") or "\x00" in path:
        raise SandboxPathError(f"path {path!r} must be relative to the sandbox's work directory")
    norm = posixpath.normpath(path)
    if norm == "." or norm == ".." or norm.startswith("../"):
        raise SandboxPathError(f"path {path!r} leaves the sandbox's work directory")
    return norm


def wrap_command(argv: Sequence[str], *, env: Mapping[str, str], limits: ExecLimits, wall_seconds: float,
                 sandbox_memory_mb: int, stdin_bytes: int | None = None) -> list[str]:
    """The ``sh -c`` command that runs ``argv`` with ``env`` only and ``limits`` applied inside the sandbox.

    ``stdin_bytes``: when given, the command reads exactly that many bytes of standard input (``head -c``), so it
    sees end-of-file even over a stream that cannot close its input half (the v4 exec protocol).
    """
    if not argv:
        raise ValueError("argv is empty")
    cpu = max(1, int(limits.cpu_seconds))
    # Soft limit first at the ceiling (SIGXCPU: "cpu"), hard one second later (SIGKILL if XCPU is ignored).
    steps = [f"ulimit -H -t {cpu + 1}", f"ulimit -S -t {cpu}",
             f"ulimit -f {max(1, limits.max_file_mb) * 2048}",  # 512-byte blocks
             f"ulimit -u {max(1, limits.max_processes)} 2>/dev/null"]
    if limits.memory_mb < sandbox_memory_mb:
        steps.append(f"ulimit -v {limits.memory_mb * 1024}")
    run = f'timeout -k 2 {max(0.001, wall_seconds):.3f} env -i "$@"'
    steps.append(f"head -c {stdin_bytes} | {run}" if stdin_bytes is not None else f"exec {run}")
    assignments = [f"{k}={v}" for k, v in env.items()]
    return ["sh", "-c", "; ".join(steps), "benchwright", *assignments, *argv]


def killed_reason(rc: int, *, wall_hit: bool) -> tuple[int, bool, str | None]:
    """(returncode, timed_out, killed_reason) from a wrapped command's exit status.

    Shells report a signal death as 128 + the signal; it is turned back into minus the signal, as ``subprocess``
    reports it (``ExecResult.returncode``).
    """
    if wall_hit or rc == TIMEOUT_RC:
        return (rc if rc <= 128 else -(rc - 128)), True, "wall_clock"
    if 128 < rc < 128 + 65:
        sig = rc - 128
        reason = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}.get(signal.Signals(sig)) \
            if sig in signal.valid_signals() else None
        if reason is None:
            try:
                reason = f"signal {signal.Signals(sig).name}"
            except ValueError:
                reason = f"signal {sig}"
        return -sig, False, reason
    return rc, False, None


class _ChannelTransport(asyncio.WriteTransport):
    """The write half of a remote stream (a pod exec's stdin channel, an E2B process's input) as a transport, so
    ``stdin`` is a real ``asyncio.StreamWriter``."""

    def __init__(self, send: Callable[[bytes], None], close: Callable[[], None]) -> None:
        super().__init__()
        self._send, self._close, self._closing = send, close, False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._send(bytes(data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._close()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        self.close()


class RemoteProcess:
    """A command in a remote sandbox, shaped like ``asyncio.subprocess.Process`` (see ``SandboxProcess``).

    The backend's pump calls :meth:`feed_stdout`/:meth:`feed_stderr` and finally :meth:`finish` on the event loop;
    ``send``/``close_stdin``/``cancel`` reach the remote side. The wall clock is watched here too: past
    ``wall_seconds`` + a grace the stream is cancelled and the command counts as timed out.
    """

    def __init__(self, *, pid: int, send: Callable[[bytes], None], close_stdin: Callable[[], None],
                 cancel: Callable[[], None], wall_seconds: float, stream_limit: int = 64 * 1024 * 1024) -> None:
        loop = asyncio.get_running_loop()
        self.pid = pid
        self.stdout: asyncio.StreamReader | None = asyncio.StreamReader(limit=stream_limit)
        self.stderr: asyncio.StreamReader | None = asyncio.StreamReader(limit=stream_limit)
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
        self.stdin: asyncio.StreamWriter | None = asyncio.StreamWriter(
            _ChannelTransport(send, close_stdin), protocol, None, loop)
        self._cancel = cancel
        self._started = time.monotonic()
        self._done = asyncio.Event()
        self._returncode: int | None = None
        self._forced: str | None = None
        self.timed_out = False
        self.killed_reason: str | None = None
        self.duration_s = 0.0
        self._watchdog = loop.call_later(wall_seconds + _GRACE_S, self._expire)

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def feed_stdout(self, data: bytes) -> None:
        if self.stdout is not None and data:
            self.stdout.feed_data(data)

    def feed_stderr(self, data: bytes) -> None:
        if self.stderr is not None and data:
            self.stderr.feed_data(data)

    def finish(self, rc: int | None) -> None:
        """The remote command ended with exit status ``rc`` (None: the stream broke without one)."""
        if self._done.is_set():
            return
        self._watchdog.cancel()
        for reader in (self.stdout, self.stderr):
            if reader is not None:
                reader.feed_eof()
        self.duration_s = time.monotonic() - self._started
        if self._forced is not None or rc is None:
            reason = self._forced or "sandbox_killed"
            self._returncode, self.timed_out, self.killed_reason = -signal.SIGKILL, reason == "wall_clock", reason
        else:
            self._returncode, self.timed_out, self.killed_reason = killed_reason(rc, wall_hit=False)
        self._done.set()

    def _expire(self) -> None:
        self._forced = self._forced or "wall_clock"
        self._cancel()

    async def wait(self) -> int:
        await self._done.wait()
        assert self._returncode is not None
        return self._returncode

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        if input and self.stdin is not None:
            self.stdin.write(input)
        if self.stdin is not None:
            self.stdin.close()
        out, _ = await read_capped(self.stdout, 1 << 62)
        err, _ = await read_capped(self.stderr, 1 << 62)
        await self.wait()
        return out, err

    def kill(self) -> None:
        """End the command: the stream is closed (the sandbox ends a command whose stream closed)."""
        if not self._done.is_set():
            self._forced = self._forced or "terminated"
            self._cancel()

    def terminate(self) -> None:
        self.kill()



async def exec_via_spawn(start: Callable[[int | None], Awaitable[RemoteProcess]], *, stdin: bytes | None,
                         limits: ExecLimits) -> ExecResult:
    """``exec`` for a remote backend: start the command, feed ``stdin``, read both streams capped, wait.

    ``start(stdin_len)`` starts the wrapped command (see :func:`wrap_command`'s ``stdin_bytes``).
    """
    proc = await start(len(stdin) if stdin is not None else None)
    out_task = asyncio.create_task(read_capped(proc.stdout, limits.max_output_bytes))
    err_task = asyncio.create_task(read_capped(proc.stderr, limits.max_output_bytes))
    try:
        if proc.stdin is not None:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        await proc.wait()
        (out, out_trunc), (err, err_trunc) = await asyncio.gather(out_task, err_task)
    finally:
        if proc.returncode is None:
            proc.kill()
        for task in (out_task, err_task):
            task.cancel()
    assert proc.returncode is not None
    return ExecResult(returncode=proc.returncode, stdout=out, stderr=err, timed_out=proc.timed_out,
                      killed_reason=proc.killed_reason, stdout_truncated=out_trunc, stderr_truncated=err_trunc,
                      duration_s=proc.duration_s)


# --------------------------------------------------------------------------------------------------------- tar ---

class WrappedCommands:
    """``spawn`` and ``exec`` for a remote backend, on top of its ``_start(sandbox_id, command, wall_seconds=)``: every
    remote backend wraps a command the same way (``wrap_command``: environment, ulimits, wall clock) and builds
    ``exec`` on ``spawn`` (``exec_via_spawn``). A backend sets ``memory_mb`` and implements ``_start``."""

    memory_mb: int

    async def _start(self, sandbox_id: str, command: list[str], *, wall_seconds: float) -> RemoteProcess:
        raise NotImplementedError

    async def spawn(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str],
                    limits: ExecLimits) -> RemoteProcess:
        wall = float(limits.wall_seconds)
        cmd = wrap_command(argv, env=env, limits=limits, wall_seconds=wall, sandbox_memory_mb=self.memory_mb)
        return await self._start(sandbox_id, cmd, wall_seconds=wall)

    async def exec(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
                   limits: ExecLimits, stdin: bytes | None = None) -> ExecResult:
        wall = max(0.001, min(float(timeout_s), float(limits.wall_seconds)))

        async def start(stdin_len: int | None) -> RemoteProcess:
            cmd = wrap_command(argv, env=env, limits=limits, wall_seconds=wall, sandbox_memory_mb=self.memory_mb,
                               stdin_bytes=stdin_len if stdin_len is not None else 0)
            return await self._start(sandbox_id, cmd, wall_seconds=wall)

        return await exec_via_spawn(start, stdin=stdin, limits=limits)


def tar_of(files: Mapping[str, bytes], *, modes: Mapping[str, int] | None = None,
           base: bytes | None = None) -> bytes:
    """A tar archive of ``base``'s members (minus those ``files`` replaces) plus ``files``, with every parent
    directory as a member of its own."""
    buf = io.BytesIO()
    names = {check_relpath(p): data for p, data in files.items()}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        dirs: set[str] = set()
        if base:
            with tarfile.open(fileobj=io.BytesIO(base), mode="r:*") as old:
                for member in old.getmembers():
                    name = posixpath.normpath(member.name)
                    if name in names or name == ".":
                        continue
                    member.name = name
                    if member.isdir():
                        dirs.add(name)
                    out.addfile(member, old.extractfile(member) if member.isfile() else None)
        now = time.time()
        for name, data in sorted(names.items()):
            parent = posixpath.dirname(name)
            chain: list[str] = []
            while parent and parent not in dirs:
                chain.append(parent)
                parent = posixpath.dirname(parent)
            for d in reversed(chain):
                info = tarfile.TarInfo(d)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
                out.addfile(info)
                dirs.add(d)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), (modes or {}).get(name, 0o644), now
            out.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def file_from_tar(archive: bytes, path: str) -> bytes:
    """The content of regular file ``path`` in ``archive`` (what ``tar -cf - path`` produced).

    Raises:
        SandboxPathError: it is a symlink or not a regular file.
        FileNotFoundError: the archive does not hold it.
    """
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        for member in tar.getmembers():
            if posixpath.normpath(member.name) != path:
                continue
            if member.issym() or member.islnk():
                raise SandboxPathError(f"path {path!r} is a link; links are not followed out of the work directory")
            if not member.isfile():
                raise SandboxPathError(f"path {path!r} is not a regular file")
            f = tar.extractfile(member)
            assert f is not None
            return f.read()
    raise FileNotFoundError(path)


def tar_listing(archive: bytes) -> dict[str, Any]:
    """path -> (type, mode, size) of every member: what a restore must reproduce (tests compare these)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        return {posixpath.normpath(m.name): (m.type, m.mode, m.size) for m in tar.getmembers()}
