"""Phase hand-off through the blob store and the event log, so a run's phases can land on workers on any host.

Phases hand each other files in the run's work directory (the dataset, ``tasks.jsonl``, ``task_impl.py``...);
what they know *about* those files is in the run's events, never in a file beside them: the dataset's name and
format in Fetch's FetchArtifact (:func:`dataset_file`), the analysis in AnalyzeArtifact, snapshot ids in
SnapshotCreated. The work directory is only a *cache* on the worker that holds the phase; the truth is the log:

* when a phase invocation completes, :func:`publish` puts every file of the work directory into the blob store
  (content-addressed: an unchanged file costs a hash, not an upload) and returns a ``WorkFilesRecorded`` event
  (path -> blob id) that lands in the same transaction as PhaseCompleted;
* when a phase invocation (or a Materialize batch) starts, :func:`restore` reads the run's newest
  ``WorkFilesRecorded`` from the store and fetches every file the local directory lacks or holds different bytes of.
  A phase reads that event as it opens (:func:`append_reading_files`) and goes by it at its end too.

So a worker with an empty disk picks up any phase of any run, given the store and the blob store. A file's digest
is computed once and remembered while it is unchanged (``benchwright.data.digests``), so an unchanged publish and an
up-to-date restore cost a ``stat`` per file, not a hash of a 52 MB dataset. The model proxy's handle
(``proxy.json``) is per-worker process state and is not handed off: the proxy listens on its worker's loopback, so a
phase on another host registers the run's route at its own worker's proxy (``activities.attach.live_proxy``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, Engine

from benchwright.data.blobs import BlobStore, write_atomic
from benchwright.data.digests import file_digests
from benchwright.errors import InvalidInput
from benchwright.events import WorkFilesRecorded
from benchwright.store.db import reader, session_scope
from benchwright.store.events import NewEvent, append_in_session, append_reading, appends_in_one_call
from benchwright.store.models import EventRow, table_of

NOT_HANDED_OFF = frozenset({"proxy.json"})
"""Worker-local state: the model proxy's process handle."""
_EVENTS = table_of(EventRow)
# Read twice by every phase: a Core statement built once (the ORM's statement building cost more than the read).
_LATEST_FILES = (select(_EVENTS.c.data)
                 .where(_EVENTS.c.run_id == bindparam("run_id_"), _EVENTS.c.type == WorkFilesRecorded.type_name())
                 .order_by(_EVENTS.c.seq.desc()).limit(1))


def _digest(path: Path) -> str:
    """Hashed once while the file is unchanged (``benchwright.data.digests``): a phase's start and end used to re-read
    the 52 MB dataset and task list of the re-run bench each time, ~0.8 s of its run."""
    return file_digests.sha256(path)


