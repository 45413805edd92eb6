"""no_answer is a projection of the log (issue 21), on SQLite and Postgres: set when the aggregate lands, from its
trials' meta, whether those trials came in the same append or earlier ones; and the migration backfills runs
recorded before the column existed."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlmodel import Session, select

from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import _MIGRATIONS, make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.models import Run, TaskRow
from benchwright.store.runs import create_run, run_view


def _trial(run_id: str, index: int, trial: int, score: float, meta: dict[str, Any]) -> NewEvent:
    return NewEvent.of(event_key(run_id, "m", 1, index, trial, "result"), MaterializeTaskResult(
        invocation=1, index=index, trial=trial, score=score, outcome="pass" if score >= 1 else "fail", output="x",
        meta=meta, input="user: what is 2+2?"))


def _aggregate(run_id: str, index: int, scores: list[float]) -> NewEvent:
    outcome = "pass" if min(scores) >= 1 else "fail"
    return NewEvent.of(event_key(run_id, "m", 1, index, "aggregated"), MaterializeTaskAggregated(
        invocation=1, index=index, score=min(scores), outcome=outcome, trial_scores=scores))


NONE = {"extracted": False, "answer": None, "rule": None}
WRONG = {"extracted": True, "answer": "5", "rule": "final_line"}


def test_no_answer_is_projected_from_the_trials_of_each_task(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="results")
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                     driver="builtin", trials_config={"plan": {"k": 2}})
    r = run.id
    # task 0: both trials found no answer, all in one append -> no_answer
    append_events(engine, r, [_trial(r, 0, 0, 0.0, NONE), _trial(r, 0, 1, 0.0, NONE), _aggregate(r, 0, [0.0, 0.0])])
    # task 1: the trials landed in an earlier append than the aggregate -> no_answer (read back from the store)
    append_events(engine, r, [_trial(r, 1, 0, 0.0, NONE)])
    append_events(engine, r, [_trial(r, 1, 1, 0.0, NONE), _aggregate(r, 1, [0.0, 0.0])])
    # task 2: one trial answered (wrong) -> a plain fail; its other trial came earlier
    append_events(engine, r, [_trial(r, 2, 0, 0.0, WRONG)])
    append_events(engine, r, [_trial(r, 2, 1, 0.0, NONE), _aggregate(r, 2, [0.0, 0.0])])
    # task 3: meta without the key (a scorer that does not say) -> a plain fail
    append_events(engine, r, [_trial(r, 3, 0, 0.0, {}), _trial(r, 3, 1, 0.0, {}), _aggregate(r, 3, [0.0, 0.0])])
    # task 4: a pass never is no_answer, whatever its meta says
    append_events(engine, r, [_trial(r, 4, 0, 1.0, NONE), _trial(r, 4, 1, 1.0, NONE), _aggregate(r, 4, [1.0, 1.0])])
    # the same events again (a retried activity): nothing changes
    append_events(engine, r, [_trial(r, 0, 0, 0.0, NONE), _aggregate(r, 0, [0.0, 0.0])])

    with Session(engine) as session:
        flags = {row.index: row.no_answer for row in session.exec(select(TaskRow).where(TaskRow.run_id == r))}
        stored = session.get(Run, r)
    assert flags == {0: True, 1: True, 2: False, 3: False, 4: False}
    assert stored is not None
    summary = run_view(engine, stored).tasks.summary
    assert (summary.passed, summary.failed, summary.no_answer) == (1, 4, 2)
    assert summary.pass_rate == 1 / 5  # no_answer stays a fail: it is in the denominator
    engine.dispose()


def test_migration_backfills_no_answer_of_rows_recorded_before_it(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="before")
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                     driver="builtin", trials_config={})
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with engine.begin() as conn:  # back to the schema before issue 21, and rows written the way it wrote them
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007")
        for index, outcome, meta in ((0, "fail", '{"extracted": false}'), (1, "fail", '{"extracted": true}'),
                                     (2, "pass", '{"extracted": false}'), (3, "fail", '{}')):
            conn.execute(text('INSERT INTO trial_results (run_id, invocation, "index", trial, outcome, meta) '
                              "VALUES (:r, 1, :i, 0, :o, :m)"), {"r": run.id, "i": index, "o": outcome, "m": meta})
            conn.execute(text('INSERT INTO task_rows (run_id, invocation, "index", outcome, trial_scores) '
                              "VALUES (:r, 1, :i, :o, '[0.0]')"), {"r": run.id, "i": index, "o": outcome})
    migrate(engine)
    with Session(engine) as session:
        flags = {row.index: row.no_answer for row in session.exec(select(TaskRow).where(TaskRow.run_id == run.id))}
    assert flags == {0: True, 1: False, 2: False, 3: False}
    engine.dispose()
