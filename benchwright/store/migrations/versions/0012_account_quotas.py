"""Per-account quota overrides: account_quotas (issue 23, fair sharing; ``benchwright.security.quotas``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "account_quotas",
        sa.Column("account_id", sqlmodel.sql.sqltypes.AutoString(length=36), sa.ForeignKey("accounts.id"),
                  primary_key=True),
        sa.Column("runs", sa.Integer(), nullable=True),
        sa.Column("model_calls", sa.Integer(), nullable=True),
        sa.Column("tasks", sa.Integer(), nullable=True),
        sa.Column("updated_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("account_quotas")
