"""Trial aggregation: reduce the k trials of one task into one per-task score.

Materialize runs ``k`` trials per task (``TrialsConfig.plan.k``). Each trial either produced a
score in [0, 1] (plus optional ``score_meta``) or errored (the scorer raised, the model call
failed). An aggregator (``TrialsConfig.aggregator``) turns those trials into one ``RowAggregate``.

Uniform error policy (every aggregator):

* A trial is *errored* when its ``error`` is set or its ``score`` is ``None``. An errored trial's
  score is ignored even if one is present, and it appears as ``None`` in ``trial_scores``.
* Errored trials are excluded from aggregation. The one exception is ``all_pass``: an errored
  trial did not pass, so it stops the row from passing (the row fails with score 0.0).
* If no trial is scored (every trial errored, or the list is empty), the row is ``err`` with
  score ``None``.
* An aggregator that has scored trials but cannot use any of them (``majority_on`` when no trial
  carries the field, ``weighted_mean`` when every scored trial has an invalid weight) also makes
  the row ``err``; ``RowAggregate.error`` says why.

Trials are ordered by their ``trial`` index before aggregation, so results never depend on the
order the trials finished in. ``trial_scores`` follows that order.

Outcomes: ``pass`` if the aggregated score is >= ``PASS_THRESHOLD`` (1.0, no tolerance), ``fail``
if it is lower, ``err`` if the row could not be scored.

This module is pure: it imports only the standard library, pydantic and ``benchwright.errors``.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from benchwright.errors import InvalidInput

PASS_THRESHOLD = 1.0
"""A score at or above this is a pass. With it, ``any_pass`` over k trials is pass@k."""

MIN_K = 1
MAX_K = 100

Outcome = Literal["pass", "fail", "err"]


# --------------------------------------------------------------------------------------------
# Configuration models
# --------------------------------------------------------------------------------------------


class TrialPlan(BaseModel):
    """How many trials to run per task."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(default=1, ge=MIN_K, le=MAX_K, description="Trials per task, 1 to 100.")


class AggregatorConfig(BaseModel):
    """Which aggregator reduces a task's trials, and its parameters.

    The parameters are typed loosely on purpose: ``validate_trials`` is the single authority on
    which aggregator takes which parameter and of what type, and reports problems as
    ``InvalidInput`` (an HTTP 400) with the allowed values.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="any_pass", description="One of the names in AGGREGATORS.")
    field: str | None = Field(
        default=None, description="score_meta key (majority_on: value voted on; min_above: confidence)."
    )
    weight: str | None = Field(default=None, description="score_meta key holding the weight (weighted_mean).")
    threshold: Any = Field(
        default=None, description="min_above: a trial counts only if score_meta.<field> > threshold."
    )


class TrialsConfig(BaseModel):
    """The launch body's ``trials`` field, e.g.
    ``{"plan": {"k": 3}, "aggregator": {"name": "majority_on", "field": "answer"}}``."""

    model_config = ConfigDict(extra="forbid")

    plan: TrialPlan = Field(default_factory=TrialPlan)
    aggregator: AggregatorConfig = Field(default_factory=AggregatorConfig)


class TrialOutcome(BaseModel):
    """One trial of one task: its score and score_meta, or the error that prevented scoring."""

    trial: int = Field(ge=0, description="0-based trial index within the task.")
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    meta: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None

    @property
    def errored(self) -> bool:
        """True if this trial has no usable score (it errored or was never scored)."""
        return self.error is not None or self.score is None


class RowAggregate(BaseModel):
    """The aggregated result of one task's trials."""

    score: float | None
    outcome: Outcome
    trial_scores: list[float | None] = Field(
        description="Per-trial scores ordered by trial index; None for errored trials."
    )
    error: str | None = Field(default=None, description="Why the row is 'err', when it is.")


# --------------------------------------------------------------------------------------------
# Reducers
# --------------------------------------------------------------------------------------------


class _Unscorable(Exception):
    """Raised by a reducer when it has trials but cannot derive a score from them."""


Reduce = Callable[[AggregatorConfig, list[TrialOutcome]], float]


