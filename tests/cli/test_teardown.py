"""Nothing outlives the stack (issue 15 item 10): `benchwright up` stopped with SIGTERM mid-run leaves no process,
cgroup or sandbox directory behind (the run's LiteLLM proxy included), and what a crash (`up` and its worker
killed with SIGKILL) left running (Temporal, the API, sandboxes, their cgroups) is reaped by the next `up` on the
same data directory, which then works. Real processes throughout: `up` as a subprocess, the dev model, a keyed run
behind its LiteLLM proxy, a scorer sleeping in a namespaced work sandbox.

Measured: 29 s and 17 s at a load average of 8 on two cores (LiteLLM's start-up is most of the first: 11 s on a
quiet machine, ~30 s at a load average of 13, when the pair took ~100 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.stack.devstack import free_port
from benchwright.stack.procreg import proc_starttime
from tests.cli.test_stack import BW, SAMPLE, _stop, _up, _wait_file

SECRET = "sk-teardown-provider-key-" + "5" * 16
# Each task calls the model (through the run's proxy), then sleeps: the run sits in Materialize with a live work
# sandbox, a running scorer and a live proxy for as long as the test needs.
SLOW_IMPL = '''
import time


class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        answer = call_sut(self.extract(row))
        time.sleep(600)
        return answer

    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''


def _until(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@dataclass(frozen=True)
class Footprint:
    """What a stack had running: processes (pid -> start time), sandbox directories and their cgroups."""

    processes: dict[int, int]
    sandbox_dirs: list[Path]
    cgroups: list[Path]

    def survivors(self) -> list[str]:
        alive = [f"pid {pid}: {_cmdline(pid)}" for pid, start in self.processes.items() if proc_starttime(pid) == start]
        return alive + [str(d) for d in self.sandbox_dirs + self.cgroups if d.exists()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def _descendants(root: int) -> dict[int, int]:
    """``root`` and every process below it (sandbox inits and their commands included), with start times."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(b")") + 2:].split()[1]), []).append(int(entry))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        start = proc_starttime(pid)
        if start is not None:
            found[pid] = start
        todo += children.get(pid, [])
    return found


def _referencing(data_dir: Path) -> list[str]:
    """Live processes (other than this one) whose command line or environment names the data directory."""
    needle = str(data_dir).encode()
    hits = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or proc_starttime(int(entry)) is None:
            continue
        for part in ("cmdline", "environ"):
            try:
                if needle in Path(f"/proc/{entry}/{part}").read_bytes():
                    hits.append(f"pid {entry}: {_cmdline(int(entry))}")
                    break
            except OSError:
                pass
    return hits


def _sandboxes(data_dir: Path) -> list[dict[str, Any]]:
    metas = []
    for meta in (data_dir / "sandboxes" / "sandboxes").glob("sb-*/meta.json"):
        try:
            metas.append(json.loads(meta.read_text()))
        except (OSError, ValueError):
            pass
    return metas


def _footprint(up: subprocess.Popen[bytes], data_dir: Path) -> Footprint:
    metas = _sandboxes(data_dir)
    return Footprint(processes=_descendants(up.pid),
                     sandbox_dirs=[data_dir / "sandboxes" / "sandboxes" / m["sandbox_id"] for m in metas],
                     cgroups=[Path(c) for m in metas for c in m["cgroups"]])


