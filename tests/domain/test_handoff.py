"""Phase hand-off through the blob store and the log: a worker with an empty disk gets the run's files back."""

from __future__ import annotations

import os
from pathlib import Path

from benchwright.data.blobs import DirBlobStore
from benchwright.runs import handoff
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import create_run


async def test_files_published_by_one_worker_are_restored_on_another(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    account, _ = create_account(engine, name="a", balance_usd=1.0)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                     driver="builtin", trials_config={})
    blobs = DirBlobStore(tmp_path / "blobs")  # what both hosts share (S3 in production)
    host_a, host_b = tmp_path / "a" / "work", tmp_path / "b" / "work"
    host_a.mkdir(parents=True)
    dataset = os.urandom(100_000)
    (host_a / "data.jsonl").write_bytes(dataset)
    (host_a / "fetch.json").write_text('{"path": "data.jsonl"}')
    (host_a / "proxy.json").write_text("{}")  # worker-local: never handed off
    (host_a / "snapshots.json.part").write_text("half-written")

    event = await handoff.publish(engine=engine, blobs=blobs, run_id=run.id, phase="fetch", invocation=1,
                                  workdir=host_a)
    assert set(event.files) == {"data.jsonl", "fetch.json"}
    append_events(engine, run.id, [NewEvent.of(event_key(run.id, "fetch", 1, "work-files"), event)])

    assert sorted(await handoff.restore(engine=engine, blobs=blobs, run_id=run.id, workdir=host_b)) == [
        "data.jsonl", "fetch.json"]
    assert (host_b / "data.jsonl").read_bytes() == dataset
    assert not (host_b / "proxy.json").exists()

    # Host B's next phase changes a file and adds one; host A, stale, is brought up to date (same-size edits too).
    (host_b / "fetch.json").write_text('{"path": "data.jsonm"}')
    (host_b / "tasks.jsonl").write_text('{"input": "1+1"}\n')
    later = await handoff.publish(engine=engine, blobs=blobs, run_id=run.id, phase="analyze", invocation=1,
                                  workdir=host_b)
    append_events(engine, run.id, [NewEvent.of(event_key(run.id, "analyze", 1, "work-files"), later)])
    assert sorted(await handoff.restore(engine=engine, blobs=blobs, run_id=run.id, workdir=host_a)) == [
        "fetch.json", "tasks.jsonl"]
    assert (host_a / "fetch.json").read_text() == '{"path": "data.jsonm"}'
    assert await handoff.restore(engine=engine, blobs=blobs, run_id=run.id, workdir=host_a) == []
