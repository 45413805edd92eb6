"""The uncertainty in a run's task summary (issue 17): Wilson from counts while the run is live, the bootstrap over
tasks once it is over, computed once per finished run and kept.

``GET /v1/runs/{id}`` is polled all through a live run, so nothing here reads task rows before the run is terminal:
the pass rate's interval comes from the outcome counts run_view already has (O(1)). pass@k and the bootstrap (mean
score, pass@k) read every task row (each counts its trials: pass@k's n and c); on a terminal run the rows never
change, so the answer is cached per (run, finish time) in the process — a 10,000 x 5 run's first read costs ~45 ms
(its task rows read cold, pass@k, the bootstraps), later reads a dict lookup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, bindparam, case, func, literal_column, select
from sqlmodel import Session, col

from benchwright.comparison.stats import Estimate, bootstrap_mean, proportion_se, wilson_interval
from benchwright.schemas import ScoreEstimate
from benchwright.scoring.aggregators import mean_of_pass_at_k, pass_at_k_values
from benchwright.store.models import TaskRow, TrialResult, table_of

__all__ = ["TerminalIntervals", "pass_rate_interval", "terminal_intervals", "trial_counts"]

_CACHE_RUNS = 512
_cache: OrderedDict[tuple[str, datetime, int], TerminalIntervals] = OrderedDict()
_lock = threading.Lock()


class TerminalIntervals:
    """What a finished run's rows say beyond its outcome counts: pass@k and the bootstrap's intervals."""

    def __init__(self, mean_score: ScoreEstimate | None, pass_at_k: dict[str, float],
                 pass_at_k_ci: dict[str, tuple[float, float]]) -> None:
        self.mean_score = mean_score
        self.pass_at_k = pass_at_k
        self.pass_at_k_ci = pass_at_k_ci


def pass_rate_interval(*, passed: int, failed: int) -> tuple[float | None, tuple[float, float] | None]:
    """(standard error, Wilson 95 % interval) of passed / (passed + failed); (None, None) before any is scored."""
    ci = wilson_interval(successes=passed, n=passed + failed)
    return proportion_se(successes=passed, n=passed + failed), (ci.low, ci.high) if ci else None


def _view(estimate: Estimate | None) -> ScoreEstimate | None:
    if estimate is None:
        return None
    return ScoreEstimate(value=estimate.value, se=estimate.se, ci=(estimate.interval.low, estimate.interval.high))


_ROWS = table_of(TaskRow)
_COUNTS_AND_SCORES = (select(_ROWS.c.trials_scored, _ROWS.c.trials_passed, _ROWS.c.outcome, _ROWS.c.score)
                      .where(_ROWS.c.run_id == bindparam("run_id_"), _ROWS.c.invocation == bindparam("invocation_"))
                      .order_by(_ROWS.c.index))
"""A finished run's task rows as its intervals read them, once: a Core statement built once (through the ORM, a
10,000 x 5 run's two reads of its rows took ~20 ms of the API's answer, and again of the worker's report beside it;
~7 ms this way)."""


_TaskRows = Sequence[Row[Any, Any, Any, Any]]
"""``_COUNTS_AND_SCORES``'s rows: (trials scored, trials passed, outcome, score)."""


def trial_counts(session: Session, run_id: str, invocation: int) -> list[tuple[int, int]]:
    """(n, c) per settled task (one with its task row) of ``invocation``, in task order: trials that produced a score,
    and those that passed. Each task row holds its own counts (migration 0018): a 10,000 x 5 run's are read from its
    10,000 rows in ~6 ms (~40 ms with nothing cached), where counting its 50,000 trial rows took ~40 (~90) ms. A row
    an older writer projected without them sends the read to the trial rows."""
    return _counts(session, run_id, invocation, _task_rows(session, run_id, invocation))


def _task_rows(session: Session, run_id: str, invocation: int) -> _TaskRows:
    return session.connection().execute(_COUNTS_AND_SCORES, {"run_id_": run_id, "invocation_": invocation}).all()


