"""Answers across runs (issue 17): paired comparison of two runs, a ranked table over many, the cost–quality
frontier, and the regression rule scheduled replays apply.

Runs are comparable only when they are *of the same shape*: the same tasks scored by the same scorer. The one rule
that decides it is :func:`shape_mismatch`. Until the registry (issue 9) lands, a run's shape is what its own log
says — the dataset's bytes (FetchArtifact.sha256), the scorer's bytes (AtomizeArtifact.impl_sha256 of the latest
Atomize) and the task count; the registry will swap in (benchmark_id, subset_id, impl_id) there and nowhere else.
Likewise the set of runs ranked comes from the caller (``?runs=a,b,c``) until the lineage endpoint of the replay
issue (10) gives a sweep's children.

A run is readable here if the caller owns it or its owner made it unlisted or public (§12); anything else is
"not found", as for ``GET /v1/runs/{id}``. Only finished runs are compared: a live run's rows are still moving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.comparison.stats import (
    bootstrap_mean,
    mcnemar_exact,
    paired_proportion_difference,
    pareto_optimal,
    proportion_se,
    sign_flip_p,
    wilson_interval,
)
from benchwright.errors import Conflict, InvalidInput, NotFound
from benchwright.events import AtomizeArtifact, FetchArtifact
from benchwright.schemas import ScoreEstimate
from benchwright.store.models import EventRow, Run, TaskRow

__all__ = ["Comparison", "Frontier", "Ranking", "RunShape", "compare_runs", "frontier", "is_regression",
           "rank_runs", "readable_run", "run_shape", "shape_mismatch"]

SIGNIFICANCE = 0.05
"""The p-value under which a verdict calls a difference significant (a regression alert sets its own)."""
MAX_RUNS = 50
"""Most runs one ranking or frontier takes (each costs a read of its task rows)."""


@dataclass(frozen=True)
class RunShape:
    """What makes two runs' scores comparable task by task (see the module docstring)."""

    dataset_id: str | None
    """sha256 of the dataset bytes Fetch read."""
    impl_id: str | None
    """sha256 of the task_impl.py Atomize wrote (the scorer)."""
    tasks: int


def shape_mismatch(a: RunShape, b: RunShape) -> str | None:
    """The one rule of comparability: the name of the first id on which two runs differ, or None when they are
    of one shape. With the registry this compares (benchmark_id, subset_id, impl_id) instead."""
    for name in ("dataset_id", "impl_id", "tasks"):
        if getattr(a, name) != getattr(b, name):
            return name
    return None


def run_shape(engine: Engine, run: Run) -> RunShape:
    """The run's shape as its log records it (the latest FetchArtifact and AtomizeArtifact)."""
    if run.subset_id is not None and run.impl_id is not None:  # in the registry (issue 9): its ids are the shape
        return RunShape(dataset_id=f"{run.benchmark_id}/{run.subset_id}", impl_id=run.impl_id, tasks=run.tasks_total)
    with Session(engine) as session:
        rows = session.execute(select(col(EventRow.type), col(EventRow.data)).where(
            col(EventRow.run_id) == run.id,
            col(EventRow.type).in_((FetchArtifact.type_name(), AtomizeArtifact.type_name())))
            .order_by(col(EventRow.seq))).all()
    latest = {kind: data for kind, data in rows}
    fetch, atomize = latest.get(FetchArtifact.type_name()), latest.get(AtomizeArtifact.type_name())
    return RunShape(dataset_id=fetch["sha256"] if fetch else None,
                    impl_id=atomize["impl_sha256"] if atomize else None, tasks=run.tasks_total)


def readable_run(engine: Engine, *, run_id: str, account_id: str, finished: bool = True) -> Run:
    """The run, if the caller may read it (own, unlisted or public) and, with ``finished``, it is over.

    Raises:
        NotFound: no such run, or another account's private run.
        Conflict: ``not_finished``: the run is still going.
    """
    with Session(engine) as session:
        run = session.get(Run, run_id)
    if run is None or (run.account_id != account_id and run.visibility not in ("unlisted", "public")):
        raise NotFound(f"run {run_id} not found")
    if finished and run.finished_at is None:
        raise Conflict(f"run {run_id} has not finished; compare it once it has", code="not_finished")
    return run


def _rows(engine: Engine, run_id: str) -> dict[int, tuple[str, float | None]]:
    """(outcome, score) per task index of the run's latest Materialize invocation."""
    with Session(engine) as session:
        latest = session.execute(select(col(TaskRow.invocation)).where(col(TaskRow.run_id) == run_id)
                                 .order_by(col(TaskRow.invocation).desc()).limit(1)).scalar()
        rows = session.execute(select(col(TaskRow.index), col(TaskRow.outcome), col(TaskRow.score)).where(
            col(TaskRow.run_id) == run_id, col(TaskRow.invocation) == (latest or 1))).all()
    return {index: (outcome, score) for index, outcome, score in rows}


