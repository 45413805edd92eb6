"""The cross-run phase cache's cells (§2): ``(phase, input_hash) -> (run_id, artifacts, snapshot_id, files)``.

Every run writes a cell when a model-free phase (Fetch, Analyze, Setup) completes, but a cell is only ever *served*
while its run is finished and ``public`` (``phase_fingerprints.served``, kept by the store's triggers): private and
unlisted runs never feed the cache, a run turned private again stops feeding it at once, and so a hit can only copy
what anyone may already read. (This is the issue's "cells are recorded when a run turns public and at terminal status
of public runs", with the recording done ahead of time so that turning public costs one row update, and the
trigger's update of its few cells.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.store.db import reader
from benchwright.store.models import PhaseCell, table_of, utcnow

_CELLS = table_of(PhaseCell)

CACHED_PHASES = ("fetch", "analyze", "setup")
"""The phases before Attach: model-free, so their cells are shareable across every model and account."""


@dataclass(frozen=True)
class Cell:
    run_id: str
    """The run whose cell this is (for a copied cell, the run that copied it)."""
    phase: str
    input_hash: str
    artifacts: list[dict[str, Any]]
    snapshot_id: str | None
    files: dict[str, str]
    result: dict[str, Any]
    source_run_id: str | None = None

    @property
    def origin_run_id(self) -> str:
        """The run that did the work."""
        return self.source_run_id or self.run_id


def _cell(row: PhaseCell) -> Cell:
    return Cell(run_id=row.run_id, phase=row.phase, input_hash=row.input_hash, artifacts=list(row.artifacts),
                snapshot_id=row.snapshot_id, files=dict(row.files), result=dict(row.result),
                source_run_id=row.source_run_id)


def cell_row(cell: Cell) -> dict[str, Any]:
    """The cell's ``phase_fingerprints`` columns but its run's id and its time."""
    return {"phase": cell.phase, "input_hash": cell.input_hash, "artifacts": cell.artifacts,
            "snapshot_id": cell.snapshot_id, "files": cell.files, "result": cell.result,
            "source_run_id": cell.source_run_id}


def record_cell_in(session: Session, cell: Cell) -> None:
    """Upsert the run's cell for the phase (a restarted phase's later invocation replaces it; its ``created_at``
    stays the first's), inside the caller's transaction: a phase's close, which lands the cell with the events it
    names. One statement (``INSERT ... ON CONFLICT DO UPDATE``), not a read and then a write: a round trip fewer on
    Postgres at every cached phase's close."""
    values = {"run_id_": cell.run_id, "phase_": cell.phase, "created_at_": utcnow(),
              **{f"{key}_": value for key, value in cell_row(cell).items() if key != "phase"}}
    session.execute(_upsert(session.connection().dialect.name), values)


_CHANGED = ("input_hash", "artifacts", "snapshot_id", "files", "result", "source_run_id")
_UPSERTS: dict[str, Any] = {}


def _upsert(dialect: str) -> Any:
    """``record_cell_in``'s statement for ``dialect``, built once: made per call, its ``excluded`` columns and its
    cache key took half of a cached phase's close on SQLite (0.6 of ~1.25 ms of CPU, cProfile, session 40)."""
    found = _UPSERTS.get(dialect)
    if found is None:
        upsert = pg_insert if dialect == "postgresql" else sqlite_insert
        columns = ("run_id", "phase", "created_at", *_CHANGED)
        stmt = upsert(_CELLS).values({key: bindparam(f"{key}_") for key in columns})
        found = _UPSERTS[dialect] = stmt.on_conflict_do_update(
            index_elements=[_CELLS.c.run_id, _CELLS.c.phase], set_={key: stmt.excluded[key] for key in _CHANGED})
    return found


def run_cell(engine: Engine, *, run_id: str, phase: str) -> Cell | None:
    with Session(reader(engine)) as session:
        row = session.get(PhaseCell, (run_id, phase))
        return _cell(row) if row else None


_SERVED = (select(PhaseCell)
           .where(PhaseCell.phase == bindparam("phase"), PhaseCell.input_hash == bindparam("input_hash"),
                  col(PhaseCell.served), PhaseCell.run_id != bindparam("exclude_run_id"))
           .order_by(col(PhaseCell.created_at).desc()).limit(1))
"""The newest served cell of an input, through the partial index of served cells (migration 0024): one probe however
many runs of that input the store holds (joining every cell of the input to its run and sorting them took 44 ms a run
with 10,000 earlier private runs of one benchmark)."""


def find_public_cell(engine: Engine, *, phase: str, input_hash: str, exclude_run_id: str) -> Cell | None:
    """The newest served cell for (phase, input_hash): of a finished public run other than ``exclude_run_id``."""
    with Session(reader(engine)) as session:
        row = session.execute(_SERVED, {"phase": phase, "input_hash": input_hash,
                                        "exclude_run_id": exclude_run_id}).scalars().first()
        return _cell(row) if row else None
