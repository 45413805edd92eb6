"""The local sandbox backend: Linux namespaces, cgroups (or rlimits) and a content-addressed snapshot store.

Isolation design
================
Mechanism: our own helper script (``_nsexec.py``, standard library + ``ctypes`` for ``unshare``/``setns``/
``mount``/``pivot_root``/``prctl``), not util-linux's ``unshare``/``nsenter``. One small script does every step in
the order the kernel needs (join the cgroup before dropping root, set PDEATHSIG after ``setuid``, open host-side
files before entering the sandbox), reports errors with the step that failed, and needs no binaries in the sandbox.
It requires root (``CAP_SYS_ADMIN``) on the host, which the worker has; without it ``create`` raises
:class:`IsolationUnavailable` (unless ``allow_unisolated``). Only a refusal by the kernel (EPERM, EINVAL, ENOSYS...
from ``unshare`` or the mount setup) counts as that; any other failed start (a resource limit, a helper that
crashed or timed out under load) raises :class:`SandboxError` with the cause and never triggers the fallback.

Per sandbox (``root_dir/sandboxes/<id>/``: ``work/``, ``rootfs/``, ``ctl/``, ``meta.json``):

* A long-lived *init* process is PID 1 of new **mount, PID, network, IPC and UTS namespaces**. Its root is a
  tmpfs assembled from read-only bind mounts of a whitelist (``/usr``, ``/bin``, ``/lib*``, the interpreter's
  prefixes and the venv, a few ``/etc`` files plus generated ``passwd``/``group``/``hosts``), a private ``/dev``
  (null, zero, full, random, urandom, tty, a private ``/dev/shm``), a fresh ``/proc``, a private ``/tmp`` tmpfs and
  ``work/`` read-write at ``/sandbox``; it ``pivot_root``s there and detaches the old root. So the host's
  ``/root``, ``/home``, ``/work``, ``root_dir`` (other sandboxes, snapshots), host ``/proc`` and ``/tmp``, service
  sockets and everything else not whitelisted simply do not exist inside; nothing is hidden by an overmount that
  could be unmounted.
* Commands run as a per-sandbox **unprivileged uid** (2,000,000 + a hash of the id; no groups, every capability
  dropped, ``no_new_privs``), in their **own nested PID namespace** inside the sandbox's, with a ``/proc`` of that
  namespace mounted ``hidepid=2`` (a command sees its own processes and nothing else, not even the root-owned
  helpers), with exactly the ``env`` given. A user namespace is not used: as root we can drop to a real unprivileged
  uid, which is simpler and stronger than "root in a user namespace".
* **Network**: the network namespace has only ``lo``. Egress, when configured (``egress_proxy_url``), goes
  sandbox ``HTTP(S)_PROXY=http://127.0.0.1:3128`` -> a forwarder in the sandbox's init (listening inside the
  sandbox's namespace) -> a Unix socket bind-mounted at ``/run/benchwright/egress.sock`` (root-only directory, so
  the sandboxed uid cannot use it directly) -> a relay thread in this backend -> the egress proxy's host TCP
  address. Pathname Unix sockets are reachable across network namespaces, TCP to the host is not: one host
  endpoint, nothing else. The scorer's model calls do not need it (they go over stdio to the host).

**Limits** (per ``exec``/``spawn``): a cgroup per command when the controllers are writable — here cgroup **v1**
``memory`` (``memory.limit_in_bytes``, OOM kill), ``pids`` (``pids.max``: fork bombs fail with EAGAIN),
``cpuacct`` (total CPU of all the command's processes, enforced by the helper's watchdog) and ``cpu`` (the CPU
*rate*, ``ExecLimits.cpu_cores``: CFS bandwidth control, ``cpu.cfs_quota_us = cpu_cores x cpu.cfs_period_us`` with
a 100 ms period, so all the command's processes together get at most ``cpu_cores`` cores' worth of CPU time per
wall second and are throttled, not killed, beyond it; ``cpu`` and ``cpuacct`` are separate hierarchies on some
hosts and co-mounted as ``cpu,cpuacct`` on others: a co-mounted pair shares one directory); cgroup v2
(``memory.max``, ``pids.max``, ``cpu.stat``, ``cpu.max = "<quota> 100000"``) when it is delegated to us. Each
cgroup is created *below the worker's own cgroup*, so the host's accounting (and any CPU limit of the worker's own)
still covers it. The rate cap is per command: two commands running at once in one sandbox get ``cpu_cores`` each.
Without cgroups: ``RLIMIT_AS`` and ``RLIMIT_NPROC`` (per sandbox uid), and **no CPU rate cap** (nothing in rlimits
can do it); likewise when the ``cpu`` controller is not mounted, not writable or built without CFS bandwidth
control (no ``cpu.cfs_quota_us``/``cpu.max``). ``LocalBackend.limit_mechanism`` (also in every sandbox's metadata
as ``limits``) says which applies.
Always: ``RLIMIT_CPU`` (per process), ``RLIMIT_FSIZE``, no core dumps, the wall clock (the helper kills the
command's PID namespace: every process of it dies), output caps (``exec`` keeps ``max_output_bytes`` per stream and
drains the rest).

Sandboxes outlive the worker process that made them (their init has its own session); ``meta.json`` and
``ctl/pids.json`` record the init's PID *and start time*, so any process can find them (``list_alive``) and kill
them (``reap``) without ever hitting a reused PID. Killing the init (SIGKILL) makes the kernel kill every process in
the sandbox's PID namespace; then the directory is removed.

**Unisolated mode** (``allow_unisolated=True`` when namespaces fail, or ``isolation="none"``): sandboxes are plain
directories and commands plain subprocesses (own session, cwd = ``work/``, exact env, the same cgroups/rlimits, the
watchdog kills the process group); ``metadata["isolation"] == "none"`` so a run can record it.

**Snapshots**: ``root_dir/snapshots/objects/ab/cdef…`` holds file contents by sha256 (each stored once);
``manifests/<id>.json`` is the canonical JSON manifest (path -> sha256, size, mode; directories; symlinks), and its
own sha256 is the snapshot id; ``labels/<id>.json`` records labels. Everything is on disk: any backend on the same
``root_dir`` restores any snapshot. Capture and restore never follow symlinks in the work directory. A capture
does not re-read a file its own store restored and nothing has touched since (same inode, size, mtime and ctime;
restore outlasts the file clock's tick, so any later change moves ctime): the re-run bench's Atomize snapshot of a
52 MB dataset went from ~0.2 s to ~0 s of hashing and copying.

Not isolated here (known limits): no seccomp filter (the full syscall surface of the kernel is reachable, including
creating user namespaces inside the sandbox, which grants nothing over host files since they are not mounted); disk
use of ``work/`` is bounded only per file (``max_file_mb``); the CPU *rate* is capped only where a ``cpu``
controller is usable (see **Limits**; otherwise only CPU seconds are); the sandbox's own helpers (its init, the
egress forwarder) run in the worker's cgroups, outside the commands' limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import marshal
import math
import os
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchwright.sandbox.base import (
    ROLES,
    ExecLimits,
    ExecResult,
    IsolationUnavailable,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SandboxPathError,
)

log = logging.getLogger(__name__)

HELPER = Path(__file__).with_name("_nsexec.py")
WORK_INSIDE = "/sandbox"
EGRESS_PORT = 3128
"""The forwarder's port inside every sandbox's network namespace (127.0.0.1:3128)."""
UID_BASE = 2_000_000
_UID_SPAN = 1_000_000
_STREAM_LIMIT = 64 * 1024 * 1024  # same line limit the scorer host uses on the runner's stdout
_START_TIMEOUT_S = 30.0
_HOST_GRACE_S = 5.0  # the helper enforces the wall clock; the backend steps in only if the helper itself hangs
_ETC_WHITELIST = ("alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf",
                  "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "mime.types",
                  "nsswitch.conf", "os-release", "protocols", "services", "ssl", "timezone")
_SNAPSHOT_FORMAT = "benchwright-snapshot/1"
# What the kernel answers when this host cannot give us a namespace or a mount at all (no privilege, a seccomp or
# LSM policy, a kernel built without it, a root that cannot be pivoted): only these make a failed start mean
# "isolation is unavailable here". Everything else (ENOSPC from the namespace limits, ENOMEM, a vanished path, a
# helper that crashed or timed out under load) is a failure of this one sandbox, not a property of the host.
_CAPABILITY_STEPS = frozenset({"unshare", "mount setup"})
_CAPABILITY_ERRNOS = frozenset({errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS, errno.ENODEV,
                                errno.EOPNOTSUPP})


# ------------------------------------------------------------------------------------------------- small helpers ---


def _proc_starttime(pid: int | None) -> int | None:
    """Start time of a live (non-zombie) process; None if there is none with that PID."""
    if not pid:
        return None
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


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
    return bool(pid) and start is not None and _proc_starttime(pid) == start


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


# ------------------------------------------------------------------------------------------------------ cgroups ---


@dataclass
class _ExecCgroup:
    dirs: list[Path]
    procs: list[str]
    cpu_usage: str | None
    oom_file: str | None


_CFS_PERIOD_US = 100_000
"""CFS bandwidth period of a command's cgroup: its quota is granted, and runs out, per 100 ms of wall clock."""
_CFS_MIN_QUOTA_US = 1_000  # the kernel refuses quotas below 1 ms


