"""A run's phase cell (``benchwright.registry.cache.record_cell_in``), written in the phase's closing transaction, on
SQLite and Postgres: the first close inserts it, a later invocation's close replaces what it says (its creation time
kept), and a rolled-back close leaves nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.registry.cache import Cell, record_cell_in, run_cell
from benchwright.store.db import session_scope
from benchwright.store.models import PhaseCell


def _cell(run_id: str, phase: str, n: int) -> Cell:
    return Cell(run_id=run_id, phase=phase, input_hash=f"{n:064x}", artifacts=[{"type": "X", "data": {"n": n}}],
                snapshot_id=f"snap-{n}", files={"data.jsonl": f"{n:064x}"}, result={"tasks": n},
                source_run_id=None if n == 1 else "another-run")


def test_a_cell_is_inserted_then_replaced_and_a_rollback_leaves_none(store_run: tuple[Engine, str]) -> None:
    engine, run_id = store_run
    with session_scope(engine) as session:
        record_cell_in(session, _cell(run_id, "fetch", 1))
    assert run_cell(engine, run_id=run_id, phase="fetch") == _cell(run_id, "fetch", 1)
    with Session(engine) as session:
        first_made = session.get(PhaseCell, (run_id, "fetch")).created_at  # type: ignore[union-attr]

    with session_scope(engine) as session:  # the phase's next invocation
        record_cell_in(session, _cell(run_id, "fetch", 2))
        record_cell_in(session, _cell(run_id, "analyze", 3))
    assert run_cell(engine, run_id=run_id, phase="fetch") == _cell(run_id, "fetch", 2)
    assert run_cell(engine, run_id=run_id, phase="analyze") == _cell(run_id, "analyze", 3)
    with Session(engine) as session:
        assert session.get(PhaseCell, (run_id, "fetch")).created_at == first_made  # type: ignore[union-attr]

    with Session(engine) as session:  # a close that fails after its cell was written
        record_cell_in(session, _cell(run_id, "setup", 4))
        session.rollback()
    assert run_cell(engine, run_id=run_id, phase="setup") is None
    engine.dispose()


def test_a_cells_write_is_one_statement_whether_new_or_replacing(store_run: tuple[Engine, str]) -> None:
    """An upsert, not a read and then a write: a round trip fewer at each cached phase's close on Postgres."""
    engine, run_id = store_run
    for n in (1, 2):
        statements: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)  # noqa: B023 - listened to and removed within this iteration

        event.listen(engine, "before_cursor_execute", count)
        try:
            with session_scope(engine) as session:  # its commit included (where the ORM would flush a new row)
                record_cell_in(session, _cell(run_id, "fetch", n))
        finally:
            event.remove(engine, "before_cursor_execute", count)
        assert len(statements) == 1, statements
        assert run_cell(engine, run_id=run_id, phase="fetch") == _cell(run_id, "fetch", n)
    engine.dispose()
