"""Reads the dashboard needs beyond the REST views: the dataset each run was launched on.

``RunSummary`` carries no launch body (a page of 200 runs would read every run's task_impl and metadata, up to
~0.6 MiB each), so the runs list's dataset column reads the one JSON field it shows, in SQL.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.store.models import Run


def launch_datasets(engine: Engine, *, account_id: str, run_ids: list[str]) -> dict[str, str]:
    """``{run_id: dataset}`` for those of ``run_ids`` that belong to ``account_id`` (others are left out).

    Args:
        engine: the store.
        account_id: the caller; another account's runs are never read.
        run_ids: the runs of one list page.
    """
    if not run_ids:
        return {}
    runs = Run.__table__.c  # type: ignore[attr-defined]
    query = select(runs.id, runs.launch["dataset"].as_string()).where(
        runs.account_id == account_id, runs.id.in_(run_ids))
    with Session(engine) as session:
        return {run_id: dataset or "" for run_id, dataset in session.execute(query).all()}
