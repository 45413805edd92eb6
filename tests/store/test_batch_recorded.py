"""What a Materialize batch finds already recorded as it starts (``benchwright.runs.materialize._recorded``): its
trials by task and its tasks already aggregated, only those of its own range and sweep, in one statement on SQLite
and Postgres (the batch resumes from them after a worker died)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.runs.materialize import _recorded
from benchwright.runs.pipeline import MaterializeBatchInput
from benchwright.schemas import ModelSpec, TrialsConfig
from benchwright.scoring.aggregators import TrialOutcome
from benchwright.store.events import NewEvent, append_events, event_key


def _trial(run_id: str, invocation: int, index: int, trial: int) -> NewEvent:
    failed = index % 3 == 2
    return NewEvent.of(event_key(run_id, "m", invocation, index, trial, "result"), MaterializeTaskResult(
        invocation=invocation, index=index, trial=trial, score=None if failed else 0.5 * trial,
        outcome="err" if failed else "pass", output="x", meta={"trial": trial, "naïve": [1, None]},
        error="TimeoutError: slow" if failed else None))


def test_a_batch_finds_its_recorded_trials_and_aggregated_tasks_in_one_statement(
        store_run: tuple[Engine, str]) -> None:
    engine, run_id = store_run
    append_events(engine, run_id, [_trial(run_id, invocation, index, trial)
                                   for invocation in (1, 2) for index in range(6) for trial in (0, 1)
                                   if (index, trial) != (3, 1)])
    append_events(engine, run_id, [NewEvent.of(event_key(run_id, "agg", invocation, index), MaterializeTaskAggregated(
        invocation=invocation, index=index, score=0.5, outcome="pass", trial_scores=[0.0, 0.5]))
        for invocation in (1, 2) for index in (0, 1, 4)])
    inp = MaterializeBatchInput(run_id=run_id, invocation=2, start=1, stop=4, model=ModelSpec(identifier="openai/x"),
                                trials=TrialsConfig(), concurrency=1)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        by_task, aggregated = _recorded(engine, inp)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 1, statements
    assert aggregated == {1}
    assert by_task == {
        1: {t: TrialOutcome(trial=t, score=0.5 * t, meta={"trial": t, "naïve": [1, None]}) for t in (0, 1)},
        2: {t: TrialOutcome(trial=t, score=None, meta={"trial": t, "naïve": [1, None]}, error="TimeoutError: slow")
            for t in (0, 1)},
        3: {0: TrialOutcome(trial=0, score=0.0, meta={"trial": 0, "naïve": [1, None]})}}
    engine.dispose()
