"""The sha256 of files on this host, remembered by inode so that a file nothing has written is hashed once.

Phases hand their work files off by digest at every start and end (``benchwright.runs.handoff``), and a snapshot
restore checks an object against its name before linking it (``benchwright.sandbox.local.snapshots``): on the
re-run bench that was a 52 MB dataset and a 52 MB task list hashed ~10 times per run (~0.8 s). A digest is
remembered under ``(st_dev, st_ino, st_size, st_mtime_ns)`` and served while the file still has that stat: any
write moves the mtime, a rename over the name brings another inode.

Not ctime: a hard link to the inode (the snapshot store links one object into many sandboxes) moves it without
touching a byte. What an mtime cannot show is a write within the same tick of the file clock as the hash, or one
that puts the mtime back: the first is "racy git", handled as git does, by remembering only files whose mtime is
older than the coarse clock (the clock file times come from) read before hashing, so any later write lands on a
later tick; the second needs the file's owner or root to call ``utime`` on purpose, which no writer of work
directories or snapshot objects does.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

_CHUNK = 1 << 20
MAX_REMEMBERED = 4096

Key = tuple[int, int, int, int]


def _key(st: os.stat_result) -> Key:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _clock_floor_ns() -> int:
    """A time no later than the file clock's current tick (Linux stamps files from the coarse realtime clock)."""
    coarse = getattr(time, "CLOCK_REALTIME_COARSE", None)
    if coarse is not None:
        return time.clock_gettime_ns(coarse)
    return time.time_ns() - 2_000_000_000  # file systems with 2 s timestamps exist


class FileDigests:
    """sha256 of files by inode, size and mtime (see the module docstring); safe to share between threads."""

    def __init__(self, capacity: int = MAX_REMEMBERED) -> None:
        self.capacity = capacity
        self._known: OrderedDict[Key, str] = OrderedDict()
        self._lock = threading.Lock()

    def sha256(self, path: Path) -> str:
        """The file's sha256, read only if this stat of it is not remembered.

        Raises:
            OSError: the file cannot be read.
        """
        with path.open("rb") as f:
            before = os.fstat(f.fileno())
            with self._lock:
                known = self._known.get(_key(before))
            if known is not None:
                return known
            floor = _clock_floor_ns()
            h = hashlib.sha256()
            while chunk := f.read(_CHUNK):
                h.update(chunk)
            after = os.fstat(f.fileno())
        digest = h.hexdigest()
        if _key(after) == _key(before):  # not written while it was read
            self._remember(after, digest, floor)
        return digest

    def note(self, path: Path, digest: str) -> None:
        """Remember ``digest`` as ``path``'s, for a caller that knows it (it put the bytes of a blob stored under
        that digest there); a no-op while the file's mtime is still in the file clock's current tick."""
        floor = _clock_floor_ns()
        self._remember(os.stat(path), digest, floor)

    def _remember(self, st: os.stat_result, digest: str, floor_ns: int) -> None:
        if st.st_mtime_ns >= floor_ns:
            return  # racily clean: a write later in this tick would keep this mtime
        with self._lock:
            self._known[_key(st)] = digest
            self._known.move_to_end(_key(st))
            while len(self._known) > self.capacity:
                self._known.popitem(last=False)


file_digests = FileDigests()
"""This process's: the worker's phases and sandboxes share it."""

__all__ = ["MAX_REMEMBERED", "FileDigests", "file_digests"]
