"""Provider secrets, per-account host policy and rules, the blocked-host log, saved compute provider.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", S(length=36), nullable=False),
        sa.Column("account_id", S(length=36), nullable=False),
        sa.Column("name", S(length=128), nullable=False),
        sa.Column("value", S(length=8192), nullable=False),
        sa.Column("host_pattern", S(length=300), nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("account_id", "name", name="uq_secrets_account_name"),
    )
    op.create_index("ix_secrets_account_id", "secrets", ["account_id"])
    op.create_table(
        "host_policies",
        sa.Column("account_id", S(length=36), nullable=False),
        sa.Column("default_mode", S(length=8), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("account_id"),
    )
    op.create_table(
        "host_rules",
        sa.Column("id", S(length=36), nullable=False),
        sa.Column("account_id", S(length=36), nullable=False),
        sa.Column("pattern", S(length=300), nullable=False),
        sa.Column("action", S(length=8), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("account_id", "pattern", name="uq_host_rules_account_pattern"),
    )
    op.create_index("ix_host_rules_account_id", "host_rules", ["account_id"])
    op.create_table(
        "blocked_hosts",
        sa.Column("run_id", S(length=36), nullable=False),
        sa.Column("host", S(length=300), nullable=False),
        sa.Column("account_id", S(length=36), nullable=False),
        sa.Column("seen_count", sa.Integer(), nullable=False),
        sa.Column("first_seen", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("last_seen", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("run_id", "host"),
    )
    op.create_index("ix_blocked_hosts_account_id", "blocked_hosts", ["account_id"])
    op.create_table(
        "account_settings",
        sa.Column("account_id", S(length=36), nullable=False),
        sa.Column("compute", S(length=32), nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("account_id"),
    )


def downgrade() -> None:
    op.drop_table("account_settings")
    op.drop_index("ix_blocked_hosts_account_id", "blocked_hosts")
    op.drop_table("blocked_hosts")
    op.drop_index("ix_host_rules_account_id", "host_rules")
    op.drop_table("host_rules")
    op.drop_table("host_policies")
    op.drop_index("ix_secrets_account_id", "secrets")
    op.drop_table("secrets")
