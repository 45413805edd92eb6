"""A phase's side of the cross-run cache (§2): look a phase's input hash up, replay a hit, record the
phase's own cell.

A hit reproduces everything the phases after it read, so the run goes on exactly as if the phase had run: the
work-directory files the phase wrote (the dataset, tasks.jsonl, ... whatever they are: the cell lists every file
the phase created or changed), its snapshot (content-addressed, so the id is the state),
and its Artifact events verbatim (so the run fingerprint is the one the work would have given). The hit itself is
a ``PhaseCacheHit`` event naming the source run and the cell, and the activity's heartbeat and result detail
(``cache_hit``), which the Temporal UI shows.

Lookups happen on a phase's first invocation without reviewer instructions only: a restart or a review asks for
the work to be done again.

The phase activities (Fetch, Setup, Analyze) call it inside their phase bracket (``activities.common.phase``), whose
scope is the ``PhaseOutput`` here: where the cache queues events and shows a hit on the heartbeat.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from benchwright.data.digests import file_digests
from benchwright.events import EVENT_TYPES, Event, FetchArtifact, PhaseCacheHit, SnapshotCreated
from benchwright.fingerprint import is_artifact, sha256_hex
from benchwright.registry.blobs import BlobStore
from benchwright.registry.cache import Cell, find_public_cell, run_cell
from benchwright.runs.pipeline import PhaseInput
from benchwright.sandbox.lifecycle import SNAPSHOT_PHASES, SNAPSHOTS, record_snapshot, snapshot_of
from benchwright.settings import Settings
from benchwright.store.db import outage_tolerant as in_thread

Listing = dict[str, tuple[int, int]]


class Beat(Protocol):
    def send(self, *details: Any) -> None: ...


class PhaseOutput(Protocol):
    """What a phase invocation's bracket gives the cache: its queued events, its heartbeat, and the cell it writes with
    its closing events."""

    @property
    def artifacts(self) -> list[tuple[str, Event]]: ...

    @property
    def heartbeat(self) -> Beat: ...

    def emit(self, what: str, event: Event) -> None: ...

    def keep_cell(self, cell: Cell) -> None: ...


def _listing(workdir: Path) -> Listing:
    """name -> (size, mtime_ns) of the work directory's regular files (their own bookkeeping excluded)."""
    out: Listing = {}
    for path in workdir.iterdir():
        if path.is_file() and path.name != SNAPSHOTS and not path.name.endswith(".part"):
            st = path.stat()
            out[path.name] = (st.st_size, st.st_mtime_ns)
    return out


def analyze_input_hash(engine: Engine, inp: PhaseInput) -> str | None:
    """Analyze's phase fingerprint: the dataset's bytes (Fetch's artifact, as this run recorded it), the task cap,
    whether the launch brings its own scorer, the Driver and a prompt's wording. None before Fetch recorded."""
    fetched = run_cell(engine, run_id=inp.run_id, phase="fetch")
    sha = next((a["data"].get("sha256") for a in fetched.artifacts if a["type"] == FetchArtifact.type_name()), None) \
        if fetched else None
    if sha is None:
        return None
    return sha256_hex({"phase": "analyze", "dataset_sha256": sha, "max_tasks": inp.max_tasks,
                       "own_scorer": inp.launch.task_impl is not None, "driver": inp.driver,
                       "prompt": getattr(inp.launch, "prompt", None)})


def setup_input_hash(*, before: str | None, requirements: list[str], python: str) -> str:
    """Setup's phase fingerprint: the filesystem it starts from (the post-Fetch snapshot, content-addressed), the
    requirements in order, and the Python they are installed for."""
    return sha256_hex({"phase": "setup", "before": before, "requirements": requirements, "python": python})


