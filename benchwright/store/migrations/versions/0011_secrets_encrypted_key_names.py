"""Secrets encrypted at rest, and API keys with names and last-used times (issue 23).

``secrets`` gains ``key_id`` and ``ciphertext``: a value is AES-GCM encrypted under the deployment key
(``benchwright.security.crypto``). Existing plaintext rows stay readable and are encrypted (and their ``value`` emptied)
at the first start of the API or a worker with a deployment key (``benchwright.store.policy.prepare_secrets``); a
migration cannot do it, since the key never lives in the store.

``api_keys`` gains ``name`` (unique per account; existing keys are named after their prefix) and ``last_used_at``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    # Plain ADD COLUMNs (no batch copy of the tables; see 0005).
    op.add_column("secrets", sa.Column("key_id", S(length=16), nullable=True))
    op.add_column("secrets", sa.Column("ciphertext", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("name", S(length=64), nullable=False, server_default="default"))
    op.add_column("api_keys", sa.Column("last_used_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
    op.execute("UPDATE api_keys SET name = prefix")
    op.create_index("uq_api_keys_account_name", "api_keys", ["account_id", "name"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_api_keys_account_name", table_name="api_keys")
    op.drop_column("api_keys", "last_used_at")
    op.drop_column("api_keys", "name")
    op.drop_column("secrets", "ciphertext")
    op.drop_column("secrets", "key_id")
