"""A capture reuses the digests of files its store restored and nothing touched since (the re-run bench's 52 MB
dataset is not re-read at Atomize's snapshot), and never reuses one for a file the sandbox changed, even when the
change keeps the size and puts the mtime back (ctime still moves: restore outlasts the file clock's tick)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchwright.sandbox import (
    ExecLimits,
    LocalBackend,
)
from tests.sandbox.local_kit import create_work, local_backend

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
FAST = ExecLimits(cpu_seconds=10, memory_mb=512, wall_seconds=20, max_processes=32)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    async for b in local_backend(tmp_path / "data"):
        yield b


def _files(b: LocalBackend, snapshot_id: str) -> dict[str, str]:
    manifest = json.loads((b.snapshots.manifests / f"{snapshot_id}.json").read_bytes())
    return {rel: entry["sha256"] for rel, entry in manifest["files"].items()}


async def test_untouched_files_keep_their_digest_and_changed_ones_are_read_again(backend: LocalBackend) -> None:
    big, small = os.urandom(3 << 20), b"0123456789"
    base = await backend.snapshot_files({"dataset.jsonl": big, "notes.txt": small, "keep.txt": b"same"},
                                        label="base")
    assert not backend.snapshots.restored  # the staging directory was forgotten with it
    box = await create_work(backend, base)
    assert box.root is not None
    work = str(box.root)
    # Small files are copies it noted; the 3 MB dataset is a link to its object (test_snapshot_links.py).
    assert set(backend.snapshots.restored[work]) == {"notes.txt", "keep.txt"}
    assert "dataset.jsonl" in backend.snapshots.linked[work]
    # Same size, mtime put back: only ctime tells. And one file replaced through a rename (a new inode).
    script = ("import os\n"
              "st = os.stat('notes.txt')\n"
              "with open('notes.txt', 'r+b') as f: f.write(b'ABCDEFGHIJ')\n"
              "os.utime('notes.txt', ns=(st.st_atime_ns, st.st_mtime_ns))\n"
              "open('keep.new', 'wb').write(b'diff'); os.replace('keep.new', 'keep.txt')\n")
    done = await backend.exec(box.sandbox_id, [sys.executable, "-c", script], env=ENV, timeout_s=20, limits=FAST)
    assert done.returncode == 0, done.stderr
    after = _files(backend, await backend.snapshot(box.sandbox_id, label="after"))
    assert after == {"dataset.jsonl": hashlib.sha256(big).hexdigest(),
                     "notes.txt": hashlib.sha256(b"ABCDEFGHIJ").hexdigest(),
                     "keep.txt": hashlib.sha256(b"diff").hexdigest()}
    assert backend.snapshots.object_path(after["notes.txt"]).read_bytes() == b"ABCDEFGHIJ"
    await backend.kill(box.sandbox_id)
    assert work not in backend.snapshots.restored  # nothing kept for a sandbox that is gone
    assert work not in backend.snapshots.linked
