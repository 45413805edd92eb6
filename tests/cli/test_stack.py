"""`benchwright up`, `worker`, `accounts create`, `dev-model` and `run` as a user runs them: real processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.client import Client
from benchwright.events import AFTER_TERMINAL
from benchwright.proxy.model_proxy import ProxyGone, control_call
from benchwright.stack.devstack import connected_to_itself, free_port, free_ports, pid_alive, port_open
from benchwright.stack.procreg import ProcessRegistry

BW = [sys.executable, "-m", "benchwright.cli"]
SAMPLE = Path(__file__).resolve().parents[2] / "benchwright" / "samples" / "arithmetic.jsonl"


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        assert proc.poll() is None, f"process exited with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    return proc.returncode


@pytest.fixture
def dev_model(tmp_path: Path) -> Iterator[str]:
    ready = tmp_path / "dev-model.json"
    proc = subprocess.Popen([*BW, "dev-model", "--answers", str(SAMPLE), "--port", "0", "--ready-file", str(ready)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield _wait_file(ready, proc)["url"]
    finally:
        _stop(proc)


def _up(data_dir: Path, ports: dict[str, int], *, tmpdir: Path | None = None) -> subprocess.Popen[bytes]:
    """``benchwright up`` on ``data_dir`` (its messages in ``up.err``), with ``tmpdir`` as its TMPDIR if given."""
    env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir is not None else None
    return subprocess.Popen(
        [*BW, "up", "--data-dir", str(data_dir), "--api-port", str(ports["api"]),
         "--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"])],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=(data_dir / "up.err").open("wb"), env=env)


@pytest.mark.asyncio(loop_scope="session")
async def test_up_runs_a_launch_restarts_its_worker_and_survives_a_restart(tmp_path: Path, dev_model: str) -> None:
    data_dir = tmp_path / "stack"
    data_dir.mkdir()
    ports = {"api": free_port(), "temporal": free_port(), "ui": free_port()}
    up = _up(data_dir, ports)
    try:
        dev = _wait_file(data_dir / "dev.json", up)
        # dev.json is the last file the stack writes as it comes up: the PIDs are there as soon as it is.
        assert set(json.loads((data_dir / "pids.json").read_text())) == {"temporal", "worker", "api"}
        assert set(dev) == {"api_url", "temporal_address", "temporal_ui_url", "api_key"}
        assert httpx.get(dev["temporal_ui_url"], timeout=10).status_code == 200

        # The worker keeps a credential proxy up ahead of any run: a spare, holding no route and not lingering.
        spare = await _a_proxy_up(data_dir)
        assert spare["spare"] is True and spare["routes"] == 0, spare

        # A connection left idle (here while the run below runs) outlasts the clients' own 5 s keep-alive
        # (API_KEEP_ALIVE_S): a request on it is answered, never raced by the server's close.
        kept, idle_since = _answered_and_kept(dev["api_url"]), time.monotonic()

        # `benchwright run --watch` launches through REST and reports the score; its exit status is truthful.
        env = {**os.environ, "BENCHWRIGHT_DATA_DIR": str(data_dir)}
        done = subprocess.run([*BW, "run", "--dataset", str(SAMPLE), "--model", "openai/dev", "--api-base", dev_model,
                               "--watch"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        time.sleep(max(0.0, 6.0 - (time.monotonic() - idle_since)))  # the idle spell under test, past 5 s
        with kept:
            kept.setblocking(False)
            with pytest.raises(BlockingIOError):  # open and quiet (a closed one reads b"")
                kept.recv(1, socket.MSG_PEEK)
            kept.setblocking(True)
            assert _answered_and_kept(dev["api_url"], kept) is kept
        assert "score (pass rate) 100.0%" in done.stdout
        run_id = done.stdout.split("run ", 1)[1].split(":", 1)[0]
        # The worker keeps a warm sandbox (issue 25): the run claimed one instead of making all of its own.
        with Client(dev["api_url"], dev["api_key"]) as client:
            created = [e["data"] for e in client.events(run_id)["events"] if e["type"] == "SandboxCreated"]
        assert any(c["metadata"].get("warm") for c in created), created
        served = await _a_proxy_up(data_dir)
        assert served["pid"] == spare["pid"] and served["spare"] is False, "the run's route went to the spare"
        _worker_on_one_cpu_its_children_on_every_cpu(data_dir)

        # The supervisor restarts a worker that dies; a launch after that still completes.
        pids = json.loads((data_dir / "pids.json").read_text())
        os.kill(pids["worker"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while json.loads((data_dir / "pids.json").read_text())["worker"] == pids["worker"]:
            assert time.monotonic() < deadline, "worker was not restarted"
            await asyncio.sleep(0.05)
        with Client(dev["api_url"], dev["api_key"]) as client:
            second = client.launch(dataset=str(SAMPLE), model={"identifier": "openai/dev", "api_base": dev_model})
            assert (await asyncio.to_thread(client.wait, second["id"], timeout_s=120))["status"] == "ok"

        # An extra `benchwright worker` joins the same queue and leaves cleanly on SIGTERM.
        extra = subprocess.Popen([*BW, "worker", "--data-dir", str(data_dir)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert extra.poll() is None
        _stop(extra)

        pids = json.loads((data_dir / "pids.json").read_text())
        assert _stop(up) == 0
        assert not any(pid_alive(pid) for pid in pids.values()), "every child stops with `up`"
        from benchwright.sandbox import LocalBackend

        # ... and nothing of theirs: the warm sandboxes of the worker killed above (reaped by its successor) and of
        # the ones stopped (killed on the way out).
        left = LocalBackend(data_dir / "sandboxes")
        assert await left.list_alive() == []
        await left.close()
        assert not (data_dir / "dev.json").exists()

        # Runs survive a restart of the stack (Temporal's and the store's files are under the data dir).
        up = _up(data_dir, ports)
        dev2 = _wait_file(data_dir / "dev.json", up)
        assert dev2["api_key"] == dev["api_key"]
        with Client(dev2["api_url"], dev2["api_key"]) as client:
            assert client.run(run_id)["status"] == "ok"
            events = client.events(run_id)["events"]
            types = [e["type"] for e in events]
            # Only output events (the report, issue 26) may follow the terminal event.
            assert set(types[types.index("PipelineFinished") + 1:]) <= AFTER_TERMINAL
        # ... and so do its work-sandbox snapshots: the post-Atomize one restores the same scorer.
        snapshot = next(e["data"]["snapshot_id"] for e in events
                        if e["type"] == "SnapshotCreated" and e["data"]["phase"] == "atomize")
        backend = LocalBackend(data_dir / "sandboxes")
        box = await backend.create(role="work", run_id="after-restart", snapshot_id=snapshot)
        try:
            restored = await backend.read_file(box.sandbox_id, "task_impl.py")
        finally:
            await backend.kill(box.sandbox_id)
            await backend.close()
        assert restored == (data_dir / "runs" / run_id / "work" / "task_impl.py").read_bytes()
        from temporalio.api.enums.v1 import EventType
        from temporalio.client import Client as TemporalClient

        temporal = await TemporalClient.connect(dev2["temporal_address"])
        handle = temporal.get_workflow_handle(run_id)
        # The run was terminal (`ok`) before the stop; its report (an output event after the terminal one) may have
        # been cut short by the stop, and the restarted worker finishes it: the workflow then completes.
        async def closed() -> None:  # a long poll on the history (its payloads are encrypted: no codec needed here)
            async for event in handle.fetch_history_events(wait_new_event=True):
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                    return

        await asyncio.wait_for(closed(), timeout=120)
        desc = await handle.describe()
        assert desc.status is not None and desc.status.name == "COMPLETED"
        # Temporal's file store runs in WAL mode (a rollback journal cost ~4 ms of fsync per workflow task).
        import sqlite3

        with contextlib.closing(sqlite3.connect(data_dir / "temporal.db")) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        _stop(up)


def _answered_and_kept(api_url: str, conn: socket.socket | None = None) -> socket.socket:
    """One HTTP/1.1 request on ``conn`` (a new connection to the API when None), its whole answer read; the
    connection is left open."""
    host, port = api_url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    conn = conn or socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(b"GET /v1/account HTTP/1.1\r\nHost: api\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536)
    head, body = answer.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    assert head.startswith(b"HTTP/1.1 401"), head  # no key: refused, and kept alive
    return conn


async def _a_proxy_up(data_dir: Path) -> dict[str, Any]:
    """The ``hello`` of the stack's one live credential proxy, waited for (the worker starts one as it starts)."""
    deadline = time.monotonic() + 60
    while not (live := ProcessRegistry(data_dir).live(kinds=("model_proxy",))):
        assert time.monotonic() < deadline, "no credential proxy came up"
        await asyncio.sleep(0.05)
    assert len(live) == 1, live
    control = live[0].detail["control"]
    while True:
        try:
            return await asyncio.to_thread(control_call, control, {"op": "hello"})
        except ProxyGone:  # recorded as it was spawned: its control socket comes up a moment later
            assert time.monotonic() < deadline, "the credential proxy never answered"
            await asyncio.sleep(0.05)


