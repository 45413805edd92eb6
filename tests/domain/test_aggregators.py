"""Tests for benchwright.scoring.aggregators: the six aggregators, validation, normalize_score, pass@k."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import pytest
from pydantic import ValidationError

from benchwright.errors import InvalidInput
from benchwright.scoring.aggregators import (
    AGGREGATORS,
    PASS_THRESHOLD,
    AggregatorConfig,
    RowAggregate,
    TrialOutcome,
    TrialPlan,
    TrialsConfig,
    aggregate,
    normalize_score,
    outcome_for,
    pass_at_k,
    pass_at_k_summary,
    pass_at_k_values,
    validate_trials,
)

ERR = "ERR"  # marker for an errored trial in the compact vectors below


def trials_of(*items: Any) -> list[TrialOutcome]:
    """Build trials from compact specs: a float, ERR, or a (score_or_ERR, meta) pair."""
    out = []
    for i, item in enumerate(items):
        score, meta = item if isinstance(item, tuple) else (item, {})
        if score == ERR:
            out.append(TrialOutcome(trial=i, score=None, meta=meta, error="scorer raised"))
        else:
            out.append(TrialOutcome(trial=i, score=score, meta=meta))
    return out


def agg(name: str, *items: Any, **params: Any) -> RowAggregate:
    return aggregate(AggregatorConfig(name=name, **params), trials_of(*items))


# ------------------------------------------------------------------------------------------
# Registry and config models
# ------------------------------------------------------------------------------------------


def test_registry_holds_exactly_the_six_builtins() -> None:
    assert set(AGGREGATORS) == {"any_pass", "all_pass", "mean", "majority_on", "weighted_mean", "min_above"}
    assert all(callable(a) for a in AGGREGATORS.values())


def test_defaults() -> None:
    config = TrialsConfig()
    assert config.plan.k == 1
    assert config.aggregator.name == "any_pass"
    assert validate_trials(config) == config
    assert PASS_THRESHOLD == 1.0


def test_concept_config_shape_parses_and_validates() -> None:
    body = {"plan": {"k": 3}, "aggregator": {"name": "majority_on", "field": "answer"}}
    config = validate_trials(TrialsConfig.model_validate(body))
    assert config.plan.k == 3
    assert config.aggregator.field == "answer"


@pytest.mark.parametrize("k", [0, -1, 101])
def test_k_out_of_range_is_rejected_by_the_model(k: int) -> None:
    with pytest.raises(ValidationError):
        TrialPlan(k=k)


def test_k_out_of_range_is_rejected_by_validate_trials_too() -> None:
    config = TrialsConfig(plan=TrialPlan.model_construct(k=0))
    with pytest.raises(InvalidInput, match="1 to 100"):
        validate_trials(config)


@pytest.mark.parametrize(
    "body",
    [
        {"plan": {"k": 2, "n": 3}},
        {"aggregator": {"name": "mean", "bogus": 1}},
        {"extra": True},
    ],
)
def test_unknown_keys_are_forbidden(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TrialsConfig.model_validate(body)


# ------------------------------------------------------------------------------------------
# The concept's example: 0, 0, 1, 0, 1
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "score", "outcome"),
    [
        ("any_pass", 1.0, "pass"),
        ("all_pass", 0.0, "fail"),
        ("mean", 0.4, "fail"),
    ],
)
def test_concept_example(name: str, score: float, outcome: str) -> None:
    row = agg(name, 0.0, 0.0, 1.0, 0.0, 1.0)
    assert row.score == pytest.approx(score)
    assert row.outcome == outcome
    assert row.trial_scores == [0.0, 0.0, 1.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------------
# Per-aggregator tables (score, outcome)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "score", "outcome"),
    [
        ((1.0,), 1.0, "pass"),
        ((0.0,), 0.0, "fail"),
        ((0.2, 0.7, 0.5), 0.7, "fail"),
        ((0.0, 1.0, 0.0), 1.0, "pass"),
        ((ERR, 1.0, ERR), 1.0, "pass"),  # errored trials are ignored
        ((ERR, 0.3), 0.3, "fail"),
        ((0.99999, 0.5), 0.99999, "fail"),  # no tolerance on the threshold
    ],
)
def test_any_pass(items: tuple[Any, ...], score: float, outcome: str) -> None:
    row = agg("any_pass", *items)
    assert row.score == pytest.approx(score)
    assert row.outcome == outcome


@pytest.mark.parametrize(
    ("items", "score", "outcome"),
    [
        ((1.0, 1.0, 1.0), 1.0, "pass"),
        ((1.0,), 1.0, "pass"),
        ((1.0, 0.9, 1.0), 0.0, "fail"),  # collapses to 0/1
        ((0.5, 0.5), 0.0, "fail"),
        ((1.0, ERR, 1.0), 0.0, "fail"),  # an errored trial cannot count as passed
        ((ERR, 1.0), 0.0, "fail"),
    ],
)
def test_all_pass(items: tuple[Any, ...], score: float, outcome: str) -> None:
    row = agg("all_pass", *items)
    assert row.score == score
    assert row.outcome == outcome


@pytest.mark.parametrize(
    ("items", "score", "outcome"),
    [
        ((1.0, 1.0, 1.0), 1.0, "pass"),
        ((0.5, 1.0), 0.75, "fail"),
        ((0.1, 0.2, 0.3), 0.2, "fail"),
        ((ERR, 0.5, 1.0), 0.75, "fail"),  # errored trial excluded from the denominator
        ((1.0, ERR, 1.0), 1.0, "pass"),
        ((0.1,) * 10, 0.1, "fail"),
    ],
)
def test_mean(items: tuple[Any, ...], score: float, outcome: str) -> None:
    row = agg("mean", *items)
    assert row.score == pytest.approx(score)
    assert row.outcome == outcome


def test_mean_of_all_passing_trials_is_exactly_one() -> None:
    row = agg("mean", *([1.0] * 100))
    assert row.score == 1.0
    assert row.outcome == "pass"


def _a(answer: Any, score: float) -> tuple[float, dict[str, Any]]:
    return (score, {"answer": answer})


@pytest.mark.parametrize(
    ("items", "score", "outcome"),
    [
        # clear majority
        ((_a("B", 0.0), _a("A", 1.0), _a("A", 1.0)), 1.0, "pass"),
        ((_a("A", 1.0), _a("B", 0.0), _a("B", 0.0)), 0.0, "fail"),
        # 2-2 tie: "B" appears first (trial 0), so it wins
        ((_a("B", 0.0), _a("A", 1.0), _a("A", 1.0), _a("B", 0.0)), 0.0, "fail"),
        ((_a("A", 1.0), _a("B", 0.0), _a("B", 0.0), _a("A", 1.0)), 1.0, "pass"),
        # all distinct: first trial's value wins
        ((_a("X", 0.3), _a("Y", 1.0), _a("Z", 0.0)), 0.3, "fail"),
        # same winning value, different scores: the earliest carrier's score
        ((_a("A", 0.4), _a("A", 1.0), _a("B", 1.0)), 0.4, "fail"),
        ((_a("B", 0.0), _a("A", 1.0), _a("A", 0.2)), 1.0, "pass"),
        # trials without the field abstain
        (((1.0, {}), _a("A", 0.0), (1.0, {"answer": None})), 0.0, "fail"),
        # errored trials do not vote, even with the field present
        (((ERR, {"answer": "B"}), (ERR, {"answer": "B"}), _a("A", 1.0)), 1.0, "pass"),
        # 1 and 1.0 agree; True does not join them
        ((_a(True, 0.0), _a(1, 1.0), _a(1.0, 0.5)), 1.0, "pass"),
        # unhashable values vote by canonical JSON
        ((_a([1, 2], 0.0), _a({"x": 1}, 1.0), _a({"x": 1}, 1.0)), 1.0, "pass"),
    ],
)
def test_majority_on(items: tuple[Any, ...], score: float, outcome: str) -> None:
    row = agg("majority_on", *items, field="answer")
    assert row.score == pytest.approx(score)
    assert row.outcome == outcome


def test_majority_on_tie_break_uses_trial_index_not_list_order() -> None:
    trials = [
        TrialOutcome(trial=3, score=1.0, meta={"answer": "A"}),
        TrialOutcome(trial=0, score=0.0, meta={"answer": "B"}),
        TrialOutcome(trial=2, score=1.0, meta={"answer": "A"}),
        TrialOutcome(trial=1, score=0.0, meta={"answer": "B"}),
    ]
    config = AggregatorConfig(name="majority_on", field="answer")
    row = aggregate(config, trials)
    assert row.score == 0.0  # "B" first occurs at trial 0
    assert row.trial_scores == [0.0, 0.0, 1.0, 1.0]  # ordered by trial index
    assert aggregate(config, list(reversed(trials))) == row


def test_majority_on_with_no_trial_carrying_the_field_is_err() -> None:
    row = agg("majority_on", (1.0, {"other": "A"}), (0.0, {}), field="answer")
    assert row.score is None
    assert row.outcome == "err"
    assert row.trial_scores == [1.0, 0.0]
    assert row.error is not None and "answer" in row.error


def _w(weight: Any, score: float) -> tuple[float, dict[str, Any]]:
    return (score, {"w": weight})


@pytest.mark.parametrize(
    ("items", "score", "outcome"),
    [
        ((_w(1, 1.0), _w(1, 0.0)), 0.5, "fail"),
        ((_w(3, 1.0), _w(1, 0.0)), 0.75, "fail"),
        ((_w(0.5, 0.2), _w(1.5, 0.6)), 0.5, "fail"),
        ((_w(2, 1.0), _w(5, 1.0)), 1.0, "pass"),
        # a zero weight drops the trial from the weighted mean
        ((_w(0, 0.0), _w(2, 1.0)), 1.0, "pass"),
        # a missing weight counts as zero
        (((0.0, {}), _w(1, 0.6)), 0.6, "fail"),
        # all weights zero or missing -> plain mean of those trials
        ((_w(0, 1.0), _w(0, 0.0)), 0.5, "fail"),
        (((1.0, {}), (0.5, {}), (0.0, {"w": None})), 0.5, "fail"),
        ((_w(0, 1.0), (1.0, {})), 1.0, "pass"),
        # negative / non-numeric / non-finite weights: that trial is treated as errored
        ((_w(-1, 0.0), _w(1, 1.0)), 1.0, "pass"),
        ((_w("heavy", 0.0), _w(1, 0.4)), 0.4, "fail"),
        ((_w(True, 0.0), _w(1, 0.4)), 0.4, "fail"),
        ((_w(float("nan"), 0.0), _w(1, 0.4)), 0.4, "fail"),
        ((_w(float("inf"), 0.0), _w(1, 0.4)), 0.4, "fail"),
        # errored trials excluded
        (((ERR, {"w": 10}), _w(1, 0.3)), 0.3, "fail"),
    ],
)
def test_weighted_mean(items: tuple[Any, ...], score: float, outcome: str) -> None:
    row = agg("weighted_mean", *items, weight="w")
    assert row.score == pytest.approx(score)
    assert row.outcome == outcome


def test_weighted_mean_with_only_invalid_weights_is_err() -> None:
    row = agg("weighted_mean", _w(-1, 1.0), _w("x", 1.0), weight="w")
    assert row.score is None
    assert row.outcome == "err"
    assert row.trial_scores == [1.0, 1.0]


def _c(conf: Any, score: float) -> tuple[float, dict[str, Any]]:
    return (score, {"conf": conf})


@pytest.mark.parametrize(
    ("items", "score", "outcome"),
    [
        ((_c(0.9, 1.0), _c(0.2, 0.0)), 1.0, "pass"),
        # the passing trial is not confident enough: it does not count
        ((_c(0.3, 1.0), _c(0.9, 0.0)), 0.0, "fail"),
        # strictly above: equal to the threshold does not qualify
        ((_c(0.8, 1.0), _c(0.81, 0.4)), 0.4, "fail"),
        # best qualifying score, like any_pass
        ((_c(0.9, 0.3), _c(0.95, 0.6), _c(0.1, 1.0)), 0.6, "fail"),
        # none qualifies -> 0.0 fail
        ((_c(0.1, 1.0), _c(0.5, 1.0)), 0.0, "fail"),
        # missing / non-numeric confidence disqualifies
        (((1.0, {}), _c("high", 1.0), _c(True, 1.0), _c(None, 1.0)), 0.0, "fail"),
        # errored trials excluded even if confident
        (((ERR, {"conf": 0.99}), _c(0.9, 1.0)), 1.0, "pass"),
        (((ERR, {"conf": 0.99}), _c(0.1, 1.0)), 0.0, "fail"),
    ],
)
def test_min_above(items: tuple[Any, ...], score: float, outcome: str) -> None:
    row = agg("min_above", *items, field="conf", threshold=0.8)
    assert row.score == pytest.approx(score)
    assert row.outcome == outcome


def test_min_above_accepts_an_int_threshold() -> None:
    row = agg("min_above", _c(2, 1.0), _c(1, 0.0), field="conf", threshold=1)
    assert row.score == 1.0


# ------------------------------------------------------------------------------------------
# Uniform error policy
# ------------------------------------------------------------------------------------------

_PARAMS: dict[str, dict[str, Any]] = {
    "any_pass": {},
    "all_pass": {},
    "mean": {},
    "majority_on": {"field": "answer"},
    "weighted_mean": {"weight": "w"},
    "min_above": {"field": "conf", "threshold": 0.5},
}


@pytest.mark.parametrize("name", list(_PARAMS))
def test_all_trials_errored_is_err(name: str) -> None:
    meta = {"answer": "A", "w": 1, "conf": 0.9}
    row = agg(name, (ERR, meta), (ERR, meta), (ERR, meta), **_PARAMS[name])
    assert row == RowAggregate(score=None, outcome="err", trial_scores=[None, None, None], error=row.error)
    assert row.error == "every trial errored"


@pytest.mark.parametrize("name", list(_PARAMS))
def test_no_trials_is_err(name: str) -> None:
    row = agg(name, **_PARAMS[name])
    assert (row.score, row.outcome, row.trial_scores) == (None, "err", [])


@pytest.mark.parametrize("name", list(_PARAMS))
def test_a_trial_with_an_error_and_a_score_counts_as_errored(name: str) -> None:
    meta = {"answer": "A", "w": 1, "conf": 0.9}
    trials = [
        TrialOutcome(trial=0, score=1.0, meta=meta, error="model call failed"),
        TrialOutcome(trial=1, score=0.25, meta=meta),
    ]
    row = aggregate(AggregatorConfig(name=name, **_PARAMS[name]), trials)
    assert row.trial_scores == [None, 0.25]
    assert row.score == (0.0 if name == "all_pass" else 0.25)


@pytest.mark.parametrize("name", list(_PARAMS))
def test_single_trial_passes_through(name: str) -> None:
    meta = {"answer": "A", "w": 1, "conf": 0.9}
    assert agg(name, (1.0, meta), **_PARAMS[name]).outcome == "pass"
    expected = 0.0 if name == "all_pass" else 0.6
    assert agg(name, (0.6, meta), **_PARAMS[name]).score == pytest.approx(expected)


def test_aggregate_rejects_an_invalid_config() -> None:
    with pytest.raises(InvalidInput):
        aggregate(AggregatorConfig(name="majority_on"), trials_of(1.0))


def test_trial_outcome_score_must_be_in_range() -> None:
    with pytest.raises(ValidationError):
        TrialOutcome(trial=0, score=1.5)
    with pytest.raises(ValidationError):
        TrialOutcome(trial=0, score=float("nan"))


@pytest.mark.parametrize(
    ("score", "outcome"),
    [(None, "err"), (0.0, "fail"), (0.999999, "fail"), (1.0, "pass"), (1.5, "pass")],
)
def test_outcome_for(score: float | None, outcome: str) -> None:
    assert outcome_for(score) == outcome


# ------------------------------------------------------------------------------------------
# validate_trials
# ------------------------------------------------------------------------------------------


def _trials(**aggregator: Any) -> TrialsConfig:
    return TrialsConfig(aggregator=AggregatorConfig(**aggregator))


@pytest.mark.parametrize(("name", "params"), list(_PARAMS.items()))
def test_valid_configs_pass_validation(name: str, params: dict[str, Any]) -> None:
    config = _trials(name=name, **params)
    assert validate_trials(config).aggregator.name == name


def test_typo_suggests_the_closest_name_and_lists_all() -> None:
    with pytest.raises(InvalidInput) as exc:
        validate_trials(_trials(name="any_pas"))
    message = str(exc.value)
    assert "'any_pas'" in message
    assert "did you mean 'any_pass'" in message
    for name in AGGREGATORS:
        assert name in message


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [("wieghted_mean", "weighted_mean"), ("MEAN", "mean"), ("majority", "majority_on")],
)
def test_other_typos_suggest(typo: str, suggestion: str) -> None:
    with pytest.raises(InvalidInput, match=f"did you mean '{suggestion}'"):
        validate_trials(_trials(name=typo))


def test_unrelated_name_has_no_suggestion() -> None:
    with pytest.raises(InvalidInput) as exc:
        validate_trials(_trials(name="zzzzzz"))
    assert "did you mean" not in str(exc.value)
    assert "allowed: any_pass, all_pass, mean, majority_on, weighted_mean, min_above" in str(exc.value)


@pytest.mark.parametrize(
    ("aggregator", "expected"),
    [
        ({"name": "majority_on"}, "aggregator majority_on needs 'field'"),
        ({"name": "weighted_mean"}, "aggregator weighted_mean needs 'weight'"),
        ({"name": "min_above", "threshold": 0.5}, "aggregator min_above needs 'field'"),
        ({"name": "min_above", "field": "conf"}, "aggregator min_above needs 'threshold'"),
    ],
)
def test_missing_params(aggregator: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidInput, match=expected):
        validate_trials(_trials(**aggregator))


@pytest.mark.parametrize(
    ("aggregator", "expected"),
    [
        (
            {"name": "any_pass", "field": "x"},
            "aggregator any_pass does not take 'field' \\(it takes no parameters\\)",
        ),
        ({"name": "mean", "threshold": 0.5}, "aggregator mean does not take 'threshold'"),
        ({"name": "all_pass", "weight": "w"}, "aggregator all_pass does not take 'weight'"),
        (
            {"name": "majority_on", "field": "a", "weight": "w"},
            "does not take 'weight' \\(it takes 'field'\\)",
        ),
        ({"name": "min_above", "field": "c", "threshold": 1, "weight": "w"}, "it takes 'field', 'threshold'"),
    ],
)
def test_extra_params(aggregator: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidInput, match=expected):
        validate_trials(_trials(**aggregator))


@pytest.mark.parametrize("threshold", ["high", "0.5", True, float("nan"), float("inf"), [0.5]])
def test_threshold_must_be_a_finite_number(threshold: Any) -> None:
    with pytest.raises(InvalidInput, match="'threshold' must be a finite number"):
        validate_trials(_trials(name="min_above", field="conf", threshold=threshold))


def test_threshold_is_normalized_to_float() -> None:
    config = validate_trials(_trials(name="min_above", field="conf", threshold=1))
    assert isinstance(config.aggregator.threshold, float)


@pytest.mark.parametrize(("name", "param"), [("majority_on", "field"), ("weighted_mean", "weight")])
def test_empty_key_params_are_rejected(name: str, param: str) -> None:
    with pytest.raises(InvalidInput, match="non-empty"):
        validate_trials(_trials(name=name, **{param: "  "}))


# ------------------------------------------------------------------------------------------
# normalize_score
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, (0.0, {})),
        (1, (1.0, {})),
        (0.25, (0.25, {})),
        (True, (1.0, {})),
        (False, (0.0, {})),
        (Fraction(1, 4), (0.25, {})),
        ({"score": 0.5}, (0.5, {})),
        ({"score": 1, "answer": "A", "conf": 0.9}, (1.0, {"answer": "A", "conf": 0.9})),
        ({"score": True, "why": None}, (1.0, {"why": None})),
    ],
)
def test_normalize_score_accepts(value: Any, expected: tuple[float, dict[str, Any]]) -> None:
    score, meta = normalize_score(value)
    assert (score, meta) == expected
    assert type(score) is float


def test_normalize_score_does_not_alias_the_input_dict() -> None:
    value = {"score": 0.5, "answer": "A"}
    _, meta = normalize_score(value)
    meta["answer"] = "B"
    assert value["answer"] == "A"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), "NaN"),
        ({"score": float("nan")}, "NaN"),
        (1.5, "out of range"),
        (-0.1, "out of range"),
        (float("inf"), "out of range"),
        ({"score": 2}, "out of range"),
        ({"answer": "A"}, "without a 'score' key"),
        ({}, "without a 'score' key"),
        ({"score": None}, "must be a number"),
        ({"score": "0.5"}, "must be a number"),
        ("1.0", "scorer must return a number"),
        (None, "scorer must return a number"),
        ([1.0], "scorer must return a number"),
        ({"score": 1, 3: "x"}, "not a string"),
    ],
)
def test_normalize_score_rejects(value: Any, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        normalize_score(value)


def test_normalize_score_round_trips_into_aggregation() -> None:
    returns = [{"score": 0.0, "answer": "B"}, {"score": 1.0, "answer": "A"}, {"score": 1, "answer": "A"}]
    trials = []
    for i, value in enumerate(returns):
        score, meta = normalize_score(value)
        trials.append(TrialOutcome(trial=i, score=score, meta=meta))
    row = aggregate(AggregatorConfig(name="majority_on", field="answer"), trials)
    assert (row.score, row.outcome) == (1.0, "pass")


# ------------------------------------------------------------------------------------------
# pass@k
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (5, 5, 5, 1.0),
        (5, 3, 3, 1.0),  # k > n - c: every draw of 3 contains a pass
        (5, 2, 4, 1.0),
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 1, 1, 0.1),
        (10, 1, 5, 0.5),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_known_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def _brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n trials (the first c passing) that contain a pass."""
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(1 for s in subsets if any(i < c for i in s))
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_brute_force(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = _brute_force_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12), (n, c, k)
            assert float(1 - Fraction(math.comb(n - c, k), math.comb(n, k))) == pytest.approx(float(expected))


