"""The Materialize hot path builds its result and aggregate events as plain dicts (``benchwright.runs.materialize``):
they must be exactly what the event models give (key, type, data and its JSON), for the records the host produces and
for odd ones a scorer could cause, which still go through the model."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.runs.materialize import _outcome, _plain, aggregated_event, result_event
from benchwright.scoring.aggregators import AggregatorConfig, TrialOutcome, aggregate, aggregator
from benchwright.scoring.host import TrialRecord
from benchwright.store.events import NewEvent, event_key

RECORDS = [
    TrialRecord(index=3, trial=0, outcome="pass", score=1.0, output="The answer is 13.",
                meta={"extracted": True, "answer": "13"}, usage={"prompt_tokens": 31, "completion_tokens": 7},
                cost_usd=0.000125, input="user: What is 3 plus 10?", duration_ms=51),
    TrialRecord(index=4, trial=2, outcome="fail", score=0, output=None, cost_usd=0),  # ints where floats are due
    TrialRecord(index=5, trial=1, outcome="err", score=None, output=None, error="solve: boom",
                meta={"trace": "x.py:1", "limit_exceeded": "attempt.duration", "attempts": 2}, duration_ms=None),
    TrialRecord(index=6, trial=0, outcome="pass", score=True, output="y",  # a bool score: coerced like the model
                meta={"nested": {"nan": math.nan, "inf": -math.inf, "tuple": (1, 2)}, "u": "ünï"}),
    TrialRecord(index=7, trial=0, outcome="pass", score=0.5, output=42, meta={})  # type: ignore[arg-type]
]


def _by_model(run_id: str, invocation: int, rec: TrialRecord) -> NewEvent:
    return NewEvent.of(event_key(run_id, "materialize", invocation, rec.index, rec.trial, "result"),
                       MaterializeTaskResult(invocation=invocation, index=rec.index, trial=rec.trial, score=rec.score,
                                             outcome=rec.outcome, output=rec.output, meta=rec.meta, error=rec.error,
                                             usage=rec.usage, cost_usd=rec.cost_usd, input=rec.input,
                                             duration_ms=rec.duration_ms))


def _same(a: NewEvent, b: NewEvent) -> None:
    assert (a.key, a.type) == (b.key, b.type)
    assert json.dumps(a.data) == json.dumps(b.data)  # the stored JSON, byte for byte (int vs float included)
    assert list(a.data) == list(b.data)


@pytest.mark.parametrize("rec", RECORDS[:-1], ids=lambda r: f"task{r.index}")
def test_a_result_event_is_the_models(rec: TrialRecord) -> None:
    _same(result_event("run-1", 2, rec), _by_model("run-1", 2, rec))


def test_a_record_the_model_refuses_is_still_refused() -> None:
    with pytest.raises(ValidationError):
        result_event("run-1", 0, RECORDS[-1])


def test_a_trial_score_out_of_range_is_still_refused() -> None:
    rec = TrialRecord(index=0, trial=0, outcome="pass", score=1.5, output=None)
    assert _plain(rec)  # plain in its types, not in its range
    with pytest.raises(ValidationError):
        _outcome(rec)


@pytest.mark.parametrize("trials", [
    [TrialOutcome(trial=1, score=0.0), TrialOutcome(trial=0, score=1.0)],
    [TrialOutcome(trial=0, error="x")],
    [TrialOutcome(trial=0, score=0.25, meta={"a": 1}), TrialOutcome(trial=1, score=0.75)],
])
@pytest.mark.parametrize("config", [{"name": "any_pass"}, {"name": "mean"}, {"name": "all_pass"}])
def test_an_aggregate_event_is_the_models(trials: list[TrialOutcome], config: dict[str, Any]) -> None:
    spec = AggregatorConfig(**config)
    row = aggregator(spec)(trials)
    assert row == aggregate(spec, trials)
    by_model = NewEvent.of(event_key("run-1", "materialize", 0, 9, "aggregated"), MaterializeTaskAggregated(
        invocation=0, index=9, score=row.score, outcome=row.outcome, trial_scores=row.trial_scores))
    _same(aggregated_event("run-1", 0, 9, row), by_model)
