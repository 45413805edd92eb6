"""Accounts carry ``admin``: platform administrators may raise the ``admin`` halt (§9) on any account's run.

Before this revision the ``admin`` halt reason existed in the display rule but nothing could raise it (issue 14).
Every existing account starts without the grant; the operator gives it with ``benchwright accounts create --admin``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN, as in 0004: batch mode would copy the table, and SQLite refuses to rename it back under
    # the events_cost trigger that names accounts (0002).
    op.add_column("accounts", sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("accounts", "admin")  # SQLite 3.35+ drops a column in place
