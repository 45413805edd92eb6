"""Loaded by Python at start-up from ``PYTHONPATH`` (``bench/worker_threads.py`` puts this directory first) when
``BENCHWRIGHT_BENCH_THREADS`` names a directory. In every process: each Python thread gives the kernel its name
(``asyncio_0``, Temporal's ``temporal_workflow_…``), so ``/proc/<pid>/task/*/comm`` tells the threads apart. In the
worker (``python -m benchwright.cli worker``) alone: each function handed to the event loop's default executor
(``asyncio.to_thread``) is timed in its thread (``time.thread_time``: CPU, the kernel's included), by its module and
name. The totals go out on request, over two FIFOs in ``<dir>``: a write to ``ask.<pid>`` is answered with the
totals as JSON on ``totals.<pid>`` (the thread that answers sleeps in ``open`` meanwhile: no polling, no CPU).
Nothing of the product changes."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_DIR = os.environ.get("BENCHWRIGHT_BENCH_THREADS")
_PR_SET_NAME = 15


def _named_threads() -> None:
    libc = ctypes.CDLL(None)
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        libc.prctl(_PR_SET_NAME, self.name[:15].encode(), 0, 0, 0)
        bootstrap(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]


def _label(func: Callable[..., Any]) -> str:
    """What ``to_thread`` runs: it hands the executor ``partial(context.run, func, *args)``."""
    target: Any = func
    if isinstance(target, functools.partial):
        target = target.args[0] if getattr(target.func, "__name__", "") == "run" and target.args else target.func
    while isinstance(target, functools.partial):
        target = target.func
    return f"{getattr(target, '__module__', None) or '?'}:{getattr(target, '__qualname__', None) or repr(target)}"


def _timed_executor(ask: str, answer: str) -> None:
    import asyncio.base_events

    totals: dict[str, list[float]] = {}
    lock = threading.Lock()
    run_in_executor = asyncio.base_events.BaseEventLoop.run_in_executor

    def timed_run_in_executor(self: Any, executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        if executor is not None:
            return run_in_executor(self, executor, func, *args)
        label = _label(func)

        def timed(*inner: Any) -> Any:
            started = time.thread_time()
            try:
                return func(*inner)
            finally:
                spent = time.thread_time() - started
                with lock:
                    entry = totals.setdefault(label, [0, 0.0])
                    entry[0] += 1
                    entry[1] += spent

        return run_in_executor(self, executor, timed, *args)

    asyncio.base_events.BaseEventLoop.run_in_executor = timed_run_in_executor  # type: ignore[method-assign]

    def answer_requests() -> None:
        os.mkfifo(ask, 0o600)
        os.mkfifo(answer, 0o600)
        while True:
            with open(ask, "rb") as request:  # blocks until the bench opens it to write
                request.read()
            with lock:
                text = json.dumps(totals).encode()
            with open(answer, "wb") as reply:  # blocks until the bench opens it to read
                reply.write(text)

    threading.Thread(target=answer_requests, daemon=True, name="bench-totals").start()


if _DIR:
    _named_threads()
    if sys.argv[:2] == ["-m", "worker"]:
        _timed_executor(os.path.join(_DIR, f"ask.{os.getpid()}"), os.path.join(_DIR, f"totals.{os.getpid()}"))
