"""A sandbox ended at once, its remains removed after (issue 25): ``LocalBackend.kill(remains="later")`` and the
scorer host's ``run_trials(reap=False)``, which a batch's sandbox uses, against the real kernel.

What must hold from the kill's return: nothing lists the sandbox or runs in it again, and every process of it has
been sent SIGKILL. What the background owes: no process left, the directory and cgroups gone, each process handle
reaped; and when the worker dies before that, the next worker's reap finishes the job.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from benchwright.llm.sut import SutReply
from benchwright.sandbox import LocalBackend, SandboxNotFound
from benchwright.sandbox.local import settle_kills
from benchwright.scoring.host import TrialItem, TrialRecord, run_trials
from tests.sandbox.test_local import (
    CRASHING_WORKER,
    ENV,
    FAST,
    PY,
    REPO,
    RUNNER,
    TASK_IMPL,
    _create,
    _pids_of_uid,
    backend,
    spawn_with_a_child,
)

__all__ = ["backend"]  # the fixture, shared with test_local


def _init_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"  # reaped, or a zombie
    except FileNotFoundError:
        return True


async def test_a_sandbox_killed_with_its_remains_for_later_is_over_at_once_and_cleaned_up_after(
        backend: LocalBackend) -> None:
    info = await _create(backend)
    uid = info.metadata["sandbox_uid"]
    home = Path(info.root).parent  # type: ignore[arg-type]
    meta = json.loads((home / "meta.json").read_text())
    proc = await spawn_with_a_child(backend, info)

    lifetime = await backend.kill(info.sandbox_id, remains="later")

    assert lifetime > 0
    assert info.sandbox_id not in {i.sandbox_id for i in await backend.list_alive()}
    assert info.sandbox_id not in {i.sandbox_id for i in await LocalBackend(backend.root_dir).list_alive()}
    with pytest.raises(SandboxNotFound):
        await backend.exec(info.sandbox_id, ["true"], env=ENV, timeout_s=5, limits=FAST)
    assert await backend.kill(info.sandbox_id) == lifetime  # idempotent, whichever way it was killed

    await settle_kills()
    assert _pids_of_uid(uid) == []
    assert _init_gone(meta["init_pid"])
    assert not home.exists()
    assert all(not Path(d).exists() for d in meta["cgroups"])
    assert proc.returncode is not None and proc.returncode < 0 and proc.killed_reason == "sandbox_killed"


async def test_a_worker_dead_before_removing_the_remains_leaves_them_to_the_next_ones_reap(
        backend: LocalBackend) -> None:
    crashed = subprocess.run([PY, "-c", CRASHING_WORKER, str(backend.root_dir), "--kill-later"], capture_output=True,
                             timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
    ended_id, uid = crashed.stdout.decode().split()
    home = backend.root_dir / "sandboxes" / ended_id
    assert home.exists()  # its directory outlived its worker
    assert ended_id not in {i.sandbox_id for i in await backend.list_alive()}  # but it is not a live sandbox

    assert await backend.reap(lambda i: i.metadata["benchwright_run_id"] == "orphan-run") == [ended_id]
    assert _pids_of_uid(int(uid)) == []
    assert not home.exists()


class _Answers:
    """A SUT double: every model call answers "4"."""

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        return SutReply(text="4", usage={"prompt_tokens": 1, "completion_tokens": 1}, cost_usd=0.0)

    async def warm(self, calls: int) -> None:
        pass

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("reap", [True, False])
async def test_a_batch_runtime_left_for_its_sandbox_to_reap(backend: LocalBackend, reap: bool) -> None:
    """``reap=False`` (a batch's runtime): every record is in when ``run_trials`` returns, but the runtime, told to
    die, has not been waited for; the sandbox's end reaps it. ``reap=True`` waits for it as before."""
    info = await _create(backend)
    await backend.write_file(info.sandbox_id, "runner.py", RUNNER.read_bytes())
    await backend.write_file(info.sandbox_id, "task_impl.py", TASK_IMPL.encode())
    spawned: list[Any] = []

    async def spawn(args: list[str]) -> Any:
        proc = await backend.spawn(info.sandbox_id, [PY, "runner.py", *args], env=ENV, limits=FAST)
        spawned.append(proc)
        return proc

    records: list[TrialRecord] = []

    async def on_record(rec: TrialRecord) -> None:
        records.append(rec)

    items = [TrialItem(index=i, trial=0, row={"q": f"{i}?", "a": "4" if i % 2 else "5"}) for i in range(6)]
    await run_trials(spawn=spawn, items=items, sut=_Answers(), threads=3, on_record=on_record,
                     reap=reap)

    assert sorted((r.index, r.score) for r in records) == [(i, 1.0 if i % 2 else 0.0) for i in range(6)]
    [runtime] = spawned
    if reap:
        assert runtime.returncode is not None and runtime.killed_reason == "terminated"
    else:
        assert runtime.returncode is None  # not waited for
    await backend.kill(info.sandbox_id, remains="later")
    await settle_kills()
    # Reaped either way. Its exit code may be 0: the host closes the runtime's stdin and then asks the sandbox's helper
    # to kill it, and a runtime reading the end of its input can exit before the helper's SIGKILL lands (one CI
    # rehearsal in session 49: returncode 0 with reap=True).
    assert runtime.returncode is not None
    assert _pids_of_uid(info.metadata["sandbox_uid"]) == []


async def test_settling_waits_for_this_loops_removals_only(backend: LocalBackend) -> None:
    """A kill made on another event loop, closed since without finishing its tasks, does not hold up (or break)
    ``settle_kills`` on this one; what that loop left undone, the reap removes."""
    info = await _create(backend)

    def kill_on_another_loop() -> None:
        loop = asyncio.new_event_loop()
        threads = ThreadPoolExecutor()
        loop.set_default_executor(threads)
        try:
            loop.run_until_complete(LocalBackend(backend.root_dir).kill(info.sandbox_id, remains="later"))
        finally:
            loop.close()  # its removal task never ran to its end (asyncio logs it as destroyed while pending)
            # What that task had already handed a thread (removing the directory) may still be under way: a dead
            # worker's would not be, so wait for it rather than race the reap below (CI saw it half-removed).
            threads.shutdown(wait=True)

    await asyncio.to_thread(kill_on_another_loop)
    await asyncio.wait_for(settle_kills(), 10)
    assert info.sandbox_id not in {i.sandbox_id for i in await backend.list_alive()}
    await backend.reap(lambda i: i.sandbox_id == info.sandbox_id)
    assert not (backend.root_dir / "sandboxes" / info.sandbox_id).exists()
