"""A worker removes the work directories of runs that ended (``benchwright.runs.workdirs``): each kept a copy of its
run's dataset and task files for good. Past the linger only, never a running run's, never one a fork is reading."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from benchwright.runs import workdirs
from benchwright.runs.workdirs import LOCK, WORK, holding, sweep_ended_workdirs
from benchwright.settings import Settings
from benchwright.stack.teardown import sweep_workdirs
from benchwright.store.db import make_engine, migrate


def _run_dir(runs: Path, run_id: str, *extra: str) -> Path:
    d = runs / run_id
    (d / WORK).mkdir(parents=True)
    (d / WORK / "dataset.jsonl").write_text('{"q": 1}\n')
    for name in extra:
        (d / name).write_text("{}")
    return d


class Store:
    """What the worker's store would say: run id -> when it ended (0.0: unknown to the store), absent while running."""

    def __init__(self, ended: dict[str, float]) -> None:
        self.ended = ended
        self.asked: list[list[str]] = []

    def __call__(self, run_ids: Sequence[str]) -> dict[str, float]:
        self.asked.append(sorted(run_ids))
        return {r: self.ended[r] for r in run_ids if r in self.ended}


def test_ended_runs_lose_their_work_past_the_linger_and_the_rest_is_kept(tmp_path: Path) -> None:
    runs, now = tmp_path / "runs", time.time()
    _run_dir(runs, "ended-long-ago", "proxy.lock")
    _run_dir(runs, "ended-just-now")
    _run_dir(runs, "running")
    _run_dir(runs, "unknown")
    _run_dir(runs, "ended-with-a-route", "proxy.json")
    (runs / "route-only").mkdir()
    (runs / "route-only" / "proxy.json").write_text("{}")
    store = Store({"ended-long-ago": now - 3600, "ended-just-now": now - 10, "unknown": 0.0,
                   "ended-with-a-route": now - 3600, "route-only": now - 3600})

    assert sweep_ended_workdirs(runs_dir=runs, ended_at=store, linger_s=600) == 3

    assert store.asked == [["ended-just-now", "ended-long-ago", "ended-with-a-route", "running", "unknown"]]
    assert sorted(p.name for p in runs.iterdir()) == ["ended-just-now", "ended-with-a-route", "route-only",
                                                      "running"]
    assert (runs / "ended-just-now" / WORK / "dataset.jsonl").is_file()
    assert (runs / "running" / WORK / "dataset.jsonl").is_file()
    assert not (runs / "ended-with-a-route" / WORK).exists()  # its handle stays for the route sweep
    assert (runs / "ended-with-a-route" / "proxy.json").is_file()
    # Nothing left to remove: the next sweep asks the store about the two that still have work.
    assert sweep_ended_workdirs(runs_dir=runs, ended_at=store, linger_s=600) == 0
    assert store.asked[-1] == ["ended-just-now", "running"]
    assert sweep_ended_workdirs(runs_dir=tmp_path / "none-yet", ended_at=store, linger_s=600) == 0


def test_a_run_directory_a_reader_holds_is_passed_by_until_it_is_let_go(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    d = _run_dir(runs, "parent")
    store = Store({"parent": 0.0})
    with holding(d):
        assert sweep_ended_workdirs(runs_dir=runs, ended_at=store, linger_s=0) == 0
        assert (d / WORK / "dataset.jsonl").is_file()
    assert sweep_ended_workdirs(runs_dir=runs, ended_at=store, linger_s=0) == 1
    assert not d.exists()
    with holding(d):  # a fork of it later: the directory is made again, to be restored from the blob store
        assert d.is_dir() and (d / LOCK).is_file()


def test_a_reader_whose_lock_the_sweep_removed_meanwhile_holds_the_new_one(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving that the inode check is for: the reader opened the lock file, then the sweep removed the run
    directory (lock and all) before the reader's lock landed. The reader must end up holding the lock file that is
    there now, or the next sweep, taking that one, would remove the files under the reader's feet."""
    runs = tmp_path / "runs"
    d = _run_dir(runs, "parent")
    store = Store({"parent": 0.0})
    real_flock = workdirs.fcntl.flock
    interleaved = threading.Event()

    def flock(fd: int, op: int) -> None:
        if op == workdirs.fcntl.LOCK_SH and not interleaved.is_set():
            interleaved.set()
            assert sweep_ended_workdirs(runs_dir=runs, ended_at=store, linger_s=0) == 1  # the sweep goes first
        real_flock(fd, op)

    monkeypatch.setattr(workdirs.fcntl, "flock", flock)
    with holding(d):
        assert interleaved.is_set()
        (d / WORK).mkdir(parents=True)  # the fork restores the parent's files
        (d / WORK / "dataset.jsonl").write_text('{"q": 1}\n')
        assert sweep_ended_workdirs(runs_dir=runs, ended_at=store, linger_s=0) == 0
        assert (d / WORK / "dataset.jsonl").is_file()


async def test_a_worker_sweeps_its_data_directory_on_its_interval_until_stopped(tmp_path: Path) -> None:
    """``sweep_workdirs``, as ``StackWorker.run`` starts it: the store's word on which runs ended (a run it does not
    know counts as ended), every ``workdir_sweep_s``; a stop ends it."""
    settings = Settings(data_dir=tmp_path / "data", workdir_sweep_s=0.02, workdir_linger_s=0)
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    d = _run_dir(settings.runs_dir(), "not-in-the-store")
    stop = asyncio.Event()
    sweeping = asyncio.create_task(sweep_workdirs(settings=settings, engine=engine, stop=stop))
    try:
        async with asyncio.timeout(10):
            while d.exists():  # the sweep's own clock: it removes the directory within an interval or two
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(sweeping, 5)
        engine.dispose()
    assert not d.exists()
    off = Settings(data_dir=tmp_path / "data", workdir_sweep_s=0)
    await asyncio.wait_for(sweep_workdirs(settings=off, engine=engine, stop=asyncio.Event()), 1)  # 0: returns at once
