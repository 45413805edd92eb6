"""The worker's side of the scorer runtime: start ``runner.py`` on task_impl.py, feed it trials, make its model
calls, and turn what comes back into trial records.

The runner process gets a clean environment (no provider keys, nothing of the worker's), and the model calls it
asks for are made here with the run's SUT client, so untrusted scorer code never holds a credential.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchwright.scoring.aggregators import normalize_score, outcome_for
from benchwright.sut import SutClient, SutError

RUNNER = Path(__file__).with_name("runner.py")
_LINE_LIMIT = 64 * 1024 * 1024
_STDERR_TAIL = 8192


class ScorerLoadError(Exception):
    """task_impl.py could not be loaded (syntax error, no Scorer class, missing methods)."""

    def __init__(self, message: str, trace: str = "") -> None:
        super().__init__(message)
        self.trace = trace


@dataclass(frozen=True)
class TrialItem:
    index: int
    trial: int
    row: dict[str, Any]


@dataclass
class TrialRecord:
    index: int
    trial: int
    outcome: str
    score: float | None
    output: str | None
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0


def runner_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The scorer's whole environment: nothing of the worker's (so no credentials) beyond a PATH."""
    return {"PATH": os.defpath, "HOME": home, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "LANG": "C.UTF-8", **(extra or {})}


Spawn = Callable[[list[str]], Awaitable[Any]]
"""Starts ``python runner.py <args>`` where the scorer lives (a sandbox, or a plain directory) and returns a process
handle shaped like ``asyncio.subprocess.Process`` (stdin/stdout/stderr pipes, ``wait``, ``kill``, ``returncode``).
``task_impl.py`` and ``runner.py`` are in its working directory."""


