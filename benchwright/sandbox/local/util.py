"""Small helpers of the local backend: process identity (PID + start time), atomic JSON, relative paths opened
without following symlinks, and what counts as the kernel refusing isolation."""

from __future__ import annotations

import contextlib
import errno
import json
import marshal
import os
import secrets
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchwright.sandbox.base import (
    SandboxPathError,
)
from benchwright.stack.procreg import proc_starttime

WORK_INSIDE = "/sandbox"
"""Where a sandbox's work directory is, as its commands see it."""
# What the kernel answers when this host cannot give us a namespace or a mount at all (no privilege, a seccomp or
# LSM policy, a kernel built without it, a root that cannot be pivoted): only these make a failed start mean
# "isolation is unavailable here". Everything else (ENOSPC from the namespace limits, ENOMEM, a vanished path, a
# helper that crashed or timed out under load) is a failure of this one sandbox, not a property of the host.
_CAPABILITY_STEPS = frozenset({"unshare", "mount setup"})
_CAPABILITY_ERRNOS = frozenset({errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS, errno.ENODEV,
                                errno.EOPNOTSUPP})

# ------------------------------------------------------------------------------------------------- small helpers ---


def _id_map_covers(path: Path, lo: int, hi: int) -> bool:
    """Whether ids ``lo``..``hi - 1`` are mapped in this user namespace (always so in the initial one)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return True  # no user namespaces in this kernel: every id exists
    for line in lines:
        inside, _, count = (int(x) for x in line.split())
        if inside <= lo and hi <= inside + count:
            return True
    return False


def _is_capability_failure(report: Mapping[str, Any]) -> bool:
    """Whether a failed init report means this host cannot isolate (vs. this one sandbox failing to start)."""
    return report.get("step") in _CAPABILITY_STEPS and report.get("errno") in _CAPABILITY_ERRNOS


def _failure_detail(report: Mapping[str, Any]) -> str:
    detail = f"{report.get('step', 'setup')} failed: {report.get('error', 'unknown error')}"
    if report.get("errno") == errno.ENOSPC and report.get("step") == "unshare":
        detail += " (too many namespaces on this host: see /proc/sys/user/max_*_namespaces)"
    return detail


def _alive(pid: int | None, start: int | None) -> bool:
    return pid is not None and pid > 0 and start is not None and proc_starttime(pid) == start


def _kill_verified(pid: int | None, start: int | None) -> None:
    """SIGKILL ``pid`` only if it is still the process that started at ``start`` (never a reused PID)."""
    if _alive(pid, start):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]


def _write_json_atomic(path: Path, data: Any, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _write_config(path: Path, cfg: dict[str, Any]) -> None:
    """A helper's config, in marshal format (the helper runs on this same interpreter and skips importing json).

    Root-only (0600, in the root-only ``ctl/``); the helper deletes it once read, as it holds the command's env.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(marshal.dumps(cfg))


def _split_relpath(path: str) -> list[str]:
    """Validate a path given for a sandbox's work dir; returns its components.

    Raises:
        SandboxPathError: absolute outside ``/sandbox``, empty, or containing ``..`` or NUL.
    """
    if not isinstance(path, str) or "\x00" in path:
        raise SandboxPathError(f"invalid sandbox path {path!r}")
    if path.startswith("/"):
        if path != WORK_INSIDE and not path.startswith(WORK_INSIDE + "/"):
            raise SandboxPathError(f"sandbox paths are relative to the work directory ({WORK_INSIDE}); got {path!r}")
        path = path[len(WORK_INSIDE):]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SandboxPathError(f"sandbox path {path!r} contains '..': paths may not leave the work directory")
    if not parts:
        raise SandboxPathError(f"sandbox path {path!r} names the work directory itself, not a file in it")
    return parts


def _open_parent(work: Path, parts: list[str], *, create: bool, uid: int | None, gid: int | None) -> int:
    """Open the directory that holds ``parts[-1]``, walking from ``work`` without following any symlink.

    Every component is opened relative to its parent's fd with O_NOFOLLOW, so a sandboxed process that swaps a
    directory for a symlink (to ``/etc``, say) cannot make the host read or write outside the work directory.
    """
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for i, part in enumerate(parts[:-1]):
            for _ in range(2):
                try:
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    break
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                        if uid is not None:
                            os.chown(part, uid, gid or uid, dir_fd=fd, follow_symlinks=False)
                except OSError as exc:  # ELOOP (a symlink) or ENOTDIR (a file)
                    raise SandboxPathError(
                        f"{'/'.join(parts[:i + 1])!r} is a symlink or not a directory; sandbox file operations "
                        f"do not follow symlinks") from exc
            else:
                raise SandboxPathError(f"cannot create directory {'/'.join(parts[:i + 1])!r}")
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd
