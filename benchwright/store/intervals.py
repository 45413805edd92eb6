"""The uncertainty in a run's task summary (issue 17): Wilson from counts while the run is live, the bootstrap over
tasks once it is over, computed once per finished run and kept.

``GET /v1/runs/{id}`` is polled all through a live run, so nothing here reads task rows before the run is terminal:
the pass rate's interval comes from the outcome counts run_view already has (O(1)). The bootstrap (mean score,
pass@k) reads every task row; on a terminal run the rows never change, so the answer is cached per (run, finish
time) in the process — a 10,000-task run's first read costs ~30 ms of bootstrap and a row scan, later reads a dict
lookup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime

from sqlalchemy import select
from sqlmodel import Session, col

from benchwright.comparison.stats import Estimate, bootstrap_mean, proportion_se, wilson_interval
from benchwright.schemas import ScoreEstimate
from benchwright.scoring.aggregators import pass_at_k
from benchwright.store.models import TaskRow

__all__ = ["TerminalIntervals", "pass_rate_interval", "terminal_intervals"]

_CACHE_RUNS = 512
_cache: OrderedDict[tuple[str, datetime, int], TerminalIntervals] = OrderedDict()
_lock = threading.Lock()


class TerminalIntervals:
    """What the bootstrap says about a finished run."""

    def __init__(self, mean_score: ScoreEstimate | None, pass_at_k_ci: dict[str, tuple[float, float]]) -> None:
        self.mean_score = mean_score
        self.pass_at_k_ci = pass_at_k_ci


def pass_rate_interval(*, passed: int, failed: int) -> tuple[float | None, tuple[float, float] | None]:
    """(standard error, Wilson 95 % interval) of passed / (passed + failed); (None, None) before any is scored."""
    ci = wilson_interval(successes=passed, n=passed + failed)
    return proportion_se(successes=passed, n=passed + failed), (ci.low, ci.high) if ci else None


def _view(estimate: Estimate | None) -> ScoreEstimate | None:
    if estimate is None:
        return None
    return ScoreEstimate(value=estimate.value, se=estimate.se, ci=(estimate.interval.low, estimate.interval.high))


def terminal_intervals(session: Session, *, run_id: str, invocation: int, finished_at: datetime, k: int,
                       per_task: list[tuple[int, int]]) -> TerminalIntervals:
    """Bootstrap intervals of a finished run: the mean task score (for k > 1 or scores other than 0/1) and each
    pass@k in the summary (``per_task``: (trials scored, trials passed) per task, as run_view reads them)."""
    key = (run_id, finished_at, invocation)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    rows = (col(TaskRow.run_id) == run_id, col(TaskRow.invocation) == invocation, col(TaskRow.outcome) != "err",
            col(TaskRow.score).is_not(None))
    # A pass/fail run (k = 1, scores 0 and 1) has its interval already (Wilson); an index-only probe in SQL says so
    # without moving its rows into Python (the run list reads up to 200 runs).
    graded = k > 1 or session.execute(
        select(col(TaskRow.index)).where(*rows, col(TaskRow.score).not_in((0.0, 1.0))).limit(1)).first() is not None
    scores = [float(s) for s in session.execute(select(col(TaskRow.score)).where(*rows)).scalars()
              if s is not None] if graded else []
    mean = _view(bootstrap_mean(values=scores)) if graded else None
    at_k: dict[str, tuple[float, float]] = {}
    for size in sorted({1, k}) if k > 1 else []:
        estimate = bootstrap_mean(values=[pass_at_k(n, c, size) for n, c in per_task if n >= size])
        if estimate is not None:
            at_k[f"pass@{size}"] = (estimate.interval.low, estimate.interval.high)
    result = TerminalIntervals(mean, at_k)
    with _lock:
        _cache[key] = result
        while len(_cache) > _CACHE_RUNS:
            _cache.popitem(last=False)
    return result
