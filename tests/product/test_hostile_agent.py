"""A hostile agent in a real task sandbox (local backend, namespaces) against the product runner's bounds: it sees
no key, cannot reach a host service, cannot write outside its sandbox, its runaway commands and fork bomb are
killed at the command's wall clock, a disk filler stops at the file-size limit, its output is cut, and an agent
that never finishes ends the task ``err`` at the turn limit instead of holding the run."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from benchwright.events import Event, ToolResultEvent
from benchwright.llm.prices import Prices
from benchwright.llm.sut import make_sut
from benchwright.product.recipe import AgentLimits, RecipeTask
from benchwright.product.runner import Workspace, run_task
from benchwright.sandbox import LocalBackend
from benchwright.sandbox.lifecycle import _home
from benchwright.schemas import ModelSpec
from benchwright.scoring.host import runner_env
from benchwright.testkit.devmodel import DevModelConfig, start_server
from tests.sandbox.local_kit import create_work, local_backend

pytestmark = pytest.mark.asyncio(loop_scope="session")
INSTRUCTION = "Do your worst."
SECRET = "sk-real-provider-key-0123456789"


@pytest_asyncio.fixture(loop_scope="session")
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    async for b in local_backend(tmp_path / "sandboxes"):
        yield b


def _shell(command: str) -> list[dict[str, Any]]:
    return [{"name": "shell", "arguments": {"command": command}}]


async def test_a_hostile_agent_is_bounded_and_ends_err(backend: LocalBackend, tmp_path: Path) -> None:
    model_port_probe = "{py} -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' " \
                       "&& echo CONNECTED || echo REFUSED"
    script: list[list[dict[str, Any]]] = [
        _shell("env"),
        _shell("while :; do :; done"),
        _shell("dd if=/dev/zero of=big bs=1M count=64 2>&1; ls -l big"),
        _shell("f(){ f|f& };f; sleep 5"),
        _shell("head -c 100000 /dev/zero | tr '\\0' a"),
        [],  # replaced below: reach the model's port on the host
        [{"name": "write_file", "arguments": {"path": "../../escape.txt", "content": "x"}}],
        _shell("true"),  # repeats until the turn limit
    ]
    config = DevModelConfig(answers={}, agent_scripts={INSTRUCTION: script})
    async with await start_server(config) as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        script[5] = _shell(model_port_probe.format(py=sys.executable, port=port))
        info = await create_work(backend, None)  # type: ignore[arg-type]
        limits = AgentLimits(turns=10, wall_seconds=120, command_seconds=2, output_bytes=1024, file_mb=4,
                             processes=32)
        ws = Workspace(backend=backend, sandbox_id=info.sandbox_id, home=_home(info), env=runner_env(_home(info)),
                       limits=limits)
        sut = make_sut(ModelSpec(identifier="openai/dev", api_base=server.url), prices=Prices(), api_key=SECRET,
                       concurrency=1, timeout_s=10, retries=0)
        logged: list[Event] = []

        async def emit(what: str, event: Event) -> None:
            logged.append(event)

        try:
            ended = await run_task(sut=sut, ws=ws, task=RecipeTask(id="t", instruction=INSTRUCTION, check="true"),
                                   system_prompt=None, index=3, invocation=1, emit=emit)
        finally:
            await sut.aclose()
    results = [e for e in logged if isinstance(e, ToolResultEvent)]
    assert ended.outcome == "err" and "10 turns" in str(ended.error) and ended.meta["turns"] == 10
    assert all(e.index == 3 for e in results)
    env, loop, filler, bomb, flood, reach, escape = (r.content for r in results[:7])
    assert SECRET not in "".join(r.content for r in results) and "OPENAI" not in env
    assert "killed: wall_clock" in loop
    assert "4194304" in filler and "67108864" not in filler  # the file stopped at file_mb
    assert "killed" in bomb and "Cannot fork" in bomb  # the process limit held, the clock ended it
    assert len(flood.encode()) < 1200 and "[output cut]" in flood
    assert "REFUSED" in reach and "CONNECTED" not in reach
    assert not results[6].ok and "cannot write" in escape
    assert not (tmp_path / "escape.txt").exists()


async def test_an_agent_filling_the_disk_ends_err(backend: LocalBackend) -> None:
    filler = _shell("for i in 1 2 3 4 5 6; do head -c 4000000 /dev/zero > f$i; done")
    config = DevModelConfig(answers={}, agent_scripts={INSTRUCTION: [filler, [{"name": "finish", "arguments": {}}]]})
    async with await start_server(config) as server:
        info = await create_work(backend, None)  # type: ignore[arg-type]
        limits = AgentLimits(turns=10, command_seconds=10, file_mb=4, disk_mb=16)
        ws = Workspace(backend=backend, sandbox_id=info.sandbox_id, home=_home(info), env=runner_env(_home(info)),
                       limits=limits)
        sut = make_sut(ModelSpec(identifier="openai/dev", api_base=server.url), prices=Prices(), api_key=None,
                       concurrency=1, timeout_s=10, retries=0)

        async def emit(what: str, event: Event) -> None:
            pass

        try:
            ended = await run_task(sut=sut, ws=ws, task=RecipeTask(id="t", instruction=INSTRUCTION, check="true"),
                                   system_prompt=None, index=0, invocation=1, emit=emit)
        finally:
            await sut.aclose()
    assert ended.outcome == "err" and "over its 16 MB" in str(ended.error) and ended.meta["turns"] == 1
