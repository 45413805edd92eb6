"""A namespaced sandbox gets a snapshot's large files as hard links to their stored objects (the re-run bench's 52 MB
dataset is not copied into every sandbox), and nothing in or around the sandbox can change a stored object through
such a link: the sandbox's uid cannot write, chmod or touch it, the backend's own writes break the link, and a
capture records the file by its object so an untouched sandbox snapshots to the id it was restored from."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchwright.sandbox import ExecLimits, LocalBackend, SandboxInfo
from benchwright.sandbox.local.snapshots import LINK_MIN_BYTES
from tests.sandbox.local_kit import create_work, local_backend

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
FAST = ExecLimits(cpu_seconds=10, memory_mb=512, wall_seconds=20, max_processes=32)
BIG = os.urandom(LINK_MIN_BYTES + 12345)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    async for b in local_backend(tmp_path / "data"):
        yield b


async def _run(b: LocalBackend, box: SandboxInfo, script: str) -> dict[str, str]:
    done = await b.exec(box.sandbox_id, [sys.executable, "-c", script], env=ENV, timeout_s=20, limits=FAST)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _manifest(b: LocalBackend, snapshot_id: str) -> dict[str, dict[str, object]]:
    return json.loads((b.snapshots.manifests / f"{snapshot_id}.json").read_bytes())["files"]  # type: ignore[no-any-return]


TRY_WRITES = """
import json, os
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as exc:
        out[name] = type(exc).__name__