def subprocess_spawn(workdir: Path, env: dict[str, str] | None = None) -> Spawn:
    """A ``Spawn`` for a plain subprocess in ``workdir`` (no isolation: only for tests of the runtime itself)."""

    async def spawn(args: list[str]) -> Any:
        return await asyncio.create_subprocess_exec(
            sys.executable, str(RUNNER), *args, cwd=str(workdir), env=env or runner_env(str(workdir)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT)

    return spawn


async def check_impl(*, spawn: Spawn, timeout_s: float = 60.0) -> None:
    """Load task_impl.py in a runner and return once it reports ready.

    Raises:
        ScorerLoadError: the file does not load or lacks the Scorer interface.
    """
    proc = await spawn(["--impl", "task_impl.py", "--check"])
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ScorerLoadError(f"task_impl.py did not load within {timeout_s:.0f} s") from None
    first = out.decode(errors="replace").splitlines()[:1]
    msg = json.loads(first[0]) if first else {}
    if msg.get("op") != "ready":
        detail = msg.get("error") or f"scorer runtime exited with {proc.returncode}: {err.decode(errors='replace')[-500:]}"
        raise ScorerLoadError(f"task_impl.py failed to load: {detail}", msg.get("trace", ""))


@dataclass(frozen=True)
class TrialLimits:
    """Per-trial ceilings (§9 task/attempt levels). A trial past one lands in err with the limit in its meta."""

    attempts: int = 1
    duration_s: float | None = None
    cost_usd: float | None = None
    attempt_duration_s: float | None = None


async def run_trials(*, spawn: Spawn, items: list[TrialItem], sut: SutClient, threads: int,
                     on_record: Callable[[TrialRecord], Awaitable[None]],
                     limits: TrialLimits = TrialLimits()) -> None:
    """Run every item through the scorer; ``on_record`` gets one record per item, in completion order.

    An item whose scorer raised, whose model call failed for good, or whose runner died becomes an ``err`` record
    (after ``limits.attempts`` attempts); only a scorer that does not load at all raises.

    Raises:
        ScorerLoadError: task_impl.py did not load.
    """
    if not items:
        return
    timed = limits.attempt_duration_s is not None or limits.duration_s is not None
    proc = await spawn(["--impl", "task_impl.py", "--threads", str(threads), *(["--report-starts"] if timed else [])])
    session = _Session(proc, items, sut, on_record, limits)
    try:
        await session.run()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


class _Session:
    def __init__(self, proc: asyncio.subprocess.Process, items: list[TrialItem], sut: SutClient,
                 on_record: Callable[[TrialRecord], Awaitable[None]], limits: TrialLimits) -> None:
        self.proc = proc
        self.items = dict(enumerate(items))
        self.next_id = len(items)
        self.sut = sut
        self.on_record = on_record
        self.limits = limits
        # Clocks start when the runner picks a task up (its "start" message), not while it waits in the queue.
        self.attempt_started: dict[int, float] = {}
        self.trial_started: dict[tuple[int, int], float] = {}
        self.attempts: dict[tuple[int, int], int] = {(i.index, i.trial): 1 for i in items}
        self.usage: dict[int, dict[str, int]] = {}
        self.cost: dict[int, float] = {}
        self.calls: set[asyncio.Task[None]] = set()
        self.stderr_tail = b""
        self.write_lock = asyncio.Lock()
        self.outbox: list[bytes] = []

    def send(self, msg: dict[str, Any]) -> None:
        """Queue a message for the runner. What is queued during one turn of the event loop goes out in one write:
        a pipe write per model reply (and the runner's wake-up per write) cost ~0.1 ms of this process's CPU each.
        Lines are whole in every write, so these writes interleave safely with ``_send_tasks``'s chunks."""
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self._flush_outbox)
        self.outbox.append((json.dumps(msg, ensure_ascii=False, default=str) + "\n").encode())

    def _flush_outbox(self) -> None:
        data, self.outbox = b"".join(self.outbox), []
        stdin = self.proc.stdin
        if data and stdin is not None and not stdin.is_closing():
            stdin.write(data)  # a dead runner is noticed on stdout (EOF), which settles what is left

    async def _send_tasks(self) -> None:
        """All tasks in large writes (one syscall per ~64 KiB, not one per task); the runner queues them."""
        assert self.proc.stdin is not None
        chunk: list[bytes] = []
        size = 0
        for item_id, item in self.items.items():
            line = (json.dumps({"op": "task", "id": item_id, "row": item.row}, ensure_ascii=False, default=str)
                    + "\n").encode()
            chunk.append(line)
            size += len(line)
            if size >= 1 << 16:
                await self._write(b"".join(chunk))
                chunk, size = [], 0
        if chunk:
            await self._write(b"".join(chunk))

    async def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        async with self.write_lock:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()

    async def run(self) -> None:
        assert self.proc.stdout is not None
        drain = asyncio.create_task(self._drain_stderr())
        watchdog: asyncio.Task[None] | None = None
        try:
            hello = await self.proc.stdout.readline()
            msg = json.loads(hello) if hello.strip() else {}
            if msg.get("op") != "ready":
                await drain
                raise ScorerLoadError(
                    f"task_impl.py failed to load: {msg.get('error') or self._died()}", msg.get("trace", ""))
            if self._timed():
                watchdog = asyncio.create_task(self._watch_durations())
            try:
                await self._send_tasks()
                await self._read_until_done()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the runner died; what is left becomes err records below
            for item_id in list(self.items):
                await self._settle(item_id, ok=False, error=self._died(), retry=False)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            for call in self.calls:
                call.cancel()
            if self.proc.stdin is not None and not self.proc.stdin.is_closing():
                self.proc.stdin.close()
            if not drain.done():
                drain.cancel()

    async def _read_until_done(self) -> None:
        assert self.proc.stdout is not None
        while self.items:
            line = await self.proc.stdout.readline()
            if not line:
                await self.proc.wait()
                return
            msg = json.loads(line)
            if msg["op"] == "start":
                item = self.items.get(msg["id"])
                if item is not None:
                    now = time.monotonic()
                    self.attempt_started[msg["id"]] = now
                    self.trial_started.setdefault((item.index, item.trial), now)
            elif msg["op"] == "call":
                task = asyncio.create_task(self._call(msg))
                self.calls.add(task)
                task.add_done_callback(self.calls.discard)
            elif msg["op"] == "result":
                if msg.get("ok"):
                    await self._settle(msg["id"], ok=True, score=msg.get("score"), output=msg.get("output"))
                else:
                    error = f"{msg.get('stage', 'scorer')}: {msg.get('error')}"
                    await self._settle(msg["id"], ok=False, error=error, trace=msg.get("trace"))

    async def _call(self, msg: dict[str, Any]) -> None:
        item_id = msg["task"]
        try:
            reply = await self.sut.complete(msg["messages"], msg.get("params") or {})
        except SutError as exc:
            answer: dict[str, Any] = {"op": "reply", "call": msg["call"], "ok": False, "error": str(exc)}
        else:
            usage = self.usage.setdefault(item_id, {})
            for k, v in reply.usage.items():
                usage[k] = usage.get(k, 0) + v
            self.cost[item_id] = self.cost.get(item_id, 0.0) + reply.cost_usd
            answer = {"op": "reply", "call": msg["call"], "ok": True, "text": reply.text}
        self.send(answer)

    def _timed(self) -> bool:
        return self.limits.attempt_duration_s is not None or self.limits.duration_s is not None

    async def _watch_durations(self) -> None:
        """Fail attempts and trials that run past their duration ceilings (their late results are ignored)."""
        while self.items:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for item_id in list(self.items):
                item = self.items[item_id]
                if item_id not in self.attempt_started:
                    continue  # still queued in the runner
                trial_s = now - self.trial_started[(item.index, item.trial)]
                if self.limits.duration_s is not None and trial_s > self.limits.duration_s:
                    await self._settle(item_id, ok=False, limit="task.duration",
                                       error=f"limit_exceeded:task.duration ({self.limits.duration_s:g} s)")
                elif (self.limits.attempt_duration_s is not None
                      and now - self.attempt_started[item_id] > self.limits.attempt_duration_s):
                    await self._settle(item_id, ok=False, limit="attempt.duration",
                                       error=f"limit_exceeded:attempt.duration ({self.limits.attempt_duration_s:g} s)")

    async def _retry(self, item_id: int, item: TrialItem) -> bool:
        """Start another attempt of a failed trial if task.attempts allows (under a new id, so a late result of
        the abandoned attempt cannot be mistaken for it)."""
        key = (item.index, item.trial)
        if self.attempts[key] >= self.limits.attempts:
            return False
        self.attempts[key] += 1
        new_id, self.next_id = self.next_id, self.next_id + 1
        self.items[new_id] = item
        self.attempt_started[new_id] = time.monotonic()
        for carry in (self.usage, self.cost):
            if item_id in carry:
                carry[new_id] = carry.pop(item_id)  # type: ignore[index]
        self.send({"op": "task", "id": new_id, "row": item.row})
        return True

    async def _settle(self, item_id: int, *, ok: bool, score: Any = None, output: str | None = None,
                      error: str | None = None, trace: str | None = None, limit: str | None = None,
                      retry: bool = True) -> None:
        item = self.items.pop(item_id, None)
        if item is None:
            return
        self.attempt_started.pop(item_id, None)
        meta: dict[str, Any] = {}
        value: float | None = None
        if ok:
            try:
                value, meta = normalize_score(score)
            except ValueError as exc:
                error = f"score: {exc}"
        cost = self.cost.get(item_id, 0.0)
        if error is None and self.limits.cost_usd is not None and cost > self.limits.cost_usd:
            error, limit = f"limit_exceeded:task.cost (${cost:.6f} > ${self.limits.cost_usd:g})", "task.cost"
        if error and retry and limit not in ("task.duration", "task.cost") and await self._retry(item_id, item):
            return
        if trace:
            meta = {**meta, "trace": trace}
        if limit:
            meta = {**meta, "limit_exceeded": limit}
        attempts = self.attempts[(item.index, item.trial)]
        if attempts > 1:
            meta = {**meta, "attempts": attempts}
        outcome = "err" if error else outcome_for(value)
        await self.on_record(TrialRecord(
            index=item.index, trial=item.trial, outcome=outcome, score=None if error else value, output=output,
            meta=meta, error=error, usage=self.usage.pop(item_id, {}), cost_usd=self.cost.pop(item_id, 0.0),
        ))

    def _died(self) -> str:
        tail = self.stderr_tail.decode(errors="replace").strip()[-1000:]
        return f"scorer runtime exited (code {self.proc.returncode})" + (f": {tail}" if tail else "")

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr_tail = (self.stderr_tail + chunk)[-_STDERR_TAIL:]
