"""pass@k's n and c per task (issue 25): each task row counts its trials (migration 0018), so a finished run's first
read takes them from its task rows instead of counting every trial row. The counts must be the ones the trial rows
give, on both stores, for rows the projection writes and rows the migration backfills; a row without them (an older
writer's) sends the read back to the trial rows."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from alembic.config import Config
from sqlalchemy import select, update
from sqlmodel import Session, col

from benchwright.comparison.stats import bootstrap_mean
from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.schemas import LaunchRequest
from benchwright.scoring.aggregators import AggregatorConfig, TrialOutcome, aggregate, pass_at_k
from benchwright.store.accounts import create_account
from benchwright.store.db import _MIGRATIONS, make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.intervals import _trial_counts_from_trials, terminal_intervals, trial_counts
from benchwright.store.models import TaskRow
from benchwright.store.runs import create_run

# Each task's trials as (score, error): a pass, a partial score (a fail), a zero, an error (no score).
TASKS: list[list[tuple[float | None, str | None]]] = [
    [(1.0, None), (1.0, None), (1.0, None)],
    [(1.0, None), (0.5, None), (None, "scorer: boom")],
    [(0.0, None), (None, "sut: timeout"), (None, "sut: timeout")],
    [(None, "x"), (None, "x"), (None, "x")],
    [(0.25, None), (1.0, None), (0.0, None)],
]


def _events(run_id: str, index: int, trials: list[tuple[float | None, str | None]]) -> list[NewEvent]:
    """A task's trial results and its aggregate, as the scorer host's records make them."""
    events = []
    outcomes = []
    for trial, (score, error) in enumerate(trials):
        outcome = "err" if error else "pass" if score is not None and score >= 1.0 else "fail"
        events.append(NewEvent.of(event_key(run_id, "m", 1, index, trial), MaterializeTaskResult(
            invocation=1, index=index, trial=trial, score=score, outcome=outcome, output="x", error=error)))
        outcomes.append(TrialOutcome(trial=trial, score=score, error=error))
    row = aggregate(AggregatorConfig(name="any_pass"), outcomes)
    events.append(NewEvent.of(event_key(run_id, "m", 1, index, "agg"), MaterializeTaskAggregated(
        invocation=1, index=index, score=row.score, outcome=row.outcome, trial_scores=row.trial_scores)))
    return events


def _run(url: str) -> str:
    engine = make_engine(url)
    migrate(engine)
    account, _ = create_account(engine, name="counts")
    run = create_run(engine, account_id=account.id, driver="builtin", trials_config={"plan": {"k": 3}},
                     launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"))
    engine.dispose()
    return run.id


EXPECTED = [(3, 3), (2, 1), (1, 0), (0, 0), (3, 1)]


def test_each_task_row_counts_its_trials_as_the_trial_rows_do(db_url: str) -> None:
    run_id = _run(db_url)
    engine = make_engine(db_url)
    # One task's trials in an append before its aggregate, the others' in the same append as theirs; the last task
    # first: the counts come in task order whatever order the rows were written in (the bootstrap resamples by
    # position).
    first = _events(run_id, 0, TASKS[0])
    append_events(engine, run_id, first[:2])
    append_events(engine, run_id, _events(run_id, 4, TASKS[4]))
    append_events(engine, run_id, first[2:] + [e for i, t in enumerate(TASKS[1:4], 1) for e in _events(run_id, i, t)])
    with Session(engine) as session:
        assert trial_counts(session, run_id, 1) == EXPECTED
        assert _trial_counts_from_trials(session, run_id, 1) == EXPECTED
    engine.dispose()


def test_a_row_without_counts_sends_the_read_to_the_trial_rows(db_url: str) -> None:
    run_id = _run(db_url)
    engine = make_engine(db_url)
    append_events(engine, run_id, [e for i, t in enumerate(TASKS) for e in _events(run_id, i, t)])
    with Session(engine) as session:
        session.execute(update(TaskRow).where(col(TaskRow.run_id) == run_id, col(TaskRow.index) == 1)
                        .values(trials_scored=None, trials_passed=None))  # what a worker before 0018 writes
        session.commit()
        assert trial_counts(session, run_id, 1) == EXPECTED
    engine.dispose()


def test_the_migration_counts_the_rows_already_stored(db_url: str) -> None:
    """Rows projected before 0018 (its downgrade drops the columns) are counted from their trials on the upgrade,
    and the finished run's pass@k reads the same before and after."""
    run_id = _run(db_url)
    engine = make_engine(db_url)
    append_events(engine, run_id, [e for i, t in enumerate(TASKS) for e in _events(run_id, i, t)])
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0017")
    engine.dispose()
    engine = make_engine(db_url)
    migrate(engine)
    with Session(engine) as session:
        counted = session.execute(select(col(TaskRow.trials_scored), col(TaskRow.trials_passed))
                                  .where(col(TaskRow.run_id) == run_id).order_by(col(TaskRow.index))).all()
        assert [tuple(row) for row in counted] == EXPECTED
    engine.dispose()