def test_pass_at_k_is_stable_for_large_n() -> None:
    value = pass_at_k(1000, 10, 100)
    exact = 1 - Fraction(math.comb(990, 100), math.comb(1000, 100))
    assert value == pytest.approx(float(exact), rel=1e-12)
    assert 0.0 <= pass_at_k(100_000, 1, 1) <= 1.0


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(5, 2, 0), (5, 6, 1), (5, -1, 1), (3, 1, 4), (0, 0, 1), (5.0, 2, 1), (5, 2, True)],
)
def test_pass_at_k_rejects_bad_arguments(n: Any, c: Any, k: Any) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_summary_averages_qualifying_tasks() -> None:
    per_task = [(5, 2), (5, 0), (5, 5), (2, 2)]  # the last has n < k and is excluded
    assert pass_at_k_summary(per_task, 3) == pytest.approx((pass_at_k(5, 2, 3) + 0.0 + 1.0) / 3)
    assert pass_at_k_summary(per_task, 1) == pytest.approx((0.4 + 0.0 + 1.0 + 1.0) / 4)


@pytest.mark.parametrize(("per_task", "k"), [([], 1), ([(1, 1), (2, 0)], 3)])
def test_pass_at_k_summary_none_when_no_task_qualifies(per_task: list[tuple[int, int]], k: int) -> None:
    assert pass_at_k_summary(per_task, k) is None


