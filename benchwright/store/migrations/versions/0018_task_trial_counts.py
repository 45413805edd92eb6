"""Each task row counts its trials (issue 25): ``task_rows.trials_scored`` and ``trials_passed``, pass@k's n and c.

A finished run's first read (``GET /v1/runs/{id}``, and the narration beside it) took them from the trial rows: an
aggregate over every trial of the run, whose pages hold the outputs and inputs too. For a 10,000 x 5 run's 50,000
trials that was ~40 ms with the pages cached and ~90 ms without; its 10,000 task rows give them in ~10 and ~40 ms.
The projection writes them from the aggregated event's ``trial_scores`` (``benchwright.store.events``: a trial with
a score is not ``err``, one with a score >= ``PASS_THRESHOLD`` passed, as the scorer host and the harness bridge
decide a trial's outcome); rows already in the store are counted here from their trial rows, as the read did.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("task_rows", sa.Column("trials_scored", sa.Integer(), nullable=True))
    op.add_column("task_rows", sa.Column("trials_passed", sa.Integer(), nullable=True))
    rows = sa.table("task_rows", sa.column("run_id"), sa.column("invocation"), sa.column("index"),
                    sa.column("trials_scored"), sa.column("trials_passed"))
    trials = sa.table("trial_results", sa.column("run_id"), sa.column("invocation"), sa.column("index"),
                      sa.column("outcome"))
    its = sa.and_(trials.c.run_id == rows.c.run_id, trials.c.invocation == rows.c.invocation,
                  trials.c["index"] == rows.c["index"])
    counted = sa.select(sa.func.count()).select_from(trials)
    op.execute(rows.update().values(
        trials_scored=counted.where(its, trials.c.outcome != "err").scalar_subquery(),
        trials_passed=counted.where(its, trials.c.outcome == "pass").scalar_subquery()))


def downgrade() -> None:
    # batch mode: SQLite rebuilds the table (older SQLite has no DROP COLUMN)
    with op.batch_alter_table("task_rows") as batch:
        batch.drop_column("trials_passed")
        batch.drop_column("trials_scored")
