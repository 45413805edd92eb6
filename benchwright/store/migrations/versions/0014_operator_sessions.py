"""Operator sessions and their logs: operator_sessions, operator_events (issue 26, ``benchwright.operator``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "operator_sessions",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=36), primary_key=True),
        sa.Column("account_id", sqlmodel.sql.sqltypes.AutoString(length=36), sa.ForeignKey("accounts.id"),
                  nullable=False),
        sa.Column("operator", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("goal", sa.JSON(), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("runs", sa.JSON(), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("next_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("finished_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
    )
    op.create_index("ix_operator_sessions_account_created", "operator_sessions", ["account_id", "created_at"])
    op.create_table(
        "operator_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sqlmodel.sql.sqltypes.AutoString(length=36), sa.ForeignKey("operator_sessions.id"),
                  nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("idem_key", sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False, unique=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.UniqueConstraint("session_id", "seq", name="uq_operator_events_session_seq"),
    )


def downgrade() -> None:
    op.drop_table("operator_events")
    op.drop_index("ix_operator_sessions_account_created", table_name="operator_sessions")
    op.drop_table("operator_sessions")
