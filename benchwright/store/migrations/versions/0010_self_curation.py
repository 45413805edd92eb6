"""Self-curation on the embedded stack (issue 22): ``accounts.curator`` lets an account promote impls on its OWN
private benchmarks (``benchwright up`` gives it to the stack's own account), and ``benchmark_subset_impls.
self_curated`` marks an impl made official that way, so it stops being official when its benchmark goes public
(only an admin makes an impl official for everyone).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMNs, as in 0004/0005 (batch mode would copy the table under the events_cost trigger)
    op.add_column("accounts", sa.Column("curator", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("benchmark_subset_impls",
                  sa.Column("self_curated", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("benchmark_subset_impls", "self_curated")
    op.drop_column("accounts", "curator")
