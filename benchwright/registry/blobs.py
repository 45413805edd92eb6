"""Content-addressed blobs (datasets, task lists, scorers) in the same object store the local backend's
snapshots use (``<root>/objects/ab/cdef…``, sha256 of the content), so a scorer Atomize snapshotted, or a dataset
Fetch snapshotted, is already a blob under its digest and is stored once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from benchwright.errors import NotFound
from benchwright.settings import Settings

CHUNK = 1 << 20


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
        """A private, writable copy (never a link: a later phase may rewrite its file in place)."""
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(self.path(digest), tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