def _worker_on_one_cpu_its_children_on_every_cpu(data_dir: Path) -> None:
    """``up``'s worker keeps its threads on one CPU; what it started (its credential proxy, the run's and the warm
    pool's sandboxes) keeps every CPU of the stack (``benchwright.stack.cpu``)."""
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        print(f"not checked: the worker's CPU (this machine gives the tests one CPU, {sorted(every)})")
        return
    worker = json.loads((data_dir / "pids.json").read_text())["worker"]
    assert os.sched_getaffinity(worker) == {max(every)}
    proxies = [entry.pid for entry in ProcessRegistry(data_dir).live(kinds=("model_proxy",))]
    sandboxed = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _runs(int(d.name), (
        "_nsexec.py", str(data_dir / "sandboxes")))]
    cpus = {}
    for pid in proxies + sandboxed:
        with contextlib.suppress(ProcessLookupError):  # a run's sandbox may end meanwhile (the warm pool's stays)
            cpus[pid] = os.sched_getaffinity(pid)
    assert set(proxies) & set(cpus) and set(sandboxed) & set(cpus), (proxies, sandboxed, cpus)
    assert cpus == dict.fromkeys(cpus, every)


def _runs(pid: int, words: tuple[str, ...]) -> bool:
    """Whether process ``pid``'s command line holds every one of ``words`` (False once it is gone)."""
    try:
        command = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return all(word in command for word in words)


