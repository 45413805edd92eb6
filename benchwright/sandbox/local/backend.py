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
  (null, zero, full, random, urandom, tty, a private ``/dev/shm``, a devpts instance of its own with at most 64
  ptys, for terminal programs such as tmux), a fresh ``/proc``, a private ``/tmp`` tmpfs and
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
``manifests/<id>.json`` is the canonical JSON manifest (path -> sha256, size, mode; directories; symlinks), and its own
sha256 is the snapshot id; ``labels/<id>.jsonl`` records who made it, one line per record (label, source, time;
appended, so a record costs the same at a benchmark's 100,000th run as at its first; ``labels/<id>.json``, a list
rewritten whole, is what versions before 2026-12-06 wrote; both are for people, no code reads them). Everything is on
disk: any backend on the same ``root_dir`` restores any snapshot. Capture and restore never follow symlinks in the work
directory. A capture does not re-read a file its own store restored and nothing has touched since (same inode, size,
mtime and ctime; restore outlasts the file clock's tick, so any later change moves ctime): the re-run bench's Atomize
snapshot of a 52 MB dataset went from ~0.2 s to ~0 s of hashing and copying. A namespaced sandbox gets its large files
(>= 1 MiB, no execute bit) as **hard links** to their objects rather than copies (~0.25 s -> ~0.1 ms for that dataset,
per sandbox): the shared inode is root-owned and 0444, so the sandbox's uid can read it and replace or delete its name
but never write it (no write permission; chmod, utime and xattrs need the owner); the backend's own writes
(``write_file``) never write in place a file that has other links; a capture records such a file by its object (the mode
in the manifest is the restored one, so an untouched sandbox snapshots to the same id). An object is hashed against its
name once per process before it is first linked (``benchwright.data.digests`` remembers it). Unisolated sandboxes run
commands as the worker's uid, so they get copies.

Not isolated here (known limits): no seccomp filter (the full syscall surface of the kernel is reachable, including
creating user namespaces inside the sandbox, which grants nothing over host files since they are not mounted); disk
use of ``work/`` is bounded only per file (``max_file_mb``); the CPU *rate* is capped only where a ``cpu``
controller is usable (see **Limits**; otherwise only CPU seconds are); the sandbox's own helpers (its init, the
egress forwarder) run in the worker's cgroups, outside the commands' limits.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from benchwright.aio import uncancellable
from benchwright.sandbox.base import (
    ROLES,
    ExecLimits,
    ExecResult,
    IsolationUnavailable,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SandboxPathError,
    read_capped,
)
from benchwright.sandbox.local.cgroups import _Cgroups, _detect_cgroups, _ExecCgroup, _remove_cgroups
from benchwright.sandbox.local.process import LocalProcess
from benchwright.sandbox.local.relay import _EgressRelay, _parse_proxy_url
from benchwright.sandbox.local.snapshots import _SnapshotStore, _write_file_into
from benchwright.sandbox.local.util import (
    WORK_INSIDE,
    _alive,
    _failure_detail,
    _id_map_covers,
    _is_capability_failure,
    _kill_verified,
    _open_parent,
    _split_relpath,
    _write_config,
    _write_json_atomic,
)
from benchwright.sandbox.local.warm import (
    MAX_AGE_S,
    WAIT_TIMEOUT_S,
    WARM_ROLE,
    RuntimeSpec,
    WaitingRuntime,
    WarmSandbox,
    warm_pool,
)
from benchwright.stack.cpu import spawning

log = logging.getLogger(__name__)

HELPER = Path(__file__).with_name("_nsexec.py")
EGRESS_PORT = 3128
"""The forwarder's port inside every sandbox's network namespace (127.0.0.1:3128)."""
UID_BASE = 2_000_000
_UID_SPAN = 1_000_000
_STREAM_LIMIT = 64 * 1024 * 1024  # same line limit the scorer host uses on the runner's stdout
_START_TIMEOUT_S = 30.0
_HOST_GRACE_S = 5.0  # the helper enforces the wall clock; the backend steps in only if the helper itself hangs
ROOT_LINKS_KEY = "root_links"
"""``metadata["root_links"]`` of ``create``: top-level names shown as symlinks into the work directory (``/logs`` ->
``/sandbox/logs``), for task environments that expect fixed absolute paths (harbor's ``/tests``, ``/logs``,
``/solution`` and the task's workdir); namespaces isolation only (the root is otherwise the host's)."""
_ROOT_LINK_RESERVED = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp",
                                 "sandbox", "run", "sys", "root", "boot"})


