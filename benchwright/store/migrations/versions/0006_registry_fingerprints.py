"""The registry (benchmarks, subsets and their snapshots, immutable impls), the fingerprint family and run shape
columns on runs, and the cross-run phase cache's cells (issue 9).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString
T = sqlmodel.sql.sqltypes.UTCDateTime
RUN_COLUMNS = (("fingerprint", 12), ("subset_fingerprint", 64), ("impl_fingerprint", 64), ("fetch_fingerprint", 64),
               ("analyze_fingerprint", 64), ("setup_fingerprint", 64), ("atomize_fingerprint", 64),
               ("benchmark_id", 64), ("subset_id", 64), ("impl_id", 80))


def upgrade() -> None:
    # Plain ADD COLUMNs (as in 0004/0005): batch mode would copy runs, which the events_cost trigger names.
    for name, length in RUN_COLUMNS:
        op.add_column("runs", sa.Column(name, S(length=length), nullable=True))
    op.add_column("runs", sa.Column("pinned", sa.JSON(), nullable=True))
    op.create_index("ix_runs_benchmark_id", "runs", ["benchmark_id"])
    op.create_index("ix_runs_subset_id", "runs", ["subset_id"])
    op.create_table(
        "benchmarks",
        sa.Column("id", S(length=64), primary_key=True),
        sa.Column("name", S(length=200), nullable=False),
        sa.Column("account_id", S(length=36), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("visibility", S(length=16), nullable=False),
        sa.Column("created_at", T(), nullable=False),
    )
    op.create_index("ix_benchmarks_name", "benchmarks", ["name"])
    op.create_index("ix_benchmarks_account_id", "benchmarks", ["account_id"])
    op.create_table(
        "benchmark_subsets",
        sa.Column("id", S(length=64), primary_key=True),
        sa.Column("benchmark_id", S(length=64), sa.ForeignKey("benchmarks.id"), nullable=False),
        sa.Column("name", S(length=200), nullable=False),
        sa.Column("rolling", sa.Boolean(), nullable=False),
        sa.Column("default_trials", sa.JSON(), nullable=True),
        sa.Column("created_at", T(), nullable=False),
        sa.UniqueConstraint("benchmark_id", "name", name="uq_subsets_benchmark_name"),
    )
    op.create_index("ix_benchmark_subsets_benchmark_id", "benchmark_subsets", ["benchmark_id"])
    op.create_table(
        "subset_snapshots",
        sa.Column("subset_id", S(length=64), sa.ForeignKey("benchmark_subsets.id"), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("tasks_sha256", S(length=64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("created_at", T(), nullable=False),
    )
    op.create_table(
        "benchmark_subset_impls",
        sa.Column("id", S(length=80), primary_key=True),
        sa.Column("benchmark_id", S(length=64), sa.ForeignKey("benchmarks.id"), nullable=False),
        sa.Column("impl_fingerprint", S(length=64), nullable=False),
        sa.Column("official", sa.Boolean(), nullable=False),
        sa.Column("promoted_at", T(), nullable=True),
        sa.Column("created_at", T(), nullable=False),
    )
    op.create_index("ix_benchmark_subset_impls_benchmark_id", "benchmark_subset_impls", ["benchmark_id"])
    op.create_table(
        "subset_impls",
        sa.Column("subset_id", S(length=64), sa.ForeignKey("benchmark_subsets.id"), primary_key=True),
        sa.Column("impl_id", S(length=80), sa.ForeignKey("benchmark_subset_impls.id"), primary_key=True),
        sa.Column("created_at", T(), nullable=False),
    )
    op.create_table(
        "phase_fingerprints",
        sa.Column("run_id", S(length=36), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("phase", S(length=32), primary_key=True),
        sa.Column("input_hash", S(length=64), nullable=False),
        sa.Column("artifacts", sa.JSON(), nullable=False),
        sa.Column("snapshot_id", S(length=64), nullable=True),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("source_run_id", S(length=36), nullable=True),
        sa.Column("created_at", T(), nullable=False),
    )
    op.create_index("ix_phase_fingerprints_input_hash", "phase_fingerprints", ["input_hash"])


def downgrade() -> None:
    for table in ("phase_fingerprints", "subset_impls", "benchmark_subset_impls", "subset_snapshots",
                  "benchmark_subsets", "benchmarks"):
        op.drop_table(table)
    op.drop_index("ix_runs_subset_id", "runs")
    op.drop_index("ix_runs_benchmark_id", "runs")
    for name, _ in reversed(RUN_COLUMNS):
        op.drop_column("runs", name)
    op.drop_column("runs", "pinned")