class PhaseCache:
    """One phase invocation's use of the cache; ``input_hash`` is the phase's model-free input hash (None: the
    phase cannot be keyed, so it neither hits nor records)."""

    def __init__(self, *, engine: Engine, settings: Settings, workdir: Path, inp: PhaseInput,
                 input_hash: str | None) -> None:
        self.engine, self.inp, self.input_hash = engine, inp, input_hash
        self.blobs = BlobStore.from_settings(settings)
        self.workdir = workdir
        self._before: Listing = {}

    async def lookup(self) -> Cell | None:
        """A served cell whose stored files and snapshot are all still present, or None."""
        if self.input_hash is None or self.inp.invocation != 1 or self.inp.instructions:
            return None
        cell = await in_thread(find_public_cell, self.engine, phase=self.inp.phase, input_hash=self.input_hash,
                               exclude_run_id=self.inp.run_id)
        if cell is None:
            return None
        # In a thread: with a shared blob store, ``has`` fetches an object this host lacks.
        present = await in_thread(lambda: all(self.blobs.has(d) for d in cell.files.values()))
        return cell if present else None

    async def replay(self, scope: PhaseOutput, cell: Cell) -> tuple[int | None, dict[str, Any]]:
        """Put the cell's files, snapshot and artifacts in place of the phase's work; record this run's copy.

        Returns:
            The phase result's ``tasks`` and ``detail`` (with ``cache_hit``: source run, phase, input hash).
        """
        for name, digest in cell.files.items():
            await in_thread(self.blobs.copy_to, digest, self.workdir / name)
            # Its digest is the blob's: the hand-off at this phase's end need not read a linked 52 MB file again.
            await in_thread(file_digests.note, self.workdir / name, digest)
        if cell.snapshot_id:
            await record_snapshot(engine=self.engine, run_id=self.inp.run_id, phase=self.inp.phase,
                                  invocation=self.inp.invocation, snapshot_id=cell.snapshot_id, emit=scope.emit)
        hit = {"source_run_id": cell.origin_run_id, "phase": cell.phase, "input_hash": cell.input_hash}
        scope.heartbeat.send({"cache_hit": hit})  # resent by every later beat of the phase (activities.common)
        scope.emit("cache-hit", PhaseCacheHit(phase=self.inp.phase, source_run_id=cell.origin_run_id,
                                              input_hash=cell.input_hash, snapshot_id=cell.snapshot_id))
        for i, artifact in enumerate(cell.artifacts):
            scope.emit(f"artifact-{i}", EVENT_TYPES[artifact["type"]].model_validate(artifact["data"]))
        scope.keep_cell(Cell(
            run_id=self.inp.run_id, phase=cell.phase, input_hash=cell.input_hash, artifacts=cell.artifacts,
            snapshot_id=cell.snapshot_id, files=cell.files, result=cell.result, source_run_id=cell.origin_run_id))
        return cell.result.get("tasks"), {**cell.result.get("detail", {}), "cache_hit": hit}

    def begin(self) -> None:
        """Note the work directory before the phase works (to tell which files it wrote)."""
        self._before = _listing(self.workdir)

    async def record(self, scope: PhaseOutput, *, tasks: int | None = None,
                     detail: dict[str, Any] | None = None) -> None:
        """The phase's cell: the files it created or changed, its snapshot, its Artifact events. It lands in the
        phase's closing transaction, with the events it names."""
        if self.input_hash is None:
            return
        after = _listing(self.workdir)
        changed = [name for name, stamp in after.items() if self._before.get(name) != stamp]
        files = {name: await in_thread(self.blobs.put_file, self.workdir / name) for name in sorted(changed)}
        artifacts = [{"type": ev.type_name(), "data": ev.model_dump(mode="json")}
                     for _, ev in scope.artifacts if is_artifact(ev.type_name())]
        # The snapshot this invocation queued for its close, else the phase's newest in the log (none for Analyze).
        queued = [ev.snapshot_id for _, ev in scope.artifacts if isinstance(ev, SnapshotCreated)]
        snapshot_id = queued[-1] if queued else (
            await in_thread(snapshot_of, self.engine, self.inp.run_id, self.inp.phase)
            if self.inp.phase in SNAPSHOT_PHASES else None)
        scope.keep_cell(Cell(
            run_id=self.inp.run_id, phase=self.inp.phase, input_hash=self.input_hash, artifacts=artifacts,
            snapshot_id=snapshot_id, files=files, result={"tasks": tasks, "detail": detail or {}}))