def _root_links(names: object) -> list[tuple[str, str]]:
    """The (target, link) pairs ``metadata["root_links"]`` asks for.

    Raises:
        ValueError: not a list of at most 16 plain lowercase names, or a name the root already uses.
    """
    if names is None:
        return []
    if not isinstance(names, list) or len(names) > 16:
        raise ValueError("root_links must be a list of at most 16 names")
    links = []
    for name in names:
        if (not isinstance(name, str) or not name or len(name) > 32 or name in _ROOT_LINK_RESERVED
                or not all(c.isascii() and (c.islower() or c.isdigit() or c in "_-") for c in name)
                or not name[0].isalpha()):
            raise ValueError(f"root link {name!r} must be a plain lowercase top-level name the root does not use")
        links.append((f"{WORK_INSIDE}/{name}", f"/{name}"))
    return links


_ETC_WHITELIST = ("alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf",
                  "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "mime.types",
                  "nsswitch.conf", "os-release", "protocols", "services", "ssl", "timezone")


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
    """``creating``, ``ready``, or ``ended`` (killed, its remains not yet removed: ``kill(..., remains="later")``)."""
    owner_pid: int = 0
    init_pid: int | None = None
    init_start: int | None = None
    supervisor_pid: int | None = None
    supervisor_start: int | None = None


_ENDING: set[asyncio.Task[None]] = set()
"""Sandboxes killed with ``remains="later"`` whose remains are still being removed (any ``LocalBackend`` of this
process)."""


def _ended(task: asyncio.Task[None]) -> None:
    _ENDING.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("removing a killed sandbox's remains failed", exc_info=task.exception())


