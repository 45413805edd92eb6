"""The cross-run cache serves a cell only while its run has finished and is public (``phase_fingerprints.served``, kept
by migration 0024's triggers on both tables), and finds the newest such cell of an input by key: the read's plan names
the partial index of served cells on each store, with thousands of private runs of the same input in the store."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.registry.cache import _SERVED, Cell, find_public_cell, record_cell_in
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate, session_scope
from benchwright.store.models import PhaseCell, Run, table_of, utcnow
from benchwright.store.runs import create_run, finish_run, set_visibility
from tests.store.conftest import explain

HASH = "ab" * 32
PRIVATE = 3000


def _run(engine: Engine, account_id: str) -> str:
    return create_run(engine, account_id=account_id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                      driver="builtin", trials_config={}).id


def _cell(run_id: str, n: int = 1) -> Cell:
    return Cell(run_id=run_id, phase="fetch", input_hash=HASH, artifacts=[{"type": "X", "data": {"n": n}}],
                snapshot_id=None, files={"data.jsonl": f"{n:064x}"}, result={"tasks": n})


def _set(engine: Engine, run_id: str, **values: Any) -> None:
    with session_scope(engine) as session:
        session.execute(update(Run).where(Run.id == run_id).values(**values))  # type: ignore[arg-type]


def _served(engine: Engine, run_id: str) -> bool:
    with Session(engine) as session:
        cell = session.get(PhaseCell, (run_id, "fetch"))
        assert cell is not None
        return cell.served


def test_a_cell_is_served_while_its_run_is_finished_and_public(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="cells")
    run_id, asking = _run(engine, account.id), _run(engine, account.id)
    with session_scope(engine) as session:
        record_cell_in(session, _cell(run_id))

    def found() -> str | None:
        cell = find_public_cell(engine, phase="fetch", input_hash=HASH, exclude_run_id=asking)
        return None if cell is None else cell.run_id

    assert not _served(engine, run_id) and found() is None  # running and private
    _set(engine, run_id, visibility="public")
    assert not _served(engine, run_id) and found() is None  # public, still running
    finish_run(engine, run_id=run_id, status="ok")
    assert _served(engine, run_id) and found() == run_id
    assert find_public_cell(engine, phase="fetch", input_hash=HASH, exclude_run_id=run_id) is None  # its own
    set_visibility(engine, run_id=run_id, account_id=account.id, visibility="private")
    assert not _served(engine, run_id) and found() is None  # turned private again: at once
    _set(engine, run_id, visibility="unlisted")
    assert found() is None
    _set(engine, run_id, visibility="public")
    assert found() == run_id
    with session_scope(engine) as session:  # a later invocation's cell replaces it: still served
        record_cell_in(session, _cell(run_id, 2))
    served = find_public_cell(engine, phase="fetch", input_hash=HASH, exclude_run_id=asking)
    assert served is not None and served.files == _cell(run_id, 2).files

    # A cell written for a run that has already finished and is public is served from its first write.
    later = _run(engine, account.id)
    _set(engine, later, visibility="public", finished_at=utcnow() + timedelta(seconds=1))
    with session_scope(engine) as session:
        record_cell_in(session, _cell(later, 3))
    assert _served(engine, later) and found() == later  # the newest served cell of the input
    engine.dispose()


def test_the_newest_served_cell_is_found_by_key_among_thousands_of_private_ones(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="many-cells")
    public = _run(engine, account.id)
    with session_scope(engine) as session:
        record_cell_in(session, _cell(public))
    _set(engine, public, visibility="public")
    finish_run(engine, run_id=public, status="ok")
    # Thousands of later private runs of the same input, finished: none may be served, and none may be read.
    now, base = utcnow(), _run(engine, account.id)
    with Session(engine) as session:
        template = session.get(Run, base)
        assert template is not None
        row = template.model_dump()
    ids = [str(uuid.uuid4()) for _ in range(PRIVATE)]
    with session_scope(engine) as session:
        session.execute(insert(table_of(Run)), [{**row, "id": i, "finished_at": now, "status": "ok"} for i in ids])
        session.execute(insert(table_of(PhaseCell)), [
            {"run_id": i, "phase": "fetch", "input_hash": HASH, "artifacts": [], "files": {}, "result": {},
             "created_at": now + timedelta(milliseconds=n)} for n, i in enumerate(ids)])
    cell = find_public_cell(engine, phase="fetch", input_hash=HASH, exclude_run_id=base)
    assert cell is not None and cell.run_id == public
    with Session(engine) as session:
        assert session.execute(select(func.count()).where(col(PhaseCell.served))).scalar_one() == 1
    params = {"phase": "fetch", "input_hash": HASH, "exclude_run_id": base}
    plan = explain(engine, _SERVED, params, "phase_fingerprints")
    assert "ix_phase_fingerprints_served" in plan, plan
    engine.dispose()