def test_pass_at_k_of_a_finished_run_comes_from_the_counts(db_url: str) -> None:
    k = 3
    run_id = _run(db_url)
    engine = make_engine(db_url)
    append_events(engine, run_id, [e for i, t in enumerate(TASKS) for e in _events(run_id, i, t)])
    with Session(engine) as session:
        got = terminal_intervals(session, run_id=run_id, invocation=1, finished_at=datetime.now(UTC), k=k)
    qualifying = [(n, c) for n, c in EXPECTED if n >= k]
    assert got.pass_at_k == {
        "pass@1": sum(pass_at_k(n, c, 1) for n, c in EXPECTED if n >= 1) / sum(1 for n, _ in EXPECTED if n >= 1),
        f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in qualifying) / len(qualifying)}
    assert set(got.pass_at_k_ci) == set(got.pass_at_k)
    engine.dispose()


def test_the_mean_score_is_bootstrapped_over_the_scored_tasks_in_task_order(db_url: str) -> None:
    """k > 1: the mean task score's bootstrap takes the scored tasks' scores (an ``err`` task has none) in task order,
    read in the same pass as the counts; k = 1: the same, once a score is neither 0 nor 1 (else none)."""
    run_id = _run(db_url)
    engine = make_engine(db_url)
    append_events(engine, run_id, [e for i, t in enumerate(TASKS) for e in _events(run_id, i, t)])

    def scored() -> list[float]:
        rows = session.execute(select(TaskRow.outcome, TaskRow.score).where(col(TaskRow.run_id) == run_id)
                               .order_by(col(TaskRow.index))).all()
        return [float(score) for outcome, score in rows if outcome != "err" and score is not None]

    def mean_score(k: int) -> tuple[float, float, tuple[float, float]] | None:
        got = terminal_intervals(session, run_id=run_id, invocation=1, finished_at=datetime.now(UTC), k=k).mean_score
        return None if got is None else (got.value, got.se, got.ci)

    def bootstrapped(values: list[float]) -> tuple[float, float, tuple[float, float]]:
        expected = bootstrap_mean(values=values)
        assert expected is not None
        return expected.value, expected.se, (expected.interval.low, expected.interval.high)

    with Session(engine) as session:
        assert scored() == [1.0, 1.0, 0.0, 1.0]  # the fourth task errored in every trial: no score
        assert mean_score(3) == bootstrapped(scored())
        assert mean_score(1) is None  # pass/fail: its interval is Wilson's
        session.execute(update(TaskRow).where(col(TaskRow.run_id) == run_id, col(TaskRow.index) == 1)
                        .values(score=0.25))
        session.commit()
        assert scored() == [1.0, 0.25, 0.0, 1.0]
        assert mean_score(1) == bootstrapped(scored()) == mean_score(3)
    engine.dispose()
