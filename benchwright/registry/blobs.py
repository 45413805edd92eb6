"""Content-addressed blobs (datasets, task lists, scorers) in the same object store the local backend's
snapshots use (``<root>/objects/ab/cdef…``, sha256 of the content), so a scorer Atomize snapshotted, or a dataset
Fetch snapshotted, is already a blob under its digest and is stored once."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from benchwright.errors import NotFound
from benchwright.settings import Settings

CHUNK = 1 << 20
LINK_MIN_BYTES = 1 << 20
"""Blobs from this size on are put in work directories as hard links (``BlobStore.copy_to``)."""


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"

    @classmethod
    def from_settings(cls, settings: Settings) -> BlobStore:
        return cls(settings.sandboxes_dir() / "snapshots")

    def path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put_file(self, source: Path) -> str:
        """Store a copy of ``source`` (hashed while copying: what is stored is what was hashed); returns its digest."""
        staging = self.objects / "tmp"
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            return self._settle(tmp, digest.hexdigest())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def put_bytes(self, data: bytes) -> str:
        staging = self.objects / "tmp"
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return self._settle(tmp, hashlib.sha256(data).hexdigest())

    def _settle(self, tmp: str, digest: str) -> str:
        dest = self.path(digest)
        if dest.exists():
            os.unlink(tmp)  # identical content is stored once
        else:
            dest.parent.mkdir(mode=0o700, exist_ok=True)
            os.chmod(tmp, 0o400)
            os.replace(tmp, dest)
        return digest

    def read_bytes(self, digest: str) -> bytes:
        """Raises: NotFound: no blob with this digest."""
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"blob {digest} is not in the store") from None

    def copy_to(self, digest: str, dest: Path) -> None:
        """Put the blob at ``dest``: a large one as a hard link to the stored object (a copy when the work
        directory is on another filesystem), a small one as a private writable copy. Measured on the re-run bench:
        its 2 x 52 MB took ~40 ms to copy (more under load), ~0.1 ms to link.

        A link shares the object's inode, so the file must never be written in place. The large files a cache hit
        or a pin puts in a work directory are datasets and tasks.jsonl, and every writer of those (Fetch,
        Analyze's normalization and subsets, forks) writes a temporary file and renames it over the name, which
        breaks the link and leaves the object alone (tests/domain/test_blob_links.py runs them on linked files).
        The link keeps the object's mode 0400: a writer that opened it in place would fail, not write the store
        (for a non-root worker; root ignores modes, hence the size threshold and the rename rule). Small files
        (fetch.json, which Fetch rewrites in place) are copied as before.
        """
        src = self.path(digest)
        tmp = dest.with_name(dest.name + ".part")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        linked = False
        if src.stat().st_size >= LINK_MIN_BYTES:
            try:
                os.link(src, tmp)
                linked = True
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
        if not linked:
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # rename(2) does nothing when dest already is a link to the same object
