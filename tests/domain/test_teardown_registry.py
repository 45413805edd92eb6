"""The process registry and the proxy reaper with real processes: a recycled PID is never signalled, SIGTERM is
escalated to SIGKILL at the deadline, and a proxy lives past its run's linger only while someone will stop it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from benchwright.proxy import model_proxy
from benchwright.proxy.model_proxy import ProxyHandle, load_handle, proxy_file, reap_model_proxies
from benchwright.stack import procreg
from benchwright.stack.procreg import ProcessRegistry, owned_tempdir, proc_starttime, sweep_owned_tempdirs

IGNORE_TERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" \
              "time.sleep(600)"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _sleeper(procs: list[subprocess.Popen[bytes]], code: str = "import time; time.sleep(600)") -> int:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    procs.append(proc)
    if "ready" in code:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc.pid


def test_an_entry_whose_pid_was_recycled_is_dropped_and_its_process_never_signalled(
        tmp_path: Path, spawn: list[subprocess.Popen[bytes]]) -> None:
    registry = ProcessRegistry(tmp_path)
    pid = _sleeper(spawn)
    entry = registry.record(kind="worker", pid=pid, group=True)
    assert entry is not None and registry.live() == [entry]
    # The same PID with another start time: what the registry would hold after the kernel reused the PID.
    stale = replace(entry, start=entry.start - 1)
    (registry.dir / f"{pid}.json").write_text(json.dumps(asdict(stale)))
    assert registry.live() == [], "an entry naming another process than the live one is dropped"
    assert registry.stop([stale], timeout_s=0.1) == []
    assert spawn[0].poll() is None, "the process now holding the PID was not touched"


def test_stop_escalates_to_sigkill_at_the_deadline(tmp_path: Path, spawn: list[subprocess.Popen[bytes]]) -> None:
    registry = ProcessRegistry(tmp_path)
    stubborn = registry.record(kind="api", pid=_sleeper(spawn, IGNORE_TERM), group=True)
    polite = registry.record(kind="temporal", pid=_sleeper(spawn), group=True)
    assert stubborn is not None and polite is not None
    started = time.monotonic()
    assert registry.stop([stubborn, polite], timeout_s=1.0) == [stubborn, polite]
    took = time.monotonic() - started
    assert spawn[0].wait(5) == -signal.SIGKILL and spawn[1].wait(5) == -signal.SIGTERM
    assert 1.0 <= took < 5.0, took
    assert registry.live() == [] and list(registry.dir.glob("*.json")) == []


def _fake_proxy(run_dir: Path, pid: int) -> None:
    """A run's proxy.json naming ``pid`` (a sleeper stands in for LiteLLM: the reaper only signals it)."""
    run_dir.mkdir(parents=True)
    handle = ProxyHandle(pid=pid, port=1, fake_key="sk-bw-x", model_name="m", started_at=time.time(),
                         start_ticks=proc_starttime(pid))
    proxy_file(run_dir).write_text(json.dumps(asdict(handle)))


def test_proxies_are_reaped_past_their_linger_or_when_their_worker_is_gone(
        tmp_path: Path, spawn: list[subprocess.Popen[bytes]]) -> None:
    registry = ProcessRegistry(tmp_path)
    runs = tmp_path / "runs"
    ended = {"running": None, "lingering": time.time() - 1, "done": time.time() - 60, "unknown": 0.0}
    for run_id in ended:
        _fake_proxy(runs / run_id, _sleeper(spawn))
    # A proxy recorded as started by a worker that is gone (the worker's PID: a process that has exited).
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = registry.record(kind="model_proxy", pid=_sleeper(spawn), group=True, owner=gone.pid)
    assert orphan is not None

    stopped = reap_model_proxies(registry=registry, runs_dir=runs, finished_at=ended.__getitem__, linger_s=30)

    assert stopped == 3
    alive = {run_id: spawn[i].poll() is None for i, run_id in enumerate(ended)}
    assert alive == {"running": True, "lingering": True, "done": False, "unknown": False}
    assert spawn[4].poll() is not None, "the orphaned worker's proxy was stopped"
    assert load_handle(runs / "done") is None and load_handle(runs / "running") is not None

    assert reap_model_proxies(registry=registry, runs_dir=runs, finished_at=ended.__getitem__, linger_s=30,
                              everything=True) == 2
    assert all(p.poll() is not None for p in spawn)
    assert os.listdir(registry.dir) == [] and list(runs.glob("*/proxy.json")) == []


