"""The scorer runtime's protocol, spoken to the real ``runner.py`` in a plain subprocess: a scorer that declares its
``solve`` to be one model call (``one_call(row)``, the builtin templates whose ``score`` is quick) runs its tasks
without a thread each, and must answer exactly as a scorer that runs them on threads (issue 25)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchwright.drivers import ScorerPlan
from benchwright.drivers.templates import render_plan
from benchwright.scoring.host import RUNNER, runner_env

THREADED = '''
class Scorer:
    def extract(self, row):
        if row.get("boom") == "extract":
            raise KeyError("no such column")
        return row["q"]

    def solve(self, row, call_sut):
        if row.get("boom") == "solve":
            return call_sut(42)  # neither a prompt nor messages: call_sut's TypeError
        return call_sut([{"role": "system", "content": "Answer."}, {"role": "user", "content": self.extract(row)}])

    def score(self, row, response):
        if row.get("boom") == "score":
            raise ValueError("cannot score " + response)
        if row.get("boom") == "json":
            return {"score": 1.0, "answer": object()}
        return {"score": 1.0 if response.strip() == row["a"] else 0.0, "answer": response.strip(),
                "reasoning": response.reasoning}
'''

ONE_CALL = THREADED + '''
    def one_call(self, row):
        if row.get("boom") == "solve":
            return 42
        return [{"role": "system", "content": "Answer."}, {"role": "user", "content": self.extract(row)}]
'''

SCORERS = pytest.mark.parametrize("impl", [THREADED, ONE_CALL], ids=["threads", "one_call"])

_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_runtime_left() -> Iterator[None]:
    """A test that fails half-way leaves no runtime waiting on its stdin: each is killed by its own PID."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


