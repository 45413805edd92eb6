"""Time marks for ``bench/timeline.py``, in every process of the stack it starts (this directory is put first on their
``PYTHONPATH``, so Python imports this file as it starts). Inert unless ``BENCHWRIGHT_BENCH_MARKS`` names a file.

When it does, a few functions of the worker and the API are wrapped as their modules are imported, and each call
appends ``<unix time> <pid> <label>`` to that file (one line-buffered write, ~3 µs): the worker's Temporal activations,
the sandboxed workflow instances it makes and its activity starts, the batch activity's preamble (hand-off, model
proxy, call limit) and the Materialize batch, its sandbox's opening (snapshot, egress proxy, create, spawn), the scorer
runtime's start and end, every model call a batch's scorer asks for, a sandbox's disposal, the warm pool's takes and
refills, and the run view and narration the API reads for a long poll's answer. Nothing of the product is changed to
take them; the marks cost what a write costs, so the timeline's own run is a little slower than an unmarked one.
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


def _call_label(args: tuple[Any, ...]) -> str:
    return f"model call {next(_CALLS)}"


# module -> (attribute path, label or a label made from the call's arguments, whether the end is marked too)
_WRAPPED: dict[str, Sequence[tuple[str, str | Callable[[tuple[Any, ...]], str], bool]]] = {
    "temporalio.worker._workflow": [("_WorkflowWorker._handle_activation", _activation_label, True),
                                    ("_WorkflowWorker._create_workflow_instance", "workflow instance made", True)],
    "temporalio.worker._activity": [("_ActivityWorker._handle_start_activity_task", _activity_label, False)],
    "benchwright.runs.materialize": [("run_batch", "batch", True)],
    "benchwright.runs.handoff": [("restore", "handoff restore", True)],
    "activities.attach": [("live_proxy", "live proxy", True)],
    "benchwright.security.quotas": [("model_call_limit", "call limit", True)],
    "benchwright.proxy.egress": [("EgressProxy.start", "egress start", True),
                                 ("EgressProxy.stop", "egress stop", True)],
    "benchwright.scoring.host": [("_Session._start_runtime", "scorer runtime start", True),
                                 ("_Session._call", _call_label, False),
                                 ("_Runtime.close", "scorer runtime close", True)],
    "benchwright.sandbox.lifecycle": [("_dispose", "sandbox dispose", True), ("snapshot_of", "snapshot of", True)],
    "benchwright.sandbox.local.backend": [("LocalBackend.create_warm", "warm sandbox made", True),
                                          ("LocalBackend.create", "sandbox create", True),
                                          ("LocalBackend.spawn", "sandbox spawn", True),
                                          ("LocalBackend.kill", "sandbox kill", True),
                                          ("LocalBackend._destroy", "sandbox destroy", True)],
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


def _instrument(module: ModuleType) -> None:
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


if _PATH:
    sys.meta_path.insert(0, _Finder())