def test_a_process_started_through_the_lifeline_dies_with_its_parent(tmp_path: Path) -> None:
    """What keeps a model proxy from outliving a worker killed with SIGKILL: the parent here starts a child through
    ``_lifeline.py`` as ``start_model_proxy`` does, prints its PID, and is killed."""
    lifeline = Path(model_proxy.__file__).with_name("_lifeline.py")
    parent_code = (f"import os, subprocess, sys, time\n"
                   f"child = subprocess.Popen([sys.executable, '-E', '-s', '-S', {str(lifeline)!r}, str(os.getpid()), "
                   f"'sleep', '600'], start_new_session=True)\n"
                   f"print(child.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while b"sleep" not in Path(f"/proc/{child}/cmdline").read_bytes():  # exec'd: the lifeline is armed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    start = proc_starttime(child)
    parent.kill()
    parent.wait()
    while proc_starttime(child) == start:
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.01)


def test_the_sweep_removes_only_the_socket_directories_of_processes_that_are_gone(
        tmp_path: Path, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(procreg, "SHORT_BASE", tmp_path)  # this test's directory alone, wherever one is made
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its PID names no process (unless the kernel reuses it within this test)
    live = _sleeper(spawn)
    mine = owned_tempdir("egress")
    assert mine.name.startswith(f"bw-egress-{os.getpid()}-") and mine.stat().st_mode & 0o777 == 0o700
    gone = [tmp_path / f"bw-cp-{dead.pid}-a", tmp_path / f"bw-egress-{dead.pid}-b"]
    kept = [mine, tmp_path / f"bw-cp-{live}-c", tmp_path / f"bw-{dead.pid}-d", tmp_path / f"other-{dead.pid}-e"]
    for path in gone + kept[1:]:
        path.mkdir()
        (path / "control.sock").write_bytes(b"")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_bytes(b"")
    (tmp_path / f"bw-cp-{dead.pid}-link").symlink_to(target)  # a link is never followed, nor removed
    assert sorted(sweep_owned_tempdirs()) == sorted(gone)
    assert all(path.is_dir() for path in kept) and not any(path.exists() for path in gone)
    assert (target / "keep").exists() and (tmp_path / f"bw-cp-{dead.pid}-link").is_symlink()


@pytest.fixture
def short_base(short_tmpdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A short directory standing in for ``/tmp`` as ``procreg.SHORT_BASE``."""
    monkeypatch.setattr(procreg, "SHORT_BASE", short_tmpdir)
    return short_tmpdir


def test_a_deep_tmpdir_puts_socket_directories_where_a_socket_fits(
        tmp_path: Path, short_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 80)  # past sun_path's 108 bytes with a socket under it
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    made = owned_tempdir("cp")
    assert made.parent == short_base and made.stat().st_mode & 0o777 == 0o700
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(made / "control.sock"))  # "AF_UNIX path too long" under the deep one
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = short_base / f"bw-cp-{dead.pid}-x"  # a SIGKILLed process's, made the same way
    left.mkdir()
    assert sweep_owned_tempdirs() == [left]  # swept from there too, though TMPDIR is the deep one
    # A TMPDIR a socket fits under keeps them (one other than SHORT_BASE, so the two are told apart).
    shallow = Path(tempfile.mkdtemp(prefix="bwt-", dir="/tmp"))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(shallow))
        assert owned_tempdir("egress").parent == shallow
    finally:
        shutil.rmtree(shallow, ignore_errors=True)
