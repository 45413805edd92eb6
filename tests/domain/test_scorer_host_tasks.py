"""The scorer host serves the runner's model calls while it is still writing the batch's tasks: a 1,000-task batch's
first call no longer waits for every other task's encoding and write (issue 25)."""

from __future__ import annotations

import asyncio
import json
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
    task_bytes = sum(len(json.dumps({"op": "task", "id": i, "row": item.row}, ensure_ascii=False)) + 1
                     for i, item in enumerate(items))
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
