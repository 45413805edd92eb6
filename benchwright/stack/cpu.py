"""A worker's threads on one CPU (``Settings.worker_cpu``, ``BENCHWRIGHT_WORKER_CPU``; ``benchwright up`` asks it).

A worker runs Python one thread at a time (the GIL), yet it hands work between its threads all the time: each
``asyncio.to_thread`` (the store's transactions, the sandboxes' files) wakes an executor thread and then the event
loop, and the GIL passes between them. When the kernel spreads those threads over CPUs, each hand-off wakes a CPU
that was idle: an inter-processor interrupt, in a virtual machine an exit to the hypervisor. On this project's
2-CPU machines a ``to_thread`` round trip cost 117 µs of CPU between two CPUs and 43 µs on one, and a worker with
its threads on one CPU used ~16 % less CPU per 1,000 tasks at C=128, its runs no slower (docs/performance.md,
session 41).

``pin_threads`` pins the calling thread, and every thread it starts afterwards inherits its CPU (the default
executor's, Temporal's). The processes a worker starts must not: a sandbox's scorer runtime or the credential proxy
held to the worker's CPU would compete with it for that one. ``spawning()`` hands the calling thread the CPUs the
process had before it was pinned for the length of a spawn, so the child inherits those.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

from benchwright.errors import InvalidInput

log = logging.getLogger("benchwright.worker")

_spawn_cpus: frozenset[int] | None = None
"""The CPUs the process had before ``pin_threads``: what its children get (None: not pinned)."""
_spawns = threading.local()
"""Per thread: spawns under way (``depth``) and the thread's own CPUs to return to after them (``own``)."""


def pin_threads(choice: str) -> int | None:
    """Pin the calling thread, and the threads it starts from now on, to the CPU ``choice`` names: ``auto`` the
    highest-numbered CPU this process may run on (none when it may run on one only), a number that CPU, ``off`` none.
    Returns the CPU, or None when nothing was pinned. A kernel that refuses is logged and leaves the threads as they
    were: the worker runs either way.

    Raises:
        InvalidInput: a number this process may not run on (outside its affinity or cgroup's CPUs).
    """
    global _spawn_cpus
    if choice == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = frozenset(os.sched_getaffinity(0))
    if choice == "auto":
        if len(allowed) < 2:
            return None
        cpu = max(allowed)
    else:
        cpu = int(choice)
        if cpu not in allowed:
            raise InvalidInput(f"BENCHWRIGHT_WORKER_CPU={cpu}: this worker may run on CPUs {cpu_list(allowed)} only",
                               code="worker_cpu_not_allowed")
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as exc:
        log.warning("the worker's threads stay on CPUs %s: the kernel refused CPU %d (%s)", cpu_list(allowed), cpu, exc)
        return None
    _spawn_cpus = allowed
    return cpu


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Around a spawn of a child process (``subprocess.Popen``, ``asyncio.create_subprocess_exec``): the calling
    thread on the CPUs the process had before ``pin_threads``, so that the child inherits those, and back on its own
    after. Nested or interleaved spawns on one thread (coroutines on the event loop) put it back when the last ends.
    Nothing when the process is not pinned."""
    if _spawn_cpus is None:
        yield
        return
    depth = getattr(_spawns, "depth", 0)
    if depth == 0:
        _spawns.own = os.sched_getaffinity(0)
        os.sched_setaffinity(0, _spawn_cpus)
    _spawns.depth = depth + 1
    try:
        yield
    finally:
        _spawns.depth -= 1
        if _spawns.depth == 0:
            os.sched_setaffinity(0, _spawns.own)


def cpu_list(cpus: frozenset[int] | set[int]) -> str:
    """CPUs as the kernel lists them (``0-3,6``)."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


__all__ = ["cpu_list", "pin_threads", "spawning"]
