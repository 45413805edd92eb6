"""A phase's opening appends its events and then reads the run's work files, and its restore and publish go by them
(``benchwright.runs.handoff.append_reading_files``), on SQLite and Postgres; on Postgres in one round trip (one call
of ``bw_append_reading``, migration 0019: the append and then the read), not four."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchwright.data.blobs import DirBlobStore
from benchwright.errors import NotFound
from benchwright.events import PhaseStarted
from benchwright.runs import handoff
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.runs import create_run
from tests.store.conftest import round_trips


async def test_a_phase_opening_reads_the_files_its_restore_and_publish_go_by(db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="handoff", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})
    blobs = DirBlobStore(tmp_path / "blobs")
    host_a, host_b = tmp_path / "a", tmp_path / "b"
    host_a.mkdir()
    host_b.mkdir()
    dataset = os.urandom(50_000)
    (host_a / "data.jsonl").write_bytes(dataset)
    (host_a / "fetch.json").write_text('{"path": "data.jsonl"}')
    fetched = await handoff.publish(engine=engine, blobs=blobs, run_id=run.id, phase="fetch", invocation=1,
                                    workdir=host_a)
    append_events(engine, run.id, [NewEvent.of(event_key(run.id, "fetch", 1, "work-files"), fetched)])

    opening = [NewEvent.of(event_key(run.id, "analyze", 1, "started"), PhaseStarted(phase="analyze"))]
    if engine.dialect.name == "postgresql":
        with round_trips(engine) as trips:
            files = handoff.append_reading_files(engine, run.id, opening)
        assert trips == [1]
    else:
        files = handoff.append_reading_files(engine, run.id, opening)
    assert files == fetched.files
    assert handoff.append_reading_files(engine, run.id, opening) == fetched.files  # a retried opening
    log = read_events(engine, run.id)
    assert [e.type for e in log].count("PhaseStarted") == 1 and log[-1].type == "PhaseStarted"
    with pytest.raises(NotFound):
        handoff.append_reading_files(engine, "no-such-run", opening)
    bare = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                      driver="builtin", trials_config={})
    assert handoff.append_reading_files(engine, bare.id, [NewEvent.of(event_key(bare.id, "fetch", 1, "started"),
                                                                      PhaseStarted(phase="fetch"))]) == {}

    # Host B has nothing yet: the files read at the opening are what it fetches
    assert sorted(await handoff.restore(engine=engine, blobs=blobs, run_id=run.id, workdir=host_b,
                                        files=files)) == ["data.jsonl", "fetch.json"]
    assert (host_b / "data.jsonl").read_bytes() == dataset

    # Its publish goes by them too: the unchanged file is recorded as it was, the changed and the new one go in
    (host_b / "fetch.json").write_text('{"path": "data.jsonm"}')
    (host_b / "tasks.jsonl").write_text('{"input": "1+1"}\n')
    analyzed = await handoff.publish(engine=engine, blobs=blobs, run_id=run.id, phase="analyze", invocation=1,
                                     workdir=host_b, known=files)
    assert analyzed.files["data.jsonl"] == files["data.jsonl"]
    assert analyzed.files["fetch.json"] != files["fetch.json"]
    for digest in analyzed.files.values():
        assert await blobs.exists(digest)
    append_events(engine, run.id, [NewEvent.of(event_key(run.id, "analyze", 1, "work-files"), analyzed)])
    assert sorted(await handoff.restore(engine=engine, blobs=blobs, run_id=run.id, workdir=host_a)) == [
        "fetch.json", "tasks.jsonl"]
    engine.dispose()
