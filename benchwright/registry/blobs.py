"""Content-addressed blobs (datasets, task lists, scorers) in the same object store the local backend's
snapshots use (``<root>/objects/ab/cdef…``, sha256 of the content), so a scorer Atomize snapshotted, or a dataset
Fetch snapshotted, is already a blob under its digest and is stored once.

With a shared blob store configured (``blob_store_url``: S3 in production, ``benchwright.data.blobs``), that local
directory is a cache of it: a put also goes to the shared store, and an object missing here is fetched from it on
first use, so a cache cell or a pinned impl recorded on one host is usable on any other. The ids are the same
sha256 in both, and the shared store also holds every blob that reached it another way (work files handed off
between phases, exported snapshot objects). The local fast path is unchanged: a blob already here is read, linked
or copied without a round trip.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from benchwright.data.blobs import BlobNotFound
from benchwright.data.blobs import BlobStore as SharedBlobStore
from benchwright.errors import NotFound
from benchwright.sandbox.local.snapshots import settle_object
from benchwright.settings import Settings

CHUNK = 1 << 20
LINK_MIN_BYTES = 1 << 20
"""Blobs from this size on are put in work directories as hard links (``BlobStore.copy_to``)."""


class BlobStore:
    """The registry's blobs under ``root``, backed by ``shared`` when the deployment has a shared store.

    Every method blocks (file and network I/O): call them from a worker thread.
    """

    def __init__(self, root: Path, *, shared: SharedBlobStore | None = None) -> None:
        self.root = root
        self.objects = root / "objects"
        self.shared = shared

    @classmethod
    def from_settings(cls, settings: Settings) -> BlobStore:
        """The worker's local store, backed by the deployment's shared blob store when ``blob_store_url`` names one
        (the rule local-backend snapshots follow too, ``sandbox.lifecycle``); without it the local store is the
        only copy, as on the single-host embedded stack."""
        shared = None
        if settings.blob_store_url:
            from benchwright.sandbox.factory import blob_store  # one client per process, made on first use

            shared = blob_store(settings)
        return cls(settings.sandboxes_dir() / "snapshots", shared=shared)

    def path(self, digest: str) -> Path:
        """Where blob ``digest`` is in the local store (it may not be there yet: ``has`` brings it)."""
        return self.objects / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        """Whether the blob is in the local store, fetching it from the shared store if only that has it: after
        True, ``path(digest)`` is a readable file.

        Raises:
            BlobError: the shared store failed, or returned bytes that do not hash to ``digest``.
        """
        return self._local(digest) is not None

    def _local(self, digest: str) -> Path | None:
        """The local object, fetched from the shared store when it is missing here; None if neither has it."""
        path = self.path(digest)
        if path.is_file():
            return path
        if self.shared is None:
            return None
        try:
            data = self.shared.get_sync(digest)  # checked against the digest
        except BlobNotFound:
            return None
        self._settle(self._stage(data), digest)
        return path

    def _need(self, digest: str) -> Path:
        """Raises: NotFound: no blob with this digest, here or in the shared store."""
        path = self._local(digest)
        if path is None:
            raise NotFound(f"blob {digest} is not in the store")
        return path

    def _share(self, digest: str) -> str:
        """Put the local object into the shared store too (unless it has it: a HEAD, not an upload)."""
        if self.shared is not None and not self.shared.exists_sync(digest):
            stored = self.shared.put_sync(self.path(digest).read_bytes())
            assert stored == digest, f"blob {digest} changed in the local store"
        return digest

    def _stage(self, data: bytes) -> str:
        staging = self.objects / "tmp"
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp

    def put_file(self, source: Path) -> str:
        """Store a copy of ``source`` (hashed while copying: what is stored is what was hashed), in the shared
        store too when there is one; returns its digest."""
        staging = self.objects / "tmp"
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            settled = self._settle(tmp, digest.hexdigest())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return self._share(settled)

    def put_bytes(self, data: bytes) -> str:
        """Store ``data`` (in the shared store too when there is one); returns its digest."""
        return self._share(self._settle(self._stage(data), hashlib.sha256(data).hexdigest()))

    def _settle(self, tmp: str, digest: str) -> str:
        settle_object(tmp, self.path(digest), digest)
        return digest

    def read_bytes(self, digest: str) -> bytes:
        """Raises: NotFound: no blob with this digest (here or in the shared store)."""
        return self._need(digest).read_bytes()

    def copy_to(self, digest: str, dest: Path) -> None:
        """Put the blob at ``dest``: a large one as a hard link to the stored object (a copy when the work
        directory is on another filesystem), a small one as a private writable copy. Measured on the re-run bench:
        its 2 x 52 MB took ~40 ms to copy (more under load), ~0.1 ms to link.

        A link shares the object's inode, so the file must never be written in place. The large files a cache hit
        or a pin puts in a work directory are datasets and tasks.jsonl, and every writer of those (Fetch,
        Analyze's normalization and subsets, forks) writes a temporary file and renames it over the name, which
        breaks the link and leaves the object alone (tests/domain/test_blob_links.py runs them on linked files).
        The link keeps the object's read-only mode (0400, or 0444 once a sandbox restore shared it): a writer
        that opened it in place would fail, not write the store (for a non-root worker; root ignores modes, hence
        the size threshold and the rename rule). Small files are copied, writable. A blob only the shared store
        has is fetched into the local store first.

        Raises:
            NotFound: no blob with this digest (here or in the shared store).
        """
        src = self._need(digest)
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
