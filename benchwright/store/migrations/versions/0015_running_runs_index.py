"""A partial index on the runs running, by account: every worker's fair share reads which accounts have runs running
ten times a second (issue 23, ``benchwright.security.fair_share.running_accounts``); without it each read scans every
run ever made.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

RUNNING = sa.text("status = 'running'")


def upgrade() -> None:
    op.create_index("ix_runs_running_account", "runs", ["account_id"], sqlite_where=RUNNING,
                    postgresql_where=RUNNING)


def downgrade() -> None:
    op.drop_index("ix_runs_running_account", table_name="runs")
