"""The scorer runtime: runs untrusted task_impl.py in its own process and talks JSON lines over stdio.

Started by ``benchwright.scoring.host`` as ``python runner.py --impl task_impl.py --threads N`` (standard library
only, so it starts fast and needs nothing installed where it runs). The scorer never sees model credentials: its
``call_sut`` sends the messages to the host, which makes the call and sends back the reply text.

Each task runs on one of N threads, since ``solve`` may call the model at any point and wait for it. A scorer that
declares ``one_call(row)`` says instead that its ``solve`` is exactly ``call_sut(one_call(row))`` and that its
``score`` is quick: its tasks run without threads (:class:`_InlineTasks`), at most N started at once.

Protocol (one JSON object per line):
    host -> runner   {"op": "task", "id": I, "row": {...}}
                     {"op": "reply", "call": C, "ok": true, "text": "...", "tool_calls": [...]?, "reasoning": "..."?}
                     {"op": "reply", "call": C, "ok": false, "error": "..."}
                     {"op": "drain"}   start no more queued tasks (an attempt here ran past its ceiling: once
                                       the started ones end, the host kills this runtime and starts a fresh one)
                     end of input (the host closes stdin once every result is in, or when it gives up)
    runner -> host   {"op": "ready"} | {"op": "fatal", "error": "...", "trace": "..."}
                     {"op": "waiting"}  started with --wait (see ``wait_then_main``), before its "go"
                     {"op": "start", "id": I}             the task started (with --report-starts)
                     {"op": "drained"}                    after "drain": no "start" follows
                     {"op": "call", "call": C, "task": I, "messages": [...], "params": {...}}
                     {"op": "result", "id": I, "ok": true, "score": <raw score()>, "output": "..."}
                     {"op": "result", "id": I, "ok": false, "stage": "extract|solve|score", "error": "...",
                      "trace": "..."}

The scorer's own prints go to stderr: fd 1 is re-pointed there before task_impl.py is imported, and the protocol
uses a private duplicate of the original stdout.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

MAX_OUTPUT_CHARS = 20_000


class SutCallError(Exception):
    """The model call failed for good (the host already retried transient faults)."""


class SutText(str):
    """What ``call_sut`` returns: the reply's text, a ``str`` as scorers expect, carrying the reply's
    ``tool_calls`` (OpenAI's shape; empty unless the scorer passed ``tools=`` and the model called one) and the
    ``reasoning`` a reasoning model sent beside the text (``""`` when none): not part of the text, so a scorer
    that reads the text never scores it; the trial's output shows it (:func:`output_of`)."""

    tool_calls: list[dict[str, Any]]
    reasoning: str

    def __new__(cls, text: str, tool_calls: list[dict[str, Any]], reasoning: str = "") -> SutText:
        self = super().__new__(cls, text)
        self.tool_calls = tool_calls
        self.reasoning = reasoning
        return self


def output_of(response: Any) -> str | None:
    """The trial's recorded output: what solve() returned, at most MAX_OUTPUT_CHARS; a reply's separate reasoning
    first, as a ``<think>`` block, cut (not the answer) when the two are too long together."""
    if response is None:
        return None
    text = str(response)
    reasoning = getattr(response, "reasoning", "") if isinstance(response, SutText) else ""
    if not reasoning:
        return text[:MAX_OUTPUT_CHARS]
    wrapper = len("<think>\n\n</think>\n\n")
    if len(reasoning) + len(text) + wrapper > MAX_OUTPUT_CHARS:
        room = max(MAX_OUTPUT_CHARS - len(text) - wrapper - len(f" [... {len(reasoning)} characters cut]"), 0)
        reasoning = reasoning[:room] + f" [... {len(reasoning) - room} characters cut]"
    return f"<think>\n{reasoning}\n</think>\n\n{text}"[:MAX_OUTPUT_CHARS]


def _line(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, ensure_ascii=False, default=str) + "\n").encode()


