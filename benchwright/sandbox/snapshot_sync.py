"""Local-backend snapshots through the shared blob store, so a snapshot taken by a worker restores on any other.

The local backend's snapshot store is content-addressed with the blob store's own ids: a snapshot id is the sha256
of its canonical manifest, and every file object is stored under the sha256 of its bytes. So exporting a snapshot
is putting its manifest and objects into the blob store under the ids they already have, and importing it is the
reverse; nothing is renamed and either side can check what it got.

Used by :mod:`benchwright.sandbox.lifecycle` when the deployment has a shared blob store (``blob_store_url``);
on one machine the local store alone is the truth and nothing is copied.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from benchwright.data.blobs import BlobStore
from benchwright.sandbox.local import LocalBackend


def _manifest_path(backend: LocalBackend, snapshot_id: str) -> Path:
    return backend.snapshots.manifests / f"{snapshot_id}.json"


async def export_snapshot(backend: LocalBackend, blobs: BlobStore, snapshot_id: str) -> int:
    """Put ``snapshot_id``'s manifest and file objects into ``blobs``; returns how many objects were uploaded."""
    raw = await asyncio.to_thread(_manifest_path(backend, snapshot_id).read_bytes)
    manifest: dict[str, Any] = json.loads(raw)
    uploaded = 0
    for entry in manifest["files"].values():
        digest = entry["sha256"]
        if not await blobs.exists(digest):
            await blobs.put(await asyncio.to_thread(backend.snapshots.object_path(digest).read_bytes))
            uploaded += 1
    stored = await blobs.put(raw)  # last: a manifest in the store means its objects are there
    assert stored == snapshot_id
    return uploaded


def _settle(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".import-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def import_snapshot(backend: LocalBackend, blobs: BlobStore, snapshot_id: str) -> int:
    """Bring ``snapshot_id`` into the local store from ``blobs`` when it is not here; returns objects fetched.

    Raises:
        BlobNotFound: the blob store does not have it either.
    """
    if _manifest_path(backend, snapshot_id).is_file():
        return 0
    raw = await blobs.get(snapshot_id)
    manifest: dict[str, Any] = json.loads(raw)
    fetched = 0
    for entry in manifest["files"].values():
        path = backend.snapshots.object_path(entry["sha256"])
        if not path.is_file():
            await asyncio.to_thread(_settle, path, await blobs.get(entry["sha256"]), 0o400)
            fetched += 1
    await asyncio.to_thread(_settle, _manifest_path(backend, snapshot_id), raw, 0o600)
    return fetched


__all__ = ["export_snapshot", "import_snapshot"]
