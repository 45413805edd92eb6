"""The local sandbox backend under concurrent use: many sandboxes created, used and killed at once.

Reproduces what an end-to-end run does: each sandbox comes from its own ``LocalBackend`` instance on one shared
``root_dir``, restores the same snapshot, has egress configured, runs a command and is killed, with several
creations (``asyncio.to_thread``) in flight at once. Every sandbox must come up, work, and leave nothing behind
(no live sandbox, directory, cgroup, process or egress relay).

No mocks: real namespaces, real processes.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from benchwright.sandbox import ExecLimits, IsolationUnavailable, LocalBackend, SandboxError, SandboxInfo, proxy_env
from benchwright.sandbox.local import backend as local_backend

PY = sys.executable
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
LIMITS = ExecLimits(cpu_seconds=20, memory_mb=256, wall_seconds=60, max_processes=16)
N_SANDBOXES = 40

# A trivial command that also checks the restored snapshot and the egress path (sandbox -> init forwarder ->
# bind-mounted socket -> the backend's relay -> the host listener).
PROBE = """
import socket
print(1)
print(open("data/greeting.txt").read().strip())
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"ping\\n")
print(s.makefile().readline().strip())
"""


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    if os.geteuid() != 0:
        return "the local sandbox backend needs root (CAP_SYS_ADMIN) to create namespaces"
    return None


@pytest.fixture
def egress_listener() -> Iterator[str]:
    """A TCP server on the host's 127.0.0.1 answering every line with ``pong``; yields its URL."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(256)

    def serve(conn: socket.socket) -> None:
        with conn:
            if conn.makefile("rb").readline():
                conn.sendall(b"pong\n")

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    srv.close()


