"""Accounts carry ``local_paths``: whether the operator lets the account name dataset files on the worker's host.

Before this revision the deployment-wide ``allow_local_paths`` alone decided, so every account of an embedded stack
could read the worker's files (issue 15). Existing accounts start without the grant, except the embedded stack's
own account (``dev``, created by ``benchwright up``), which keeps reading local datasets as before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

EMBEDDED_ACCOUNT = "dev"
"""``benchwright.stack.supervisor.DEV_ACCOUNT`` as of this revision (a migration must not follow later renames)."""


def upgrade() -> None:
    # A plain ADD COLUMN: batch mode would copy the table, and SQLite refuses to rename it back under the
    # events_cost trigger that names accounts (0002).
    op.add_column("accounts", sa.Column("local_paths", sa.Boolean(), nullable=False, server_default=sa.false()))
    accounts = sa.table("accounts", sa.column("name", sa.String()), sa.column("local_paths", sa.Boolean()))
    op.execute(accounts.update().where(accounts.c.name == EMBEDDED_ACCOUNT).values(local_paths=True))


def downgrade() -> None:
    op.drop_column("accounts", "local_paths")  # SQLite 3.35+ drops a column in place
