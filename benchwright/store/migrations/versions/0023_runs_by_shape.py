"""Partial indexes on the finished runs by account and shape: a run's narration compares it with the newest earlier
finished run of its shape in its account (``benchwright.report.facts._comparison``: the same benchmark, subset and
impl, else the same data and scorer fingerprints), and the long poll's terminal answer waits for that read. Through
``ix_runs_account_created`` it walked the account's runs back from the run's creation until one matched: with
20,000 runs of other shapes in the account 8-12 ms on either store, growing with the account. These find it by key.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

FINISHED = sa.text("finished_at IS NOT NULL")


def upgrade() -> None:
    op.create_index("ix_runs_finished_by_registry_shape", "runs",
                    ["account_id", "benchmark_id", "subset_id", "impl_id", "created_at"],
                    sqlite_where=FINISHED, postgresql_where=FINISHED)
    op.create_index("ix_runs_finished_by_fingerprints", "runs",
                    ["account_id", "subset_fingerprint", "impl_fingerprint", "created_at"],
                    sqlite_where=FINISHED, postgresql_where=FINISHED)


def downgrade() -> None:
    op.drop_index("ix_runs_finished_by_fingerprints", table_name="runs")
    op.drop_index("ix_runs_finished_by_registry_shape", table_name="runs")