@pytest.fixture
async def shared_root(tmp_path: Path, egress_listener: str) -> AsyncIterator[tuple[Path, str]]:
    """A root dir holding one snapshot (``data/greeting.txt``); yields (root, snapshot id). Checks it is clean
    afterwards and kills whatever a failed test left."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "root"
    b = LocalBackend(root, egress_proxy_url=egress_listener)
    info = await b.create(role="task", run_id="seed")
    await b.write_file(info.sandbox_id, "data/greeting.txt", b"hello from the snapshot\n")
    await b.write_file(info.sandbox_id, "data/bulk.bin", os.urandom(256 * 1024))
    snap = await b.snapshot(info.sandbox_id, label="seed")
    await b.kill(info.sandbox_id)
    await b.close()
    try:
        yield root, snap
    finally:
        sweeper = LocalBackend(root)
        await sweeper.reap(lambda _info: True)
        await sweeper.close()


def _assert_gone(backend: LocalBackend, infos: list[SandboxInfo]) -> None:
    leftovers = sorted(os.listdir(backend.root_dir / "sandboxes"))
    assert leftovers == [], f"sandbox directories left behind: {leftovers}"
    for info in infos:
        for d in backend.cgroups.sandbox_dirs(info.sandbox_id):
            assert not d.exists(), f"cgroup left behind: {d}"
        uid = info.metadata["sandbox_uid"]
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    status = Path(f"/proc/{name}/status").read_text()
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                    pytest.fail(f"process {name} of sandbox {info.sandbox_id} (uid {uid}) is still running")


async def _use(backend: LocalBackend, info: SandboxInfo) -> None:
    res = await backend.exec(info.sandbox_id, [PY, "-c", PROBE], env={**ENV, **proxy_env(info)}, timeout_s=60,
                             limits=LIMITS)
    assert (res.returncode, res.stdout.decode().split("\n")) == (0, ["1", "hello from the snapshot", "pong", ""]), \
        res.stderr.decode()[-2000:]


def _failures(results: list[object]) -> list[str]:
    return [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]


async def test_many_backends_create_concurrently(shared_root: tuple[Path, str], egress_listener: str) -> None:
    """40 sandboxes created at once, each from its own backend on one root, restoring one snapshot, with egress."""
    root, snap = shared_root
    backends = [LocalBackend(root, egress_proxy_url=egress_listener) for _ in range(N_SANDBOXES)]
    try:
        created = await asyncio.gather(*(b.create(role="task", run_id=f"run-{i}", snapshot_id=snap)
                                         for i, b in enumerate(backends)), return_exceptions=True)
        failures = _failures(created)
        assert not failures, f"{len(failures)}/{N_SANDBOXES} creates failed; first: {failures[0]}"
        infos: list[SandboxInfo] = created  # type: ignore[assignment]
        assert len({i.sandbox_id for i in infos}) == N_SANDBOXES
        alive = {i.sandbox_id for i in await backends[0].list_alive()}
        assert alive == {i.sandbox_id for i in infos}  # visible from any instance
        used = await asyncio.gather(*(_use(b, i) for b, i in zip(backends, infos, strict=True)),
                                    return_exceptions=True)
        assert not _failures(used), _failures(used)[0]
        await asyncio.gather(*(b.kill(i.sandbox_id) for b, i in zip(backends, infos, strict=True)))
        relay_sockets = [b._egress.socket_path for b in backends if b._egress is not None]
        assert len(relay_sockets) == N_SANDBOXES
    finally:
        for b in backends:
            await b.close()
    assert await backends[0].list_alive() == []
    _assert_gone(backends[0], infos)
    assert not [p for p in relay_sockets if p.parent.exists()], "egress relay directories left behind"


async def test_kills_while_others_are_being_created(shared_root: tuple[Path, str], egress_listener: str) -> None:
    """Sandboxes are created, used and killed in overlapping waves: kills run while other creates are in flight."""
    root, snap = shared_root
    rng = random.Random(1234)
    infos: list[SandboxInfo] = []

    async def lifecycle(i: int) -> None:
        await asyncio.sleep(rng.random() * 1.5)  # staggered starts: creates overlap kills of earlier ones
        b = LocalBackend(root, egress_proxy_url=egress_listener)
        try:
            info = await b.create(role="task", run_id=f"churn-{i}", snapshot_id=snap)
            infos.append(info)
            await _use(b, info)
            await b.kill(info.sandbox_id)
        finally:
            await b.close()

    # Long-lived sandboxes that get killed in the middle of the churn, from other backend instances.
    early = [LocalBackend(root, egress_proxy_url=egress_listener) for _ in range(8)]
    try:
        early_infos = await asyncio.gather(*(b.create(role="task", run_id="early", snapshot_id=snap)
                                             for b in early))
        infos.extend(early_infos)

        async def kill_early() -> None:
            killer = LocalBackend(root)
            for info in early_infos:
                await asyncio.sleep(0.15)
                await killer.kill(info.sandbox_id)  # not the instance that created it

        supervisors = [json.loads((root / "sandboxes" / i.sandbox_id / "meta.json").read_text())["supervisor_pid"]
                       for i in early_infos]
        results = await asyncio.gather(kill_early(), *(lifecycle(i) for i in range(N_SANDBOXES)),
                                       return_exceptions=True)
        failures = _failures(results)
        assert not failures, f"{len(failures)} lifecycles failed; first: {failures[0]}"
    finally:
        for b in early:
            await b.close()
    checker = LocalBackend(root)
    assert await checker.list_alive() == []
    _assert_gone(checker, infos)
    # Their sandboxes were killed through another instance: the creators still collect their supervisors.
    assert [pid for pid in supervisors if _is_zombie_child(pid)] == []


def _is_zombie_child(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = raw[raw.rindex(b")") + 2:].split()
    return fields[0] == b"Z" and int(fields[1]) == os.getpid()


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline and not _is_zombie_child(int(name)):
                found.append(int(name))
    return found


# ---------------------------------------------------------------------------- failures are named, not "unavailable" ---


@pytest.mark.parametrize(("report", "capability"), [
    ({"step": "unshare", "errno": errno.EPERM}, True),  # no CAP_SYS_ADMIN, seccomp, LSM
    ({"step": "unshare", "errno": errno.EINVAL}, True),  # kernel without that namespace type
    ({"step": "mount setup", "errno": errno.EPERM}, True),  # locked mounts
    ({"step": "mount setup", "errno": errno.EINVAL}, True),  # pivot_root refused (e.g. initramfs root)
    ({"step": "unshare", "errno": errno.ENOSPC}, False),  # max_*_namespaces reached: load, not capability
    ({"step": "unshare", "errno": errno.ENOMEM}, False),
    ({"step": "mount setup", "errno": errno.ENOENT}, False),  # a host path vanished
    ({"step": "mount setup", "errno": None}, False),
    ({"step": "record pids", "errno": errno.ENOSPC}, False),
    ({"step": "start", "error": "Traceback ... FileNotFoundError"}, False),  # crashed or timed-out helper
])
def test_only_kernel_refusals_count_as_isolation_unavailable(report: dict[str, object], capability: bool) -> None:
    assert local_backend._is_capability_failure(report) is capability


async def test_a_start_that_times_out_is_a_sandbox_error_and_leaks_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An init that does not report in time (a loaded host) fails that create with the cause, without claiming
    that namespaces are unavailable and without falling back to no isolation; nothing of it survives."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "root"
    b = LocalBackend(root, allow_unisolated=True)
    try:
        # Timeouts swept across the helper's start-up, so the supervisor gets killed at every stage: before it
        # forks, between the fork and the init arming PDEATHSIG, during the mount setup.
        outcomes = {"timed out": 0, "started": 0}
        for ms in range(1, 121, 3):
            monkeypatch.setattr(local_backend, "_START_TIMEOUT_S", ms / 1000)
            try:
                info = await b.create(role="task", run_id="r")
            except SandboxError as exc:
                assert not isinstance(exc, IsolationUnavailable), exc
                assert "did not report within" in str(exc), exc
                outcomes["timed out"] += 1
            else:
                assert info.metadata["isolation"] == "namespaces"
                await b.kill(info.sandbox_id)
                outcomes["started"] += 1
        assert outcomes["timed out"] > 0, outcomes
        monkeypatch.undo()
        info = await b.create(role="task", run_id="r")
        assert info.metadata["isolation"] == "namespaces"  # no silent fallback to running unisolated
        await b.kill(info.sandbox_id)
    finally:
        for info in await b.list_alive():
            await b.kill(info.sandbox_id)
        await b.close()
    assert os.listdir(root / "sandboxes") == []
    deadline = asyncio.get_running_loop().time() + 5
    while (left := _processes_mentioning(str(root))) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert left == [], "a sandbox init whose start timed out is still running"
