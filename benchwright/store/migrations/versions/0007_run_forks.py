"""The fork tree: run_forks names each forked run's parent and rewind point (issue 10).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "run_forks",
        sa.Column("run_id", S(length=36), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("parent_run_id", S(length=36), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("rewind_to", S(length=32), nullable=True),
        sa.Column("kind", S(length=16), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    )
    op.create_index("ix_run_forks_parent_run_id", "run_forks", ["parent_run_id"])


def downgrade() -> None:
    op.drop_index("ix_run_forks_parent_run_id", table_name="run_forks")
    op.drop_table("run_forks")