def _counts(session: Session, run_id: str, invocation: int, rows: _TaskRows) -> list[tuple[int, int]]:
    if all(n is not None and c is not None for n, c, _outcome, _score in rows):
        return [(n, c) for n, c, _outcome, _score in rows]
    return _trial_counts_from_trials(session, run_id, invocation)


def _scores(rows: _TaskRows) -> list[float]:
    """The scores of the tasks that were scored (not ``err``, a score), in task order."""
    return [float(score) for _n, _c, outcome, score in rows if outcome != "err" and score is not None]


def _trial_counts_from_trials(session: Session, run_id: str, invocation: int) -> list[tuple[int, int]]:
    """``trial_counts`` from the trial rows (the settled tasks an ``IN`` of the task rows' keys, not a join: SQLite
    probed the task row of each of a 10,000 x 5 run's trials, ~70 ms; ~40 ms this way)."""
    scored = func.sum(case((col(TrialResult.outcome) != "err", 1), else_=0))
    passing = func.sum(case((col(TrialResult.outcome) == "pass", 1), else_=0))
    settled = select(col(TaskRow.index)).where(col(TaskRow.run_id) == run_id, col(TaskRow.invocation) == invocation)
    rows = session.execute(
        select(scored, passing)
        .where(col(TrialResult.run_id) == run_id, col(TrialResult.invocation) == invocation,
               col(TrialResult.index).in_(settled))
        .group_by(col(TrialResult.index)).order_by(col(TrialResult.index))
    ).all()
    return [(int(n or 0), int(c or 0)) for n, c in rows]


def graded_rows() -> ColumnElement[bool]:
    """A task row scored with something other than 0 and 1 (its run's mean score is then bootstrapped). Its values
    are literals: a bound parameter would leave a prepared statement's generic plan to guess them on Postgres."""
    return and_(col(TaskRow.outcome) != literal_column("'err'"), col(TaskRow.score).is_not(None),
                col(TaskRow.score).not_in((literal_column("0.0"), literal_column("1.0"))))


def terminal_intervals(session: Session, *, run_id: str, invocation: int, finished_at: datetime,
                       k: int, graded: bool | None = None) -> TerminalIntervals:
    """pass@k (k > 1) and the bootstrap intervals of a finished run: the mean task score (for k > 1 or scores other
    than 0/1) and each pass@k in the summary. ``graded``: whether a task of ``invocation`` has a score other than 0
    and 1 (``graded_rows``), when the caller read it already (``run_view``, with the run's counts)."""
    key = (run_id, finished_at, invocation)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    # A pass/fail run (k = 1, scores 0 and 1) has its interval already (Wilson); an index-only probe in SQL says so
    # without moving its rows into Python (the run list reads up to 200 runs). With k > 1 the mean score is
    # bootstrapped whatever the scores.
    graded = k > 1 or (graded if graded is not None else session.execute(
        select(col(TaskRow.index)).where(col(TaskRow.run_id) == run_id, col(TaskRow.invocation) == invocation,
                                         graded_rows()).limit(1)).first() is not None)
    rows = _task_rows(session, run_id, invocation) if graded else []  # counts and scores in one read
    per_task = _counts(session, run_id, invocation, rows) if k > 1 else []
    scores = _scores(rows)
    mean = _view(bootstrap_mean(values=scores)) if graded else None
    at_k: dict[str, float] = {}
    at_k_ci: dict[str, tuple[float, float]] = {}
    for size in sorted({1, k}) if k > 1 else []:
        values = pass_at_k_values(per_task, size)  # once for both the mean and its bootstrap
        estimate = bootstrap_mean(values=values)
        average = mean_of_pass_at_k(values)
        if estimate is not None and average is not None:
            at_k[f"pass@{size}"] = average
            at_k_ci[f"pass@{size}"] = (estimate.interval.low, estimate.interval.high)
    result = TerminalIntervals(mean, at_k, at_k_ci)
    with _lock:
        _cache[key] = result
        while len(_cache) > _CACHE_RUNS:
            _cache.popitem(last=False)
    return result
