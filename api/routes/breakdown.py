"""A run's results per group of its dataset rows (issue 21): ``GET /v1/runs/{id}/breakdown?by=COLUMN``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import AccountDep, StateDep
from api.errors import responses
from api.routes.runs import RunId
from benchwright.registry.shape import readable_run
from benchwright.schemas import BreakdownView
from benchwright.store.results import breakdown

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.get("/{run_id}/breakdown", response_model=BreakdownView, responses=responses(400, 404, 409))
def get_breakdown(run_id: RunId, account: AccountDep, state: StateDep,
                  by: Annotated[str | None, Query(min_length=1, max_length=128, description=(
                      "The dataset column to group by (default: the launch's group_by, else the first of subject, "
                      "category, difficulty... the data has)."))] = None) -> BreakdownView:
    """Pass rate, counts (passed/failed/errored/no_answer) and 95 % interval per value of one dataset column."""
    from benchwright.sandbox.factory import blob_store  # the deployment's blob store, made on first use

    run = readable_run(state.engine, run_id=run_id, account_id=account.id)
    return breakdown(state.engine, blob_store(state.settings), run=run, by=by)
