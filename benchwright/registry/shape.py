"""What a run gets when it reaches its terminal status (§6, §7), and who may read it (§12).

``stamp_terminal`` runs inside the transaction that closes the run (``finish_run``, ``finish_halted``), so the
stored fingerprint always describes exactly the log that PipelineFinished closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.errors import NotFound
from benchwright.events import AtomizeArtifact, ProductRecipeArtifact
from benchwright.fingerprint import artifact_types, derive, model_config_hash, sha256_hex
from benchwright.store.db import reader
from benchwright.store.models import EventRow, PhaseCell, Run

READABLE_BY_ID = ("unlisted", "public")
"""Visibilities any authenticated caller may load by id; ``private`` runs are the owner's alone."""


def run_events(session: Session, run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    """The run's Artifact events as ``(seq, type, data)`` in seq order: all that the fingerprint (``derive``), the
    family and the run shape read. The rest of the log (a result and an aggregate per task) is not read: decoding
    it was most of the CPU of finishing a 1,000-task run, and scanning it (a ``LIKE`` on the type) ~25 ms of
    finishing a 10,000 x 5 one; the types by name go through ``ix_events_run_type``."""
    rows = session.execute(_ARTIFACT_EVENTS, {"run_id_": run_id}).all()
    # Sorted here, not by the query: asked for seq order, SQLite walks the run's whole log on (run_id, seq) instead.
    return sorted((int(seq), str(kind), dict(data)) for seq, kind, data in rows)


ARTIFACT_TYPES = artifact_types()
"""Every Artifact event type the log can hold (each event is appended as one of ``EVENT_TYPES``)."""
_ARTIFACT_EVENTS = (select(EventRow.seq, EventRow.type, EventRow.data)
                    .where(EventRow.run_id == bindparam("run_id_"), col(EventRow.type).in_(ARTIFACT_TYPES)))
_CELLS = select(PhaseCell).where(PhaseCell.run_id == bindparam("run_id_"))
"""``run_events``' and ``family``'s reads, built once: made at each run's end, their cache keys (an ``IN`` of every
artifact type) cost more of the worker's CPU than the reads (cProfile, session 40)."""


def family(session: Session, run: Run, events: list[tuple[int, str, dict[str, Any]]]) -> dict[str, str | None]:
    """The model-free members of the fingerprint family, from the run's phase cells and artifacts."""
    return family_of(run, events, {c.phase: c for c in session.execute(_CELLS, {"run_id_": run.id}).scalars()})


def family_of(run: Run, events: list[tuple[int, str, dict[str, Any]]], cells: Mapping[str, PhaseCell]
              ) -> dict[str, str | None]:
    """``family`` from the run's cells as given (phase -> cell)."""
    impls = [data.get("impl_sha256") for _, kind, data in events if kind == AtomizeArtifact.type_name()]
    analyze, setup = cells.get("analyze"), cells.get("setup")
    atomize_key = None
    if setup is not None:
        launch = run.launch or {}
        task_impl = launch.get("task_impl")
        atomize_key = sha256_hex({
            "phase": "atomize", "after_setup": setup.snapshot_id, "analyze": analyze.input_hash if analyze else None,
            "task_impl": sha256_hex(task_impl) if task_impl else None, "driver": run.driver,
            "model_config_hash": model_config_hash(run.model)})
    return {
        "subset_fingerprint": analyze.files.get("tasks.jsonl") if analyze else None,
        "impl_fingerprint": impls[-1] if impls else None,
        "fetch_fingerprint": cells["fetch"].input_hash if "fetch" in cells else None,
        "analyze_fingerprint": analyze.input_hash if analyze else None,
        "setup_fingerprint": setup.input_hash if setup else None,
        "atomize_fingerprint": atomize_key,
    }


def stamp_terminal(session: Session, run: Run) -> None:
    """Store the run fingerprint, the fingerprint family and, for a pinned run, the run shape."""
    events = run_events(session, run.id)
    stamp_from(run, events, {c.phase: c for c in session.execute(_CELLS, {"run_id_": run.id}).scalars()})


def stamp_from(run: Run, events: list[tuple[int, str, dict[str, Any]]], cells: Mapping[str, PhaseCell]) -> None:
    """``stamp_terminal`` from the run's artifacts (``run_events``) and phase cells as given."""
    run.fingerprint, _ = derive(events)
    for column, value in family_of(run, events, cells).items():
        setattr(run, column, value)
    pin = run.pinned or {}
    if pin and run.benchmark_id is None:
        # The run's task_impl is the pinned impl's source byte for byte, so this is also its content id.
        run.benchmark_id, run.subset_id, run.impl_id = pin["benchmark_id"], pin["subset_id"], pin["impl_id"]
    recipe = next((data for _, kind, data in reversed(events) if kind == ProductRecipeArtifact.type_name()), None)
    if recipe is not None and run.subset_id is None:
        # A Benchwright-built (product) benchmark keys its shape on the subset id, the recipe's name (§7): no
        # registry benchmark; the impl is the generated task_impl.py (benchwright.product.recipe.impl_id).
        run.subset_id, run.impl_id = str(recipe["name"]), str(recipe["impl_id"])


_TERMINAL_INPUTS = select(
    Run,
    select(func.json_agg(func.json_build_array(EventRow.seq, EventRow.type, EventRow.data)))
    .where(EventRow.run_id == Run.id, col(EventRow.type).in_(ARTIFACT_TYPES)).scalar_subquery(),
    select(func.json_agg(func.json_build_object("phase", PhaseCell.phase, "input_hash", PhaseCell.input_hash,
                                                "snapshot_id", PhaseCell.snapshot_id, "files", PhaseCell.files)))
    .where(PhaseCell.run_id == Run.id).scalar_subquery(),
).where(Run.id == bindparam("run_id_"))
"""On Postgres, what a run's end reads in one statement (one snapshot): the row, its artifacts (``run_events``) and
its phase cells (``family``)."""


def terminal_inputs(engine: Engine, run_id: str
                    ) -> tuple[Run, list[tuple[int, str, dict[str, Any]]], dict[str, PhaseCell]] | None:
    """On Postgres, the run's row with what ``stamp_from`` reads, in one round trip in autocommit (``_TERMINAL_INPUTS``:
    the row's ``next_seq`` and the artifacts are of one snapshot); None for no such run."""
    with Session(reader(engine)) as session:
        found = session.execute(_TERMINAL_INPUTS, {"run_id_": run_id}).first()
    if found is None:
        return None
    run, artifacts, cells = found
    events = sorted((int(seq), str(kind), dict(data)) for seq, kind, data in artifacts or [])
    return run, events, {str(c["phase"]): PhaseCell(run_id=run_id, **c) for c in cells or []}


def readable_run(engine: Engine, *, run_id: str, account_id: str) -> Run:
    """The run for a read route: the owner's always; anyone's when unlisted or public.

    Raises:
        NotFound: no such run, or a private run of another account (the two are indistinguishable).
    """
    with Session(reader(engine)) as session:
        run = session.get(Run, run_id)
    if run is None or (run.account_id != account_id and run.visibility not in READABLE_BY_ID):
        raise NotFound(f"run {run_id} not found")
    return run


def set_pin(engine: Engine, *, run_id: str, pinned: dict[str, Any]) -> None:
    """Freeze a pinned launch's resolution on its run (before its workflow starts)."""
    from benchwright.store.db import session_scope

    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        if run is not None:
            run.pinned = pinned
