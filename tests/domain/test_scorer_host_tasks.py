"""The scorer host serves the runner's model calls while it is still writing the batch's tasks: a 1,000-task batch's
first call no longer waits for every other task's encoding and write (issue 25)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from benchwright.llm.sut import SutReply
from benchwright.scoring.host import TrialItem, TrialRecord, run_trials, runner_env

SLOW_READER = r'''
"""A test double of runner.py that speaks its protocol: it asks its first model call at once, then reads nothing (its
stdin backs up) until the test's SUT double says the call was made (a byte on the pipe whose read end it was given;
at most 30 s, so a host that never makes the call fails the test instead of hanging it), then scores every task 1."""
import json, os, select, sys

def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()

send({"op": "ready"})
first = json.loads(sys.stdin.readline())
send({"op": "start", "id": first["id"]})
send({"op": "call", "call": 0, "task": first["id"], "messages": [{"role": "user", "content": "hi"}]})
called = int(sys.argv[-2])
if select.select([called], [], [], 30.0)[0]:
    os.read(called, 1)
tasks, replied = [first["id"]], False
for line in sys.stdin:
    msg = json.loads(line)
    if msg["op"] == "task":
        tasks.append(msg["id"])
    elif msg["op"] == "reply":
        replied = True
    if replied and len(tasks) == int(sys.argv[-1]):
        break
for task in tasks:
    send({"op": "result", "id": task, "ok": True, "score": 1.0, "output": "x"})
sys.stdin.read()
'''


class _WrittenAtCall:
    """A SUT double that notes how many bytes the host had handed to the runner's stdin when it was called, then
    tells the runner double so (a byte on ``called``)."""

    def __init__(self, written: list[int], called: int) -> None:
        self.written = written
        self.called = called
        self.at_call: list[int] = []

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        self.at_call.append(self.written[0])
        os.write(self.called, b"x")
        return SutReply(text="4", usage={"prompt_tokens": 1, "completion_tokens": 1}, cost_usd=0.0)


async def test_the_first_call_is_served_before_the_last_task_is_written(tmp_path: Path) -> None:
    n = 10_000
    (tmp_path / "runner.py").write_text(SLOW_READER)
    written = [0]
    called_r, called_w = os.pipe()

    async def spawn(args: list[str]) -> Any:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "runner.py", str(called_r), str(n), cwd=str(tmp_path), env=runner_env(str(tmp_path)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            pass_fds=(called_r,))
        assert proc.stdin is not None
        write = proc.stdin.write

        def counted(data: bytes) -> None:
            written[0] += len(data)
            write(data)

        proc.stdin.write = counted  # type: ignore[method-assign,assignment]
        return proc

    items = [TrialItem(index=i, trial=0, row={"input": f"question {i} " + "x" * 150, "reference": "4"})
             for i in range(n)]
    task_bytes = sum(len(json.dumps({"op": "task", "id": i, "row": item.row}, separators=(",", ":"))) + 1
                     for i, item in enumerate(items))  # the lines as the host writes them: compact
    sut = _WrittenAtCall(written, called_w)
    records: list[TrialRecord] = []

    async def on_record(record: TrialRecord) -> None:
        records.append(record)

    try:
        await asyncio.wait_for(run_trials(spawn=spawn, items=items, sut=sut, threads=4,  # type: ignore[arg-type]
                                          on_record=on_record), 60)
    finally:
        os.close(called_r)
        os.close(called_w)
    assert len(sut.at_call) == 1
    assert sut.at_call[0] < task_bytes / 4, (
        f"the call waited for the tasks: {sut.at_call[0]} of {task_bytes} bytes written when it was made")
    assert written[0] >= task_bytes, "every task was written"
    assert sorted(r.index for r in records) == list(range(n)) and {r.outcome for r in records} == {"pass"}


ECHO_IMPL = r'''
import math

class Scorer:
    def extract(self, row):
        return row

    def solve(self, row, call_sut):
        return call_sut(row["question"])

    def score(self, row, response):
        return {"score": 1.0, "row": repr(row), "nan": isinstance(row["x"], float) and math.isnan(row["x"]),
                "wide": 2 ** 70 + row["n"], "echo": str(response), "tools": repr(response.tool_calls)}
'''


class _Echo:
    """A SUT double answering each prompt with itself, a <think> block and a tool call holding a wide integer."""

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        text = f"<think>\n$\\frac{{1}}{{2}}$ — ünï 🧪\n</think>\n{messages[-1]['content']}"
        return SutReply(text=text, usage={"prompt_tokens": 1, "completion_tokens": 1}, cost_usd=0.0,
                        tool_calls=[{"id": "c1", "type": "function",
                                     "function": {"name": "f", "arguments": '{"n": 123456789012345678901234567890}'},
                                     "n": 123456789012345678901234567890}])


async def test_the_pipe_carries_values_both_ways_as_json_reads_them(tmp_path: Path) -> None:
    """Through the real runner.py: a row's NaN, infinity, null and integer wider than 64 bits reach the scorer as
    ``json`` reads them, the reply's text and tool call (a 30-digit integer) come back unchanged, and the scorer's
    result (an integer wider than 64 bits) is read exactly (the host reads and writes the pipe by orjson where that
    means the same, ``benchwright.fastjson``)."""
    from benchwright.scoring.host import RUNNER

    (tmp_path / "task_impl.py").write_text(ECHO_IMPL)
    (tmp_path / "runner.py").write_bytes(RUNNER.read_bytes())

    async def spawn(args: list[str]) -> Any:
        return await asyncio.create_subprocess_exec(
            sys.executable, "runner.py", *args, cwd=str(tmp_path), env=runner_env(str(tmp_path)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    rows = [{"question": "Réponse : **B** — 日本語", "x": math.nan, "y": math.inf, "z": None, "n": 2 ** 65},
            {"question": "What is 2+2?", "x": 0.1, "y": -0.0, "z": [1, {"k": None}], "n": -(10 ** 20)}]
    items = [TrialItem(index=i, trial=0, row=row) for i, row in enumerate(rows)]
    records: list[TrialRecord] = []

    async def on_record(record: TrialRecord) -> None:
        records.append(record)

    await asyncio.wait_for(run_trials(spawn=spawn, items=items, sut=_Echo(), threads=2,  # type: ignore[arg-type]
                                      on_record=on_record), 60)
    by_index = {r.index: r for r in records}
    assert [by_index[i].outcome for i in range(2)] == ["pass", "pass"], [r.error for r in records]
    for i, row in enumerate(rows):
        meta = by_index[i].meta
        assert meta["row"] == repr(row)
        assert meta["nan"] is (i == 0)
        assert meta["wide"] == 2 ** 70 + row["n"] and type(meta["wide"]) is int
        assert meta["echo"] == f"<think>\n$\\frac{{1}}{{2}}$ — ünï 🧪\n</think>\n{row['question']}"
        assert "123456789012345678901234567890" in meta["tools"] and "e+29" not in meta["tools"]
