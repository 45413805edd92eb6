"""The store reads behind a run's breakdown and task views (issue 21; rules in ``benchwright.scoring.results``).

The dataset rows a run scored are its ``tasks.jsonl`` as the newest ``WorkFilesRecorded`` lists it (a blob in the
deployment's blob store, ``benchwright.runs.handoff``): line i is task i. They are read from there, never from a
worker's disk. A row list is read once per (blob, column) and kept in the process (an LRU of
``_CACHE_COLUMNS`` columns): the blob never changes under its digest, so a dashboard polling the breakdown of a
10,000-task run costs one parse of its task list, then dict lookups.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from benchwright.data.blobs import BlobStore
from benchwright.errors import Conflict, InvalidInput
from benchwright.events import AnalyzeArtifact
from benchwright.runs.handoff import latest_files
from benchwright.schemas import BreakdownView, TaskRowView
from benchwright.scoring.results import MAX_FIELD_CHARS, candidate_columns, group_label, group_results, reference_column
from benchwright.store.db import reader
from benchwright.store.models import EventRow, Run, TaskRow

__all__ = ["breakdown", "dataset_columns", "fill_references"]

TASKS_FILE = "tasks.jsonl"
MAX_COLUMNS = 500
"""Columns a breakdown lists (``by`` may name any column the data has)."""
_CACHE_COLUMNS = 64
_cache: OrderedDict[tuple[str, str, str], list[Any]] = OrderedDict()
_lock = threading.Lock()


def dataset_columns(engine: Engine, run_id: str) -> tuple[list[str], str | None]:
    """The columns of the run's dataset and its reference column, from its newest AnalyzeArtifact.

    Raises:
        Conflict: the run has not analyzed a dataset (yet).
    """
    with Session(reader(engine)) as session:
        row = session.exec(select(EventRow).where(col(EventRow.run_id) == run_id,
                                                  col(EventRow.type) == AnalyzeArtifact.type_name())
                           .order_by(col(EventRow.seq).desc()).limit(1)).first()
    if row is None:
        raise Conflict("the run has no analyzed dataset yet, so there are no columns to group by",
                       code="no_dataset_rows")
    return [str(c) for c in row.data.get("columns", [])], row.data.get("reference_field")


def _column(engine: Engine, blobs: BlobStore, run_id: str, column: str, kind: str,
            convert: Callable[[Any], Any]) -> list[Any]:
    """``convert(row[column])`` for every row of the run's task list, by task index."""
    digest = latest_files(engine, run_id).get(TASKS_FILE)
    if digest is None:
        raise Conflict("the run has no recorded task list", code="no_dataset_rows")
    key = (digest, column, kind)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    values = []
    for line in blobs.get_sync(digest).splitlines():
        if line.strip():
            row = json.loads(line)
            values.append(convert(row.get(column) if isinstance(row, dict) else None))
    with _lock:
        _cache[key] = values
        while len(_cache) > _CACHE_COLUMNS:
            _cache.popitem(last=False)
    return values


def breakdown(engine: Engine, blobs: BlobStore, *, run: Run, by: str | None) -> BreakdownView:
    """The run's latest Materialize sweep grouped by dataset column ``by`` (default: the launch's ``group_by``,
    else the first grouping column the data has).

    Without ``by``, a run whose data has no grouping column (or no analyzed data yet) answers ``by: null`` and no
    groups, so a page can ask every run without provoking an error.

    Raises:
        InvalidInput: ``by`` is not a column of the run's data (the message names those that are).
        Conflict: ``by`` was named and the run has no analyzed dataset / task list yet.
    """
    try:
        columns, _reference = dataset_columns(engine, run.id)
    except Conflict:
        if by is not None:
            raise
        columns = []
    preferred = (run.launch or {}).get("group_by")
    candidates = candidate_columns(columns, preferred)
    if by is None:
        if not candidates:
            return BreakdownView(run_id=run.id, by=None, groups=[], columns=columns[:MAX_COLUMNS], candidates=[])
        by = candidates[0]
    if by not in columns:
        raise InvalidInput(f"the run's data has no column {by[:128]!r}; it has {_names(columns)}",
                           code="unknown_column")
    labels = _column(engine, blobs, run.id, by, "label", group_label)
    with Session(reader(engine)) as session:
        invocation = session.exec(select(col(TaskRow.invocation)).where(col(TaskRow.run_id) == run.id)
                                  .order_by(col(TaskRow.invocation).desc()).limit(1)).first() or 1
        settled = session.execute(select(col(TaskRow.index), col(TaskRow.outcome), col(TaskRow.no_answer)).where(
            col(TaskRow.run_id) == run.id, col(TaskRow.invocation) == invocation)).all()
    groups, folded = group_results(labels, [(int(i), str(o), bool(n)) for i, o, n in settled])
    return BreakdownView(run_id=run.id, by=by, groups=groups, folded=folded, columns=columns[:MAX_COLUMNS],
                         candidates=candidates)


def _names(columns: list[str]) -> str:
    shown = ", ".join(repr(c[:64]) for c in columns[:50])
    return f"columns {shown}" + (f" and {len(columns) - 50} more" if len(columns) > 50 else "") if columns \
        else "no columns"


def _reference_text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_FIELD_CHARS else text[: MAX_FIELD_CHARS - 1] + "…"


def fill_references(engine: Engine, blobs: BlobStore, *, run_id: str, tasks: list[TaskRowView]) -> None:
    """Give tasks whose score_meta named no ``reference`` the row's value of the dataset's reference column
    (``benchwright.scoring.results.reference_column``), when the run recorded one; otherwise leave them as they are."""
    if all(t.reference is not None for t in tasks):
        return
    try:
        columns, chosen = dataset_columns(engine, run_id)
        reference = reference_column(columns, chosen)
        if not reference:
            return
        values = _column(engine, blobs, run_id, reference, "reference", _reference_text)
    except Conflict:
        return
    for task in tasks:
        if task.reference is None and 0 <= task.index < len(values):
            task.reference = values[task.index]
