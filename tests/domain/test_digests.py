"""File digests remembered by inode, size and mtime (``benchwright.data.digests``): a file nothing wrote is read once,
and every way of changing one is seen, including a same-size rewrite in the same tick of the file clock."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from benchwright.data.digests import FileDigests


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _age(path: Path, seconds: int = 10) -> None:
    """Put the file's mtime in the past, as for any file older than the current tick of the file clock."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 1_000_000_000))


def test_an_old_file_is_read_once_and_every_change_is_seen(tmp_path: Path) -> None:
    digests, path = FileDigests(), tmp_path / "data.jsonl"
    path.write_bytes(b"one")
    _age(path)
    assert digests.sha256(path) == _sha(b"one")
    os.chmod(path, 0o400)  # metadata only (ctime moves, as when the inode is linked elsewhere): still known
    with open(path, "rb") as f:
        assert digests.sha256(path) == _sha(f.read())

    os.chmod(path, 0o600)
    path.write_bytes(b"two")  # in place, same size: the mtime moves
    assert digests.sha256(path) == _sha(b"two")
    replacement = tmp_path / "new"
    replacement.write_bytes(b"six")
    os.utime(replacement, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))  # same size and mtime
    os.replace(replacement, path)  # but another inode
    assert digests.sha256(path) == _sha(b"six")


def test_a_file_written_in_the_current_tick_is_not_remembered(tmp_path: Path) -> None:
    digests, path = FileDigests(), tmp_path / "fresh"
    path.write_bytes(b"aaaa")
    assert digests.sha256(path) == _sha(b"aaaa")
    # Same size, and no guarantee the clock ticked: an mtime in the tick of the hash is never trusted.
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert digests.sha256(path) == _sha(b"bbbb")
    digests.note(path, _sha(b"not these bytes"))  # a note on a fresh file is not taken either
    assert digests.sha256(path) == _sha(b"bbbb")


def test_a_noted_digest_is_served_for_an_old_file_and_the_memory_is_bounded(tmp_path: Path) -> None:
    digests = FileDigests(capacity=2)
    paths = [tmp_path / f"f{i}" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(b"x" * i)
        _age(path)
    digests.note(paths[0], "0" * 64)  # the caller vouches (a blob put there under its digest)
    assert digests.sha256(paths[0]) == "0" * 64
    digests.sha256(paths[1])
    digests.sha256(paths[2])  # evicts the oldest entry
    assert digests.sha256(paths[0]) == _sha(b"")