class _Input:
    """The host's lines on fd 0, read as the pipe holds them: :meth:`reads` yields the complete lines of each read, so
    that a runtime can answer a burst of lines with one write."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._parts: list[bytes] = []  # a line begun and not yet ended
        self._lines: list[bytes] = []  # read and not yet taken (after readline)

    def reads(self) -> Iterator[list[bytes]]:
        if self._lines:
            kept, self._lines = self._lines, []
            yield kept
        while (lines := self._read()) is not None:
            if lines:
                yield lines

    def readline(self) -> bytes:
        """One line (``b""`` at the end of input); what came after it in the same read is kept for :meth:`reads`."""
        while not self._lines:
            lines = self._read()
            if lines is None:
                return b""
            self._lines = lines
        return self._lines.pop(0)

    def _read(self) -> list[bytes] | None:
        data = os.read(self._fd, 1 << 16)
        if not data:
            if self._parts:  # a last line with no newline, as iterating a file yields it
                last, self._parts = b"".join(self._parts), []
                return [last]
            return None
        lines = data.split(b"\n")
        if self._parts:
            self._parts.append(lines[0])
            lines[0] = b"".join(self._parts)
            self._parts = []
        if lines[-1]:
            self._parts.append(lines[-1])
        del lines[-1]
        return [line for line in lines if line.strip()]


_STDIN = _Input(0)


class _Channel:
    """The protocol's output side. Messages from every task thread go through one writer thread, which writes
    whatever has queued up in one go: under load that is one pipe write (and one wake-up of the host) for many
    messages instead of one each."""

    def __init__(self, out_fd: int) -> None:
        self._out = os.fdopen(out_fd, "wb", buffering=0)
        self._lock = threading.Lock()
        self._calls = itertools.count()
        self._pending: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="protocol-writer", daemon=True)
        self._writer.start()

    def send(self, msg: dict[str, Any]) -> None:
        self._queue.put(_line(msg))

    def write_directly(self) -> Callable[[list[bytes]], None]:
        """Write everything sent so far, stop the writer thread, and return a writer for the caller's own thread: lines
        made by :func:`_line`, written at once. (Handed to the writer, each write waited for that thread's turn at the
        GIL while the reader held it: up to the 5 ms switch interval.)"""
        self.close()

        def write(lines: list[bytes]) -> None:
            view = memoryview(b"".join(lines))
            while view:
                view = view[self._out.write(view):]
        return write

    def close(self) -> None:
        """Write out everything sent so far (the process exits after this)."""
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while True:
            first = self._queue.get()
            batch = [first]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            done = None in batch
            data = b"".join(b for b in batch if b is not None)
            try:
                view = memoryview(data)
                while view:
                    view = view[self._out.write(view):]
            except OSError:
                return  # the host is gone; nothing left to tell it
            if done:
                return

    def call_sut(self, task_id: int, prompt_or_messages: Any, params: dict[str, Any]) -> str:
        messages = _as_messages(prompt_or_messages)
        done, box = threading.Event(), list[Any]()
        with self._lock:
            call = next(self._calls)
            self._pending[call] = (done, box)
        self.send({"op": "call", "call": call, "task": task_id, "messages": messages, "params": params})
        done.wait()
        return _response(box[0])

    def fail_pending(self, error: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for done, box in pending.values():
            box.append({"ok": False, "error": error})
            done.set()

    def deliver(self, reply: dict[str, Any]) -> None:
        with self._lock:
            done, box = self._pending.pop(reply["call"])
        box.append(reply)
        done.set()


class _TaskThreads:
    """``count`` threads running queued tasks. A background thread starts them (~60 µs each) while the scorer
    loads, instead of one per task as the first tasks arrive: started lazily, 192 threads put the first wave of
    model calls ~30 ms behind the first one.

    ``on_pick`` runs as a thread takes a task, under the same lock as ``drain``: so every "start" it reports is
    sent before "drained", and none after."""

    def __init__(self, count: int, on_pick: Callable[[int], None] | None = None) -> None:
        self._queue: queue.SimpleQueue[tuple[int, Callable[..., None], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._on_pick = on_pick
        self._pick_lock = threading.Lock()
        self._draining = False
        self._stop_starting = False
        self._starter = threading.Thread(target=self._start, args=(count,), name="task-starter", daemon=True)
        self._starter.start()

    def _start(self, count: int) -> None:
        for i in range(count):
            if self._stop_starting:
                return
            thread = threading.Thread(target=self._serve, name=f"task-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self) -> None:
        while (work := self._queue.get()) is not None:
            task_id, fn, args = work
            with self._pick_lock:
                if self._draining:
                    continue
                if self._on_pick is not None:
                    self._on_pick(task_id)
            fn(*args)

    def stop_starting(self) -> None:
        """Start no more threads: the scorer runs its tasks without them (:class:`_InlineTasks`). Those started wait
        on the empty queue until the process ends; ending them here would hold up the first tasks."""
        self._stop_starting = True

    def submit(self, task_id: int, fn: Callable[..., None], *args: Any) -> None:
        self._queue.put((task_id, fn, args))

    def drain(self, then: Callable[[], None]) -> None:
        """Start no more queued tasks (they are dropped; the host re-sends them elsewhere), then call ``then``."""
        with self._pick_lock:
            self._draining = True
            while not self._queue.empty():
                self._queue.get_nowait()
            then()

    def shutdown(self) -> None:
        """Drop tasks not yet started, let running ones finish, and end every thread."""
        self._starter.join()
        while not self._queue.empty():
            self._queue.get_nowait()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()


def _load_scorer(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("task_impl", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["task_impl"] = module
    spec.loader.exec_module(module)
    scorer_cls = getattr(module, "Scorer", None)
    if scorer_cls is None:
        raise TypeError("task_impl.py defines no class Scorer")
    scorer = scorer_cls()
    for method in ("extract", "solve", "score"):
        if not callable(getattr(scorer, method, None)):
            raise TypeError(f"Scorer has no method {method}(...)")
    return scorer


def _failed(task_id: int, stage: str, exc: BaseException) -> dict[str, Any]:
    return {"op": "result", "id": task_id, "ok": False, "stage": stage,
            "error": f"{type(exc).__name__}: {exc}"[:2000], "trace": traceback.format_exc()[-4000:]}


def _response(reply: dict[str, Any]) -> SutText:
    """What ``call_sut`` returns for the host's reply (or the call's error)."""
    if not reply.get("ok"):
        raise SutCallError(reply.get("error", "model call failed"))
    return SutText(str(reply.get("text", "")), reply.get("tool_calls") or [], str(reply.get("reasoning") or ""))


def _scored(scorer: Any, task_id: int, row: dict[str, Any], response: Any) -> dict[str, Any]:
    score = scorer.score(row, response)
    json.dumps(score)  # must travel as JSON; a non-serializable score is the scorer's error
    return {"op": "result", "id": task_id, "ok": True, "score": score, "output": output_of(response)}


def _as_messages(prompt_or_messages: Any) -> list[Any]:
    if isinstance(prompt_or_messages, str):
        return [{"role": "user", "content": prompt_or_messages}]
    if isinstance(prompt_or_messages, list):
        return prompt_or_messages
    raise TypeError("call_sut takes a prompt string or a list of chat messages")


class _InlineTasks:
    """The tasks of a scorer that declares ``one_call(row)`` (its ``solve`` is that one model call, its ``score`` is
    quick: the builtin templates but code and tool calls), run by the reader itself: it asks a task's call as the task
    starts and scores the reply as it comes. The threads' hand-offs (a task's thread woken for its task and for its
    reply, the writer for each message) were most of the runtime's CPU per task: 1,000 tasks at C=128 cost it
    0.19-0.29 s on threads, 0.09-0.12 s here (a scratch harness driving this file and the numeric template).

    The protocol is the threads': at most ``slots`` tasks started and not yet replied to, the rest queued in arrival
    order; a "start" for each (with ``report_starts``) before its "call"; "drain" drops the queued ones. What one read
    of the pipe brings is answered in one write of the calls it frees slots for, then one of its results. A ``score``
    that never returns holds up every task started beside it (on threads they went on, sharing the GIL with it), and
    the attempt ceiling ends them with it; the host gives the tasks not yet started to a fresh runtime."""

    def __init__(self, scorer: Any, slots: int, report_starts: bool) -> None:
        self._scorer = scorer
        self._free = slots
        self._report_starts = report_starts
        self._queued: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self._asked: dict[int, tuple[int, dict[str, Any]]] = {}
        self._replied: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
        self._calls = itertools.count()
        self._draining = False
        self.out: list[bytes] = []

    def task(self, task_id: int, row: dict[str, Any]) -> None:
        if self._draining:
            return
        if self._free:  # then nothing is queued
            self._free -= 1
            if not self._start(task_id, row):
                self._free += 1
        else:
            self._queued.append((task_id, row))

    def reply(self, reply: dict[str, Any]) -> None:
        """The task's slot goes to the next queued task at once; the reply is scored by :meth:`score_replies`."""
        self._replied.append((*self._asked.pop(reply["call"]), reply))
        self._next()

    def score_replies(self) -> None:
        replied, self._replied = self._replied, []
        for task_id, row, reply in replied:
            stage = "solve"
            try:
                response = _response(reply)
                stage = "score"
                self.out.append(_line(_scored(self._scorer, task_id, row, response)))
            except BaseException as exc:  # noqa: BLE001 - as in _run_task
                self.out.append(_line(_failed(task_id, stage, exc)))

    def drain(self) -> None:
        self._draining = True
        self._queued.clear()
        self.out.append(_line({"op": "drained"}))

    def fail_pending(self, error: str) -> None:
        self._draining = True
        for call in list(self._asked):
            self.reply({"op": "reply", "call": call, "ok": False, "error": error})
        self.score_replies()

    def _start(self, task_id: int, row: dict[str, Any]) -> bool:
        """Ask the task's call (True), or tell its failure (False: its slot is free again)."""
        if self._report_starts:
            self.out.append(_line({"op": "start", "id": task_id}))
        stage = "extract"
        try:
            self._scorer.extract(row)
            stage = "solve"
            messages = _as_messages(self._scorer.one_call(row))
            call = next(self._calls)
            self.out.append(_line({"op": "call", "call": call, "task": task_id, "messages": messages, "params": {}}))
        except BaseException as exc:  # noqa: BLE001 - as in _run_task
            self.out.append(_line(_failed(task_id, stage, exc)))
            return False
        self._asked[call] = (task_id, row)
        return True

    def _next(self) -> None:
        """A slot is free: the first queued task that asks its call takes it (a loop: thousands of tasks in a row may
        fail before they ask)."""
        while self._queued and not self._draining:
            if self._start(*self._queued.popleft()):
                return
        self._free += 1