def test_accounts_create_prints_a_working_key_and_refuses_a_duplicate(tmp_path: Path) -> None:
    made = subprocess.run([*BW, "accounts", "create", "alice", "--data-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("bw_")
    from benchwright.settings import Settings
    from benchwright.store.accounts import authenticate
    from benchwright.store.db import make_engine

    assert authenticate(make_engine(Settings(data_dir=tmp_path).resolved_database_url()), key).name == "alice"
    again = subprocess.run([*BW, "accounts", "create", "alice", "--data-dir", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1 and "already exists" in again.stderr


def test_cli_exit_status_is_truthful_across_repeats(tmp_path: Path) -> None:
    """A failing command exits 1 and a usage error 2, every time (no abort code from the interpreter's exit)."""
    for _ in range(5):
        failed = subprocess.run([*BW, "run", "--dataset", "x.jsonl", "--model", "m", "--api-url", "http://127.0.0.1:9",
                                 "--api-key", "k"], capture_output=True, text=True, timeout=60)
        assert failed.returncode == 1, (failed.returncode, failed.stderr)
        usage = subprocess.run([*BW, "run"], capture_output=True, text=True, timeout=60)
        assert usage.returncode == 2, (usage.returncode, usage.stderr)


def test_free_ports_picks_distinct_ports_a_stack_can_bind() -> None:
    """A stack's ports (the demo's and the benches': API, Temporal, its UI) are picked together: two ``free_port``
    calls in a row may return the same port, and the stack's second server then fails to start."""
    ports = free_ports(8)
    assert len(set(ports)) == len(ports) == 8
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_counts_as_open_only_when_something_listens_not_when_tcp_connects_a_socket_to_itself() -> None:
    """A port from the ephemeral range can become a readiness probe's own source port, and TCP then connects the
    probe to itself with nothing listening (a simultaneous open). CI once went on past such a probe to a Temporal dev
    server that was not up yet. The kernel picks a probe's source port, so ``port_open``'s own connection cannot be
    made to do it; the check it applies to its connection is tested on a self-connection made on purpose (bound to
    the port it connects to), and on a real listener's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.connect(("127.0.0.1", port))
        assert connected_to_itself(probe)
    assert not port_open("127.0.0.1", port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname(), timeout=5) as conn:
            assert not connected_to_itself(conn)
        assert port_open("127.0.0.1", listener.getsockname()[1])


def test_the_supervisors_files_are_never_read_half_written(tmp_path: Path) -> None:
    """``pids.json`` is rewritten each time the supervisor restarts a child, while tests and operators read it: CI
    once read it empty between the truncation and the write. A reader now finds the old content or the new one."""
    from benchwright.stack.supervisor import _write_whole

    path = tmp_path / "pids.json"
    _write_whole(path, json.dumps({"worker": 0}))
    stop = threading.Event()
    seen: list[str] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for pid in range(1, 3001):
            _write_whole(path, json.dumps({"worker": pid, "api": pid, "temporal": pid}))
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 100, "the reader ran alongside the writes"
    assert all(json.loads(text)["worker"] >= 0 for text in seen)
    assert json.loads(path.read_text())["worker"] == 3000
    assert path.stat().st_mode & 0o777 == 0o600