attempt("open_rw", lambda: open("data/big.jsonl", "r+b").write(b"X"))
attempt("append", lambda: open("data/big.jsonl", "ab").write(b"X"))
attempt("truncate", lambda: os.truncate("data/big.jsonl", 0))
attempt("chmod", lambda: os.chmod("data/big.jsonl", 0o666))
attempt("chown", lambda: os.chown("data/big.jsonl", os.getuid(), os.getgid()))
attempt("utime", lambda: os.utime("data/big.jsonl", (0, 0)))
attempt("touch_now", lambda: os.utime("data/big.jsonl"))
attempt("xattr", lambda: os.setxattr("data/big.jsonl", "user.x", b"1"))
out["read"] = len(open("data/big.jsonl", "rb").read())
print(json.dumps(out))
"""


async def test_a_large_file_is_linked_and_the_sandbox_cannot_change_the_object(backend: LocalBackend) -> None:
    base = await backend.snapshot_files({"data/big.jsonl": BIG, "small.txt": b"small"}, label="base")
    obj = backend.snapshots.object_path(_sha(BIG))
    box = await create_work(backend, base)
    linked = Path(box.root) / "data" / "big.jsonl"  # type: ignore[arg-type]
    st, obj_st = os.stat(linked), os.stat(obj)
    assert (st.st_dev, st.st_ino) == (obj_st.st_dev, obj_st.st_ino)  # the object itself, not a copy
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o444
    small = os.stat(Path(box.root) / "small.txt")  # type: ignore[arg-type]
    assert small.st_nlink == 1 and small.st_uid == box.metadata["sandbox_uid"]  # small files are private copies

    tried = await _run(backend, box, TRY_WRITES)
    assert tried == {
        "read": len(BIG), "open_rw": "PermissionError", "append": "PermissionError", "truncate": "PermissionError",
        "chmod": "PermissionError", "chown": "PermissionError", "utime": "PermissionError",
        "touch_now": "PermissionError", "xattr": "PermissionError"}, tried
    assert await backend.read_file(box.sandbox_id, "data/big.jsonl") == BIG
    assert obj.read_bytes() == BIG and stat.S_IMODE(os.stat(obj).st_mode) == 0o444

    # Untouched: the capture is the snapshot it came from, byte for byte (the manifest keeps the file's own mode).
    assert await backend.snapshot(box.sandbox_id, label="untouched") == base

    # The sandbox may replace the name (its directory is its own): a new file, the object left alone.
    await _run(backend, box, "import json, os\n"
                             "open('data/new', 'wb').write(b'rewritten')\n"
                             "os.replace('data/new', 'data/big.jsonl')\n"
                             "print(json.dumps({}))")
    changed = await backend.snapshot(box.sandbox_id, label="replaced")
    assert _manifest(backend, changed)["data/big.jsonl"]["sha256"] == _sha(b"rewritten")
    assert obj.read_bytes() == BIG


async def test_the_backends_own_write_breaks_the_link(backend: LocalBackend) -> None:
    base = await backend.snapshot_files({"task_impl.py": BIG}, label="big impl")
    obj = backend.snapshots.object_path(_sha(BIG))
    box = await create_work(backend, base)
    assert os.stat(Path(box.root) / "task_impl.py").st_ino == os.stat(obj).st_ino  # type: ignore[arg-type]
    await backend.write_file(box.sandbox_id, "task_impl.py", b"class Scorer: ...")  # as root, like put_runtime
    assert await backend.read_file(box.sandbox_id, "task_impl.py") == b"class Scorer: ..."
    assert obj.read_bytes() == BIG
    mine = os.stat(Path(box.root) / "task_impl.py")  # type: ignore[arg-type]
    assert mine.st_nlink == 1 and mine.st_uid == box.metadata["sandbox_uid"]


async def test_restores_stay_byte_identical_and_executables_are_copied(backend: LocalBackend) -> None:
    tool = BIG[:-7] + b"binary!"
    first = await create_work(backend, await backend.snapshot_files({"data/big.jsonl": BIG}, label="one"))
    await backend.write_file(first.sandbox_id, "bin/tool", tool, mode=0o755)
    await backend.write_file(first.sandbox_id, "private.bin", BIG, mode=0o600)
    snap = await backend.snapshot(first.sandbox_id, label="two")
    modes = {rel: entry["mode"] for rel, entry in _manifest(backend, snap).items()}
    assert modes == {"data/big.jsonl": 0o644, "bin/tool": 0o755, "private.bin": 0o600}

    second = await create_work(backend, snap)
    root = Path(second.root)  # type: ignore[arg-type]
    assert await backend.read_file(second.sandbox_id, "data/big.jsonl") == BIG
    assert await backend.read_file(second.sandbox_id, "private.bin") == BIG
    assert await backend.read_file(second.sandbox_id, "bin/tool") == tool
    exe = os.stat(root / "bin" / "tool")
    assert exe.st_nlink == 1 and stat.S_IMODE(exe.st_mode) == 0o755  # an executable keeps its own copy and mode
    assert os.stat(root / "private.bin").st_ino == os.stat(root / "data" / "big.jsonl").st_ino  # one object
    assert await backend.snapshot(second.sandbox_id, label="again") == snap  # modes as the manifest had them


async def test_a_damaged_large_object_is_refused(backend: LocalBackend) -> None:
    other = os.urandom(len(BIG))
    base = await backend.snapshot_files({"data/big.jsonl": other}, label="to damage")
    obj = backend.snapshots.object_path(_sha(other))
    box = await create_work(backend, base)  # hashed once, then known
    await backend.kill(box.sandbox_id)
    os.chmod(obj, 0o600)
    with open(obj, "r+b") as f:  # same size, other bytes: only a hash tells (the mtime moves)
        f.write(b"tampered")
    with pytest.raises(Exception, match="damaged"):
        await backend.create(role="work", run_id="run-1", snapshot_id=base)


async def test_an_unisolated_sandbox_gets_copies(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path / "data", allow_unisolated=True, isolation="none")
    try:
        base = await b.snapshot_files({"data/big.jsonl": BIG}, label="base")
        box = await b.create(role="work", run_id="run-1", snapshot_id=base)
        copy = os.stat(Path(box.root) / "data" / "big.jsonl")  # type: ignore[arg-type]
        assert copy.st_ino != os.stat(b.snapshots.object_path(_sha(BIG))).st_ino and copy.st_nlink == 1
        assert await b.snapshot(box.sandbox_id, label="again") == base
        await b.kill(box.sandbox_id)
    finally:
        await b.close()
