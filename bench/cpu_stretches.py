"""The CPU each process of the stack spends in each stretch of a run (``bench/timeline.py --cpu``).

A run is bound by CPU where its processes are busy at once, and by hops where they are not: this tells which. A
sampler process reads every thread's ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on the CPU, the scheduler's own
count) of the stack's processes every ``interval`` ms: the worker, the API, Temporal and the dev model by their PIDs,
and the credential proxy, the scorer runtimes and the sandboxes' own helpers (their init and the helper that enters
them, ``_nsexec.py``) by their command lines as they appear: any such process on the machine is counted (a sandbox's
processes are reparented away from the worker, so ancestry cannot tell them), so run it on a machine of its own, as
every bench here. A process that ends keeps its last count (its last few
ms are lost). A stretch's CPU is the difference of the counts at its two ends, each read between the samples around
it (linearly).

The sampler costs CPU of its own (printed: ~4 % of a core at 4 ms here), so a run measured with it is a little slower
than one without, and a stretch a few intervals long is read coarsely.

    python bench/cpu_stretches.py sample OUT INTERVAL_MS worker=PID api=PID ...   # what timeline.py starts
"""

from __future__ import annotations

import bisect
import itertools
import os
import signal
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

FOUND_BY_COMMAND = (("credential_proxy.py", "proxy"), ("runner.py", "runtime"), ("_nsexec.py", "sandbox"))
"""A process whose command line holds the first string is counted as the second (the first match wins)."""
ROLES = ("worker", "runtime", "proxy", "dev_model", "temporal", "api", "sandbox")
RESCAN_S = 0.05
YOUNG_S = 1.0


class _Threads:
    """The open ``schedstat`` files of one process's threads, re-listed at each rescan; read by ``pread`` (one system
    call a thread a sample, not three)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds: dict[str, int] = {}
        self.relist()

    def relist(self) -> bool:
        """Open the threads that started and close those that ended; False once the process is gone."""
        try:
            tids = set(os.listdir(f"/proc/{self.pid}/task"))
        except OSError:
            self.close()
            return False
        for tid in self.fds.keys() - tids:
            os.close(self.fds.pop(tid))
        for tid in tids - self.fds.keys():
            try:
                self.fds[tid] = os.open(f"/proc/{self.pid}/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue  # a thread that ended between the listing and the open
        return True

    def cpu_ns(self) -> int | None:
        """Every thread's time on the CPU so far (ns); None once the process is gone."""
        total, read = 0, False
        for fd in self.fds.values():
            try:
                total += int(os.pread(fd, 64, 0).split()[0])
                read = True
            except (OSError, ValueError, IndexError):
                continue  # an ended thread (closed at the next relist)
        return total if read else None

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _role_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ")
    except OSError:
        return None
    return next((role for needle, role in FOUND_BY_COMMAND if needle.encode() in command), None)


def sample(out: Path, interval_s: float, named: Mapping[int, str]) -> None:
    """Write ``<unix time> <role>=<ns> ...`` (each role's cumulative CPU) every ``interval_s`` until SIGTERM; the last
    line is ``self <ns>``, the sampler's own CPU."""
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    roles: dict[int, str | None] = dict(named)
    for entry in os.listdir("/proc"):  # what runs already is named once
        if entry.isdigit() and int(entry) not in roles:
            roles[int(entry)] = _role_of(int(entry))
    young: dict[int, float] = {}
    """Processes that appeared since: named again at each rescan for ``YOUNG_S`` (one seen between its fork and its
    exec still has its parent's command line, and a sandbox's helper may exec the scorer runtime)."""
    last: dict[int, int] = {}
    threads = {pid: _Threads(pid) for pid, role in roles.items() if role is not None}
    scanned = time.time()
    with out.open("w", buffering=1) as f:
        while not stop:
            now = time.time()
            if now - scanned >= RESCAN_S:
                for entry in os.listdir("/proc"):
                    if entry.isdigit() and int(entry) not in roles:
                        young[int(entry)] = now
                for pid, seen in list(young.items()):
                    roles[pid] = _role_of(pid) or roles.get(pid)  # one gone keeps what it was
                    if roles[pid] is not None and pid not in threads:
                        threads[pid] = _Threads(pid)
                    if now - seen > YOUNG_S:
                        del young[pid]
                for pid, process in list(threads.items()):
                    if not process.relist():
                        del threads[pid]
                scanned = now
            for pid, process in threads.items():
                if (ns := process.cpu_ns()) is not None:
                    last[pid] = ns
            totals: dict[str, int] = {}
            for pid, ns in last.items():
                if (role := roles[pid]) is not None:
                    totals[role] = totals.get(role, 0) + ns
            f.write(f"{now:.4f} " + " ".join(f"{role}={ns}" for role, ns in totals.items()) + "\n")
            time.sleep(interval_s)
        f.write(f"self {time.process_time_ns()}\n")


