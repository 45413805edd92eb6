"""Warm sandboxes (``benchwright.sandbox.local.warm``, issue 25) against the real kernel: a pool's sandbox claimed by
another backend instance gets the run's snapshot, egress and metadata; its waiting scorer runtime is handed over only
when it can stand for the one asked for, and then behaves as if started with the run's arguments and environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from benchwright.drivers.templates import prime_source
from benchwright.runs.limits import ScorerCeilings
from benchwright.runs.placement import scorer_limits
from benchwright.sandbox import ExecLimits, LocalBackend, proxy_env
from benchwright.sandbox.local import WORK_INSIDE
from benchwright.sandbox.local.warm import MAX_AGE_S, WARM_ROLE, RuntimeSpec, WarmPool, start_warm_pool, stop_warm_pool
from benchwright.scoring.host import RUNNER, runner_env
from tests.sandbox.test_local import _namespaces_skip_reason

PY = sys.executable
LIMITS = scorer_limits(1, ScorerCeilings(batch_duration_s=120.0))
SPEC = RuntimeSpec(argv=(PY, "runner.py"), source=RUNNER.read_bytes(), env=runner_env(WORK_INSIDE), limits=LIMITS,
                   prime=prime_source().encode())
SCORER = '''
import json, os, sys
import depmod  # from /sandbox/.deps, on PYTHONPATH only when the run's environment is applied


class Scorer:
    def extract(self, row):
        return row

    def solve(self, row, call_sut):
        return json.dumps({"proxy": os.environ.get("HTTP_PROXY"), "dep": depmod.VALUE, "home": os.environ["HOME"],
                           "path1": sys.path[1], "argv_threads": sys.argv, "files": sorted(os.listdir(".")),
                           "primed": "fractions" in sys.modules})  # imported by the numeric template, not by us

    def score(self, row, response):
        return 1.0
'''
FILES = {"runner.py": RUNNER.read_bytes(), "task_impl.py": SCORER.encode(), ".deps/depmod.py": b"VALUE = 42\n"}


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[WarmPool]:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    started = await start_warm_pool(LocalBackend(tmp_path / "data"), size=1, runtime=SPEC)
    await started.until_ready()
    yield started
    await stop_warm_pool(started)


@pytest.fixture
def egress_server() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback TCP server standing for the run's egress proxy: it records what it reads and answers ``hello``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                got.append(conn.recv(100))
                conn.sendall(b"hello")

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], got
    listener.close()


async def _claim(pool: WarmPool, root: Path, proxy_port: int | None = None) -> tuple[LocalBackend, str]:
    url = f"http://127.0.0.1:{proxy_port}" if proxy_port else None
    claimer = LocalBackend(root, egress_proxy_url=url)
    snap = await claimer.snapshot_files(FILES, label="warm-test")
    info = await claimer.create(role="work", run_id="run-warm", snapshot_id=snap, metadata={"account": "acct"})
    return claimer, info.sandbox_id


async def _one_task(proc: object) -> dict[str, object]:
    stdin, stdout = proc.stdin, proc.stdout  # type: ignore[attr-defined]
    ready = json.loads(await asyncio.wait_for(stdout.readline(), 30))
    assert ready == {"op": "ready"}
    stdin.write(json.dumps({"op": "task", "id": 0, "row": {"q": 1}}).encode() + b"\n")
    await stdin.drain()
    result = json.loads(await asyncio.wait_for(stdout.readline(), 30))
    stdin.close()
    assert result["ok"], result
    return json.loads(result["output"])  # type: ignore[no-any-return]


async def test_a_claimed_sandbox_is_the_runs_and_its_runtime_goes_on_with_the_runs_arguments(
        pool: WarmPool, tmp_path: Path, egress_server: tuple[int, list[bytes]]) -> None:
    warm = pool.ready[0]
    waiting = warm.runtime
    assert waiting is not None and warm.meta.role == WARM_ROLE
    # Before a run claims it, its egress goes nowhere: the relay closes every connection.
    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(warm.relay.socket_path))
        assert probe.recv(10) == b""

    port, got = egress_server
    claimer, sandbox_id = await _claim(pool, tmp_path / "data", port)
    try:
        assert sandbox_id == warm.meta.sandbox_id
        info = next(i for i in await claimer.list_alive() if i.sandbox_id == sandbox_id)
        assert info.metadata["warm"] is True and info.metadata["benchwright_run_id"] == "run-warm"
        assert info.metadata["benchwright_role"] == "work" and info.metadata["account"] == "acct"
        # The run's egress: the sandbox's forwarder now reaches the run's egress proxy.
        probe = ("import socket; s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'ping'); "
                 "print(s.recv(10).decode())")
        res = await claimer.exec(sandbox_id, [PY, "-c", probe], env={"PATH": os.defpath}, timeout_s=20,
                                 limits=ExecLimits(cpu_seconds=10, memory_mb=512, wall_seconds=20))
        assert res.stdout.decode().strip() == "hello" and got == [b"ping"]

        env = runner_env(WORK_INSIDE, {"PYTHONPATH": f"{WORK_INSIDE}/.deps", **proxy_env(info)})
        limits = scorer_limits(5, ScorerCeilings(batch_duration_s=120.0))  # another process count: 69, not 65
        proc = await claimer.spawn(sandbox_id, [PY, "runner.py", "--impl", "task_impl.py", "--threads", "5"],
                                   env=env, limits=limits)
        assert proc is waiting.process  # handed over, not started
        assert {Path(d, "pids.max").read_text().strip() for d in proc.cgroup_dirs
                if Path(d, "pids.max").exists()} == {str(limits.max_processes)}
        seen = await _one_task(proc)
        assert seen["proxy"] == proxy_env(info)["HTTP_PROXY"] and seen["dep"] == 42
        assert seen["home"] == WORK_INSIDE and seen["path1"] == f"{WORK_INSIDE}/.deps"
        assert seen["files"] == [".deps", "runner.py", "task_impl.py"]  # the snapshot's files, nothing of the pool's
        assert seen["primed"] is True  # the primer ran while it waited (the builtin templates' imports)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        await claimer.kill(sandbox_id)
        await claimer.close()
    assert sandbox_id not in {i.sandbox_id for i in await claimer.list_alive()}


async def test_a_runtime_that_cannot_stand_for_the_asked_one_is_replaced_by_a_cold_start(
        pool: WarmPool, tmp_path: Path) -> None:
    waiting = pool.ready[0].runtime
    assert waiting is not None
    claimer, sandbox_id = await _claim(pool, tmp_path / "data")
    try:
        env = runner_env(WORK_INSIDE, {"PYTHONPATH": f"{WORK_INSIDE}/.deps"})
        other = replace(LIMITS, memory_mb=LIMITS.memory_mb // 2)  # a limit set only at the start
        proc = await claimer.spawn(sandbox_id, [PY, "runner.py", "--impl", "task_impl.py"], env=env, limits=other)
        assert proc is not waiting.process and waiting.process.returncode is not None  # killed, not leaked
        assert (await _one_task(proc))["dep"] == 42
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        await claimer.kill(sandbox_id)
        await claimer.close()


@pytest.mark.parametrize("change", ["age", "interpreter_variable", "interpreter"])
async def test_what_a_waiting_runtime_cannot_take_on(pool: WarmPool, change: str) -> None:
    waiting = pool.ready[0].runtime
    assert waiting is not None
    argv = [PY, "runner.py", "--impl", "task_impl.py"]
    env = runner_env(WORK_INSIDE, {"PYTHONPATH": f"{WORK_INSIDE}/.deps", "HTTP_PROXY": "http://127.0.0.1:3128"})
    assert waiting.fits(argv, env, LIMITS, pids=True)  # the run's own variables are applied when it goes on
    if change == "age":
        waiting.started -= MAX_AGE_S + 1  # its wall clock started that long ago
    elif change == "interpreter_variable":
        env["PYTHONHASHSEED"] = "0"  # read as the interpreter starts
    else:
        argv[0] = "/usr/bin/python3"
    assert not waiting.fits(argv, env, LIMITS, pids=True)


async def test_the_pool_makes_another_after_a_claim_and_kills_what_is_left_when_stopped(tmp_path: Path) -> None:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "data"
    pool = await start_warm_pool(LocalBackend(root), size=1, runtime=SPEC)
    claimer = LocalBackend(root)
    try:
        await pool.until_ready()
        first = pool.ready[0].meta.sandbox_id
        info = await claimer.create(role="work", run_id="run-a")
        assert info.sandbox_id == first
        await pool.until_ready()
        second = pool.ready[0].meta.sandbox_id
        assert second != first and pool.claimed == 1
        alive = {i.sandbox_id: i.metadata["benchwright_role"] for i in await claimer.list_alive()}
        assert alive == {first: "work", second: WARM_ROLE}
    finally:
        await stop_warm_pool(pool)
    # The claimed one is the run's to kill; the unclaimed one went with the pool, its runtime with it.
    assert {i.sandbox_id for i in await claimer.list_alive()} == {first}
    await claimer.kill(first)
    await claimer.close()
    assert await claimer.list_alive() == []
    # Without a pool, a backend on that root makes its sandboxes on demand again.
    cold = LocalBackend(root)
    info = await cold.create(role="work", run_id="run-b")
    assert "warm" not in info.metadata
    await cold.kill(info.sandbox_id)
    await cold.close()


async def test_a_warm_sandbox_whose_init_died_while_waiting_is_not_claimed(pool: WarmPool, tmp_path: Path) -> None:
    warm = pool.ready[0]
    assert warm.meta.init_pid is not None
    os.kill(warm.meta.init_pid, 9)  # its namespace, and the runtime waiting in it, end with it
    await asyncio.to_thread(warm.supervisor.wait, 10)  # the supervisor ends once it has reaped the init
    claimer = LocalBackend(tmp_path / "data")
    info = await claimer.create(role="work", run_id="run-after")
    try:
        assert info.sandbox_id != warm.meta.sandbox_id and "warm" not in info.metadata  # made on demand
        assert not (tmp_path / "data" / "sandboxes" / warm.meta.sandbox_id).exists()  # the dead one cleaned up
    finally:
        await claimer.kill(info.sandbox_id)
        await claimer.close()


# A worker standing in a process of its own: a pool of one, a sandbox claimed from it by a run and the pool's next
# one made; it prints both ids, then waits to be killed.
_OWNER = '''
import asyncio, json, sys
from pathlib import Path
from benchwright.sandbox import LocalBackend
from benchwright.sandbox.local.warm import start_warm_pool
from tests.sandbox.test_warm import SPEC

async def main():
    root = Path(sys.argv[1])
    pool = await start_warm_pool(LocalBackend(root), size=1, runtime=SPEC)
    await pool.until_ready()
    claimed = await LocalBackend(root).create(role="work", run_id="run-claimed")
    await pool.until_ready()
    print(json.dumps({"claimed": claimed.sandbox_id, "warm": pool.ready[0].meta.sandbox_id}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
'''


def _pidfd(root: Path, sandbox_id: str, which: str) -> int:
    """A pidfd of the sandbox's init or supervisor (readable once that process has exited)."""
    pids = json.loads((root / "sandboxes" / sandbox_id / "ctl" / "pids.json").read_text())
    return os.pidfd_open(pids[f"{which}_pid"])


