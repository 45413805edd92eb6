"""One backend suite, three backends: ``local`` (this machine's namespaces), ``sandbox0`` (the real ``kubernetes``
client against :mod:`benchwright.testkit.k8s_double`, v5 and v4 exec subprotocols) and ``e2b`` (the real ``e2b``
SDK against :mod:`benchwright.testkit.e2b_double`).

Against a real cluster or a real E2B account (see docs/backends.md):

    BENCHWRIGHT_TEST_KUBECONFIG=~/.kube/config BENCHWRIGHT_TEST_SANDBOX0_IMAGE=python:3.12-slim \
        .venv/bin/python -m pytest tests/sandbox/test_backends.py -k sandbox0-real
    BENCHWRIGHT_TEST_E2B_API_KEY=e2b_... .venv/bin/python -m pytest tests/sandbox/test_backends.py -k e2b-real

Those parameters are skipped, saying why, when the variables are not set.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchwright.data.blobs import DirBlobStore
from benchwright.sandbox import (
    ExecLimits,
    LocalBackend,
    SandboxBackend,
    SandboxNotFound,
    SandboxPathError,
)
from benchwright.sandbox.e2b import E2BBackend
from benchwright.sandbox.sandbox0 import Sandbox0Backend, load_api_client
from benchwright.testkit.e2b_double import E2BDouble
from benchwright.testkit.k8s_double import V4, K8sDouble

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
FAST = ExecLimits(cpu_seconds=10, memory_mb=512, wall_seconds=20, max_processes=32)


@dataclass
class Kit:
    """How a test reaches one backend: ``new()`` builds a fresh backend object on the same infrastructure (a
    second worker, or the same worker after a crash); ``python`` is the interpreter inside its sandboxes."""

    name: str
    new: Callable[[], SandboxBackend]
    python: str
    double: K8sDouble | None = None


async def _local_kit(root: Path) -> AsyncIterator[Kit]:
    yield Kit("local", lambda: LocalBackend(root, allow_unisolated=True), sys.executable)


async def _sandbox0_kit(root: Path, protocols: tuple[str, ...] | None) -> AsyncIterator[Kit]:
    double = K8sDouble(root / "pods", allow_unisolated=True, **({"protocols": protocols} if protocols else {}))
    await double.start()
    kubeconfig = double.kubeconfig(root / "kubeconfig")
    blobs = DirBlobStore(root / "blobs")
    try:
        yield Kit("sandbox0", lambda: Sandbox0Backend(api_client=load_api_client(str(kubeconfig)), namespace="bw",
                                                      image="benchwright-sandbox:dev", blobs=blobs),
                  sys.executable, double)
    finally:
        await double.stop()


async def _sandbox0_real(root: Path) -> AsyncIterator[Kit]:
    kubeconfig = os.environ.get("BENCHWRIGHT_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("BENCHWRIGHT_TEST_KUBECONFIG is not set: no real cluster to run the sandbox0 suite against")
    blobs = DirBlobStore(root / "blobs")
    yield Kit("sandbox0", lambda: Sandbox0Backend(
        api_client=load_api_client(kubeconfig), namespace=os.environ.get("BENCHWRIGHT_TEST_SANDBOX0_NAMESPACE",
                                                                         "default"),
        image=os.environ.get("BENCHWRIGHT_TEST_SANDBOX0_IMAGE", "python:3.12-slim"), blobs=blobs), "python3")


async def _e2b_kit(root: Path) -> AsyncIterator[Kit]:
    double = E2BDouble(root / "vms", allow_unisolated=True)
    url = await double.start()
    blobs = DirBlobStore(root / "blobs")
    try:
        yield Kit("e2b", lambda: E2BBackend(api_key=double.api_key, blobs=blobs, api_url=url, sandbox_url=url),
                  sys.executable)
    finally:
        await double.stop()


async def _e2b_real(root: Path) -> AsyncIterator[Kit]:
    key = os.environ.get("BENCHWRIGHT_TEST_E2B_API_KEY")
    if not key:
        pytest.skip("BENCHWRIGHT_TEST_E2B_API_KEY is not set: no E2B account to run the e2b suite against")
    blobs = DirBlobStore(root / "blobs")
    yield Kit("e2b", lambda: E2BBackend(api_key=key, blobs=blobs,
                                        template=os.environ.get("BENCHWRIGHT_TEST_E2B_TEMPLATE", "base")), "python3")


KITS = ["local", "sandbox0", "sandbox0-v4", "sandbox0-real", "e2b", "e2b-real"]


@pytest.fixture(params=KITS)
async def kit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Kit]:
    root = tmp_path_factory.mktemp(request.param)
    factories = {"local": lambda: _local_kit(root), "sandbox0": lambda: _sandbox0_kit(root, None),
                 "sandbox0-v4": lambda: _sandbox0_kit(root, (V4,)), "sandbox0-real": lambda: _sandbox0_real(root),
                 "e2b": lambda: _e2b_kit(root), "e2b-real": lambda: _e2b_real(root)}
    async for k in factories[request.param]():
        yield k


@pytest.fixture
async def backend(kit: Kit) -> AsyncIterator[SandboxBackend]:
    b = kit.new()
    alive_before = {i.sandbox_id for i in await b.list_alive()}
    try:
        yield b
    finally:
        for info in await b.list_alive():
            if info.sandbox_id not in alive_before:
                await b.kill(info.sandbox_id)
        await b.close()


def _run_id() -> str:
    return f"run_{uuid.uuid4().hex[:12]}"


async def test_create_records_role_and_run_and_execs(kit: Kit, backend: SandboxBackend) -> None:
    run_id = _run_id()
    info = await backend.create(role="task", run_id=run_id, metadata={"account": "acct-1"})
    assert info.backend == kit.name == backend.name
    assert info.role == "task"
    assert info.metadata["benchwright_role"] == "task" and info.metadata["benchwright_run_id"] == run_id
    listed = {i.sandbox_id: i for i in await backend.list_alive()}
    assert listed[info.sandbox_id].role == "task"
    assert listed[info.sandbox_id].metadata["benchwright_run_id"] == run_id

    script = "import os, sys; print(sorted(os.environ)); print(sys.stdin.read()[::-1]); sys.exit(3)"
    res = await backend.exec(info.sandbox_id, [kit.python, "-c", script],
                             env={**ENV, "ONLY_THIS": "1"}, timeout_s=30, limits=FAST, stdin=b"olleh")
    lines = res.stdout.decode().splitlines()
    assert res.returncode == 3, res
    assert eval(lines[0]) == sorted({**ENV, "ONLY_THIS": "1"})  # exactly the env given, nothing of the host's
    assert lines[1] == "hello"
    assert not res.timed_out and res.killed_reason is None
    if kit.double is not None:  # the exec stream spoke the subprotocol the double offered first
        assert set(kit.double.exec_protocols) == {kit.double.protocols[0]}


async def test_limits_wall_clock_output_cpu_memory(kit: Kit, backend: SandboxBackend) -> None:
    info = await backend.create(role="work", run_id=_run_id())
    sid = info.sandbox_id
    slow = await backend.exec(sid, [kit.python, "-c", "import time; time.sleep(60)"], env=ENV, timeout_s=1.5,
                              limits=FAST)
    assert slow.timed_out and slow.killed_reason == "wall_clock" and slow.returncode != 0
    assert slow.duration_s < 15

    loud = await backend.exec(sid, [kit.python, "-c", "print('x' * 100000)"], env=ENV, timeout_s=30,
                              limits=ExecLimits(max_output_bytes=1000, wall_seconds=30))
    assert loud.stdout == b"x" * 1000 and loud.stdout_truncated and loud.returncode == 0

    spin = await backend.exec(sid, [kit.python, "-c", "while True: pass"], env=ENV, timeout_s=30,
                              limits=ExecLimits(cpu_seconds=1, wall_seconds=30))
    assert spin.killed_reason == "cpu" and spin.returncode != 0, spin

    hog = await backend.exec(sid, [kit.python, "-c", "b = bytearray(1500 * 1024 * 1024); print('allocated')"],
                             env=ENV, timeout_s=30, limits=ExecLimits(memory_mb=256, wall_seconds=30))
    assert hog.returncode != 0 and b"allocated" not in hog.stdout, hog


async def test_files_in_and_out(kit: Kit, backend: SandboxBackend) -> None:
    sid = (await backend.create(role="work", run_id=_run_id())).sandbox_id
    blob = os.urandom(200_000)
    await backend.write_file(sid, "data/nested/blob.bin", blob)
    await backend.write_file(sid, "run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert await backend.read_file(sid, "data/nested/blob.bin") == blob
    res = await backend.exec(sid, ["./run.sh"], env=ENV, timeout_s=30, limits=FAST)
    assert res.stdout == b"ran\n", res
    made = await backend.exec(sid, [kit.python, "-c", "open('made.txt', 'w').write('by the command')"], env=ENV,
                              timeout_s=30, limits=FAST)
    assert made.returncode == 0, made
    assert await backend.read_file(sid, "made.txt") == b"by the command"
    with pytest.raises(FileNotFoundError):
        await backend.read_file(sid, "missing.txt")
    for bad in ("../escape", "/etc/passwd", "a/../../b"):
        with pytest.raises(SandboxPathError):
            await backend.write_file(sid, bad, b"x")


_DIGEST = ("import hashlib, os\n"
           "for d, _, fs in sorted(os.walk('.')):\n"
           "    for f in sorted(fs):\n"
           "        p = os.path.join(d, f)\n"
           "        print(p, oct(os.stat(p).st_mode & 0o777), hashlib.sha256(open(p, 'rb').read()).hexdigest())\n")


async def test_snapshot_restore_is_byte_identical(kit: Kit, backend: SandboxBackend) -> None:
    sid = (await backend.create(role="work", run_id=_run_id())).sandbox_id
    files = {"a.txt": b"alpha\n", "deep/er/b.bin": os.urandom(65_537), "empty": b""}
    for path, data in files.items():
        await backend.write_file(sid, path, data)
    await backend.write_file(sid, "tool.sh", b"#!/bin/sh\n", mode=0o755)
    await backend.exec(sid, [kit.python, "-c", "import os; open('gen.bin','wb').write(os.urandom(300000))"],
                       env=ENV, timeout_s=30, limits=FAST)
    before = await backend.exec(sid, [kit.python, "-c", _DIGEST], env=ENV, timeout_s=30, limits=FAST)
    snap = await backend.snapshot(sid, label="test:setup:v1")

    # Restored by another backend object (another worker): same files, same bytes, same modes.
    other = kit.new()
    try:
        restored = (await other.create(role="task", run_id=_run_id(), snapshot_id=snap)).sandbox_id
        after = await other.exec(restored, [kit.python, "-c", _DIGEST], env=ENV, timeout_s=30, limits=FAST)
        assert after.stdout == before.stdout and before.stdout.count(b"\n") == 5, (before, after)
        for path, data in files.items():
            assert hashlib.sha256(await other.read_file(restored, path)).digest() == hashlib.sha256(data).digest()

        derived = await other.snapshot_files({"task_impl.py": b"print('impl')\n"}, label="atomize", base=snap)
        third = (await other.create(role="task", run_id=_run_id(), snapshot_id=derived)).sandbox_id
        assert await other.read_file(third, "task_impl.py") == b"print('impl')\n"
        assert await other.read_file(third, "deep/er/b.bin") == files["deep/er/b.bin"]
    finally:
        for info in await other.list_alive():
            if info.metadata.get("benchwright_role") == "task":
                await other.kill(info.sandbox_id)
        await other.close()


async def test_spawn_speaks_json_lines_and_kill_ends_it(kit: Kit, backend: SandboxBackend) -> None:
    sid = (await backend.create(role="work", run_id=_run_id())).sandbox_id
    script = ("import json, sys\n"
              "for line in sys.stdin:\n"
              "    print(json.dumps({'echo': json.loads(line)['n'] * 2}), flush=True)\n")
    proc = await backend.spawn(sid, [kit.python, "-u", "-c", script], env=ENV, limits=FAST)
    assert proc.stdin is not None and proc.stdout is not None
    for n in (1, 21):
        proc.stdin.write(json.dumps({"n": n}).encode() + b"\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert json.loads(line) == {"echo": n * 2}
    proc.kill()
    rc = await asyncio.wait_for(proc.wait(), 20)
    assert rc != 0 and proc.returncode == rc


async def test_kill_ends_the_sandbox_and_is_idempotent(kit: Kit, backend: SandboxBackend) -> None:
    sid = (await backend.create(role="driver", run_id=_run_id())).sandbox_id
    lifetime = await backend.kill(sid)
    assert lifetime >= 0
    assert sid not in {i.sandbox_id for i in await backend.list_alive()}
    with pytest.raises(SandboxNotFound):
        await backend.exec(sid, ["true"], env=ENV, timeout_s=10, limits=FAST)
    assert await backend.kill(sid) == 0.0 or kit.name == "local"


async def test_reap_after_a_worker_crash(kit: Kit) -> None:
    crashed = kit.new()
    run_id = _run_id()
    orphan = (await crashed.create(role="work", run_id=run_id)).sandbox_id
    keep = (await crashed.create(role="work", run_id=_run_id())).sandbox_id
    await crashed.close()  # the worker died: nothing killed, nothing in memory survives

    survivor = kit.new()
    try:
        alive = {i.sandbox_id: i for i in await survivor.list_alive()}
        assert orphan in alive and keep in alive
        reaped = await survivor.reap(lambda i: i.metadata.get("benchwright_run_id") == run_id)
        assert reaped == [orphan]
        assert orphan not in {i.sandbox_id for i in await survivor.list_alive()}
        with pytest.raises(SandboxNotFound):
            await survivor.exec(orphan, ["true"], env=ENV, timeout_s=10, limits=FAST)
    finally:
        await survivor.kill(keep)
        await survivor.close()