class Samples:
    """A sampler's output: each role's cumulative CPU (ms) at any moment between its first and last sample."""

    def __init__(self, path: Path) -> None:
        self.times: list[float] = []
        self.rows: list[dict[str, float]] = []
        self.self_ms = 0.0
        for line in path.read_text().splitlines():
            head, _, rest = line.partition(" ")
            if head == "self":
                self.self_ms = int(rest) / 1e6
                continue
            self.times.append(float(head))
            self.rows.append({role: int(ns) / 1e6 for role, ns in (kv.split("=") for kv in rest.split())})

    @property
    def span_s(self) -> float:
        return self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0

    def at(self, t: float, role: str) -> float | None:
        i = bisect.bisect_left(self.times, t)
        if i == 0 or i >= len(self.times):
            return None
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.rows[i - 1].get(role, 0.0), self.rows[i].get(role, 0.0)
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


Stretch = tuple[str, float, dict[str, float]]
"""A stretch of one run: its name (``<bound> -> <bound>``), wall (ms) and CPU (ms) by role."""


def stretches(samples: Samples, bounds: Sequence[tuple[str, float | None]]) -> list[Stretch]:
    """Each stretch between two consecutive known bounds (a bound the run did not reach is skipped)."""
    known = [(name, t) for name, t in bounds if t is not None]
    out = []
    for (a, ta), (b, tb) in itertools.pairwise(known):
        cpu = {}
        for role in ROLES:
            va, vb = samples.at(ta, role), samples.at(tb, role)
            if va is not None and vb is not None:
                cpu[role] = vb - va
        out.append((f"{a} -> {b}", 1000 * (tb - ta), cpu))
    return out


def print_table(runs: list[list[Stretch]], samples: Samples, interval_ms: float) -> None:
    """Medians over the runs of each stretch's wall and CPU by process."""
    by_name: dict[str, list[tuple[float, dict[str, float]]]] = {}
    for run in runs:
        for name, wall, cpu in run:
            by_name.setdefault(name, []).append((wall, cpu))
    print(f"CPU by process in each stretch of a run (ms; medians over {len(runs)} runs; {len(samples.times)} samples "
          f"every {interval_ms:g} ms over {samples.span_s:.1f} s, the sampler itself "
          f"{samples.self_ms / max(samples.span_s, 1e-9) / 10:.1f} % of a core)")
    print(f"{'stretch':72} {'wall':>6} " + " ".join(f"{role:>9}" for role in ROLES) + f" {'all':>7} {'cores':>5}")
    for name, rows in by_name.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = {role: statistics.median(c.get(role, 0.0) for _, c in rows) for role in ROLES}
        total = statistics.median(sum(c.values()) for _, c in rows)
        print(f"{name[:72]:72} {wall:6.1f} " + " ".join(f"{cpu[role]:9.1f}" for role in ROLES)
              + f" {total:7.1f} {total / wall if wall else 0:5.2f}")


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] != "sample":
        sys.exit(__doc__)
    interval_ms = float(argv[2])
    if not 0.5 <= interval_ms <= 1000:
        sys.exit("the interval is 0.5 to 1,000 ms")
    named = {int(pid): role for role, _, pid in (a.partition("=") for a in argv[3:])}
    sample(Path(argv[1]), interval_ms / 1000, named)


if __name__ == "__main__":
    main(sys.argv[1:])
