"""Per-command cgroups of the local backend (v1 and v2): memory, pids, CPU time and CPU rate (see ``local``'s
module docstring, **Limits**)."""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchwright.sandbox.base import (
    ExecLimits,
    SandboxError,
)

log = logging.getLogger(__name__)

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
                    time.sleep(0.001)


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


_DETECTED: list[_Cgroups] = []
_DETECTING = threading.Lock()


def _detect_cgroups() -> _Cgroups:
    """Find writable memory/pids/CPU-accounting cgroups below this process's own cgroup, once per process: the
    probes write into cgroupfs (~0.5 ms of CPU), and the worker makes a backend for every sandbox and snapshot. A host
    that offered none is asked again next time."""
    with _DETECTING:
        if not _DETECTED:
            found = _probe_cgroups()
            if not found.controllers:
                return found
            _DETECTED.append(found)
        return _DETECTED[0]


def _probe_cgroups() -> _Cgroups:
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
