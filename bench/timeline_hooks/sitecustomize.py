"""Time marks for ``bench/timeline.py``, in every process of the stack it starts (this directory is put first on their
``PYTHONPATH``, so Python imports this file as it starts). Inert unless ``BENCHWRIGHT_BENCH_MARKS`` names a file.

When it does, a few functions of the worker and the API are wrapped as their modules are imported, and each call appends
``<unix time> <pid> <label>`` to that file (one line-buffered write, ~3 µs): the worker's Temporal activations, the
sandboxed workflow instances it makes, their code in each activation and Temporal's answer to its completion, its
activity starts, the batch activity's preamble (hand-off, model proxy, call limit) and the Materialize batch, its
sandbox's opening (snapshot, egress proxy, create, spawn), the scorer runtime's start and end, every model call a
batch's scorer asks for and the SUT client's call it makes (its start and end), the batch's commits of results, a
sandbox's disposal (its kill, its SandboxKilled, its backend's close), the warm pool's takes and refills, and the run
view and narration the API reads for a long poll's answer; and a probe on the worker's event loop for as long as a batch
runs (how late a 1 ms timer fires).
Nothing of the product is changed to take them; the marks cost what a write costs (the probe a wake-up a
millisecond), so the timeline's own run is a little slower than an unmarked one. With ``BENCHWRIGHT_BENCH_PGTRACE``
naming a directory, every Postgres connection a process opens also writes libpq's trace of its messages there.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_PATH = os.environ.get("BENCHWRIGHT_BENCH_MARKS")
_OUT: Any = None
_PGTRACE = os.environ.get("BENCHWRIGHT_BENCH_PGTRACE")
"""A directory: every Postgres connection the process opens writes libpq's trace of its messages to a file there
(``bench/timeline.py --round-trips`` counts the server's ReadyForQuery messages in it, one per round trip)."""
_TRACES = itertools.count(1)


def mark(label: str) -> None:
    global _OUT
    if _OUT is None:
        _OUT = open(_PATH or os.devnull, "a", buffering=1)  # noqa: SIM115 - held for the process's life
    _OUT.write(f"{time.time():.6f} {os.getpid()} {label}\n")


def _activation_label(args: tuple[Any, ...]) -> str:
    jobs = ",".join(sorted({job.WhichOneof("variant") for job in args[1].jobs}))
    return f"activation {jobs}"


def _activity_label(args: tuple[Any, ...]) -> str:
    return f"activity {args[2].activity_type}"


_CALLS = itertools.count(1)
_SUT_CALLS = itertools.count(1)


def _call_label(args: tuple[Any, ...]) -> str:
    return f"model call {next(_CALLS)}"


def _sut_call_label(args: tuple[Any, ...]) -> str:
    return f"sut call {next(_SUT_CALLS)}"  # numbered, so that its end pairs with its start


def _with_loop_probe(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``run_batch`` with a probe beside it on the worker's event loop: a 1 ms sleep, again and again, each wake-up's
    lateness kept; at the batch's end one mark ``loop late <n> <mean> <p50> <p90> <p99> <max>`` (ms). How late the
    loop answers a timer is how late it reads a model's reply or a runner's line."""
    import asyncio

    @functools.wraps(fn)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        late: list[float] = []

        async def probe() -> None:
            while True:
                asked = time.perf_counter()
                await asyncio.sleep(0.001)
                late.append(time.perf_counter() - asked - 0.001)

        prober = asyncio.get_running_loop().create_task(probe())
        try:
            return await fn(*args, **kwargs)
        finally:
            prober.cancel()
            if late:
                late.sort()
                n = len(late)
                ms = [1000 * sum(late) / n, *(1000 * late[min(n - 1, int(n * q))] for q in (0.5, 0.9, 0.99)),
                      1000 * late[-1]]
                mark(f"loop late {n} " + " ".join(f"{v:.3f}" for v in ms))
    return wrapped


# module -> (attribute path, label or a label made from the call's arguments, whether the end is marked too)
_WRAPPED: dict[str, Sequence[tuple[str, str | Callable[[tuple[Any, ...]], str], bool]]] = {
    "temporalio.worker._workflow": [("_WorkflowWorker._handle_activation", _activation_label, True),
                                    ("_WorkflowWorker._create_workflow_instance", "workflow instance made", True)],
    "temporalio.worker.workflow_sandbox._runner": [("_Instance.activate", "workflow code", True)],
    "temporalio.bridge.worker": [("Worker.complete_workflow_activation", "activation completed to the server", True)],
    "temporalio.worker._activity": [("_ActivityWorker._handle_start_activity_task", _activity_label, False)],
    "benchwright.runs.materialize": [("run_batch", "batch", True), ("append_checking", "results commit", True)],
    "benchwright.llm.sut": [("OpenAICompatibleSut.complete", _sut_call_label, True)],
    "benchwright.runs.handoff": [("restore", "handoff restore", True)],
    "activities.attach": [("live_proxy", "live proxy", True)],
    "benchwright.security.quotas": [("model_call_limit", "call limit", True)],
    "benchwright.proxy.egress": [("EgressProxy.start", "egress start", True),
                                 ("EgressProxy.stop", "egress stop", True)],
    "benchwright.scoring.host": [("_Session._start_runtime", "scorer runtime start", True),
                                 ("_Session._call", _call_label, False),
                                 ("_Runtime.close", "scorer runtime close", True)],
    "benchwright.sandbox.lifecycle": [("_dispose", "sandbox dispose", True), ("snapshot_of", "snapshot of", True),
                                      ("append_events", "sandbox event", True)],
    "benchwright.sandbox.local.backend": [("LocalBackend.create_warm", "warm sandbox made", True),
                                          ("LocalBackend.create", "sandbox create", True),
                                          ("LocalBackend.spawn", "sandbox spawn", True),
                                          ("LocalBackend.kill", "sandbox kill", True),
                                          ("LocalBackend._destroy", "sandbox destroy", True),
                                          ("LocalBackend.close", "backend close", True)],
    "benchwright.sandbox.local.process": [("LocalProcess.wait", "process wait", True)],
    "benchwright.sandbox.local.warm": [("WarmPool.take", "warm sandbox taken", False)],
    "benchwright.store.runs": [("run_view", "run view", True)],
    "benchwright.report.facts": [("run_narration", "narration", True)],
}


def _wrap(fn: Callable[..., Any], label: str | Callable[[tuple[Any, ...]], str], ends: bool) -> Callable[..., Any]:
    def name(args: tuple[Any, ...]) -> str:
        return label if isinstance(label, str) else label(args)

    if getattr(fn, "__code__", None) is not None and fn.__code__.co_flags & 0x80:  # a coroutine function
        @functools.wraps(fn)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            what = name(args)
            mark(f"{what} >")
            try:
                return await fn(*args, **kwargs)
            finally:
                if ends:
                    mark(f"{what} <")
        return wrapped_async

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        what = name(args)
        mark(f"{what} >")
        try:
            return fn(*args, **kwargs)
        finally:
            if ends:
                mark(f"{what} <")
    return wrapped


def _traced_connections(psycopg: ModuleType) -> None:
    """``psycopg.connect`` (SQLAlchemy's way in) tracing each connection it opens into ``_PGTRACE``."""
    connect = psycopg.Connection.connect.__func__

    def traced(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = connect(cls, *args, **kwargs)
        conn._bench_trace = open(  # noqa: SIM115 - held for the connection's life
            os.path.join(_PGTRACE or os.devnull, f"{os.getpid()}-{next(_TRACES)}.trace"), "ab")
        conn.pgconn.trace(conn._bench_trace.fileno())
        return conn

    psycopg.Connection.connect = classmethod(traced)
    psycopg.connect = psycopg.Connection.connect


def _instrument(module: ModuleType) -> None:
    if module.__name__ == "psycopg":
        _traced_connections(module)
        return
    if module.__name__ == "benchwright.runs.materialize":
        module.run_batch = _with_loop_probe(module.run_batch)  # type: ignore[attr-defined]
    for path, label, ends in _WRAPPED[module.__name__]:
        *owners, attr = path.split(".")
        owner: Any = module
        for part in owners:
            owner = getattr(owner, part)
        setattr(owner, attr, _wrap(getattr(owner, attr), label, ends))


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps a listed module's functions right after it runs, before any other module imports them by name."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _WRAPPED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _instrument(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _PGTRACE:
    _WRAPPED["psycopg"] = []
if _PATH or _PGTRACE:
    sys.meta_path.insert(0, _Finder())
