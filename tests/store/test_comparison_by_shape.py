"""A narration's comparison finds the newest earlier finished run of the same shape in the account by key (migration
0023's partial indexes), not by walking the account's runs back in time: the read's plan names the index on each
store, with an account holding thousands of runs of other shapes, and it finds the right run."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import insert, text
from sqlmodel import Session

from benchwright.report.facts import _BY_SHAPE, _SHAPES, _comparison
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate, reader
from benchwright.store.models import Run, table_of, utcnow
from benchwright.store.runs import create_run, get_run
from tests.store.conftest import explain

OTHERS = 3000


def test_the_previous_run_of_a_shape_is_found_by_key(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="many-runs")
    now = utcnow()
    shape = {"benchmark_id": "b1", "subset_id": "s1", "impl_id": "i1", "subset_fingerprint": "f1",
             "impl_fingerprint": "g1"}
    earlier = str(uuid.uuid4())
    rows = [{"id": earlier, "account_id": account.id, "status": "ok", "model": {"identifier": "m"},
             "driver": "builtin", "launch": {}, "created_at": now - timedelta(hours=2),
             "finished_at": now - timedelta(hours=2), **shape}]
    rows += [{"id": str(uuid.uuid4()), "account_id": account.id, "status": "ok", "model": {"identifier": "m"},
              "driver": "builtin", "launch": {}, "created_at": now - timedelta(seconds=OTHERS - i),
              "finished_at": now - timedelta(seconds=OTHERS - i), "benchmark_id": f"b{i + 2}", "subset_id": "s",
              "impl_id": "i", "subset_fingerprint": f"f{i + 2}", "impl_fingerprint": "g"} for i in range(OTHERS)]
    with engine.begin() as conn:
        conn.execute(insert(table_of(Run)), rows)
    run_id = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                        driver="builtin", trials_config={}).id
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET benchmark_id = :b, subset_id = :s, impl_id = :i, subset_fingerprint = :f, "
                          "impl_fingerprint = :g, finished_at = :at WHERE id = :id"),
                     {"b": "b1", "s": "s1", "i": "i1", "f": "f1", "g": "g1", "at": utcnow(), "id": run_id})
    run = get_run(engine, run_id=run_id)
    with Session(reader(engine)) as session:
        found = _comparison(session, run)
    assert found is not None and (found.run_id, found.relation) == (earlier, "previous")
    for same, index in zip(_SHAPES, ("ix_runs_finished_by_registry_shape", "ix_runs_finished_by_fingerprints"),
                           strict=True):
        params = {"run_id_": run.id, "account_id_": run.account_id, "created_at_": run.created_at,
                  **{f"{name}_": getattr(run, name) for name in same}}
        plan = explain(engine, _BY_SHAPE[same], params, "runs")
        assert index in plan, plan
    engine.dispose()
