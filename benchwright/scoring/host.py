"""The worker's side of the scorer runtime: start ``runner.py`` on task_impl.py, feed it trials, make its model
calls, and turn what comes back into trial records.

The runner process gets a clean environment (no provider keys, nothing of the worker's), and the model calls it
asks for are made here with the run's SUT client, so untrusted scorer code never holds a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchwright import fastjson
from benchwright.llm.sut import SutClient, SutError
from benchwright.runs.halts import limit_exceeded
from benchwright.scoring.aggregators import normalize_score, outcome_for
from benchwright.scoring.results import model_input
from benchwright.security.traces import relative_trace

RUNNER = Path(__file__).with_name("runner.py")
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
    input: str | None = None
    """The messages of the trial's last model call, bounded (``benchwright.scoring.results.model_input``)."""
    duration_ms: int | None = None
    """From the runtime taking the trial up to its settling (retries included); None if it never started."""


def runner_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The scorer's whole environment: nothing of the worker's (so no credentials) beyond a PATH."""
    return {"PATH": os.defpath, "HOME": home, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "LANG": "C.UTF-8", **(extra or {})}


Spawn = Callable[[list[str]], Awaitable[Any]]
"""Starts ``python runner.py <args>`` where the scorer lives (a sandbox, or a plain directory) and returns a process
handle shaped like ``asyncio.subprocess.Process`` (stdin/stdout/stderr pipes, ``wait``, ``kill``, ``returncode``).
``task_impl.py`` and ``runner.py`` are in its working directory."""


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
        detail = msg.get("error") or (f"scorer runtime exited with {proc.returncode}: "
                                      f"{err.decode(errors='replace')[-500:]}")
        raise ScorerLoadError(f"task_impl.py failed to load: {detail}", msg.get("trace", ""))


@dataclass(frozen=True)
class TrialLimits:
    """Per-trial ceilings (§9 task/attempt levels) and the batch's own. A trial past one lands in err with the limit
    in its meta."""

    attempts: int = 1
    duration_s: float | None = None
    cost_usd: float | None = None
    attempt_duration_s: float | None = None
    load_s: float = 60.0
    """How long a scorer runtime may take to import task_impl.py and build its Scorer (one stuck there is killed)."""
    deadline: float | None = None
    """``time.monotonic()`` past which every trial not yet settled errs ``limit_exceeded:batch.duration``."""


WATCH_EVERY_S = 0.05
_RESTART_ERROR = "scorer runtime could not be restarted"
_NO_RETRY = ("task.duration", "task.cost", "batch.duration")
"""Ceilings that fail the trial itself (§9: a task ceiling never retries), not just one attempt."""


async def run_trials(*, spawn: Spawn, items: list[TrialItem], sut: SutClient, threads: int,
                     on_record: Callable[[TrialRecord], Awaitable[None]],
                     limits: TrialLimits = TrialLimits(), reap: bool = True) -> None:
    """Run every item through the scorer; ``on_record`` gets one record per item, in completion order.

    An item whose scorer raised, whose model call failed for good, or whose runner died becomes an ``err`` record
    (after ``limits.attempts`` attempts); only a scorer that does not load at all raises. An attempt past its
    duration ceiling cannot be interrupted inside the runner (a thread in ``while True: pass`` never yields), so
    the runtime is killed, which frees its CPU, and a fresh one carries on with the trials still unsettled.

    ``reap=False``: the caller ends the sandbox right after (a batch's), so a runtime that settled every item is
    killed without waiting for it to die; the sandbox's end reaps it.

    Raises:
        ScorerLoadError: task_impl.py did not load (or did not finish loading within ``limits.load_s``).
    """
    if not items:
        return
    await _Session(spawn, items, sut, threads, on_record, limits, reap=reap).run()


_ENCODE = json.JSONEncoder(ensure_ascii=False, default=str).encode
"""``json.dumps(msg, ensure_ascii=False, default=str)`` without making an encoder per call (~1.6 µs of ~5)."""
_DECODE = json.JSONDecoder().decode


def _line(msg: dict[str, Any]) -> bytes:
    """A message to the runner as one line: ``_ENCODE``'s meaning, by orjson where it writes the same (a task, a
    reply: ~0.5 µs instead of ~2; a value of a type JSON does not have, a NaN: ``_ENCODE`` itself)."""
    return fastjson.dumps_bytes(msg, _ENCODE) + b"\n"


def _read_line(line: bytes) -> Any:
    """A runner's line as ``json.loads`` reads it, by orjson where that is the same (three messages a trial, ~2.5 µs
    each by ``json``); the rest by ``json`` from the text decoded as before (not sniffed for another encoding; a
    lone surrogate kept)."""
    return fastjson.loads(line, _decode_text)


def _decode_text(line: bytes) -> Any:
    return _DECODE(line.decode("utf-8", "surrogatepass"))


TASK_CHUNK_BYTES = 16 * 1024
"""The tasks sent to a runner go in writes of about this size."""

OUTBOX_COALESCE_S = 0.001
"""How long a reply for the runner waits for others to share its pipe write. One loop turn (``call_soon``) coalesced
one or two replies at 2,000 trials/s, and the writes took ~19 % of the worker's event loop in a 10,000 x 5 run
(py-spy); a millisecond against a model call of tens: 10,000 x 5 at C=128 in 22.7-22.8 s instead of 23.2-24.1 s,
worker CPU 12.8-13.3 s instead of 14.0-14.7 s (docs/performance.md)."""


class _Runtime:
    """One scorer runtime process and what belongs to it: its pipes, the model calls it has in flight, the tail of
    its stderr. ``killed`` says the host ended it (a ceiling), as opposed to a runtime that died on its own;
    ``doomed_at`` that an attempt in it ran past its ceiling, so it starts nothing more and is killed once the
    attempts it started are settled; ``drained`` that it confirmed so."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.calls: set[asyncio.Task[None]] = set()
        self.outbox: list[bytes] = []
        self.write_lock = asyncio.Lock()
        self.stderr_tail = b""
        self.killed = False
        self.doomed_at: float | None = None
        self.drained = False
        self.drain = asyncio.create_task(self._drain_stderr())

    def send(self, msg: dict[str, Any]) -> None:
        """Queue a message for the runner. What is queued within ``OUTBOX_COALESCE_S`` goes out in one write: a pipe
        write per model reply (and the runner's wake-up per write) cost ~0.1 ms of this process's CPU each. Lines are
        whole in every write, so these writes interleave safely with ``write``'s chunks."""
        if not self.outbox:
            asyncio.get_running_loop().call_later(OUTBOX_COALESCE_S, self._flush_outbox)
        self.outbox.append(_line(msg))

    def _flush_outbox(self) -> None:
        data, self.outbox = b"".join(self.outbox), []
        stdin = self.proc.stdin
        if data and stdin is not None and not stdin.is_closing() and not self.killed:
            stdin.write(data)  # a dead runner is noticed on stdout (EOF), which settles what is left

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        async with self.write_lock:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()

    def kill(self) -> None:
        """End the runtime now (every thread of it, however stuck); its stdout then ends, waking the reader."""
        self.killed = True
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def close(self, *, reap: bool = True) -> None:
        """Cancel its model calls, end the process and reap it. ``reap=False``: end it and leave the reaping (and its
        exit status) to the sandbox's end, which follows (a 192-thread runtime takes ~7 ms to die, issue 25)."""
        for call in self.calls:
            call.cancel()
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if not reap:
            self.drain.cancel()
            return
        await self.proc.wait()
        try:  # the rest of its stderr, for the error message; a grandchild holding the pipe must not hold us
            await asyncio.wait_for(asyncio.shield(self.drain), 2.0)
        except TimeoutError:
            self.drain.cancel()

    def died(self) -> str:
        tail = self.stderr_tail.decode(errors="replace").strip()[-1000:]
        return f"scorer runtime exited (code {self.proc.returncode})" + (f": {tail}" if tail else "")

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr_tail = (self.stderr_tail + chunk)[-_STDERR_TAIL:]