class Runtime:
    """``python runner.py`` in ``directory``, spoken to over its pipes; every read is bounded (a runtime that stops
    answering fails the test instead of hanging it)."""

    def __init__(self, directory: Path, impl: str, *args: str, wait: bool = False) -> None:
        (directory / "task_impl.py").write_text(impl)
        (directory / "runner.py").write_bytes(RUNNER.read_bytes())
        argv = ["--wait"] if wait else ["--impl", "task_impl.py", *args]
        self.proc = subprocess.Popen([sys.executable, "runner.py", *argv], cwd=directory,
                                     env=runner_env(str(directory)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        _STARTED.append(self.proc)
        self._buffer = b""
        self.seen: list[dict[str, Any]] = []

    def send(self, *msgs: dict[str, Any], raw: bytes = b"") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in msgs) + raw)
        self.proc.stdin.flush()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def until(self, done: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The messages read up to and including the first one ``done`` accepts."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        out: list[dict[str, Any]] = []
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                msg = json.loads(line)
                out.append(msg)
                self.seen.append(msg)
                if done(msg):
                    return out
            left = deadline - time.monotonic()
            assert left > 0 and select.select([fd], [], [], left)[0], f"the runtime said nothing more; so far {out}"
            data = os.read(fd, 1 << 16)
            assert data, f"the runtime ended its output; so far {out}"
            self._buffer += data

    def finish(self) -> int:
        self.close()
        assert self.proc.stdout is not None
        self._buffer += self.proc.stdout.read()
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self.seen.append(json.loads(line))
        return self.proc.wait(timeout=30)


def _op(name: str, **kw: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["op"] == name and all(m.get(k) == v for k, v in kw.items())


def _results(msgs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each task's result without its trace (whose frames differ by the way the task ran)."""
    return {m["id"]: {k: v for k, v in m.items() if k != "trace"} for m in msgs if m["op"] == "result"}


ROWS = {
    1: {"q": "2+2?", "a": "4"},
    2: {"q": "3+3?", "a": "6"},
    3: {"q": "x", "boom": "extract"},
    4: {"q": "x", "boom": "solve"},
    5: {"q": "x", "a": "4", "boom": "score"},
    6: {"q": "x", "a": "4", "boom": "json"},
    7: {"q": "the model fails", "a": "4"},
}


def _serve_all(rt: Runtime, rows: dict[int, dict[str, Any]]) -> None:
    """Send every task, answer every call ("4", with a reasoning part; the call for the task asking "the model
    fails" fails), until every task has its result."""
    rt.send(*({"op": "task", "id": i, "row": row} for i, row in rows.items()))
    left = set(rows)
    while left:
        msg = rt.until(lambda m: m["op"] in ("call", "result"))[-1]
        if msg["op"] == "result":
            left.discard(msg["id"])
        elif msg["messages"][-1]["content"] == "the model fails":
            rt.send({"op": "reply", "call": msg["call"], "ok": False, "error": "model endpoint answered HTTP 503"})
        else:
            rt.send({"op": "reply", "call": msg["call"], "ok": True, "text": "4", "reasoning": "2 and 2"})


def test_a_one_call_scorer_answers_every_task_as_a_threaded_one(tmp_path: Path) -> None:
    transcripts = {}
    for name, impl in (("threads", THREADED), ("one_call", ONE_CALL)):
        (tmp_path / name).mkdir()
        rt = Runtime(tmp_path / name, impl, "--threads", "3")
        rt.until(_op("ready"))
        _serve_all(rt, ROWS)
        assert rt.finish() == 0
        transcripts[name] = rt.seen
    threads, one_call = (_results(transcripts[n]) for n in ("threads", "one_call"))
    assert one_call == threads
    assert threads[1] == {"op": "result", "id": 1, "ok": True, "output": "<think>\n2 and 2\n</think>\n\n4",
                          "score": {"score": 1.0, "answer": "4", "reasoning": "2 and 2"}}
    assert threads[2]["score"]["score"] == 0.0
    assert (threads[3]["stage"], threads[3]["error"]) == ("extract", "KeyError: 'no such column'")
    assert (threads[4]["stage"], threads[4]["error"]) == (
        "solve", "TypeError: call_sut takes a prompt string or a list of chat messages")
    assert (threads[5]["stage"], threads[5]["error"]) == ("score", "ValueError: cannot score 4")
    assert threads[6]["stage"] == "score" and threads[6]["error"].startswith("TypeError: Object of type object")
    assert (threads[7]["stage"], threads[7]["error"]) == ("solve", "SutCallError: model endpoint answered HTTP 503")
    # the same calls asked, the same messages in them
    calls = {n: sorted(json.dumps(m["messages"]) for m in transcripts[n] if m["op"] == "call") for n in transcripts}
    assert calls["one_call"] == calls["threads"] and len(calls["threads"]) == 5  # 1, 2, 5, 6 and 7


def test_a_one_call_scorer_has_at_most_its_slots_asked_at_once(tmp_path: Path) -> None:
    rt = Runtime(tmp_path, ONE_CALL, "--threads", "2")
    rt.until(_op("ready"))
    rt.send(*({"op": "task", "id": i, "row": {"q": f"q{i}", "a": "4"}} for i in range(1, 6)))
    first = rt.until(_op("call", task=2))
    assert [m["task"] for m in first] == [1, 2]
    rt.send({"op": "reply", "call": first[0]["call"], "ok": True, "text": "4"})
    # Whatever the five tasks and the reply made the runtime say was said before the reply's result: one slot freed,
    # one more task asked, and its call goes out before the replied task's result.
    upto = rt.until(_op("result", id=1))
    assert [(m["op"], m.get("task", m.get("id"))) for m in upto] == [("call", 3), ("result", 1)]
    rt.send(*({"op": "reply", "call": c, "ok": True, "text": "4"} for c in (first[1]["call"], upto[0]["call"])))
    upto = rt.until(_op("result", id=3))
    assert sorted((m["op"], m.get("task", m.get("id"))) for m in upto) == [
        ("call", 4), ("call", 5), ("result", 2), ("result", 3)]
    assert rt.finish() == 0
    assert [m["id"] for m in rt.seen if m["op"] == "result"][-2:] == [4, 5]  # ended by the closed channel


@SCORERS
def test_starts_are_told_before_their_calls_and_a_drain_drops_the_queued_tasks(tmp_path: Path, impl: str) -> None:
    rt = Runtime(tmp_path, impl, "--threads", "1", "--report-starts")
    rt.until(_op("ready"))
    rt.send(*({"op": "task", "id": i, "row": {"q": f"q{i}", "a": "4"}} for i in (1, 2, 3)))
    assert [m["op"] for m in rt.until(_op("call", task=1))] == ["start", "call"]
    rt.send({"op": "drain"})
    rt.until(_op("drained"))
    call = next(m for m in rt.seen if m["op"] == "call")
    rt.send({"op": "reply", "call": call["call"], "ok": True, "text": "4"})
    rt.until(_op("result", id=1))
    assert rt.finish() == 0
    assert [(m["op"], m.get("id", m.get("task"))) for m in rt.seen] == [
        ("ready", None), ("start", 1), ("call", 1), ("drained", None), ("result", 1)]


@SCORERS
def test_thousands_of_queued_tasks_failing_in_a_row_each_get_their_result(tmp_path: Path, impl: str) -> None:
    rt = Runtime(tmp_path, impl, "--threads", "1")
    rt.until(_op("ready"))
    rt.send({"op": "task", "id": 0, "row": {"q": "q", "a": "4"}},
            *({"op": "task", "id": i, "row": {"q": "x", "boom": "extract"}} for i in range(1, 3001)))
    call = rt.until(_op("call", task=0))[-1]
    rt.send({"op": "reply", "call": call["call"], "ok": True, "text": "4"})  # its slot frees for the 3,000 behind it
    rt.until(lambda m: m["op"] == "result" and sum(s["op"] == "result" for s in rt.seen) == 3001)
    assert rt.finish() == 0
    results = {m["id"]: m for m in rt.seen if m["op"] == "result"}
    assert results[0]["ok"] and all(results[i]["stage"] == "extract" for i in range(1, 3001))


@SCORERS
def test_the_end_of_input_fails_the_calls_still_waiting(tmp_path: Path, impl: str) -> None:
    rt = Runtime(tmp_path, impl, "--threads", "4")
    rt.until(_op("ready"))
    rt.send({"op": "task", "id": 1, "row": {"q": "q", "a": "4"}})
    rt.until(_op("call"))
    assert rt.finish() == 0
    result = rt.seen[-1]
    assert (result["op"], result["id"], result["ok"], result["stage"], result["error"]) == (
        "result", 1, False, "solve", "SutCallError: the host closed the scorer channel")


@SCORERS
def test_lines_longer_than_a_read_and_a_last_line_with_no_newline_are_read_whole(tmp_path: Path, impl: str) -> None:
    rt = Runtime(tmp_path, impl, "--threads", "4")
    rt.until(_op("ready"))
    big = "é" * 150_000  # 300 KB of UTF-8: several reads of the pipe, one split inside a character
    line = json.dumps({"op": "task", "id": 1, "row": {"q": big, "a": "4"}}, ensure_ascii=False).encode()
    rt.send(raw=line[:70_001])
    rt.send(raw=line[70_001:] + b"\n")
    call = rt.until(_op("call", task=1))[-1]
    assert call["messages"][-1]["content"] == big
    rt.send(raw=json.dumps({"op": "reply", "call": call["call"], "ok": True, "text": "4"}).encode())  # no newline
    assert rt.finish() == 0  # the reply is ended by the end of input alone
    assert [(m["id"], m["score"]["score"]) for m in rt.seen if m["op"] == "result"] == [(1, 1.0)]


@SCORERS
def test_a_warm_runtime_keeps_the_lines_that_came_with_its_go(tmp_path: Path, impl: str) -> None:
    rt = Runtime(tmp_path, impl, wait=True)
    rt.until(_op("waiting"))
    go = {"op": "go", "args": ["--impl", "task_impl.py", "--threads", "2"], "env": runner_env(str(tmp_path))}
    rt.send(go, {"op": "task", "id": 1, "row": {"q": "q", "a": "4"}})  # one write: the task behind the go
    call = rt.until(_op("call", task=1))[-1]
    rt.send({"op": "reply", "call": call["call"], "ok": True, "text": "4"})
    assert rt.until(_op("result", id=1))[-1]["score"]["score"] == 1.0
    assert rt.finish() == 0


@pytest.mark.parametrize("plan", [
    ScorerPlan(template="numeric", fields={"input": "question", "reference": "answer"}, why=""),
    ScorerPlan(template="exact_match", fields={"input": "question", "reference": "answer"}, why=""),
    ScorerPlan(template="multiple_choice", fields={"input": "question", "reference": "answer", "choices": "choices"},
               why=""),
], ids=lambda p: p.template)
def test_a_template_that_declares_one_call_solves_by_exactly_that_call(plan: ScorerPlan) -> None:
    ns: dict[str, Any] = {"__name__": "task_impl"}
    exec(compile(render_plan(plan), "task_impl.py", "exec"), ns)
    scorer = ns["Scorer"]()
    row = {"question": "Which is prime?", "answer": "B", "choices": ["4", "7", "9"]}
    asked: list[Any] = []

    def call_sut(messages: Any, **params: Any) -> str:
        asked.append((messages, params))
        return "B"

    assert scorer.solve(row, call_sut) == "B"
    assert asked == [(scorer.one_call(row), {})]