class RunScore(BaseModel):
    """One run's side of a comparison, over the tasks both runs scored."""

    run_id: str
    model: str
    passed: int
    scored: int
    pass_rate: float | None
    pass_rate_ci: tuple[float, float] | None
    """95 % Wilson interval."""


class Comparison(BaseModel):
    """``GET /v1/compare?a=&b=``: B against A, task by task."""

    a: RunScore
    b: RunScore
    dataset_id: str | None
    impl_id: str | None
    tasks: int
    compared: int
    """Tasks both runs scored (an ``err`` row in either leaves the task out)."""
    gained: list[int]
    """Task indices A failed and B passed."""
    lost: list[int]
    """Task indices A passed and B failed."""
    difference: float
    """B's pass rate minus A's on the compared tasks."""
    difference_ci: tuple[float, float]
    """95 % paired interval (Agresti–Min)."""
    test: Literal["mcnemar_exact"] = "mcnemar_exact"
    p_value: float
    score_difference: ScoreEstimate | None = None
    """Graded runs (scores besides 0 and 1): mean per-task score difference B − A, paired bootstrap interval."""
    score_p_value: float | None = None
    """Graded runs: two-sided sign-flip permutation test of the score difference."""
    significant: bool
    """p_value <= 0.05."""
    verdict: str


def _score(run: Run, outcomes: list[str]) -> RunScore:
    passed, scored = outcomes.count("pass"), len(outcomes)
    ci = wilson_interval(successes=passed, n=scored)
    return RunScore(run_id=run.id, model=str(run.model.get("identifier", "")), passed=passed, scored=scored,
                    pass_rate=passed / scored if scored else None, pass_rate_ci=(ci.low, ci.high) if ci else None)


def _points(x: float) -> str:
    return f"{abs(x) * 100:.1f}"


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def verdict(*, difference: float, ci: tuple[float, float], p: float, tasks: int) -> str:
    """The comparison in one sentence, e.g. "B is better than A by 4.1 points, 95 % CI [1.2, 7.0], p = 0.006, on
    1,000 tasks" (points are percentage points of pass rate)."""
    span = f"95 % CI [{ci[0] * 100:.1f}, {ci[1] * 100:.1f}], {_p(p)}, on {tasks:,} tasks"
    if p <= SIGNIFICANCE and difference != 0:
        return f"B is {'better' if difference > 0 else 'worse'} than A by {_points(difference)} points, {span}"
    return f"No significant difference: B − A = {difference * 100:+.1f} points, {span}"


def compare_runs(engine: Engine, *, a: Run, b: Run) -> Comparison:
    """B against A on the tasks both scored: flips both ways, the paired difference and its test.

    Raises:
        InvalidInput: ``different_shape``: the runs are not of one shape; the message names the id that differs.
    """
    shape_a, shape_b = run_shape(engine, a), run_shape(engine, b)
    differs = shape_mismatch(shape_a, shape_b)
    if differs is not None:
        raise InvalidInput(f"runs {a.id} and {b.id} are not of the same shape: their {differs} differs "
                           f"({getattr(shape_a, differs)} vs {getattr(shape_b, differs)})", code="different_shape")
    rows_a, rows_b = _rows(engine, a.id), _rows(engine, b.id)
    both = sorted(i for i in rows_a.keys() & rows_b.keys() if rows_a[i][0] != "err" and rows_b[i][0] != "err")
    gained = [i for i in both if rows_a[i][0] == "fail" and rows_b[i][0] == "pass"]
    lost = [i for i in both if rows_a[i][0] == "pass" and rows_b[i][0] == "fail"]
    if not both:
        raise Conflict(f"runs {a.id} and {b.id} have no task both of them scored", code="nothing_to_compare")
    diff = paired_proportion_difference(b=len(lost), c=len(gained), n=len(both))
    p = mcnemar_exact(b=len(lost), c=len(gained))
    ci = (diff.interval.low, diff.interval.high)
    scores = [(rows_a[i][1] or 0.0, rows_b[i][1] or 0.0) for i in both]
    graded = any(s not in (0.0, 1.0) for pair in scores for s in pair)
    score_diff = score_p = None
    if graded:
        deltas = [sb - sa for sa, sb in scores]
        boot = bootstrap_mean(values=deltas)
        assert boot is not None
        score_diff = ScoreEstimate(value=boot.value, se=boot.se, ci=(boot.interval.low, boot.interval.high))
        score_p = sign_flip_p(diffs=deltas)
    return Comparison(
        a=_score(a, [rows_a[i][0] for i in both]), b=_score(b, [rows_b[i][0] for i in both]),
        dataset_id=shape_a.dataset_id, impl_id=shape_a.impl_id, tasks=shape_a.tasks, compared=len(both),
        gained=gained, lost=lost, difference=diff.value, difference_ci=ci, p_value=p,
        score_difference=score_diff, score_p_value=score_p, significant=p <= SIGNIFICANCE,
        verdict=verdict(difference=diff.value, ci=ci, p=p, tasks=len(both)))