class _Session:
    def __init__(self, spawn: Spawn, items: list[TrialItem], sut: SutClient, threads: int,
                 on_record: Callable[[TrialRecord], Awaitable[None]], limits: TrialLimits, *,
                 reap: bool = True) -> None:
        self.spawn = spawn
        self.reap = reap
        self.items = dict(enumerate(items))
        self.next_id = len(items)
        self.sut = sut
        self.threads = threads
        self.on_record = on_record
        self.limits = limits
        self.runtime: _Runtime | None = None
        self.runtimes = 0
        # Clocks start when the runner picks a task up (its "start" message), not while it waits in the queue.
        self.attempt_started: dict[int, float] = {}
        self.trial_started: dict[tuple[int, int], float] = {}
        self.attempts: dict[tuple[int, int], int] = {(i.index, i.trial): 1 for i in items}
        self.usage: dict[int, dict[str, int]] = {}
        self.cost: dict[int, float] = {}
        self.inputs: dict[int, Any] = {}
        """The messages of each item's latest model call; rendered to one bounded string when it settles."""
        self.failure: Exception | None = None
        """What ended the watchdog (``on_record`` raised in it); ``run`` raises it."""

    def _timed(self) -> bool:
        return (self.limits.attempt_duration_s is not None or self.limits.duration_s is not None
                or self.limits.deadline is not None)

    async def run(self) -> None:
        watchdog = asyncio.create_task(self._watch_durations()) if self._timed() else None
        try:
            while self.items and self.failure is None:
                runtime = await self._start_runtime()
                if runtime is None:
                    return
                self.runtime = runtime
                try:
                    await self._serve(runtime)
                finally:
                    self.runtime = None
                    # Settled to the last trial: nothing more is wanted of it, not even how it ended.
                    done = not self.items and self.failure is None
                    await asyncio.shield(runtime.close(reap=self.reap or not done))
                self.attempt_started.clear()  # a trial re-sent to a fresh runtime starts its attempt anew
                if self.items and not runtime.killed and self.failure is None:
                    # It died on its own (a crash, out of memory): what is left becomes err records.
                    for item_id in list(self.items):
                        await self._settle(item_id, ok=False, error=runtime.died(), retry=False)
            if self.failure is not None:
                raise self.failure
        finally:
            if watchdog is not None:
                watchdog.cancel()

    async def _start_runtime(self) -> _Runtime | None:
        """A runtime that has loaded the scorer. The first one failing to load is the scorer's fault (raised); a
        replacement failing settles what is left as err (the scorer loaded before, in the same sandbox)."""
        self.runtimes += 1
        args = ["--impl", "task_impl.py", "--threads", str(self.threads)]
        runtime = _Runtime(await self.spawn([*args, *(["--report-starts"] if self._timed() else [])]))
        assert runtime.proc.stdout is not None
        msg: dict[str, Any] = {}
        try:
            hello = await asyncio.wait_for(runtime.proc.stdout.readline(), self.limits.load_s)
            msg = json.loads(hello) if hello.strip() else {}
        except TimeoutError:
            msg = {"error": f"it did not finish loading within {self.limits.load_s:g} s"}
        if msg.get("op") == "ready":
            return runtime
        await runtime.close()
        error = msg.get("error") or runtime.died()
        if self.runtimes == 1:
            raise ScorerLoadError(f"task_impl.py failed to load: {error}", msg.get("trace", ""))
        for item_id in list(self.items):
            await self._settle(item_id, ok=False, error=f"{_RESTART_ERROR}: {error}", retry=False)
        return None

    async def _serve(self, runtime: _Runtime) -> None:
        """Give the runtime every unsettled trial and read until they are all settled or the runtime ends."""
        if self.failure is not None:
            return  # the watchdog failed while this runtime loaded
        # The tasks go out while the runner's first calls are served. Read only after the last task was written, the
        # first call of a 1,000-task batch waited ~30 ms for the other tasks' encoding (issue 25).
        sending = asyncio.create_task(self._send_tasks(runtime, list(self.items.items())))
        try:
            await self._read_until_done(runtime)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the runner died (or was killed); the caller settles or re-sends what is left
        finally:
            sending.cancel()  # done by now unless the runner ended first
            await asyncio.gather(sending, return_exceptions=True)
        error = None if sending.cancelled() else sending.exception()
        if error is not None and not isinstance(error, (BrokenPipeError, ConnectionResetError)):
            raise error  # a write that failed for another reason than the runner's end

    async def _send_tasks(self, runtime: _Runtime, items: list[tuple[int, TrialItem]]) -> None:
        """All tasks in a few writes (one syscall per ``TASK_CHUNK_BYTES``, not one per task); the runner queues
        them. The first write carries as many tasks as the runner has threads, so that each thread has one at once;
        between two writes the runner's first messages are read (a 64 KiB chunk's encoding held them up ~10 ms)."""
        chunk: list[bytes] = []
        size = 0
        first = self.threads
        for n, (item_id, item) in enumerate(items, 1):
            line = _line({"op": "task", "id": item_id, "row": item.row})
            chunk.append(line)
            size += len(line)
            if size >= TASK_CHUNK_BYTES or n == first:
                await runtime.write(b"".join(chunk))
                chunk, size = [], 0
                await asyncio.sleep(0)  # the reader's turn: a call may be waiting
        if chunk:
            await runtime.write(b"".join(chunk))

    async def _read_until_done(self, runtime: _Runtime) -> None:
        stdout = runtime.proc.stdout
        assert stdout is not None
        while self.items:
            line = await stdout.readline()
            if not line:
                await runtime.proc.wait()
                return
            msg = _read_line(line)
            if msg["op"] == "start":
                item = self.items.get(msg["id"])
                if item is not None:
                    now = time.monotonic()
                    self.attempt_started[msg["id"]] = now
                    self.trial_started.setdefault((item.index, item.trial), now)
            elif msg["op"] == "call":
                if not runtime.killed:
                    task = asyncio.create_task(self._call(runtime, msg))
                    runtime.calls.add(task)
                    task.add_done_callback(runtime.calls.discard)
            elif msg["op"] == "result":
                if msg.get("ok"):
                    await self._settle(msg["id"], ok=True, score=msg.get("score"), output=msg.get("output"))
                else:
                    error = f"{msg.get('stage', 'scorer')}: {msg.get('error')}"
                    await self._settle(msg["id"], ok=False, error=error, trace=msg.get("trace"))
                self._maybe_kill(time.monotonic())
            elif msg["op"] == "drained":
                runtime.drained = True
                self._maybe_kill(time.monotonic())

    async def _call(self, runtime: _Runtime, msg: dict[str, Any]) -> None:
        item_id = msg["task"]
        self.inputs[item_id] = msg["messages"]
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
            if reply.tool_calls:
                answer["tool_calls"] = reply.tool_calls
            if reply.reasoning:
                answer["reasoning"] = reply.reasoning
        runtime.send(answer)

    def _expired(self, now: float) -> list[tuple[int, str, str]]:
        """Trials past a ceiling now, as (id, limit path, error)."""
        if self.limits.deadline is not None and now > self.limits.deadline:
            return [(item_id, "batch.duration", f"{limit_exceeded('batch.duration')} (the batch's ceiling passed)")
                    for item_id in self.items]
        out = []
        # Only the attempts under way can be past a ceiling (a trial still queued in the runner has not started):
        # the runner's threads bound them, where the batch's unsettled trials may be thousands, looked at every
        # WATCH_EVERY_S (~7 % of the worker's time in a 10,000 x 5 run when every trial was).
        for item_id, attempt_s in self.attempt_started.items():
            item = self.items.get(item_id)
            if item is None:  # settled: _settle forgets its start in the same step
                continue
            trial_s = now - self.trial_started[(item.index, item.trial)]
            if self.limits.duration_s is not None and trial_s > self.limits.duration_s:
                out.append((item_id, "task.duration",
                            f"{limit_exceeded('task.duration')} ({self.limits.duration_s:g} s)"))
            elif self.limits.attempt_duration_s is not None and now - attempt_s > self.limits.attempt_duration_s:
                out.append((item_id, "attempt.duration",
                            f"{limit_exceeded('attempt.duration')} ({self.limits.attempt_duration_s:g} s)"))
        return out

    async def _watch_durations(self) -> None:
        """Fail attempts and trials that run past their ceilings, and have the runtime running them killed: the
        attempt cannot be stopped any other way, and a stuck thread would otherwise spin (and hold its pool slot)
        for good. The runtime is first drained, not killed at once: the attempts it already started keep their
        progress (and the other stuck ones, started a few ms apart, reach their ceilings too), so one kill serves
        a whole wave of stuck attempts; the trials it never started, and retries, go to its replacement."""
        try:
            while True:
                await asyncio.sleep(WATCH_EVERY_S)
                now = time.monotonic()
                expired = self._expired(now)
                runtime = self.runtime
                if expired and runtime is not None and not runtime.killed:
                    if expired[0][1] == "batch.duration":
                        runtime.kill()  # every trial is settled below: nothing of this runtime is still wanted
                    elif runtime.doomed_at is None:
                        runtime.doomed_at = now
                        runtime.send({"op": "drain"})
                for item_id, limit, error in expired:
                    await self._settle(item_id, ok=False, limit=limit, error=error)
                self._maybe_kill(now)
        except Exception as exc:  # noqa: BLE001 - on_record's (a commit crossing run.cost): the session's outcome
            self.failure = exc
            if self.runtime is not None:
                self.runtime.kill()  # wakes the reader, and run() raises it

    async def _retry(self, item_id: int, item: TrialItem) -> bool:
        """Start another attempt of a failed trial if task.attempts allows (under a new id, so a late result of
        the abandoned attempt cannot be mistaken for it)."""
        key = (item.index, item.trial)
        if self.attempts[key] >= self.limits.attempts:
            return False
        self.attempts[key] += 1
        new_id, self.next_id = self.next_id, self.next_id + 1
        self.items[new_id] = item
        if item_id in self.usage:
            self.usage[new_id] = self.usage.pop(item_id)
        if item_id in self.cost:
            self.cost[new_id] = self.cost.pop(item_id)
        self.inputs.pop(item_id, None)
        if self.runtime is not None and not self.runtime.killed and self.runtime.doomed_at is None:
            self.runtime.send({"op": "task", "id": new_id, "row": item.row})
        # else: the next runtime is given every unsettled trial, this one included
        return True

    def _maybe_kill(self, now: float) -> None:
        """Kill a doomed runtime once it has confirmed the drain and every attempt it started is settled, or once
        a whole attempt ceiling has passed since it was doomed (by then each attempt it started has ended or
        expired; a runtime too wedged to confirm the drain is killed then too)."""
        runtime = self.runtime
        if runtime is None or runtime.killed or runtime.doomed_at is None:
            return
        if (runtime.drained and not self.attempt_started) or now - runtime.doomed_at > self._drain_grace():
            runtime.kill()

    def _drain_grace(self) -> float:
        ceilings = [c for c in (self.limits.attempt_duration_s, self.limits.duration_s) if c is not None]
        return min(ceilings, default=0.0)

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
            error, limit = f"{limit_exceeded('task.cost')} (${cost:.6f} > ${self.limits.cost_usd:g})", "task.cost"
        if error and retry and limit not in _NO_RETRY and await self._retry(item_id, item):
            return
        if trace:  # shown to the run's readers: without the server's paths (benchwright.security.traces)
            meta = {**meta, "trace": relative_trace(trace)}
        if limit:
            meta = {**meta, "limit_exceeded": limit}
        # Settled for good: nothing of the trial stays behind in this session (a batch's worth would: issue 25).
        attempts = self.attempts.pop((item.index, item.trial), 1)
        if attempts > 1:
            meta = {**meta, "attempts": attempts}
        outcome = "err" if error else outcome_for(value)
        started = self.trial_started.pop((item.index, item.trial), None)
        await self.on_record(TrialRecord(
            index=item.index, trial=item.trial, outcome=outcome, score=None if error else value, output=output,
            meta=meta, error=error, usage=self.usage.pop(item_id, {}), cost_usd=self.cost.pop(item_id, 0.0),
            input=model_input(self.inputs.pop(item_id, None)),
            duration_ms=None if started is None else round((time.monotonic() - started) * 1000),
        ))