@pytest.fixture
def dev_model(tmp_path: Path) -> Iterator[str]:
    ready = tmp_path / "dev-model.json"
    proc = subprocess.Popen([*BW, "dev-model", "--answers", str(SAMPLE), "--port", "0", "--ready-file", str(ready)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield _wait_file(ready, proc)["url"]
    finally:
        _stop(proc)


def _start_slow_run(data_dir: Path, up: subprocess.Popen[bytes], model_url: str, *, keyed: bool) -> str:
    """Launch a run whose scorer sleeps (and, ``keyed``, whose model names a secret, so its LiteLLM proxy runs);
    return its id once a work sandbox is alive in Materialize (and the proxy is up)."""
    dev = _wait_file(data_dir / "dev.json", up)
    model = {"identifier": "openai/dev", "api_base": model_url}
    with httpx.Client(base_url=dev["api_url"], headers={"Authorization": f"Bearer {dev['api_key']}"},
                      timeout=30) as http:
        if keyed:
            assert http.post("/v1/secrets", json={"name": "TEARDOWN", "value": SECRET}).status_code == 201
            model["secret"] = "TEARDOWN"
        made = http.post("/v1/runs", json={"dataset": str(SAMPLE), "task_impl": SLOW_IMPL, "model": model})
        assert made.status_code == 201, made.text
        run_id = made.json()["id"]

        def materializing() -> bool:
            run = http.get(f"/v1/runs/{run_id}").json()
            assert run["status"] == "running", run
            live = [m for m in _sandboxes(data_dir) if m.get("state") == "ready" and m.get("role") == "work"]
            return run["phase"] == "materialize" and bool(live)

        _until("a live work sandbox in Materialize", materializing, 120)
    if keyed:
        proxy = json.loads((data_dir / "runs" / run_id / "proxy.json").read_text())
        assert Path(f"/proc/{proxy['pid']}").exists(), "the credential proxy holding the run's key is up"
    return run_id


def _socket_dirs(tmpdir: Path) -> list[str]:
    """The stack's sockets' directories (``benchwright.stack.procreg.owned_tempdir``) in its TMPDIR."""
    return sorted(path.name for path in tmpdir.glob("bw-*"))


def test_sigterm_mid_run_leaves_no_process_cgroup_or_sandbox(tmp_path: Path, short_tmpdir: Path,
                                                              dev_model: str) -> None:
    data_dir, tmpdir = tmp_path / "stack", short_tmpdir
    data_dir.mkdir()
    up = _up(data_dir, {"api": free_port(), "temporal": free_port(), "ui": free_port()}, tmpdir=tmpdir)
    try:
        _start_slow_run(data_dir, up, dev_model, keyed=True)
        before = _footprint(up, data_dir)
        assert any(name.startswith("bw-cp-") for name in _socket_dirs(tmpdir)), _socket_dirs(tmpdir)
        kinds = " ".join(_cmdline(pid) for pid in before.processes)
        assert "credential_proxy.py" in kinds and "_nsexec.py init" in kinds, kinds
        assert before.cgroups, "the sandbox's commands run in cgroups"

        stopping = time.monotonic()
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, (data_dir / "up.err").read_text()
        print(f"stopped in {time.monotonic() - stopping:.1f} s")
    finally:
        _stop(up)
    assert before.survivors() == [], "everything the stack started stops with it"
    assert _referencing(data_dir) == []
    assert list((data_dir / "sandboxes" / "sandboxes").iterdir()) == []
    assert list(data_dir.glob("runs/*/proxy.json")) == []
    assert _socket_dirs(tmpdir) == []  # the proxy's control socket and the sandboxes' egress relays


def test_after_sigkill_the_next_up_reaps_the_leftovers_and_works(tmp_path: Path, short_tmpdir: Path,
                                                                   dev_model: str) -> None:
    data_dir, tmpdir = tmp_path / "stack", short_tmpdir
    data_dir.mkdir()
    ports = {"api": free_port(), "temporal": free_port(), "ui": free_port()}
    up = _up(data_dir, ports, tmpdir=tmpdir)
    try:
        # Keyless: the proxy's death with its worker is tested apart (tests/domain/test_teardown_registry.py),
        # which saves a LiteLLM start-up here.
        slow_run = _start_slow_run(data_dir, up, dev_model, keyed=False)
        crashed = _footprint(up, data_dir)
        # A crash: `up` and its worker die by SIGKILL, nothing of theirs runs any cleanup. Temporal, the API and
        # the sandbox (its init has its own session) are orphaned.
        worker = json.loads((data_dir / "pids.json").read_text())["worker"]
        up.kill()
        os.kill(worker, signal.SIGKILL)
        up.wait()
        orphans = crashed.survivors()
        assert any("temporal" in o for o in orphans) and any("_nsexec.py" in o for o in orphans), orphans
        assert [d for d in crashed.sandbox_dirs if d.exists()] and [c for c in crashed.cgroups if c.exists()]
        # The dead worker's sockets' directories (its proxy's control socket, its warm sandbox's egress relay)
        left = [name for name in _socket_dirs(tmpdir) if f"-{worker}-" in name]
        assert any(name.startswith("bw-egress-") for name in left), _socket_dirs(tmpdir)

        (data_dir / "dev.json").unlink()  # the dead stack's; wait for the next one's
        up = _up(data_dir, ports, tmpdir=tmpdir)  # the same ports: the orphaned Temporal and API hold them until reaped
        dev = _wait_file(data_dir / "dev.json", up)
        assert crashed.survivors() == [], "the next `up` reaped every leftover before serving"
        assert not set(left) & set(_socket_dirs(tmpdir)), "... and the dead worker's sockets' directories"
        assert "stopped what was left of the stack" in (data_dir / "up.err").read_text()

        with httpx.Client(base_url=dev["api_url"], headers={"Authorization": f"Bearer {dev['api_key']}"},
                          timeout=30) as http:
            made = http.post("/v1/runs", json={"dataset": str(SAMPLE),
                                               "model": {"identifier": "openai/dev", "api_base": dev_model}})
            assert made.status_code == 201, made.text
            done = http.get(f"/v1/runs/{made.json()['id']}", params={"wait_s": 60}, timeout=90).json()
            assert done["status"] == "ok" and done["tasks"]["summary"]["pass_rate"] == 1.0, done
            assert http.get(f"/v1/runs/{slow_run}").json()["status"] == "running", "the old run goes on"
        after = _footprint(up, data_dir)
        stopping = time.monotonic()
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        print(f"stopped in {time.monotonic() - stopping:.1f} s")
    finally:
        _stop(up)
    assert after.survivors() == [] and _referencing(data_dir) == []
    assert _socket_dirs(tmpdir) == []