def test_pass_at_k_summary_of_many_tasks_is_exactly_each_tasks_estimate_averaged() -> None:
    """pass_at_k_values computes each distinct (n, c) once (a finished run's first read); the summary is still the
    correctly rounded mean of every task's own estimate, bit for bit."""
    import random

    rng = random.Random(7)
    per_task = [(n, rng.randint(0, n)) for n in (rng.choice((1, 3, 5, 10)) for _ in range(5000))]
    for k in (1, 3, 5):
        one_by_one = [pass_at_k(n, c, k) for n, c in per_task if n >= k]
        assert pass_at_k_values(per_task, k) == one_by_one
        assert pass_at_k_summary(per_task, k) == math.fsum(one_by_one) / len(one_by_one)


@pytest.mark.parametrize("bad", [(True, 1), (5, 2.0), (5.0, 2)])
def test_pass_at_k_values_checks_a_count_that_is_not_an_int_even_after_its_equal_int(bad: tuple[Any, Any]) -> None:
    """(True, 1) == (1, 1): a memo keyed on the pair alone would answer it from the int's entry unchecked."""
    with pytest.raises(ValueError):
        pass_at_k_values([(1, 1), (5, 2), bad], 1)


def test_pass_at_k_summary_rejects_bad_k() -> None:
    with pytest.raises(ValueError):
        pass_at_k_summary([(5, 1)], 0)


def test_any_pass_rows_agree_with_pass_at_n() -> None:
    """With k = n, pass@k of a task equals whether any_pass marked the row pass."""
    vectors = [(0.0, 0.0, 1.0, 0.0, 1.0), (0.0, 0.0, 0.0), (1.0, 1.0), (0.5, 1.0, 0.2)]
    for vector in vectors:
        row = agg("any_pass", *vector)
        c = sum(1 for s in vector if s >= PASS_THRESHOLD)
        assert (row.outcome == "pass") == (pass_at_k(len(vector), c, len(vector)) == 1.0)