async def settle_kills() -> None:
    """Wait until the remains of every sandbox killed with ``remains="later"`` on this event loop are removed.
    (Another loop's removals are its own; one that closed before they ended left them to the next reap.)"""
    loop = asyncio.get_running_loop()
    while mine := [task for task in _ENDING if task.get_loop() is loop and not task.done()]:
        await asyncio.gather(*mine, return_exceptions=True)
    for task in [task for task in _ENDING if task.get_loop().is_closed()]:
        _ENDING.discard(task)


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
        self._relays: dict[str, _EgressRelay] = {}
        """Adopted warm sandboxes' own egress relays (the others share ``_egress``)."""
        self._waiting: dict[str, WaitingRuntime] = {}
        """Adopted warm sandboxes' runtimes, until ``spawn`` hands them over or starts another."""

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

        A warm sandbox of the worker's pool on this root (``benchwright.sandbox.local.warm``) is claimed instead of
        making one when there is one ready and the sandbox needs nothing a warm one lacks (extra host paths, root
        links); its ``metadata["warm"]`` is then True.

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
        pool = warm_pool(self.root_dir) if self._isolation in (None, "namespaces") and not self.extra_ro_paths \
            and not (metadata or {}).get(ROOT_LINKS_KEY) else None
        warm = pool.take() if pool is not None else None
        if warm is not None and not self._is_alive(warm.meta):  # its init ended while it waited: made on demand
            await self.discard_warm(warm)
            warm = None
        if warm is not None:
            try:
                return await self._adopt(warm, role=role, run_id=run_id, snapshot_id=snapshot_id, metadata=metadata)
            except (OSError, SandboxError) as exc:
                log.warning("cannot adopt warm sandbox %s (%s); creating one", warm.meta.sandbox_id, exc)
                await self.discard_warm(warm)
            except BaseException:  # cancelled mid-adoption: neither the run's nor the pool's, so killed now
                await uncancellable(self.discard_warm(warm))
                raise
        sandbox_id = f"sb-{secrets.token_hex(8)}"
        isolation = self._isolation or "namespaces"
        uid = UID_BASE + int(sandbox_id[3:11], 16) % _UID_SPAN
        meta = _Meta(sandbox_id=sandbox_id, role=role, run_id=run_id, created_at=time.time(), isolation=isolation,
                     instance_size=self.instance_size, metadata={}, uid=uid if isolation == "namespaces" else None,
                     gid=uid if isolation == "namespaces" else None,
                     cgroups=[str(p) for p in self.cgroups.sandbox_dirs(sandbox_id)], owner_pid=os.getpid())
        meta.metadata = self._metadata(meta, metadata)
        _root_links(meta.metadata.get(ROOT_LINKS_KEY))  # refused before anything is created
        d = self._dir(sandbox_id)
        try:
            # Both waited out when the caller is cancelled (a halt mid-create): the cleanup below must not race a
            # thread still starting the init, or it can remove the directory of an init it never saw and leave that
            # init running for good (seen once in CI).
            await uncancellable(asyncio.to_thread(self._prepare_dirs, meta, snapshot_id))
            if isolation == "namespaces":
                report = await uncancellable(asyncio.to_thread(self._start_init, meta))
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

    # -- warm sandboxes (benchwright.sandbox.local.warm) ----------------------------------------------------------

    async def create_warm(self, runtime: RuntimeSpec | None) -> WarmSandbox:
        """A namespaced sandbox of no run, its egress relay without a target, ``runtime`` waiting in it (if
        given): what a :class:`~benchwright.sandbox.local.warm.WarmPool` keeps ready.

        Raises:
            IsolationUnavailable: namespaces cannot be used here (a warm sandbox is never unisolated).
            SandboxError: it could not be made.
        """
        reason = self._static_unavailable_reason()
        if reason is not None or self._isolation == "none":
            raise self._unavailable(reason or "this backend runs without isolation")
        sandbox_id = f"sb-{secrets.token_hex(8)}"
        uid = UID_BASE + int(sandbox_id[3:11], 16) % _UID_SPAN
        meta = _Meta(sandbox_id=sandbox_id, role=WARM_ROLE, run_id="", created_at=time.time(),
                     isolation="namespaces", instance_size=self.instance_size, metadata={}, uid=uid, gid=uid,
                     cgroups=[str(p) for p in self.cgroups.sandbox_dirs(sandbox_id)], owner_pid=os.getpid())
        meta.metadata = self._metadata(meta, None)
        relay = _EgressRelay(None)
        lifeline_r, lifeline_w = os.pipe()  # both close-on-exec: the init's supervisor alone is handed the read end
        made = False
        try:
            await uncancellable(asyncio.to_thread(self._prepare_dirs, meta, None))  # as in create
            report = await uncancellable(asyncio.to_thread(self._start_init, meta, relay, lifeline_r))
            if not report.get("ok"):
                raise SandboxError(f"cannot create warm sandbox {sandbox_id}: {_failure_detail(report)}")
            meta.state = "ready"
            self._save_meta(meta)
            waiting = await self.start_waiting(meta, runtime) if runtime is not None else None
            made = True
            return WarmSandbox(meta=meta, supervisor=self._supervisors.pop(sandbox_id), relay=relay, runtime=waiting,
                               lifeline=lifeline_w)
        finally:
            os.close(lifeline_r)
            if not made:
                os.close(lifeline_w)
                await asyncio.to_thread(self._destroy, meta)
                relay.close()

    async def start_waiting(self, meta: _Meta, spec: RuntimeSpec) -> WaitingRuntime:
        """``spec``'s runtime started in a warm sandbox and waiting (its script and primer removed again once read)."""
        files = {"runner.py": spec.source, **({"prime.py": spec.prime} if spec.prime else {})}
        for name, data in files.items():
            await self.write_file(meta.sandbox_id, name, data)
        argv = [*spec.argv, "--wait", *(["--prime", "prime.py"] if spec.prime else [])]
        limits = replace(spec.limits, wall_seconds=spec.limits.wall_seconds + MAX_AGE_S)
        proc = await self._start(meta.sandbox_id, argv, env=spec.env, limits=limits,
                                 wall_seconds=float(limits.wall_seconds), stdin_pipe=True)
        self._running.get(meta.sandbox_id, set()).discard(proc)  # the claiming backend tracks it from then on
        waiting = WaitingRuntime(process=proc, spec=spec)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT_TIMEOUT_S)
            if json.loads(line or b"{}").get("op") != "waiting":
                raise SandboxError(f"the waiting runtime did not start: {line[:200]!r}")
            work = self._dir(meta.sandbox_id) / "work"
            for name in files:
                await asyncio.to_thread(os.unlink, work / name)
        except SandboxError:
            await waiting.discard()
            raise
        except (TimeoutError, ValueError, OSError) as exc:
            await waiting.discard()
            raise SandboxError(f"the waiting runtime did not start: {exc!r}") from exc
        return waiting

    async def discard_warm(self, warm: WarmSandbox) -> None:
        """Kill a warm sandbox nobody adopted (or whose adoption failed)."""
        warm.release(claimed=False)
        if warm.runtime is not None:
            warm.runtime.process.kill()
        self._supervisors[warm.meta.sandbox_id] = warm.supervisor
        await asyncio.to_thread(self._destroy, warm.meta)
        if warm.runtime is not None:
            with contextlib.suppress(Exception):
                await warm.runtime.process.wait()
        warm.relay.close()

    async def _adopt(self, warm: WarmSandbox, *, role: str, run_id: str, snapshot_id: str | None,
                     metadata: Mapping[str, Any] | None) -> SandboxInfo:
        """A warm sandbox becomes the run's: its snapshot restored, its relay pointed at this backend's egress
        proxy, its metadata and lifetime the run's (``metadata["warm"]`` says it was made ahead)."""
        meta = warm.meta
        d = self._dir(meta.sandbox_id)
        if snapshot_id is not None:
            await uncancellable(asyncio.to_thread(self.snapshots.restore, snapshot_id, d / "work", uid=meta.uid,
                                                  gid=meta.gid, link=True))
        meta.role, meta.run_id, meta.created_at = role, run_id, time.time()
        meta.metadata = self._metadata(meta, {**(metadata or {}), "warm": True})
        self._save_meta(meta)
        if self._egress_target is not None:
            warm.relay.retarget(*self._egress_target)
        self._supervisors[meta.sandbox_id] = warm.supervisor
        self._relays[meta.sandbox_id] = warm.relay
        if warm.runtime is not None:
            self._waiting[meta.sandbox_id] = warm.runtime
            self._running.setdefault(meta.sandbox_id, set()).add(warm.runtime.process)
        self._isolation = "namespaces"
        warm.release(claimed=True)  # the run's now: it no longer dies with this worker
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
            # Linked large files only under a sandbox uid: unisolated commands run as us and could write them.
            self.snapshots.restore(snapshot_id, d / "work", uid=meta.uid, gid=meta.gid, link=meta.uid is not None)

    def _start_init(self, meta: _Meta, relay: _EgressRelay | None = None,
                    owner_lifeline: int | None = None) -> dict[str, Any]:
        """Start the sandbox's init; its egress goes through ``relay`` (a warm sandbox's own) or the backend's.
        ``owner_lifeline``: a warm sandbox's, the read end of a pipe whose write end only this worker holds (the
        supervisor kills the init at its end of file unless a run claimed the sandbox first; ``WarmSandbox``)."""
        d = self._dir(meta.sandbox_id)
        relay = relay or self._egress_relay()
        assert meta.uid is not None and meta.gid is not None
        binds, links, etc = self._root_layout(meta.uid, meta.gid)
        links = links + _root_links(meta.metadata.get(ROOT_LINKS_KEY))
        cfg = {"rootfs": str(d / "rootfs"), "work_dir": str(d / "work"), "log": str(d / "ctl" / "init.log"),
               "pidfile": str(d / "ctl" / "pids.json"), "ro_binds": binds, "symlinks": links, "etc_files": etc,
               "tmp_size_mb": self.tmp_size_mb, "shm_size_mb": min(self.tmp_size_mb, 64), "hostname": "sandbox",
               "egress_socket": str(relay.socket_path) if relay else None,
               "egress_port": EGRESS_PORT if relay else None, "owner_lifeline": owner_lifeline}
        cfg_path = d / "ctl" / f"init-{secrets.token_hex(4)}.cfg"
        _write_config(cfg_path, cfg)
        self._reap_supervisors()
        with open(d / "ctl" / "init.log", "ab") as log_fh, spawning():
            proc = subprocess.Popen(
                [sys.executable, "-E", "-s", "-S", str(HELPER), "init", str(cfg_path)], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=log_fh, env={}, start_new_session=True, close_fds=True,
                pass_fds=() if owner_lifeline is None else (owner_lifeline,))
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
            with spawning():
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
        handle.cgroup_dirs = [str(d) for d in cg.dirs]
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
        out_task = asyncio.create_task(read_capped(proc.stdout, limits.max_output_bytes))
        err_task = asyncio.create_task(read_capped(proc.stderr, limits.max_output_bytes))
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
        waiting = self._waiting.pop(sandbox_id, None)
        if waiting is not None:  # an adopted warm sandbox's runtime, if it can stand for this one
            proc = await waiting.claim(argv, env, limits, pids="pids" in self.cgroups.controllers)
            if proc is not None:
                return proc
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
        if (layered := self.snapshots.layer(base, files, label=label, source="files")) is not None:
            return layered
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

    async def kill(self, sandbox_id: str, *, remains: Literal["wait", "later"] = "wait") -> float:
        """Kill every process of the sandbox and remove its directory; returns its lifetime in seconds.

        ``remains="later"`` (a namespaced sandbox): return once its init and supervisor are sent SIGKILL (the
        kernel then kills every process of its PID namespace) and it is marked ended, so that nothing lists it or
        starts in it again; waiting for the processes to be gone and removing their cgroups and the directory go on
        in the background (``settle_kills``; ``reap`` finishes them after a crash). A batch's sandbox and its scorer
        runtime took ~15 ms to die, on the way to the run's end (issue 25).

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
        later = remains == "later" and meta.isolation == "namespaces"
        lifetime = await asyncio.to_thread(self._end if later else self._destroy, meta)
        self._killed[sandbox_id] = lifetime
        self._waiting.pop(sandbox_id, None)
        relay = self._relays.pop(sandbox_id, None)
        handles = list(self._running.pop(sandbox_id, ()))
        if later:
            task = asyncio.create_task(self._remove_remains(meta, handles, relay))
            _ENDING.add(task)
            task.add_done_callback(_ended)
            return lifetime
        if relay is not None:
            relay.close()
        await self._reap_handles(handles)
        return lifetime

    def _end(self, meta: _Meta) -> float:
        """A namespaced sandbox's processes sent SIGKILL and its record marked ended; returns its lifetime."""
        if meta.init_pid is None:
            meta = self._load_meta(meta.sandbox_id) or meta  # maybe the supervisor recorded it
        _kill_verified(meta.init_pid, meta.init_start)
        _kill_verified(meta.supervisor_pid, meta.supervisor_start)
        with contextlib.suppress(OSError):
            self._save_meta(replace(meta, state="ended"))
        return max(0.0, time.time() - meta.created_at)

    async def _remove_remains(self, meta: _Meta, handles: list[LocalProcess], relay: _EgressRelay | None) -> None:
        if relay is not None:  # an adopted warm sandbox's own egress relay (a socket and a directory)
            await asyncio.to_thread(relay.close)
        await asyncio.to_thread(self._destroy, meta)
        await self._reap_handles(handles)

    @staticmethod
    async def _reap_handles(handles: list[LocalProcess]) -> None:
        for handle in handles:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.wait(), 10)

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
                time.sleep(0.001)  # 5 ms steps made a kill ~7.5 ms; these ~4.5
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
        for relay in self._relays.values():
            relay.close()
        self._relays.clear()


__all__ = ["EGRESS_PORT", "LocalBackend", "LocalProcess", "settle_kills"]
