"""The builtin product runner: a tool-using agent loop for one task of a product-sandbox run (§2, §4).

The agent gets the task's instruction and four tools in OpenAI's ``tools`` format: ``shell`` (a ``/bin/sh -c``
command in the task sandbox), ``read_file``, ``write_file`` and ``finish``. Its model calls go through the run's
``SutClient`` only, which is the run's credential proxy with the run's per-run key (``benchwright.llm.sut.run_sut``):
the runner never holds a real key and the sandbox has no route to the model at all. Every step is logged through
``emit`` (AgentTextEvent, ToolCallEvent, ToolResultEvent, each stamped with the task index).

Bounded, so a runaway agent ends its task ``err`` and never holds the run: model calls (``turns``), tokens, the
task's wall clock (agent, tools and checker together), the task's files together (``disk_mb``, measured after
every command and write), each command's wall clock, CPU, memory, processes and file size (the sandbox's
``ExecLimits``), and what the agent sees of any output (``output_bytes``). When the agent
finishes (``finish``, or a reply with no tool call) the recipe's checker runs in the same sandbox: exit 0 passes.

This file is also the body of every product impl's generated ``task_impl.py`` (``benchwright.product.recipe``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from benchwright.events import AgentTextEvent, Event, ToolCallEvent, ToolResultEvent
from benchwright.llm.sut import SutClient, SutError
from benchwright.product.recipe import AgentLimits, RecipeTask
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.base import SandboxBackend, SandboxError
from benchwright.schemas import Outcome

PHASE = "materialize"
CHECK_SECONDS = 60.0
MAX_WRITE_BYTES = 1024 * 1024
SYSTEM_PROMPT = ("You are an agent working in a Linux sandbox. Use the tools to complete the task: shell runs a "
                 "command in the working directory, read_file and write_file read and write files, and finish ends "
                 "the task when it is done.")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "shell", "description": "Run a /bin/sh command in the task's working directory.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file (relative to the working directory).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a text file (relative to the working directory).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "End the task.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}}}},
]

Emit = Callable[[str, Event], Awaitable[None]]
"""``(what, event)``: log one step; ``what`` is unique within the task (its idempotency key's tail)."""


@dataclass
class TaskRun:
    """How one task ended."""

    outcome: Outcome
    score: float | None
    error: str | None = None
    output: str | None = None
    """The agent's last words (its finish summary or final reply)."""
    meta: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0


class AgentStopped(Exception):
    """The agent crossed one of its bounds (the message says which)."""


@dataclass
class Workspace:
    """The task sandbox as the tools see it."""

    backend: SandboxBackend
    sandbox_id: str
    home: str
    env: dict[str, str]
    limits: AgentLimits

    def _exec_limits(self, seconds: float) -> ExecLimits:
        lim = self.limits
        return ExecLimits(cpu_seconds=max(1, int(seconds) + 1), memory_mb=lim.memory_mb, wall_seconds=seconds,
                          max_processes=lim.processes, max_output_bytes=lim.output_bytes, max_file_mb=lim.file_mb,
                          cpu_cores=1.0)

    async def sh(self, command: str, seconds: float) -> tuple[int, str]:
        result = await self.backend.exec(self.sandbox_id, ["/bin/sh", "-c", command], env=self.env,
                                         timeout_s=seconds, limits=self._exec_limits(seconds))
        text = (result.stdout + result.stderr).decode(errors="replace")
        cut = result.stdout_truncated or result.stderr_truncated
        text = clip(text, self.limits.output_bytes) + ("\n[output cut]" if cut else "")
        if result.killed_reason:  # first, so no cut of the output hides it
            text = f"[killed: {result.killed_reason}]\n{text}"
        return result.returncode, text

    async def disk_mb(self) -> float:
        """What the task's working directory holds, in MB."""
        code, text = await self.sh("du -sk . 2>/dev/null | cut -f1", 30.0)
        first = text.strip().splitlines()[-1] if text.strip() else ""
        return int(first) / 1024 if code == 0 and first.isdigit() else 0.0

    def relative(self, path: str) -> str:
        prefix = self.home.rstrip("/") + "/"
        return path[len(prefix):] if path.startswith(prefix) else path


def clip(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore") + "\n[output cut]"


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        raise ValueError(f"the tool arguments are not JSON: {str(raw)[:200]}") from None
    if not isinstance(parsed, dict):
        raise ValueError("the tool arguments must be a JSON object")
    return parsed


async def _tool(ws: Workspace, name: str, args: dict[str, Any], deadline: float) -> tuple[bool, str]:
    """Run one tool call; ``(ok, what the agent is told)``."""
    seconds = min(ws.limits.command_seconds, max(deadline - time.monotonic(), 0.1))
    if name == "shell":
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            return False, "shell needs a non-empty 'command' string"
        code, text = await ws.sh(command, seconds)
        return code == 0, f"exit {code}\n{text}"
    if name == "read_file":
        path = args.get("path")
        if not isinstance(path, str) or not path:
            return False, "read_file needs a 'path' string"
        code, text = await ws.sh(f"exec head -c {ws.limits.output_bytes + 1} -- {_quote(path)}", seconds)
        return (code == 0, clip(text, ws.limits.output_bytes)) if code == 0 else (False, f"cannot read {path}: {text}")
    if name == "write_file":
        path, content = args.get("path"), args.get("content")
        if not isinstance(path, str) or not isinstance(content, str):
            return False, "write_file needs 'path' and 'content' strings"
        data = content.encode()
        if len(data) > MAX_WRITE_BYTES:
            return False, f"content is over {MAX_WRITE_BYTES} bytes"
        try:
            await ws.backend.write_file(ws.sandbox_id, ws.relative(path), data)
        except (SandboxError, ValueError, OSError) as exc:
            return False, f"cannot write {path}: {exc}"
        return True, f"wrote {len(data)} bytes to {path}"
    return False, f"unknown tool {name!r}; the tools are shell, read_file, write_file and finish"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


async def run_task(*, sut: SutClient, ws: Workspace, task: RecipeTask, system_prompt: str | None, index: int,
                   invocation: int, emit: Emit) -> TaskRun:
    """One task: the agent loop, then the checker. Never raises for the agent's doing (a bound, a model error, a
    tool failure): those end the task ``err`` with the reason; cancellation (a halt) propagates."""
    limits = ws.limits
    started = time.monotonic()
    deadline = started + limits.wall_seconds
    usage: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0}
    cost = 0.0
    turns = 0
    summary: str | None = None
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt or SYSTEM_PROMPT},
                                      {"role": "user", "content": task.instruction}]

    def ended(outcome: Outcome, score: float | None, error: str | None, **meta: Any) -> TaskRun:
        return TaskRun(outcome=outcome, score=score, error=error, output=summary,
                       meta={"task_id": task.id, "turns": turns, "tokens": sum(usage.values()), **meta},
                       usage=dict(usage), cost_usd=cost)

    try:
        async with asyncio.timeout(limits.wall_seconds):
            while True:
                if turns >= limits.turns:
                    raise AgentStopped(f"the agent did not finish within {limits.turns} turns")
                turns += 1
                reply = await sut.complete(messages, {"tools": TOOLS})
                for key in ("prompt_tokens", "completion_tokens"):
                    usage[key] += int(reply.usage.get(key, 0))
                cost += reply.cost_usd
                if sum(usage.values()) > limits.tokens:
                    raise AgentStopped(f"the agent used {sum(usage.values())} tokens, over its {limits.tokens}")
                if reply.text:
                    await emit(f"text:{turns}", AgentTextEvent(phase=PHASE, text=clip(reply.text, 4096),
                                                               index=index))
                calls = reply.tool_calls or []
                messages.append({"role": "assistant", "content": reply.text or None,
                                 **({"tool_calls": calls} if calls else {})})
                if not calls:
                    summary = reply.text
                    break
                finished = False
                for n, call in enumerate(calls):
                    fn = call.get("function") or {}
                    name, call_id = str(fn.get("name", "")), str(call.get("id") or f"call_{turns}_{n}")
                    bad: str | None = None
                    try:
                        args = _arguments(fn.get("arguments"))
                    except ValueError as exc:
                        args, bad = {}, str(exc)
                    await emit(f"call:{turns}:{n}", ToolCallEvent(phase=PHASE, invocation=invocation,
                                                                  step=turns, call_id=call_id, name=name,
                                                                  arguments=_clip_args(args), index=index))
                    if bad is not None:
                        ok, content = False, bad
                    elif name == "finish":
                        ok, content, finished = True, "finished", True
                        summary = str(args.get("summary", "")) or reply.text
                    else:
                        ok, content = await _tool(ws, name, args, deadline)
                        if name in ("shell", "write_file") and (used := await ws.disk_mb()) > limits.disk_mb:
                            raise AgentStopped(f"the task's files grew to {used:.0f} MB, over its "
                                               f"{limits.disk_mb} MB")
                    await emit(f"result:{turns}:{n}", ToolResultEvent(
                        phase=PHASE, invocation=invocation, step=turns, call_id=call_id, name=name, ok=ok,
                        content=clip(content, limits.output_bytes), index=index))
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
                if finished:
                    break
            code, checked = await ws.sh(task.check, min(CHECK_SECONDS, max(deadline - time.monotonic(), 0.1)))
    except TimeoutError:
        return ended("err", None, f"the task ran past its wall clock ({limits.wall_seconds:g} s)")
    except AgentStopped as exc:
        return ended("err", None, str(exc))
    except SutError as exc:
        return ended("err", None, f"model call failed: {exc}")
    except SandboxError as exc:
        return ended("err", None, f"the task sandbox failed: {exc}")
    passed = code == 0
    return ended("pass" if passed else "fail", 1.0 if passed else 0.0, None, check_exit=code,
                 check_output=clip(checked, 2048))


def _clip_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: clip(v, 4096) if isinstance(v, str) else v for k, v in args.items()}