async def test_a_killed_workers_unclaimed_warm_sandbox_dies_with_it_and_a_claimed_one_lives_on(
        tmp_path: Path) -> None:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "data"
    owner = await asyncio.create_subprocess_exec(
        PY, "-c", _OWNER, str(root), stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2])
    try:
        made = json.loads(await asyncio.wait_for(owner.stdout.readline(), 60))  # type: ignore[union-attr]
        # Opened while the owner lives: once it is killed the unclaimed sandbox's processes may exit and be reaped
        # at once, and a pid that is gone has no pidfd to open.
        warm_supervisor = _pidfd(root, made["warm"], "supervisor")
        warm_init, claimed_init = _pidfd(root, made["warm"], "init"), _pidfd(root, made["claimed"], "init")
    finally:
        owner.kill()  # SIGKILL: no shutdown code of the pool runs
        await owner.wait()
    try:
        # The unclaimed one's supervisor saw its lifeline end, killed the init and ended (a pidfd is readable once
        # its process has exited); the claimed one's supervisor had been told, so its init lives on.
        ready = await asyncio.to_thread(select.select, [warm_supervisor], [], [], 30)
        assert ready[0], "the unclaimed warm sandbox outlived the worker that made it"
        assert select.select([warm_init], [], [], 0)[0]
        # Both lifelines ended at the same instant and the unclaimed one has been acted on; absence can only be
        # watched for, so the claimed init is given two more seconds to die, and must not.
        died = (await asyncio.to_thread(select.select, [claimed_init], [], [], 2.0))[0]
        assert not died, "the claimed sandbox died with the worker"
    finally:
        for fd in (warm_supervisor, warm_init, claimed_init):
            os.close(fd)
        cleaner = LocalBackend(root)
        for sandbox_id in (made["claimed"], made["warm"]):
            await cleaner.kill(sandbox_id)
        await cleaner.close()
    assert await LocalBackend(root).list_alive() == []
