"""Comparisons: two runs paired task by task, a ranked table over many, the cost–quality frontier (issue 17)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import AccountDep, StateDep
from api.errors import responses
from benchwright.comparison.compare import (
    Comparison,
    Frontier,
    Ranking,
    compare_runs,
    frontier,
    rank_runs,
    readable_run,
)
from benchwright.errors import InvalidInput

router = APIRouter(prefix="/v1", tags=["compare"])
RunParam = Annotated[str | None, Query(max_length=64)]
RunList = Annotated[str | None, Query(max_length=64 * 51, description=(
    "Comma-separated run ids of one shape (until the lineage endpoint lands, the runs of a sweep are listed "
    "here by hand)."))]


def _ids(runs: str) -> list[str]:
    return [r.strip() for r in runs.split(",") if r.strip()]


@router.get("/compare", response_model=Comparison | Ranking, responses=responses(400, 404, 409))
def compare(account: AccountDep, state: StateDep, a: RunParam = None, b: RunParam = None,
            runs: RunList = None) -> Comparison | Ranking:
    """``?a=&b=``: B against A on the same tasks (flips, paired interval, McNemar's exact test, a verdict);
    ``?runs=x,y,z``: a ranked table with intervals. Runs of different shapes answer 400 naming the id that
    differs."""
    if runs is not None and a is None and b is None:
        return rank_runs(state.engine, run_ids=_ids(runs), account_id=account.id)
    if a is None or b is None or runs is not None:
        raise InvalidInput("give either a= and b= (two runs) or runs= (a comma-separated list)", code="invalid_runs")
    run_a = readable_run(state.engine, run_id=a, account_id=account.id)
    run_b = readable_run(state.engine, run_id=b, account_id=account.id)
    return compare_runs(state.engine, a=run_a, b=run_b)


@router.get("/frontier", response_model=Frontier, responses=responses(400, 404, 409))
def get_frontier(account: AccountDep, state: StateDep,
                 runs: Annotated[str, Query(max_length=64 * 51, description="Comma-separated run ids of one shape.")],
                 ) -> Frontier:
    """Each run's pass rate (95 % interval) against its cost per task (cost.model / tasks), Pareto-optimal runs
    marked."""
    return frontier(state.engine, run_ids=_ids(runs), account_id=account.id)