def _cpu_quota_us(cpu_cores: float) -> int | None:
    """The CFS quota per ``_CFS_PERIOD_US`` for a rate of ``cpu_cores``; None for no cap (<= 0, inf, NaN)."""
    cores = float(cpu_cores)
    if not (cores > 0 and math.isfinite(cores)):
        return None
    return max(_CFS_MIN_QUOTA_US, round(cores * _CFS_PERIOD_US))


def _write_cpu_quota(path: Path, value: str, cpu_cores: float) -> None:
    """Write a CFS quota; EINVAL (an ancestor's quota is stricter, in v1, or beyond the kernel's maximum) leaves
    the cgroup uncapped, which means "bounded by the ancestors": never more than what was asked."""
    try:
        path.write_text(value)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        log.debug("CPU rate %s cores not set on %s (%s); the enclosing cgroups' limit applies", cpu_cores, path, exc)


class _Cgroups:
    """Per-command cgroups under the worker's own cgroup: v1 per controller, or one v2 directory.

    Only used when a probe directory can be created (and, for v2, the controllers enabled for children).
    ``cpu_rate``: whether the CPU rate can be capped (v1 ``cpu`` controller with ``cpu.cfs_quota_us``, or v2
    ``cpu.max``). In v1, controllers co-mounted in one hierarchy (``cpu,cpuacct``) share one directory.
    """

    def __init__(self, v1: dict[str, Path], v2: Path | None, v2_controllers: set[str], *,
                 cpu_rate: bool | None = None) -> None:
        self.v1 = v1
        self.v2 = v2
        self.v2_controllers = v2_controllers
        if cpu_rate is None:
            cpu_rate = "cpu" in v2_controllers if v2 is not None else "cpu" in v1
        self.cpu_rate = cpu_rate

    @property
    def controllers(self) -> set[str]:
        if self.v2 is not None:
            return {("cpuacct" if c == "cpu" else c) for c in self.v2_controllers}
        return set(self.v1)

    def describe(self) -> str:
        if self.v2 is not None:
            return f"cgroup v2 ({', '.join(sorted(self.v2_controllers))})"
        if self.v1:
            return f"cgroup v1 ({', '.join(sorted(self.v1))})"
        return "none (rlimits only)"

    def describe_cpu_rate(self) -> str:
        if self.cpu_rate and self.v2 is not None:
            return f"CPU rate capped by cgroup v2 cpu.max (period {_CFS_PERIOD_US} us)"
        if self.cpu_rate:
            return f"CPU rate capped by cgroup v1 cpu.cfs_quota_us (period {_CFS_PERIOD_US} us)"
        return "CPU rate NOT capped (no usable cpu controller; only CPU seconds are limited)"

    def _v1_groups(self) -> dict[Path, list[str]]:
        """v1 controllers by hierarchy directory (co-mounted ones, e.g. ``cpu,cpuacct``, share one)."""
        groups: dict[Path, list[str]] = {}
        for controller, parent in self.v1.items():
            groups.setdefault(parent, []).append(controller)
        return groups

    def sandbox_dirs(self, sandbox_id: str) -> list[Path]:
        name = f"benchwright-{sandbox_id}"
        if self.v2 is not None:
            return [self.v2 / name]
        return [parent / name for parent in self._v1_groups()]

    def create_exec(self, sandbox_id: str, limits: ExecLimits) -> _ExecCgroup:
        leaf = f"x{secrets.token_hex(5)}"
        memory = limits.memory_mb * 1024 * 1024
        made: list[Path] = []
        procs: list[str] = []
        cpu_usage = oom_file = None
        quota = _cpu_quota_us(limits.cpu_cores)
        try:
            if self.v2 is not None:
                parent = self.v2 / f"benchwright-{sandbox_id}"
                parent.mkdir(exist_ok=True)
                # Checked every time, not only by whoever made the directory: a concurrent exec of the same
                # sandbox may see it before its creator has enabled the controllers.
                subtree = parent / "cgroup.subtree_control"
                if not self.v2_controllers <= set(subtree.read_text().split()):
                    subtree.write_text(" ".join(f"+{c}" for c in sorted(self.v2_controllers)))
                d = parent / leaf
                d.mkdir()
                made.append(d)
                if "memory" in self.v2_controllers:
                    (d / "memory.max").write_text(str(memory))
                    with contextlib.suppress(OSError):
                        (d / "memory.swap.max").write_text("0")
                    oom_file = str(d / "memory.events")
                if "pids" in self.v2_controllers:
                    (d / "pids.max").write_text(str(limits.max_processes))
                if "cpu" in self.v2_controllers:
                    cpu_usage = str(d / "cpu.stat")
                    if self.cpu_rate and quota is not None:
                        _write_cpu_quota(d / "cpu.max", f"{quota} {_CFS_PERIOD_US}", limits.cpu_cores)
                procs.append(str(d / "cgroup.procs"))
            else:
                for parent, controllers in self._v1_groups().items():
                    d = parent / f"benchwright-{sandbox_id}" / leaf
                    d.mkdir(parents=True)
                    made.append(d)
                    for controller in controllers:
                        if controller == "memory":
                            (d / "memory.limit_in_bytes").write_text(str(memory))
                            if (d / "memory.memsw.limit_in_bytes").exists():  # no swapping around the limit
                                (d / "memory.memsw.limit_in_bytes").write_text(str(memory))
                            oom_file = str(d / "memory.oom_control")
                        elif controller == "pids":
                            (d / "pids.max").write_text(str(limits.max_processes))
                        elif controller == "cpuacct":
                            cpu_usage = str(d / "cpuacct.usage")
                        elif controller == "cpu" and quota is not None:
                            (d / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
                            _write_cpu_quota(d / "cpu.cfs_quota_us", str(quota), limits.cpu_cores)
                    procs.append(str(d / "cgroup.procs"))
        except OSError as exc:
            _remove_cgroups(made)
            raise SandboxError(f"cannot set up the command's cgroup: {exc}") from exc
        return _ExecCgroup(dirs=made, procs=procs, cpu_usage=cpu_usage, oom_file=oom_file)


def _kill_cgroup_members(d: Path) -> None:
    try:
        pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _remove_cgroups(dirs: Sequence[Path | str], timeout_s: float = 5.0) -> None:
    """Kill what is left in these cgroup directories (and their children) and remove them, deepest first."""
    deadline = time.monotonic() + timeout_s
    for top in dirs:
        top = Path(top)
        if not top.is_dir():
            continue
        subdirs = sorted((Path(root) for root, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
        for d in subdirs:
            while True:
                _kill_cgroup_members(d)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY while killed members are still exiting
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s: %s", d, exc)
                        break
                    time.sleep(0.005)


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(root, mountpoint, fstype, super options) of every mount."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            lf, rf = left.split(), right.split()
            if len(lf) >= 5 and len(rf) >= 3:
                out.append((lf[3], lf[4], rf[0], rf[2]))
    return out


def _probe_dir(parent: Path, write: tuple[str, str] | None = None) -> bool:
    """Whether a child cgroup can be made in ``parent`` (and, given ``write=(file, value)``, that file written)."""
    probe = parent / f"benchwright-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        if write is not None:
            (probe / write[0]).write_text(write[1])
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _detect_cgroups() -> _Cgroups:
    """Find writable memory/pids/CPU-accounting cgroups below this process's own cgroup."""
    try:
        own = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    except OSError:
        return _Cgroups({}, None, set())
    mounts = _mountinfo()

    def _under(mount_root: str, mountpoint: str, path: str) -> Path | None:
        if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
            return None
        rel = path[len(mount_root):] if mount_root != "/" else path
        return Path(mountpoint + rel.rstrip("/")) if rel not in ("", "/") else Path(mountpoint)

    # cgroup v2, if memory and pids are delegated to our cgroup's children.
    for hid, controllers, path in own:
        if hid != "0" or controllers:
            continue
        for root, mountpoint, fstype, _ in mounts:
            if fstype != "cgroup2":
                continue
            d = _under(root, mountpoint, path)
            if d is None:
                continue
            try:
                available = set((d / "cgroup.controllers").read_text().split())
            except OSError:
                continue
            wanted = {"memory", "pids", "cpu"} & available
            if not {"memory", "pids"} <= wanted:
                continue
            try:
                (d / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
                enabled = set((d / "cgroup.subtree_control").read_text().split())
            except OSError:
                continue  # e.g. EBUSY: processes in our own cgroup (the "no internal processes" rule)
            if {"memory", "pids"} <= enabled and _probe_dir(d):
                enabled &= wanted
                # cpu.max exists only with CFS bandwidth control; without it "cpu" still gives cpu.stat.
                cpu_rate = "cpu" in enabled and _probe_dir(d, ("cpu.max", f"max {_CFS_PERIOD_US}"))
                return _Cgroups({}, d, enabled, cpu_rate=cpu_rate)

    # cgroup v1: each controller in the hierarchy it is mounted in (cpu and cpuacct often share one, "cpu,cpuacct").
    probes = {"cpu": ("cpu.cfs_quota_us", "-1")}  # absent without CONFIG_CFS_BANDWIDTH: then no rate cap
    v1: dict[str, Path] = {}
    for controller in ("memory", "pids", "cpuacct", "cpu"):
        for _hid, controllers, path in own:
            if controller not in controllers.split(","):
                continue
            for root, mountpoint, fstype, opts in mounts:
                if fstype == "cgroup" and controller in opts.split(","):
                    d = _under(root, mountpoint, path)
                    if d is not None and d.is_dir() and _probe_dir(d, probes.get(controller)):
                        v1[controller] = d
                        break
            break
    return _Cgroups(v1, None, set())


# ------------------------------------------------------------------------------------------------- egress relay ---


class _EgressRelay:
    """Host end of the egress path: a Unix socket whose every connection is piped to one host TCP address.

    Threads, not asyncio: it must keep serving whatever event loop (or none) the backend's caller runs.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._dir = Path(tempfile.mkdtemp(prefix="benchwright-egress-"))  # short path: sun_path is 108 bytes
        self.socket_path = self._dir / "egress.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._listener.listen(128)
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="sandbox-egress", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((self.host, self.port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        upstream.close()
        client.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _parse_proxy_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.scheme not in ("http", "") or not parts.hostname or not parts.port:
        raise ValueError(f"egress_proxy_url must be http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port


# ---------------------------------------------------------------------------------------------------- snapshots ---


def _write_file_into(work: Path, parts: list[str], data: bytes, *, mode: int, uid: int | None,
                     gid: int | None) -> None:
    """Write a regular file at ``parts`` under ``work`` (parents created), never through a symlink."""
    dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
    try:
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (40, 21):  # ELOOP, EISDIR
                raise SandboxPathError(f"{'/'.join(parts)!r} is a symlink or a directory") from exc
            raise
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SandboxPathError(f"{'/'.join(parts)!r} is not a regular file")
        _write_all(fd, data)
        if uid is not None:
            os.fchown(fd, uid, gid or uid)
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)


class _SnapshotStore:
    """Content-addressed snapshots of work directories (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.manifests = root / "manifests"
        self.labels = root / "labels"
        for d in (root, self.objects, self.manifests, self.labels, self.objects / "tmp"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.restored: dict[str, dict[str, tuple[int, int, int, int, int, str]]] = {}
        """work dir -> relative path -> (st_dev, st_ino, size, mtime_ns, ctime_ns, sha256) as restore left it."""

    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def _store(self, fd: int) -> tuple[str, int]:
        """Copy an open file into the store while hashing it (what is stored is exactly what was hashed)."""
        h = hashlib.sha256()
        size = 0
        tmp_fd, tmp = tempfile.mkstemp(dir=self.objects / "tmp")
        try:
            with os.fdopen(tmp_fd, "wb") as out:
                while chunk := os.read(fd, 1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = h.hexdigest()
            dest = self.object_path(digest)
            if dest.exists():
                os.unlink(tmp)  # identical content is stored once
            else:
                dest.parent.mkdir(mode=0o700, exist_ok=True)
                os.chmod(tmp, 0o400)
                os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return digest, size

    def capture(self, work: Path, *, label: str, source: str) -> str:
        files: dict[str, dict[str, Any]] = {}
        dirs: dict[str, dict[str, int]] = {}
        links: dict[str, str] = {}

        def walk(dfd: int, prefix: str) -> None:
            for name in sorted(os.listdir(dfd)):
                rel = prefix + name
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                    try:
                        dirs[rel] = {"mode": stat.S_IMODE(st.st_mode) & 0o777}
                        walk(sub, rel + "/")
                    finally:
                        os.close(sub)
                elif stat.S_ISREG(st.st_mode):
                    # O_NONBLOCK: if it was swapped for a FIFO meanwhile, open must not hang; fstat rejects it.
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
                    try:
                        st = os.fstat(fd)
                        if not stat.S_ISREG(st.st_mode):
                            continue
                        was = restored.get(rel)
                        if was is not None and was[:5] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                           st.st_ctime_ns) and self.object_path(was[5]).is_file():
                            digest, size = was[5], st.st_size  # untouched since restore: its object is stored
                        else:
                            digest, size = self._store(fd)
                    finally:
                        os.close(fd)
                    files[rel] = {"sha256": digest, "size": size, "mode": stat.S_IMODE(st.st_mode) & 0o777}
                elif stat.S_ISLNK(st.st_mode):
                    links[rel] = os.readlink(name, dir_fd=dfd)
                # FIFOs, sockets and device nodes are not content: skipped.

        restored = self.restored.get(str(work), {})
        top = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            walk(top, "")
        finally:
            os.close(top)
        manifest = {"format": _SNAPSHOT_FORMAT, "files": files, "dirs": dirs, "symlinks": links}
        raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        snapshot_id = hashlib.sha256(raw).hexdigest()
        path = self.manifests / f"{snapshot_id}.json"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            tmp.write_bytes(raw)
            os.replace(tmp, path)
        label_path = self.labels / f"{snapshot_id}.json"
        try:
            entries = json.loads(label_path.read_text())
        except (OSError, ValueError):
            entries = []
        entries.append({"label": label, "source": source, "created_at": time.time()})
        _write_json_atomic(label_path, entries)
        return snapshot_id

    def load(self, snapshot_id: str) -> dict[str, Any]:
        if not isinstance(snapshot_id, str) or len(snapshot_id) != 64 or not all(
                c in "0123456789abcdef" for c in snapshot_id):
            raise SandboxError(f"invalid snapshot id {snapshot_id!r}")
        try:
            raw = (self.manifests / f"{snapshot_id}.json").read_bytes()
        except FileNotFoundError:
            raise SandboxError(f"unknown snapshot {snapshot_id}") from None
        if hashlib.sha256(raw).hexdigest() != snapshot_id:
            raise SandboxError(f"snapshot {snapshot_id} is damaged (its manifest does not match its id)")
        manifest: dict[str, Any] = json.loads(raw)
        if manifest.get("format") != _SNAPSHOT_FORMAT:
            raise SandboxError(f"snapshot {snapshot_id} has unknown format {manifest.get('format')!r}")
        return manifest

    def restore(self, snapshot_id: str, work: Path, *, uid: int | None, gid: int | None) -> None:
        manifest = self.load(snapshot_id)
        owner = (uid, gid if gid is not None else uid) if uid is not None else None
        stamps: dict[str, tuple[int, int, int, int, int, str]] = {}
        for rel in sorted(manifest["dirs"], key=lambda p: p.count("/")):
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parts[-1], 0o700, dir_fd=dfd)
                if owner:
                    os.chown(parts[-1], *owner, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        for rel, entry in manifest["files"].items():
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            finally:
                os.close(dfd)
            try:
                h = hashlib.sha256()
                try:
                    src = open(self.object_path(entry["sha256"]), "rb")  # noqa: SIM115
                except FileNotFoundError:
                    raise SandboxError(f"snapshot {snapshot_id} is damaged: object of {rel!r} is missing") from None
                with src:
                    while chunk := src.read(1 << 20):
                        h.update(chunk)
                        _write_all(fd, chunk)
                if h.hexdigest() != entry["sha256"]:
                    raise SandboxError(f"snapshot {snapshot_id} is damaged: object of {rel!r} does not match")
                if owner:
                    os.fchown(fd, *owner)
                os.fchmod(fd, int(entry["mode"]) & 0o777)
                st = os.fstat(fd)
                stamps[rel] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, entry["sha256"])
            finally:
                os.close(fd)
        for rel, target in manifest["symlinks"].items():
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                os.symlink(target, parts[-1], dir_fd=dfd)
                if owner:
                    os.chown(parts[-1], *owner, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        for rel, entry in manifest["dirs"].items():  # modes last: a read-only dir must not block its own restore
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=False, uid=uid, gid=gid)
            try:
                os.chmod(parts[-1], int(entry["mode"]) & 0o777, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        if stamps:
            _outlast_tick(self.objects / "tmp", max(stamp[4] for stamp in stamps.values()))
            self.restored[str(work)] = stamps

    def forget(self, work: Path) -> None:
        """Drop what restore noted about ``work`` (the sandbox or staging directory is going away)."""
        self.restored.pop(str(work), None)


def _outlast_tick(probe_dir: Path, newest_ns: int) -> None:
    """Return once the file clock (the kernel's coarse clock: 1-4 ms ticks) has passed ``newest_ns``, so that any
    change to a restored file from now on gives it a later ctime than restore saw (the "racy git" problem). Read on
    a probe file in ``probe_dir``; bounded at 50 ms."""
    fd, probe = tempfile.mkstemp(dir=probe_dir)
    try:
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            os.fchmod(fd, 0o600)  # a metadata change: stamps ctime with the clock's current tick
            if os.fstat(fd).st_ctime_ns > newest_ns:
                return
            time.sleep(0.0005)
    finally:
        os.close(fd)
        os.unlink(probe)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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


async def _read_capped(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bool]:
    if stream is None:
        return b"", False
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(1 << 16):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True  # keep draining (the command must not block on a full pipe) but keep nothing
    return bytes(kept), truncated


# ------------------------------------------------------------------------------------------------------ backend ---


@dataclass
class _Meta:
    sandbox_id: str
    role: str
    run_id: str
    created_at: float
    isolation: str
    instance_size: str
    metadata: dict[str, Any]
    uid: int | None
    gid: int | None
    cgroups: list[str]
    state: str = "creating"
    owner_pid: int = 0
    init_pid: int | None = None
    init_start: int | None = None
    supervisor_pid: int | None = None
    supervisor_start: int | None = None


class LocalBackend:
    """Sandboxes on this machine, isolated with Linux namespaces (see the module docstring).

    Args:
        root_dir: Where sandboxes (``sandboxes/<id>/``) and snapshots (``snapshots/``) live. Created if missing.
        allow_unisolated: When namespaces cannot be used, run sandboxes as plain directories and subprocesses
            (recorded as ``metadata["isolation"] == "none"``) instead of raising :class:`IsolationUnavailable`.
        egress_proxy_url: ``http://HOST:PORT`` of the egress proxy on the host. Each sandbox then reaches exactly
            that endpoint through ``http://127.0.0.1:3128`` inside it (``metadata["egress_proxy"]``; see
            :func:`benchwright.sandbox.base.proxy_env`). Without it, sandboxes have no network at all.
        isolation: ``"auto"`` (namespaces, else per ``allow_unisolated``), ``"namespaces"``, or ``"none"``
            (requires ``allow_unisolated=True``; for hosts that cannot isolate, and for tests).
        use_cgroups: Use cgroups for limits when they are writable (else rlimits only).
        extra_ro_paths: More host paths to show read-only inside sandboxes at the same path (e.g. a dataset dir).
        instance_size: Size class recorded for cost; default ``local-<cores>cpu-<memory_mb of default limits>gb``.
        default_limits: The limits ``instance_size`` is derived from.
        tmp_size_mb: Size of each sandbox's private ``/tmp`` (and ``/dev/shm``) tmpfs.
    """

    name = "local"

    def __init__(self, root_dir: Path, *, allow_unisolated: bool = False, egress_proxy_url: str | None = None,
                 isolation: str = "auto", use_cgroups: bool = True, extra_ro_paths: Sequence[Path] = (),
                 instance_size: str | None = None, default_limits: ExecLimits | None = None,
                 tmp_size_mb: int = 512) -> None:
        if isolation not in ("auto", "namespaces", "none"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', not {isolation!r}")
        if isolation == "none" and not allow_unisolated:
            raise ValueError("isolation='none' needs allow_unisolated=True")
        self.root_dir = Path(root_dir).resolve()
        self.allow_unisolated = allow_unisolated
        self.egress_proxy_url = egress_proxy_url
        self._egress_target = _parse_proxy_url(egress_proxy_url) if egress_proxy_url else None
        self._egress: _EgressRelay | None = None
        self._egress_lock = threading.Lock()
        self._isolation: str | None = None if isolation == "auto" else isolation
        self._forced = isolation != "auto"
        self._isolation_error: str | None = None
        self.cgroups = _detect_cgroups() if use_cgroups else _Cgroups({}, None, set())
        self.extra_ro_paths = [Path(p) for p in extra_ro_paths]
        limits = default_limits or ExecLimits()
        self.instance_size = instance_size or (
            f"local-{os.cpu_count() or 1}cpu-{max(1, math.ceil(limits.memory_mb / 1024))}gb")
        self.tmp_size_mb = tmp_size_mb
        self._sandboxes_dir = self.root_dir / "sandboxes"
        self._sandboxes_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._sandboxes_dir, 0o700)
        self.snapshots = _SnapshotStore(self.root_dir / "snapshots")
        self._supervisors: dict[str, subprocess.Popen[bytes]] = {}
        self._running: dict[str, set[LocalProcess]] = {}
        self._killed: dict[str, float] = {}

    # -- isolation ----------------------------------------------------------------------------------------------

    @property
    def limit_mechanism(self) -> str:
        """How limits are enforced here, with what caps the CPU rate (``ExecLimits.cpu_cores``), e.g.
        ``"cgroup v1 (cpu, cpuacct, memory, pids) + rlimits; CPU rate capped by cgroup v1 cpu.cfs_quota_us
        (period 100000 us)"`` or ``"...; CPU rate NOT capped (...)"``."""
        if not self.cgroups.controllers:
            return ("rlimits only (RLIMIT_AS, RLIMIT_NPROC per sandbox uid, RLIMIT_CPU, RLIMIT_FSIZE); "
                    f"{self.cgroups.describe_cpu_rate()}")
        return f"{self.cgroups.describe()} + rlimits; {self.cgroups.describe_cpu_rate()}"

    def _static_unavailable_reason(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return f"Linux namespaces are not available on {sys.platform}"
        if os.geteuid() != 0:
            return ("creating mount/PID/network namespaces and dropping to a per-sandbox uid needs root "
                    f"(CAP_SYS_ADMIN); this process runs as uid {os.geteuid()}")
        for kind in ("uid", "gid"):
            if not _id_map_covers(Path(f"/proc/self/{kind}_map"), UID_BASE, UID_BASE + _UID_SPAN):
                return (f"this process runs in a user namespace whose {kind} map does not include the sandbox "
                        f"{kind}s {UID_BASE}-{UID_BASE + _UID_SPAN - 1} (rootless container?)")
        return None

    def _unavailable(self, detail: str) -> IsolationUnavailable:
        return IsolationUnavailable(
            f"Linux namespace isolation is unavailable on this host: {detail}. The operator may opt into running "
            f"sandboxes without isolation with LocalBackend(..., allow_unisolated=True) (runs then record "
            f"isolation='none').")

    # -- paths and metadata -------------------------------------------------------------------------------------

    def _dir(self, sandbox_id: str) -> Path:
        if not sandbox_id.startswith("sb-") or not all(c in "0123456789abcdef" for c in sandbox_id[3:]) \
                or len(sandbox_id) != 19:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r} (not a local sandbox id)")
        return self._sandboxes_dir / sandbox_id

    def _load_meta(self, sandbox_id: str) -> _Meta | None:
        d = self._dir(sandbox_id)
        try:
            raw = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        meta = _Meta(**{k: v for k, v in raw.items() if k in _Meta.__dataclass_fields__})
        if meta.isolation == "namespaces" and meta.init_pid is None:
            # Created by a process that died before it could record the init: the supervisor wrote it.
            with contextlib.suppress(OSError, ValueError):
                pids = json.loads((d / "ctl" / "pids.json").read_text())
                for key in ("init_pid", "init_start", "supervisor_pid", "supervisor_start"):
                    setattr(meta, key, pids.get(key))
        return meta

    def _save_meta(self, meta: _Meta) -> None:
        _write_json_atomic(self._dir(meta.sandbox_id) / "meta.json", asdict(meta))

    def _info(self, meta: _Meta) -> SandboxInfo:
        return SandboxInfo(sandbox_id=meta.sandbox_id, role=meta.role, backend=self.name,
                           created_at=meta.created_at, metadata=dict(meta.metadata),
                           root=self._dir(meta.sandbox_id) / "work", instance_size=meta.instance_size)

    def _is_alive(self, meta: _Meta) -> bool:
        if meta.isolation == "namespaces":
            return _alive(meta.init_pid, meta.init_start)
        return meta.state == "ready"

    def _live_meta(self, sandbox_id: str) -> _Meta:
        meta = self._load_meta(sandbox_id)
        if meta is None or meta.state != "ready" or not self._is_alive(meta):
            raise SandboxNotFound(f"no live sandbox {sandbox_id!r}")
        return meta

    # -- create -------------------------------------------------------------------------------------------------

    def _egress_relay(self) -> _EgressRelay | None:
        if self._egress_target is None:
            return None
        with self._egress_lock:
            if self._egress is None:
                self._egress = _EgressRelay(*self._egress_target)
            return self._egress

    def _root_layout(self, uid: int, gid: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]],
                                                        dict[str, str]]:
        binds: list[tuple[str, str]] = []
        links: list[tuple[str, str]] = []
        for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                links.append((os.readlink(top), top))
            elif os.path.isdir(top):
                binds.append((top, top))
        for name in _ETC_WHITELIST:
            path = f"/etc/{name}"
            if os.path.islink(path):
                links.append((os.readlink(path), path))
            elif os.path.exists(path):
                binds.append((path, path))
        wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
        wanted |= {str(p) for p in self.extra_ro_paths}
        for path in sorted({os.path.realpath(p) for p in wanted if p}):
            if not os.path.exists(path) or any(path == b or path.startswith(b.rstrip("/") + "/") for b, _ in binds):
                continue
            binds.append((path, path))
        etc = {
            "passwd": (f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:sandbox:{WORK_INSIDE}:"
                       f"/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
            "group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            "hostname": "sandbox\n",
        }
        return binds, links, etc

    async def create(self, *, role: str, run_id: str, snapshot_id: str | None = None,
                     metadata: Mapping[str, Any] | None = None) -> SandboxInfo:
        """Create a sandbox (see :meth:`benchwright.sandbox.base.SandboxBackend.create`).

        Args:
            role: One of ``ROLES``.
            run_id: The run it belongs to (``metadata["benchwright_run_id"]``; what ``reap`` predicates look at).
            snapshot_id: Restore that snapshot's files into the new work directory.
            metadata: Extra metadata to record (``benchwright_*`` keys are set by the backend).

        Returns:
            The new sandbox's info; ``metadata["isolation"]`` is ``"namespaces"`` or ``"none"``.

        Raises:
            ValueError: unknown role.
            IsolationUnavailable: namespaces cannot be used and ``allow_unisolated`` is False.
            SandboxError: the snapshot is unknown/damaged or the sandbox could not be started (for any reason
                other than the host refusing namespaces; the message names it).
        """
        if role not in ROLES:
            raise ValueError(f"unknown sandbox role {role!r}; expected one of {', '.join(ROLES)}")
        if self._isolation is None or self._isolation == "namespaces":
            reason = self._static_unavailable_reason()
            if reason is not None:
                if not self.allow_unisolated or self._forced:
                    raise self._unavailable(reason)
                self._fall_back(reason)
        if snapshot_id is not None:
            self.snapshots.load(snapshot_id)  # fail before creating anything
        sandbox_id = f"sb-{secrets.token_hex(8)}"
        isolation = self._isolation or "namespaces"
        uid = UID_BASE + int(sandbox_id[3:11], 16) % _UID_SPAN
        meta = _Meta(sandbox_id=sandbox_id, role=role, run_id=run_id, created_at=time.time(), isolation=isolation,
                     instance_size=self.instance_size, metadata={}, uid=uid if isolation == "namespaces" else None,
                     gid=uid if isolation == "namespaces" else None,
                     cgroups=[str(p) for p in self.cgroups.sandbox_dirs(sandbox_id)], owner_pid=os.getpid())
        meta.metadata = self._metadata(meta, metadata)
        d = self._dir(sandbox_id)
        try:
            await asyncio.to_thread(self._prepare_dirs, meta, snapshot_id)
            if isolation == "namespaces":
                report = await asyncio.to_thread(self._start_init, meta)
                if not report.get("ok"):
                    await asyncio.to_thread(self._destroy, meta)
                    detail = _failure_detail(report)
                    if not _is_capability_failure(report):
                        # A failure of this sandbox (load, resources, a crash): neither "unavailable on this
                        # host" nor a reason to silently drop isolation for every later sandbox.
                        raise SandboxError(f"cannot create sandbox {sandbox_id}: {detail}")
                    if not self.allow_unisolated or self._forced:
                        raise self._unavailable(detail)
                    self._fall_back(detail)
                    return await self.create(role=role, run_id=run_id, snapshot_id=snapshot_id, metadata=metadata)
                self._isolation = "namespaces"
            meta.state = "ready"
            self._save_meta(meta)
        except BaseException as exc:
            if d.exists() and meta.state != "ready":
                await asyncio.to_thread(self._destroy, meta)
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot create sandbox {sandbox_id}: {exc}") from exc
            raise
        return self._info(meta)

    def _reap_supervisors(self) -> None:
        """Collect the exit status of supervisors whose sandbox ended (e.g. killed through another instance)."""
        for sandbox_id, sup in list(self._supervisors.items()):
            if sup.poll() is not None:
                self._supervisors.pop(sandbox_id, None)

    def _fall_back(self, reason: str) -> None:
        if self._isolation != "none":
            log.warning("sandbox isolation unavailable (%s); running sandboxes WITHOUT isolation as allowed "
                        "(allow_unisolated=True)", reason)
        self._isolation = "none"
        self._isolation_error = reason

    def _metadata(self, meta: _Meta, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        md = dict(extra or {})
        md.update({"benchwright_role": meta.role, "benchwright_run_id": meta.run_id, "isolation": meta.isolation,
                   "owner_pid": meta.owner_pid, "limits": self.limit_mechanism})
        if meta.uid is not None:
            md["sandbox_uid"] = meta.uid
        if meta.isolation == "namespaces" and self._egress_target is not None:
            md["egress_proxy"] = f"http://127.0.0.1:{EGRESS_PORT}"
        if meta.isolation == "none":
            md["isolation_error"] = self._isolation_error
            if self._egress_target is not None:  # no namespace to confine it: the host proxy, reached directly
                md["egress_proxy"] = f"http://{self._egress_target[0]}:{self._egress_target[1]}"
        return md

    def _prepare_dirs(self, meta: _Meta, snapshot_id: str | None) -> None:
        d = self._dir(meta.sandbox_id)
        d.mkdir(mode=0o700)
        for sub in ("work", "rootfs", "ctl"):
            (d / sub).mkdir(mode=0o700)
        os.chmod(d / "rootfs", 0o755)
        if meta.uid is not None:
            os.chown(d / "work", meta.uid, meta.gid or meta.uid)
        self._save_meta(meta)  # from here on a reaper can see it
        if snapshot_id is not None:
            self.snapshots.restore(snapshot_id, d / "work", uid=meta.uid, gid=meta.gid)

    def _start_init(self, meta: _Meta) -> dict[str, Any]:
        d = self._dir(meta.sandbox_id)
        relay = self._egress_relay()
        assert meta.uid is not None and meta.gid is not None
        binds, links, etc = self._root_layout(meta.uid, meta.gid)
        cfg = {"rootfs": str(d / "rootfs"), "work_dir": str(d / "work"), "log": str(d / "ctl" / "init.log"),
               "pidfile": str(d / "ctl" / "pids.json"), "ro_binds": binds, "symlinks": links, "etc_files": etc,
               "tmp_size_mb": self.tmp_size_mb, "shm_size_mb": min(self.tmp_size_mb, 64), "hostname": "sandbox",
               "egress_socket": str(relay.socket_path) if relay else None,
               "egress_port": EGRESS_PORT if relay else None}
        cfg_path = d / "ctl" / f"init-{secrets.token_hex(4)}.cfg"
        _write_config(cfg_path, cfg)
        self._reap_supervisors()
        with open(d / "ctl" / "init.log", "ab") as log_fh:
            proc = subprocess.Popen(
                [sys.executable, "-E", "-s", "-S", str(HELPER), "init", str(cfg_path)], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=log_fh, env={}, start_new_session=True, close_fds=True)
        assert proc.stdout is not None
        # poll, not select: a busy worker can hold more than FD_SETSIZE (1024) descriptors.
        poller = select.poll()
        poller.register(proc.stdout, select.POLLIN)
        ready = poller.poll(int(_START_TIMEOUT_S * 1000))
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        try:
            report = json.loads(line) if line.strip() else {}
        except ValueError:
            report = {}
        if not report:
            proc.kill()
            proc.wait()
            tail = (d / "ctl" / "init.log").read_text(errors="replace")[-800:].strip()
            why = (f"the sandbox init did not report within {_START_TIMEOUT_S:g} s" if not ready
                   else f"the sandbox init exited with status {proc.returncode} without reporting")
            return {"ok": False, "step": "start", "error": f"{why}: {tail}" if tail else why}
        for key in ("init_pid", "init_start", "supervisor_pid", "supervisor_start"):
            setattr(meta, key, report.get(key))
        if not report.get("ok"):
            proc.wait()
            return report
        self._supervisors[meta.sandbox_id] = proc
        return report

    # -- exec / spawn -------------------------------------------------------------------------------------------

    async def _start(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], limits: ExecLimits,
                     wall_seconds: float, stdin_pipe: bool) -> LocalProcess:
        if not argv:
            raise ValueError("argv must not be empty")
        meta = self._live_meta(sandbox_id)
        d = self._dir(sandbox_id)
        cg = await asyncio.to_thread(self.cgroups.create_exec, sandbox_id, limits) if self.cgroups.controllers \
            else _ExecCgroup([], [], None, None)
        controllers = self.cgroups.controllers
        ns = meta.isolation == "namespaces"
        status_r, status_w = os.pipe()
        cfg = {"mode": meta.isolation, "init_pid": meta.init_pid, "init_start": meta.init_start,
               "cwd": WORK_INSIDE if ns else str(d / "work"), "uid": meta.uid, "gid": meta.gid,
               "argv": [str(a) for a in argv], "env": {str(k): str(v) for k, v in env.items()},
               "limits": asdict(limits), "wall_seconds": wall_seconds, "status_fd": status_w,
               "cgroup_procs": cg.procs, "cpu_usage": cg.cpu_usage, "oom_file": cg.oom_file,
               "rlimit_as": "memory" not in controllers, "rlimit_nproc": "pids" not in controllers}
        cfg_path = d / "ctl" / f"exec-{secrets.token_hex(6)}.cfg"
        loop = asyncio.get_running_loop()
        try:
            _write_config(cfg_path, cfg)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-E", "-s", "-S", str(HELPER), "enter", str(cfg_path),
                stdin=asyncio.subprocess.PIPE if stdin_pipe else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, pass_fds=(status_w,), env={},
                start_new_session=True, limit=_STREAM_LIMIT)
        except BaseException:
            os.close(status_r)
            os.close(status_w)
            with contextlib.suppress(OSError):
                cfg_path.unlink()
            await asyncio.to_thread(_remove_cgroups, cg.dirs)
            raise
        os.close(status_w)
        status = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(status),
                                                    os.fdopen(status_r, "rb", buffering=0))
        running = self._running.setdefault(sandbox_id, set())

        def _done() -> None:
            running.discard(handle)
            _remove_cgroups(cg.dirs)

        handle = LocalProcess(proc, status, transport, limits=limits, on_done=_done, started_at=time.monotonic())
        running.add(handle)
        try:
            first = await asyncio.wait_for(status.readline(), _START_TIMEOUT_S)
        except TimeoutError:
            first = b""
        event = json.loads(first) if first.strip() else {}
        if event.get("event") != "started":
            handle._hard_kill("start_failed")
            await handle.wait()
            detail = event.get("error")
            if not detail:
                err = await proc.stderr.read() if proc.stderr is not None else b""
                detail = err.decode(errors="replace")[-800:].strip() or "the sandbox helper did not start"
            if "sandbox killed" in detail:
                raise SandboxNotFound(f"no live sandbox {sandbox_id!r}: {detail}")
            raise SandboxError(f"cannot run {list(argv)[:1]} in sandbox {sandbox_id}: {detail}")
        return handle

    async def exec(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
                   limits: ExecLimits, stdin: bytes | None = None) -> ExecResult:
        """Run a short command to completion in the sandbox.

        Args:
            sandbox_id: The sandbox.
            argv: Command and arguments; ``argv[0]`` is looked up on ``env["PATH"]`` inside the sandbox.
            env: The command's entire environment (nothing of the host's is added).
            timeout_s: Wall-clock limit for this call; the effective one is ``min(timeout_s, limits.wall_seconds)``.
            limits: Resource limits.
            stdin: Bytes fed to its standard input (then closed); None for /dev/null.

        Returns:
            How it ended, with stdout/stderr capped at ``limits.max_output_bytes`` each.

        Raises:
            SandboxNotFound: no such live sandbox.
            SandboxError: it could not be started.
        """
        wall = max(0.001, min(float(timeout_s), float(limits.wall_seconds)))
        proc = await self._start(sandbox_id, argv, env=env, limits=limits, wall_seconds=wall,
                                 stdin_pipe=stdin is not None)
        feeder = asyncio.create_task(self._feed(proc, stdin)) if stdin is not None else None
        out_task = asyncio.create_task(_read_capped(proc.stdout, limits.max_output_bytes))
        err_task = asyncio.create_task(_read_capped(proc.stderr, limits.max_output_bytes))
        try:
            try:
                await asyncio.wait_for(asyncio.shield(proc._proc.wait()), wall + _HOST_GRACE_S)
            except TimeoutError:
                proc._hard_kill("wall_clock")
            await proc.wait()
            # A process that escaped the command's namespace could hold the pipes open; do not wait for it forever.
            done, pending = await asyncio.wait({out_task, err_task}, timeout=2.0)
            for task in pending:
                task.cancel()
            out, out_trunc = out_task.result() if out_task in done else (b"", False)
            err, err_trunc = err_task.result() if err_task in done else (b"", False)
        finally:
            for leftover in (out_task, err_task, feeder):
                if leftover is not None and not leftover.done():
                    leftover.cancel()
            if proc.returncode is None:
                proc._hard_kill("cancelled")
                with contextlib.suppress(Exception):
                    await asyncio.shield(proc.wait())
        assert proc.returncode is not None
        return ExecResult(returncode=proc.returncode, stdout=out, stderr=err, timed_out=proc.timed_out,
                          killed_reason=proc.killed_reason, stdout_truncated=out_trunc, stderr_truncated=err_trunc,
                          duration_s=proc.duration_s, cpu_seconds=proc.cpu_seconds)

    @staticmethod
    async def _feed(proc: LocalProcess, data: bytes) -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(data)
            await proc.stdin.drain()
        with contextlib.suppress(Exception):
            proc.stdin.close()

    async def spawn(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str],
                    limits: ExecLimits) -> LocalProcess:
        """Start a long-lived command with stdin/stdout/stderr pipes (e.g. the scorer runner).

        The wall clock (``limits.wall_seconds``) counts from now; the other limits apply as for :meth:`exec`.
        The stdout/stderr readers accept lines of up to 64 MiB. Call ``wait()`` (after ``kill()`` if need be) to
        release its cgroup; ``kill(sandbox_id)`` releases everything anyway.

        Raises:
            SandboxNotFound: no such live sandbox.
            SandboxError: it could not be started.
        """
        return await self._start(sandbox_id, argv, env=env, limits=limits, wall_seconds=float(limits.wall_seconds),
                                 stdin_pipe=True)

    # -- files --------------------------------------------------------------------------------------------------

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` in the work directory (parents created; owned by the sandbox's user).

        Raises:
            SandboxPathError: ``path`` leaves the work directory or crosses a symlink.
            SandboxNotFound: no such sandbox.
        """
        parts = _split_relpath(path)
        meta = self._live_meta(sandbox_id)
        await asyncio.to_thread(self._write_file_sync, meta, parts, bytes(data), mode)

    def _write_file_sync(self, meta: _Meta, parts: list[str], data: bytes, mode: int) -> None:
        _write_file_into(self._dir(meta.sandbox_id) / "work", parts, data, mode=mode, uid=meta.uid, gid=meta.gid)

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        """Read ``path`` from the work directory.

        Raises:
            SandboxPathError: ``path`` leaves the work directory or crosses a symlink.
            FileNotFoundError: no such file.
            SandboxNotFound: no such sandbox.
        """
        parts = _split_relpath(path)
        meta = self._live_meta(sandbox_id)
        return await asyncio.to_thread(self._read_file_sync, meta, parts)

    def _read_file_sync(self, meta: _Meta, parts: list[str]) -> bytes:
        dfd = _open_parent(self._dir(meta.sandbox_id) / "work", parts, create=False, uid=None, gid=None)
        try:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == 40:  # ELOOP
                    raise SandboxPathError(f"{'/'.join(parts)!r} is a symlink; not followed") from exc
                raise
        finally:
            os.close(dfd)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxPathError(f"{'/'.join(parts)!r} is not a regular file")
            return fh.read()

    # -- snapshots ----------------------------------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, *, label: str) -> str:
        """Capture the sandbox's work directory; returns the snapshot id (sha256 of its manifest).

        Files are stored once by content; symlinks are recorded, never followed; FIFOs/sockets/devices skipped.
        """
        meta = self._live_meta(sandbox_id)
        return await asyncio.to_thread(self.snapshots.capture, self._dir(sandbox_id) / "work", label=label,
                                       source=meta.sandbox_id)

    async def snapshot_files(self, files: Mapping[str, bytes], *, label: str, base: str | None = None) -> str:
        """A snapshot of ``base``'s files (none if not given) plus ``files``, made without a live sandbox.

        It is the snapshot a sandbox would give after ``create(snapshot_id=base)`` and a ``write_file`` of each
        file (same modes, so the same id), for phases that only put files in place and run nothing: no
        namespaces, processes or cgroups are set up for it.

        Raises:
            SandboxPathError: a path would leave the work directory.
            SandboxError: ``base`` is unknown or damaged.
        """
        return await asyncio.to_thread(self._snapshot_files_sync, dict(files), label, base)

    def _snapshot_files_sync(self, files: dict[str, bytes], label: str, base: str | None) -> str:
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=self.snapshots.root))
        try:
            if base is not None:
                self.snapshots.restore(base, staging, uid=None, gid=None)
            for path, data in files.items():  # as write_file would, with its default mode
                _write_file_into(staging, _split_relpath(path), data, mode=0o644, uid=None, gid=None)
            return self.snapshots.capture(staging, label=label, source="files")
        finally:
            self.snapshots.forget(staging)
            shutil.rmtree(staging, ignore_errors=True)

    # -- kill / list / reap -------------------------------------------------------------------------------------

    async def kill(self, sandbox_id: str) -> float:
        """Kill every process of the sandbox and remove its directory; returns its lifetime in seconds.

        Idempotent: killing a killed (or unknown) sandbox returns the recorded lifetime (0.0 if unknown here).
        """
        if sandbox_id in self._killed:
            return self._killed[sandbox_id]
        try:
            meta = self._load_meta(sandbox_id)
        except SandboxNotFound:  # not even a local sandbox id: nothing to kill
            return 0.0
        if meta is None:
            return 0.0
        for handle in list(self._running.get(sandbox_id, ())):
            handle._signal_helper("sandbox_killed")
        lifetime = await asyncio.to_thread(self._destroy, meta)
        self._killed[sandbox_id] = lifetime
        for handle in list(self._running.pop(sandbox_id, ())):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.wait(), 10)
        return lifetime

    def _destroy(self, meta: _Meta) -> float:
        d = self._dir(meta.sandbox_id)
        if meta.isolation == "namespaces":
            if meta.init_pid is None:
                meta = self._load_meta(meta.sandbox_id) or meta  # maybe the supervisor recorded it
            _kill_verified(meta.init_pid, meta.init_start)
            _kill_verified(meta.supervisor_pid, meta.supervisor_start)
            deadline = time.monotonic() + 10
            # The PID namespace is gone once its init is: the kernel kills and reaps every member first.
            while _alive(meta.init_pid, meta.init_start) and time.monotonic() < deadline:
                time.sleep(0.005)
        _remove_cgroups(meta.cgroups)
        sup = self._supervisors.pop(meta.sandbox_id, None)
        if sup is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                sup.wait(timeout=5)
        self.snapshots.forget(d / "work")
        shutil.rmtree(d, ignore_errors=True)
        return max(0.0, time.time() - meta.created_at)

    def _all_meta(self) -> Iterator[_Meta]:
        try:
            names = sorted(os.listdir(self._sandboxes_dir))
        except OSError:
            return
        for name in names:
            with contextlib.suppress(SandboxNotFound):
                meta = self._load_meta(name)
                if meta is not None:
                    yield meta

    async def list_alive(self) -> list[SandboxInfo]:
        """Every live sandbox under ``root_dir``, whichever process created it."""
        metas = await asyncio.to_thread(lambda: [m for m in self._all_meta() if m.state == "ready"
                                                 and self._is_alive(m)])
        return [self._info(m) for m in metas]

    async def reap(self, is_orphan: Callable[[SandboxInfo], bool]) -> list[str]:
        """Kill the sandboxes ``is_orphan`` picks, alive or left half-dead by a crash; returns their ids.

        Every sandbox directory under ``root_dir`` is offered, including ones whose init already died (a crashed
        host) or whose creator died mid-``create``, so their directories and cgroups are released too.
        """
        metas = await asyncio.to_thread(lambda: list(self._all_meta()))
        reaped = []
        for meta in metas:
            if is_orphan(self._info(meta)):
                await self.kill(meta.sandbox_id)
                reaped.append(meta.sandbox_id)
        return reaped

    async def close(self) -> None:
        """Stop the egress relay and forget child handles. Sandboxes stay alive (``kill``/``reap`` end them)."""
        self._reap_supervisors()
        if self._egress is not None:
            self._egress.close()
            self._egress = None


__all__ = ["EGRESS_PORT", "LocalBackend", "LocalProcess"]