def _listing(workdir: Path) -> dict[str, Path]:
    return {p.relative_to(workdir).as_posix(): p for p in sorted(workdir.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name not in NOT_HANDED_OFF
            and not p.name.endswith(".part") and not p.name.startswith(".")}


def latest_files(engine: Engine, run_id: str) -> dict[str, str]:
    """The run's work files as its newest ``WorkFilesRecorded`` lists them (path -> blob id); {} before any."""
    with reader(engine).connect() as conn:
        return _latest_files(conn, run_id)


def _latest_files(conn: Connection, run_id: str) -> dict[str, str]:
    data = conn.execute(_LATEST_FILES, {"run_id_": run_id}).scalar_one_or_none()
    return dict(data["files"]) if data is not None else {}


def append_reading_files(engine: Engine, run_id: str, events: list[NewEvent]) -> dict[str, str]:
    """Append ``events``, then read the run's work files as ``latest_files`` does: a phase's opening
    (``activities.common``), whose restore and publish both go by the files it read.

    One transaction. On Postgres one call in autocommit (``append_reading``: the append and then the read): one
    round trip instead of four (BEGIN, the call, the read, COMMIT), ~0.4 ms each on every phase's opening.

    Raises:
        NotFound: the run does not exist.
    """
    if engine.dialect.name == "postgresql" and appends_in_one_call(events):
        data = append_reading(engine, run_id, events, WorkFilesRecorded.type_name())
        return dict(data["files"]) if data is not None else {}
    with session_scope(engine) as session:
        append_in_session(session, run_id, events)
        return _latest_files(session.connection(), run_id)


def _survey(engine: Engine, run_id: str, workdir: Path, known: dict[str, str] | None
            ) -> tuple[dict[str, str], dict[str, str]]:
    """The work files as last recorded (``known`` when the caller read them) and as they are now (path -> blob id),
    in one thread hop: every phase publishes at its end."""
    recorded = latest_files(engine, run_id) if known is None else known
    return recorded, {rel: _digest(path) for rel, path in _listing(workdir).items()}


def _stale(engine: Engine, run_id: str, workdir: Path, files: dict[str, str] | None) -> dict[str, str]:
    """The recorded work files (``files`` when the caller read them) whose copy in ``workdir`` is missing or differs
    (path -> blob id), in one thread hop: every phase restores at its start."""
    recorded = latest_files(engine, run_id) if files is None else files
    return {rel: digest for rel, digest in recorded.items()
            if not ((workdir / rel).is_file() and _digest(workdir / rel) == digest)}


async def publish(*, engine: Engine, blobs: BlobStore, run_id: str, phase: str, invocation: int,
                  workdir: Path, known: dict[str, str] | None = None) -> WorkFilesRecorded:
    """Every work file into the blob store; the event that records them (the caller appends it).

    ``known``: the run's recorded work files as the caller read them earlier in the same phase invocation (none else
    records any meanwhile), or None to read them. A file recorded there with the same digest is not looked for in the
    blob store: it went in before it was recorded.
    """
    recorded, files = await asyncio.to_thread(_survey, engine, run_id, workdir, known)
    for rel, digest in files.items():
        if recorded.get(rel) != digest and not await blobs.exists(digest):
            stored = await blobs.put(await asyncio.to_thread((workdir / rel).read_bytes))
            assert stored == digest, f"{rel} changed while it was published"
    return WorkFilesRecorded(phase=phase, invocation=invocation, files=files)


async def restore(*, engine: Engine, blobs: BlobStore, run_id: str, workdir: Path,
                  files: dict[str, str] | None = None) -> list[str]:
    """Bring ``workdir`` to the run's newest recorded work files (``files`` when the caller has just read them,
    ``append_reading_files``; else read here); returns the paths fetched."""
    stale = await asyncio.to_thread(_stale, engine, run_id, workdir, files)
    for rel, digest in stale.items():
        await asyncio.to_thread(write_atomic, workdir / rel, await blobs.get(digest))
    return list(stale)


def dataset_file(fetched: Mapping[str, Any], files: Mapping[str, str]) -> str:
    """The work file that holds the dataset a FetchArtifact describes (``fetched``: its data).

    The artifact names it (``file``). One recorded before Fetch named it is matched by content instead: a blob id is
    the sha256 of the bytes, so the dataset is the work file (``files``: path -> blob id, as ``latest_files``
    returns them) whose id is the artifact's ``sha256``; of several (tasks.jsonl may hold the same bytes), Fetch's
    own ``dataset.*``.

    Raises:
        InvalidInput: ``dataset_file_missing`` when no work file holds those bytes.
    """
    if fetched.get("file"):
        return str(fetched["file"])
    sha = fetched.get("sha256")
    same = [path for path, digest in files.items() if digest == sha and "/" not in path]
    if not same:
        raise InvalidInput(f"no work file of the run holds the fetched dataset (sha256 {sha}); fetch it again",
                           code="dataset_file_missing")
    return min(same, key=lambda path: (not path.startswith("dataset."), path))


__all__ = ["NOT_HANDED_OFF", "append_reading_files", "dataset_file", "latest_files", "publish", "restore"]
