"""Phase hand-off through the blob store and the event log, so a run's phases can land on workers on any host.

Phases hand each other files in the run's work directory (the dataset, ``fetch.json``, ``tasks.jsonl``,
``analysis.json``, ``task_impl.py``...; snapshot ids are in SnapshotCreated events). That directory is only a
*cache* on the worker that holds the phase; the truth is the log:

* when a phase invocation completes, :func:`publish` puts every file of the work directory into the blob store
  (content-addressed: an unchanged file costs a hash, not an upload) and returns a ``WorkFilesRecorded`` event
  (path -> blob id) that lands in the same transaction as PhaseCompleted;
* when a phase invocation (or a Materialize batch) starts, :func:`restore` reads the run's newest
  ``WorkFilesRecorded`` from the store and fetches every file the local directory lacks or holds different bytes of.

So a worker with an empty disk picks up any phase of any run, given the store and the blob store. Measured here
with a 52 MB dataset in a directory blob store: first publish 0.24 s, an unchanged publish and an up-to-date
restore 0.035 s each (hashing), a restore onto an empty disk 0.21 s. The model proxy's
handle (``proxy.json``) is per-worker process state and is not handed off: a keyed run whose worker dies loses its
proxy with it (the proxy dies with its worker by design).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from benchwright.blobs import BlobStore, write_atomic
from benchwright.events import WorkFilesRecorded
from benchwright.store.models import EventRow

_CHUNK = 1 << 20
NOT_HANDED_OFF = frozenset({"proxy.json"})
"""Worker-local state: the model proxy's process handle."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _listing(workdir: Path) -> dict[str, Path]:
    return {p.relative_to(workdir).as_posix(): p for p in sorted(workdir.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name not in NOT_HANDED_OFF
            and not p.name.endswith(".part") and not p.name.startswith(".")}


def latest_files(engine: Engine, run_id: str) -> dict[str, str]:
    """The run's work files as its newest ``WorkFilesRecorded`` lists them (path -> blob id); {} before any."""
    with Session(engine) as session:
        row = session.exec(select(EventRow).where(EventRow.run_id == run_id,
                                                  EventRow.type == WorkFilesRecorded.type_name())
                           .order_by(col(EventRow.seq).desc()).limit(1)).first()
    return dict(row.data["files"]) if row is not None else {}


async def publish(*, engine: Engine, blobs: BlobStore, run_id: str, phase: str, invocation: int,
                  workdir: Path) -> WorkFilesRecorded:
    """Every work file into the blob store; the event that records them (the caller appends it)."""
    known = await asyncio.to_thread(latest_files, engine, run_id)
    files: dict[str, str] = {}
    for rel, path in (await asyncio.to_thread(_listing, workdir)).items():
        digest = await asyncio.to_thread(_digest, path)
        if known.get(rel) != digest and not await blobs.exists(digest):
            stored = await blobs.put(await asyncio.to_thread(path.read_bytes))
            assert stored == digest, f"{rel} changed while it was published"
        files[rel] = digest
    return WorkFilesRecorded(phase=phase, invocation=invocation, files=files)


async def restore(*, engine: Engine, blobs: BlobStore, run_id: str, workdir: Path) -> list[str]:
    """Bring ``workdir`` to the run's newest recorded work files; returns the paths fetched."""
    fetched = []
    for rel, digest in (await asyncio.to_thread(latest_files, engine, run_id)).items():
        path = workdir / rel
        if path.is_file() and await asyncio.to_thread(_digest, path) == digest:
            continue
        await asyncio.to_thread(write_atomic, path, await blobs.get(digest))
        fetched.append(rel)
    return fetched


__all__ = ["NOT_HANDED_OFF", "latest_files", "publish", "restore"]
