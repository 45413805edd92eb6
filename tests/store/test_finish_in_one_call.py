"""A run's end (``finish_run``): the row, its fingerprint family and the terminal events, whichever way it is written.
On Postgres in two round trips (one read, then ``bw_finish_run`` of migration 0026) where the transaction took seven;
the function writes nothing when the log moved since the read or the run has ended, and the transaction then does it.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.events import AtomizeArtifact, DatasetTasksArtifact, FetchArtifact, PhaseCompleted, PipelineFinished
from benchwright.fingerprint import derive
from benchwright.registry.cache import Cell, record_cell_in
from benchwright.registry.shape import stamp_terminal, terminal_inputs
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate, session_scope
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.models import Run
from benchwright.store.runs import TERMINAL_COLUMNS, create_run, finish_run, get_run
from tests.store.conftest import round_trips


def _run_with_artifacts(engine: Engine) -> str:
    """A run whose log holds a few artifacts and whose Fetch and Analyze left cache cells, as a run's phases leave
    them before its end."""
    account, _ = create_account(engine, name="ends")
    run_id = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                        driver="builtin", trials_config={}).id
    append_events(engine, run_id, [
        NewEvent.of(event_key(run_id, "fetch"), FetchArtifact(source="x.jsonl", sha256="a" * 64, bytes=10,
                                                               format="jsonl", file="x.jsonl")),
        NewEvent.of(event_key(run_id, "tasks"), DatasetTasksArtifact(count=3)),
        NewEvent.of(event_key(run_id, "atomize"), AtomizeArtifact(invocation=1, impl_sha256="b" * 64,
                                                                   source="template"))])
    with session_scope(engine) as session:
        for phase, files in (("fetch", {"x.jsonl": "c" * 64}), ("analyze", {"tasks.jsonl": "d" * 64})):
            record_cell_in(session, Cell(run_id=run_id, phase=phase, input_hash=phase * 8, artifacts=[],
                                         snapshot_id=None, files=files, result={}))
    return run_id


def _stamped_again(engine: Engine, run_id: str) -> dict[str, object]:
    """The terminal columns as ``stamp_terminal`` computes them in a transaction from the store's log and cells."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
        stamp_terminal(session, run)
        return {column: getattr(run, column) for column in TERMINAL_COLUMNS}


def test_a_runs_end_sets_the_row_and_its_fingerprint_family_from_its_log(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    run_id = _run_with_artifacts(engine)
    preface = NewEvent.of(event_key(run_id, "materialize", 1, "completed"),
                          PhaseCompleted(phase="materialize", duration_ms=5))
    finish_run(engine, run_id=run_id, status="error", error="the endpoint said no" * 300, before=[preface])
    run = get_run(engine, run_id=run_id)
    assert run.status == "error" and run.error == ("the endpoint said no" * 300)[:4000]
    assert isinstance(run.finished_at, datetime)
    artifacts = [(e.seq, e.type, e.data) for e in read_events(engine, run_id) if e.type.endswith("Artifact")]
    assert run.fingerprint == derive(artifacts)[0] and len(artifacts) == 3
    assert run.fetch_fingerprint == "fetch" * 8 and run.analyze_fingerprint == "analyze" * 8
    assert run.subset_fingerprint == "d" * 64 and run.impl_fingerprint == "b" * 64
    assert {column: getattr(run, column) for column in TERMINAL_COLUMNS} == _stamped_again(engine, run_id)
    tail = [e.type for e in read_events(engine, run_id)][-2:]
    assert tail == [PhaseCompleted.type_name(), PipelineFinished.type_name()] and run.next_seq == 6

    finish_run(engine, run_id=run_id, status="succeeded")  # a retry: nothing lands twice, the row stays
    again = get_run(engine, run_id=run_id)
    assert again.status == "error" and again.finished_at == run.finished_at and again.next_seq == 6
    engine.dispose()


def test_on_postgres_a_runs_end_is_two_round_trips(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    migrate(engine)
    run_id = _run_with_artifacts(engine)
    with round_trips(engine) as trips:
        finish_run(engine, run_id=run_id, status="succeeded")
    assert trips == [2], "the read of the row, its artifacts and cells, then bw_finish_run"
    assert get_run(engine, run_id=run_id).fingerprint is not None
    with pytest.raises(Exception, match="not found"):
        finish_run(engine, run_id="no-such-run", status="succeeded")
    engine.dispose()


def _finish_call(engine: Engine, run_id: str, seen_seq: int) -> str:
    values = {column: None for column in TERMINAL_COLUMNS} | {"status": "succeeded"}
    with engine.begin() as conn:
        return str(conn.execute(text(
            "SELECT o_state FROM bw_finish_run(:run, ARRAY[:key]::text[], ARRAY['PipelineFinished']::text[], "
            "ARRAY['{}']::json[], ARRAY[NULL]::text[], ARRAY[NULL]::integer[], now()::timestamp, :seen, "
            + ", ".join(f"CAST(:{c} AS {'timestamptz' if c == 'finished_at' else 'text'})" for c in TERMINAL_COLUMNS)
            + ")"), {"run": run_id, "key": event_key(run_id, "pipeline", "finished"), "seen": seen_seq,
                     **values}).scalar_one())


def test_on_postgres_the_call_writes_nothing_once_the_log_moved_or_the_run_ended(postgres_url: str) -> None:
    """The read and the call are two statements: an event appended between them (a late artifact) would be missing
    from the fingerprint, so the call refuses, and ``finish_run`` goes by its transaction, which covers it."""
    engine = make_engine(postgres_url)
    migrate(engine)
    run_id = _run_with_artifacts(engine)
    found = terminal_inputs(engine, run_id)
    assert found is not None
    seen = found[0].next_seq
    append_events(engine, run_id, [NewEvent.of(event_key(run_id, "late"), DatasetTasksArtifact(count=4))])
    assert _finish_call(engine, run_id, seen) == "moved"
    assert get_run(engine, run_id=run_id).finished_at is None and len(read_events(engine, run_id)) == seen + 1
    assert _finish_call(engine, "no-such-run", 0) == "missing"

    finish_run(engine, run_id=run_id, status="succeeded")
    artifacts = [(e.seq, e.type, e.data) for e in read_events(engine, run_id) if e.type.endswith("Artifact")]
    assert get_run(engine, run_id=run_id).fingerprint == derive(artifacts)[0] and len(artifacts) == 4
    ended = get_run(engine, run_id=run_id)
    assert _finish_call(engine, run_id, ended.next_seq) == "ended"
    assert get_run(engine, run_id=run_id).next_seq == ended.next_seq
    engine.dispose()