@dataclass(frozen=True)
class Aggregator:
    """A registered aggregator: its name, the parameters it requires, and its reducer.

    Calling it runs the reducer: ``AGGREGATORS["mean"](config, trials) -> float``. The reducer
    receives every trial of the row (errored ones included) sorted by trial index, and at least
    one of them is scored; ``aggregate`` handles the all-errored case before calling it.
    """

    name: str
    params: tuple[str, ...]
    reduce: Reduce
    description: str

    def __call__(self, config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
        return self.reduce(config, trials)


def _scored(trials: list[TrialOutcome]) -> list[TrialOutcome]:
    return [t for t in trials if not t.errored]


def _is_number(value: Any) -> bool:
    """A finite real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _any_pass(config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
    """Best scored trial's score.

    With the pass threshold at 1.0 this is exact pass@k: the row passes iff some trial passed.
    Errored trials are ignored.
    """
    return max(t.score for t in _scored(trials) if t.score is not None)


def _all_pass(config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
    """1.0 if every trial passed, else 0.0.

    Edge-case policy: an errored trial counts as not passed, so one errored trial makes the row
    fail (0.0) even if every other trial passed. "Every trial passed" cannot be claimed for a
    trial with no result; excluding it instead would let a row with one pass and four errors
    report a perfect all_pass. (If *every* trial errored the row is ``err``, as for all
    aggregators.)
    """
    every_passed = all(not t.errored and t.score >= PASS_THRESHOLD for t in trials)  # type: ignore[operator]
    return 1.0 if every_passed else 0.0


def _mean(config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
    """Arithmetic mean of the scored trials' scores; errored trials are ignored."""
    scores = [t.score for t in _scored(trials)]
    return _clamp(math.fsum(scores) / len(scores))  # type: ignore[arg-type]


def _vote_key(value: Any) -> Any:
    """A hashable key under which equal ``score_meta`` values vote together.

    Values compare with Python equality (so 1 and 1.0 agree), except that bools are kept apart
    from numbers (True is not the answer 1). Unhashable values (lists, dicts) compare by their
    canonical JSON form.
    """
    if isinstance(value, bool):
        return ("bool", value)
    try:
        hash(value)
    except TypeError:
        return ("json", json.dumps(value, sort_keys=True, default=repr))
    return ("value", value)


def _abstains(meta: Mapping[str, Any], field: str) -> bool:
    value = meta.get(field)
    return value is None or (isinstance(value, float) and math.isnan(value))


def _majority_on(config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
    """Score of the trial whose ``score_meta.<field>`` is the modal value (self-consistency).

    Edge-case policy:

    * Only scored trials vote. A trial whose meta lacks the field (or has it as None/NaN)
      abstains.
    * Ties between modal values are broken by first occurrence: the tied value seen at the
      lowest trial index wins.
    * Trials carrying the winning value may have different scores; the row takes the score of
      the earliest (lowest trial index) trial carrying it, so the score is always one a real
      trial earned and never depends on completion order.
    * If no scored trial carries the field, nothing was voted on and the row is ``err``. This is
      almost always a misconfigured field name; a silent 0.0 would hide it.
    """
    field = config.field or ""
    counts: dict[Any, int] = {}
    first: dict[Any, TrialOutcome] = {}
    for t in _scored(trials):
        if _abstains(t.meta, field):
            continue
        key = _vote_key(t.meta[field])
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, t)
    if not counts:
        raise _Unscorable(f"majority_on: no scored trial has score_meta.{field}")
    # dicts keep insertion order (= first occurrence by trial index); max() returns the first
    # maximal key, which is exactly the tie-break rule.
    winner = max(counts, key=counts.__getitem__)
    return first[winner].score  # type: ignore[return-value]


def _weighted_mean(config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
    """``sum(score * w) / sum(w)`` with ``w = score_meta.<weight>``.

    Edge-case policy:

    * A missing weight (key absent or None) is a weight of 0: the trial is present but does not
      count.
    * A negative, non-finite or non-numeric weight (including bools and numeric strings) is
      treated as an error of that trial: the trial is excluded like an errored trial. If that
      leaves no trial, the row is ``err``.
    * If every remaining weight is zero (or missing), the row takes the plain mean of those
      trials' scores. All-equal weights mean "no trial matters more than another", whose limit
      is the plain mean; scoring 0 instead would turn a scorer that forgot to emit weights into
      a silent 0% benchmark.
    """
    key = config.weight or ""
    pairs: list[tuple[float, float]] = []
    for t in _scored(trials):
        raw = t.meta.get(key)
        if raw is None:
            pairs.append((t.score, 0.0))  # type: ignore[arg-type]
        elif _is_number(raw) and raw >= 0:
            pairs.append((t.score, float(raw)))  # type: ignore[arg-type]
        # else: invalid weight -> this trial is treated as errored and skipped.
    if not pairs:
        raise _Unscorable(f"weighted_mean: no scored trial has a valid score_meta.{key} (>= 0 number)")
    total_weight = math.fsum(w for _, w in pairs)
    if total_weight == 0.0:
        return _clamp(math.fsum(s for s, _ in pairs) / len(pairs))
    return _clamp(math.fsum(s * w for s, w in pairs) / total_weight)


def _min_above(config: AggregatorConfig, trials: list[TrialOutcome]) -> float:
    """any_pass over the trials whose ``score_meta.<field>`` is strictly above ``threshold``.

    "The row passes if any high-confidence trial passed." The row score is the best qualifying
    trial's score.

    Edge-case policy:

    * Only scored trials whose field is a finite number (not a bool, not a numeric string)
      strictly greater than the threshold qualify; a missing or non-numeric field disqualifies
      the trial.
    * If no trial qualifies, the row scores 0.0 (fail): no confident trial vouched for the row.
      (If every trial errored, the row is ``err`` as for all aggregators.)
    """
    field = config.field or ""
    threshold = float(config.threshold)
    qualifying = [
        t.score for t in _scored(trials)
        if t.score is not None and _is_number(t.meta.get(field)) and t.meta[field] > threshold
    ]
    return max(qualifying) if qualifying else 0.0


def _clamp(score: float) -> float:
    """Guard against float rounding pushing a reduced score an ulp outside [0, 1]."""
    return min(1.0, max(0.0, score))


AGGREGATORS: dict[str, Aggregator] = {
    a.name: a
    for a in (
        Aggregator("any_pass", (), _any_pass, "best trial's score (pass@k)"),
        Aggregator("all_pass", (), _all_pass, "1.0 only if every trial passed, else 0.0"),
        Aggregator("mean", (), _mean, "arithmetic mean of trial scores"),
        Aggregator("majority_on", ("field",), _majority_on, "score of the modal score_meta.<field> value"),
        Aggregator("weighted_mean", ("weight",), _weighted_mean, "mean weighted by score_meta.<weight>"),
        Aggregator(
            "min_above",
            ("field", "threshold"),
            _min_above,
            "any_pass over trials with score_meta.<field> > threshold",
        ),
    )
}
"""The registry: the one place aggregator names and their parameters live."""

_ALL_PARAMS: tuple[str, ...] = ("field", "weight", "threshold")


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _validate_aggregator(config: AggregatorConfig) -> AggregatorConfig:
    """Check an aggregator config; return a normalized copy (threshold as float)."""
    names = list(AGGREGATORS)
    spec = AGGREGATORS.get(config.name)
    if spec is None:
        message = f"unknown aggregator {config.name!r}"
        close = difflib.get_close_matches(str(config.name).strip().lower(), names, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        raise InvalidInput(f"{message} (allowed: {', '.join(names)})")

    takes = ", ".join(repr(p) for p in spec.params) if spec.params else "no parameters"
    for param in _ALL_PARAMS:
        present = getattr(config, param) is not None
        if param in spec.params and not present:
            raise InvalidInput(f"aggregator {spec.name} needs {param!r} (it takes {takes})")
        if param not in spec.params and present:
            raise InvalidInput(f"aggregator {spec.name} does not take {param!r} (it takes {takes})")

    for param in ("field", "weight"):
        value = getattr(config, param)
        if value is not None and not value.strip():
            raise InvalidInput(f"aggregator {spec.name}: {param!r} must be a non-empty score_meta key")

    if config.threshold is not None:
        if not _is_number(config.threshold):
            raise InvalidInput(
                f"aggregator {spec.name}: 'threshold' must be a finite number, got {config.threshold!r}"
            )
        return config.model_copy(update={"threshold": float(config.threshold)})
    return config


def validate_trials(config: TrialsConfig) -> TrialsConfig:
    """Check a trials config beyond what the pydantic models enforce.

    Args:
        config: The launch body's ``trials`` value.

    Returns:
        A normalized copy (``threshold`` coerced to float); otherwise equal to ``config``.

    Raises:
        InvalidInput: With a message naming the problem and the allowed values: ``k`` outside
            1..100, an unknown aggregator name (lists the six names and suggests the closest one
            for a typo), a missing required parameter, a parameter the aggregator does not take,
            an empty ``field``/``weight``, or a ``threshold`` that is not a finite number.
    """
    k = config.plan.k
    if isinstance(k, bool) or not isinstance(k, int) or not MIN_K <= k <= MAX_K:
        raise InvalidInput(f"trials.plan.k must be an integer from {MIN_K} to {MAX_K}, got {k!r}")
    aggregator = _validate_aggregator(config.aggregator)
    return config.model_copy(update={"aggregator": aggregator})


# --------------------------------------------------------------------------------------------
# Scores and outcomes
# --------------------------------------------------------------------------------------------


def outcome_for(score: float | None) -> Outcome:
    """Bucket an aggregated score.

    Args:
        score: The row's aggregated score, or None if it could not be scored.

    Returns:
        ``"err"`` for None, ``"pass"`` for a score >= ``PASS_THRESHOLD`` (no tolerance),
        ``"fail"`` otherwise.
    """
    if score is None:
        return "err"
    return "pass" if score >= PASS_THRESHOLD else "fail"


def _check_score(value: Any, where: str) -> float:
    if type(value) is not float and type(value) is not int:  # what JSON gives: no ABC check on the hot path
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if not isinstance(value, numbers.Real):
            got = f"{type(value).__name__} {value!r}"
            raise ValueError(f"{where} must be a number in [0, 1] or a bool, got {got}")
    score = float(value)
    if math.isnan(score):
        raise ValueError(f"{where} is NaN; expected a number in [0, 1]")
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"{where} {score!r} is out of range; expected a number in [0, 1]")
    return score


def normalize_score(value: Any) -> tuple[float, dict[str, Any]]:
    """Turn a scorer's ``score()`` return value into ``(score, score_meta)``.

    Args:
        value: A number in [0, 1] (int, float or any real number type), a bool (True -> 1.0,
            False -> 0.0), or a mapping whose ``score`` key holds such a value; the mapping's
            other keys (which must be strings) become ``score_meta``.

    Returns:
        The score as a float in [0, 1] and the score_meta dict (empty for a bare number).

    Raises:
        ValueError: Saying which problem: the value is neither a number nor a mapping, the
            mapping has no ``score`` key, the score is non-numeric (e.g. None or a string),
            NaN, or outside [0, 1], or a score_meta key is not a string.
    """
    if type(value) is float or type(value) is int:  # a bare number, as JSON gives it: the common case, first
        return _check_score(value, "scorer score"), {}
    if type(value) is dict or isinstance(value, Mapping):
        if "score" not in value:
            keys = ", ".join(repr(k) for k in value) or "none"
            raise ValueError(f"scorer returned a dict without a 'score' key (keys: {keys})")
        score = _check_score(value["score"], "scorer dict 'score'")
        meta: dict[str, Any] = {}
        for key, item in value.items():
            if key == "score":
                continue
            if not isinstance(key, str):
                raise ValueError(f"scorer dict key {key!r} is not a string; score_meta keys must be strings")
            meta[key] = item
        return score, meta
    if isinstance(value, (bool, numbers.Real)):
        return _check_score(value, "scorer score"), {}
    raise ValueError(
        "scorer must return a number in [0, 1], a bool, or a dict with a numeric 'score' key; "
        f"got {type(value).__name__} {value!r}"
    )


def aggregate(config: AggregatorConfig, trials: list[TrialOutcome]) -> RowAggregate:
    """Reduce one task's trials into its row score and outcome.

    Args:
        config: The aggregator config. It is validated here too, so an unvalidated config fails
            loudly rather than mis-scoring.
        trials: The task's trials, in any order; they are sorted by ``trial`` index first.

    Returns:
        The row aggregate. ``score`` is None and ``outcome`` is ``"err"`` when no trial is
        scored, or when the aggregator cannot use any scored trial (see the module docstring
        and each reducer's docstring for the edge-case policies).

    Raises:
        InvalidInput: If ``config`` is invalid (see ``validate_trials``).
    """
    return aggregator(config)(trials)


def aggregator(config: AggregatorConfig) -> Callable[[list[TrialOutcome]], RowAggregate]:
    """``aggregate`` with ``config`` validated once, for reducing many tasks' trials (a Materialize batch validated
    the same config again for every task).

    Raises:
        InvalidInput: If ``config`` is invalid (see ``validate_trials``).
    """
    config = _validate_aggregator(config)
    reduce = AGGREGATORS[config.name]

    def apply(trials: list[TrialOutcome]) -> RowAggregate:
        return _reduce(config, reduce, trials)

    return apply


def _reduce(config: AggregatorConfig, reduce: Aggregator, trials: list[TrialOutcome]) -> RowAggregate:
    ordered = sorted(trials, key=lambda t: t.trial)
    trial_scores = [None if t.errored else t.score for t in ordered]
    if all(s is None for s in trial_scores):
        reason = "no trials" if not ordered else "every trial errored"
        return RowAggregate(score=None, outcome="err", trial_scores=trial_scores, error=reason)
    try:
        score: float | None = reduce(config, ordered)
    except _Unscorable as exc:
        return RowAggregate(score=None, outcome="err", trial_scores=trial_scores, error=str(exc))
    return RowAggregate(score=score, outcome=outcome_for(score), trial_scores=trial_scores)


# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


def _check_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return value


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021, HumanEval).

    ``1 - C(n - c, k) / C(n, k)``, computed in the stable product form
    ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (no large binomials).

    Args:
        n: Trials run for the task (n >= k).
        c: Trials that passed (0 <= c <= n).
        k: The k of pass@k (k >= 1).

    Returns:
        The probability that at least one of k trials drawn without replacement from the n
        passed: 0.0 when c == 0, 1.0 when n - c < k.

    Raises:
        ValueError: If an argument is not an int, k < 1, c is outside [0, n], or n < k.
    """
    n, c, k = _check_count(n, "n"), _check_count(c, "c"), _check_count(k, "k")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if n < k:
        raise ValueError(f"pass@{k} needs at least k trials, got n={n}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def pass_at_k_summary(per_task: list[tuple[int, int]], k: int) -> float | None:
    """Mean pass@k over tasks.

    Args:
        per_task: ``(n, c)`` per task: trials run and trials passed.
        k: The k of pass@k (k >= 1).

    Returns:
        The mean of ``pass_at_k(n, c, k)`` over tasks with ``n >= k``; tasks with fewer than k
        trials are excluded. None if no task qualifies.

    Raises:
        ValueError: If k < 1 or a qualifying task's counts are invalid (see ``pass_at_k``).
    """
    _check_count(k, "k")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return mean_of_pass_at_k(pass_at_k_values(per_task, k))


def mean_of_pass_at_k(values: list[float]) -> float | None:
    """The summary of ``pass_at_k_values``: their exact mean, None when no task qualified."""
    return math.fsum(values) / len(values) if values else None


def pass_at_k_values(per_task: list[tuple[int, int]], k: int) -> list[float]:
    """``pass_at_k(n, c, k)`` of each task with ``n >= k``, in order: computed once per distinct ``(n, c)`` (a run
    with k trials has at most (k + 1)(k + 2) / 2 of them; 10,000 tasks each computed and checked anew took ~40 ms of
    a finished run's first read). A pair that is not two ints is computed, and refused, on its own."""
    known: dict[tuple[int, int], float] = {}
    values = []
    for n, c in per_task:
        if type(n) is not int or type(c) is not int:
            if n >= k:
                values.append(pass_at_k(n, c, k))  # raises for a bool or float count, as it always did
            continue
        if n >= k:
            value = known.get((n, c))
            if value is None:
                value = known[(n, c)] = pass_at_k(n, c, k)
            values.append(value)
    return values