def is_regression(comparison: Comparison, *, drop: float, p: float) -> bool:
    """A scheduled replay regressed: B's pass rate fell by at least ``drop`` (a fraction: 0.03 = 3 points) and
    McNemar's p is at most ``p``."""
    return -comparison.difference >= drop and comparison.p_value <= p


def _same_shape_runs(engine: Engine, *, run_ids: list[str], account_id: str) -> list[Run]:
    if not 1 <= len(run_ids) <= MAX_RUNS or len(set(run_ids)) != len(run_ids):
        raise InvalidInput(f"give between 1 and {MAX_RUNS} distinct run ids (got {len(run_ids)})",
                           code="invalid_runs")
    runs = [readable_run(engine, run_id=r, account_id=account_id) for r in run_ids]
    first = run_shape(engine, runs[0])
    for run in runs[1:]:
        shape = run_shape(engine, run)
        differs = shape_mismatch(first, shape)
        if differs is not None:
            raise InvalidInput(f"runs {runs[0].id} and {run.id} are not of the same shape: their {differs} differs "
                               f"({getattr(first, differs)} vs {getattr(shape, differs)})", code="different_shape")
    return runs


class RankedRun(BaseModel):
    rank: int
    run_id: str
    model: str
    pass_rate: float | None
    pass_rate_se: float | None
    pass_rate_ci: tuple[float, float] | None
    scored: int
    p_vs_leader: float | None
    """McNemar's exact p against the top run on the tasks both scored (None for the leader itself)."""
    tied_with_leader: bool
    """Not significantly different from the leader (p > 0.05): a tie the ranking cannot break."""


class Ranking(BaseModel):
    """``GET /v1/compare?runs=``: runs of one shape, best pass rate first."""

    runs: list[RankedRun]


def rank_runs(engine: Engine, *, run_ids: list[str], account_id: str) -> Ranking:
    """Rank runs of one shape by pass rate, with intervals and each run's paired test against the leader."""
    runs = _same_shape_runs(engine, run_ids=run_ids, account_id=account_id)
    rows = {run.id: _rows(engine, run.id) for run in runs}
    scores = {run.id: _score(run, [o for o, _ in rows[run.id].values() if o != "err"]) for run in runs}
    ordered = sorted(runs, key=lambda r: (-(scores[r.id].pass_rate or 0.0), r.created_at, r.id))
    leader = rows[ordered[0].id]
    out = []
    for rank, run in enumerate(ordered, start=1):
        score, p = scores[run.id], None
        if rank > 1:
            mine = rows[run.id]
            both = [i for i in leader.keys() & mine.keys() if leader[i][0] != "err" and mine[i][0] != "err"]
            p = mcnemar_exact(b=sum(leader[i][0] == "pass" and mine[i][0] == "fail" for i in both),
                              c=sum(leader[i][0] == "fail" and mine[i][0] == "pass" for i in both))
        out.append(RankedRun(rank=rank, run_id=run.id, model=score.model, pass_rate=score.pass_rate,
                             pass_rate_se=proportion_se(successes=score.passed, n=score.scored),
                             pass_rate_ci=score.pass_rate_ci, scored=score.scored, p_vs_leader=p,
                             tied_with_leader=p is None or p > SIGNIFICANCE))
    return Ranking(runs=out)


class FrontierPoint(BaseModel):
    run_id: str
    model: str
    pass_rate: float | None
    pass_rate_ci: tuple[float, float] | None
    cost_per_task: float
    """cost.model / tasks, in USD."""
    pareto_optimal: bool
    """No other run is at most as costly and at least as good, and strictly better at one of the two."""


class Frontier(BaseModel):
    """``GET /v1/frontier?runs=``: each run's pass rate against its cost per task, cheapest first."""

    points: list[FrontierPoint]


def frontier(engine: Engine, *, run_ids: list[str], account_id: str) -> Frontier:
    """The cost–quality frontier of runs of one shape."""
    runs = _same_shape_runs(engine, run_ids=run_ids, account_id=account_id)
    scores = {run.id: _score(run, [o for o, _ in _rows(engine, run.id).values() if o != "err"]) for run in runs}
    costs = {run.id: run.cost_model / run.tasks_total if run.tasks_total else 0.0 for run in runs}
    flags = pareto_optimal([(costs[r.id], scores[r.id].pass_rate or 0.0) for r in runs])
    points = [FrontierPoint(run_id=r.id, model=scores[r.id].model, pass_rate=scores[r.id].pass_rate,
                            pass_rate_ci=scores[r.id].pass_rate_ci, cost_per_task=costs[r.id], pareto_optimal=flag)
              for r, flag in zip(runs, flags, strict=True)]
    return Frontier(points=sorted(points, key=lambda pt: (pt.cost_per_task, -(pt.pass_rate or 0.0))))