def _run_task(channel: _Channel, scorer: Any, task_id: int, row: dict[str, Any]) -> None:
    stage = "extract"
    try:
        scorer.extract(row)
        stage = "solve"
        response = scorer.solve(row, lambda p, **params: channel.call_sut(task_id, p, params))
        stage = "score"
        channel.send(_scored(scorer, task_id, row, response))
    except BaseException as exc:  # noqa: BLE001 - every scorer failure becomes an err row, never a dead runner
        channel.send(_failed(task_id, stage, exc))


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--impl", required=True)
    args.add_argument("--threads", type=int, default=32)
    args.add_argument("--check", action="store_true", help="load the scorer, report ready or fatal, and exit")
    args.add_argument("--report-starts", action="store_true", help="say when each task starts (for time limits)")
    opts = args.parse_args(argv)

    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # the scorer's prints land on stderr, never in the protocol
    sys.stdout = sys.stderr
    channel = _Channel(protocol_fd)
    try:
        return _serve(channel, opts)
    finally:
        channel.close()


def _serve(channel: _Channel, opts: argparse.Namespace) -> int:
    def report(task_id: int) -> None:
        channel.send({"op": "start", "id": task_id})

    pool = None if opts.check else _TaskThreads(max(opts.threads, 1), report if opts.report_starts else None)
    try:
        scorer = _load_scorer(opts.impl)
    except BaseException as exc:  # noqa: BLE001
        channel.send({"op": "fatal", "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-4000:]})
        if pool is not None:
            pool.shutdown()
        return 2
    channel.send({"op": "ready"})
    if opts.check:
        return 0
    if callable(getattr(scorer, "one_call", None)):
        assert pool is not None
        pool.stop_starting()
        return _serve_inline(channel, _InlineTasks(scorer, max(opts.threads, 1), opts.report_starts))
    assert pool is not None
    for lines in _STDIN.reads():
        for line in lines:
            msg = json.loads(line)
            if msg.get("op") == "task":
                pool.submit(msg["id"], _run_task, channel, scorer, msg["id"], msg["row"])
            elif msg.get("op") == "reply":
                channel.deliver(msg)
            elif msg.get("op") == "drain":
                pool.drain(lambda: channel.send({"op": "drained"}))
    # stdin ended: the host has every result, or gave up. Unblock calls still waiting so the threads can end.
    channel.fail_pending("the host closed the scorer channel")
    pool.shutdown()
    return 0


def _serve_inline(channel: _Channel, tasks: _InlineTasks) -> int:
    write = channel.write_directly()
    try:
        for lines in _STDIN.reads():
            for line in lines:
                msg = json.loads(line)
                if msg.get("op") == "task":
                    tasks.task(msg["id"], msg["row"])
                elif msg.get("op") == "reply":
                    tasks.reply(msg)
                elif msg.get("op") == "drain":
                    tasks.drain()
            # What one read brought is answered in two writes: first the calls of the tasks that took the replied
            # ones' slots (the next wave of calls is not held up by this one's scoring), then the results.
            for _ in range(2):
                if tasks.out:
                    write(tasks.out)
                    tasks.out = []
                tasks.score_replies()
        # stdin ended: the host has every result, or gave up
        tasks.fail_pending("the host closed the scorer channel")
        write(tasks.out)
    except OSError:
        pass  # the host is gone; nothing left to tell it
    return 0


def wait_then_main(prime: str | None = None) -> int:
    """``--wait [--prime FILE]``: a runtime started ahead of its batch in a warm sandbox
    (``benchwright.sandbox.local.warm``). It runs ``FILE`` (its errors ignored: priming caches a scorer's load would
    fill), says ``{"op": "waiting"}``, then waits for ``{"op": "go", "args": [...], "env": {...}}`` and goes
    on as ``runner.py <args>`` started with that environment (the host checked that everything the interpreter
    reads as it starts was the same, but ``PYTHONPATH``, which is applied here as the interpreter would have)."""
    if prime is not None:
        try:
            with open(prime, encoding="utf-8") as f:
                exec(compile(f.read(), prime, "exec"), {"__name__": "__prime__"})
        except Exception:  # noqa: BLE001 - a primer that fails only leaves the caches cold
            pass
    print(json.dumps({"op": "waiting"}), flush=True)
    line = _STDIN.readline()
    if not line:
        return 0  # never claimed: the pool killed or replaced this runtime
    go = json.loads(line)
    env = {str(k): str(v) for k, v in go.get("env", {}).items()}
    os.environ.clear()
    os.environ.update(env)
    sys.path[1:1] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]  # after the script's directory
    return main([str(a) for a in go["args"]])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--wait"]:
        sys.exit(wait_then_main(sys.argv[3] if sys.argv[2:3] == ["--prime"] and len(sys.argv) == 4 else None))
    sys.exit(main())
