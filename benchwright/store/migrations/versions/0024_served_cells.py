"""The cross-run cache's lookup by key: ``phase_fingerprints.served`` says whether a cell may be served (its run has
finished and is public), kept so by triggers on both tables, and a partial index of the served cells on
``(phase, input_hash, created_at)`` finds the newest for an input at once (``benchwright.registry.cache``).

The lookup joined every cell of the input to its run and sorted them. Every run writes a cell per cached phase, so an
account that ran one benchmark 10,000 times (private runs: never served) made each later run's lookups read 10,000
cells: 0.34 → 44 ms of the worker's time a one-task run on SQLite, growing with the runs.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

SERVED_OF_RUN = "(SELECT runs.visibility = 'public' AND runs.finished_at IS NOT NULL FROM runs WHERE runs.id = {run})"

POSTGRES = [
    f"""
CREATE OR REPLACE FUNCTION bw_cell_served() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.served := COALESCE({SERVED_OF_RUN.format(run="NEW.run_id")}, false);
  RETURN NEW;
END
$$
""",
    """
CREATE TRIGGER bw_cell_served BEFORE INSERT OR UPDATE OF run_id ON phase_fingerprints FOR EACH ROW
  EXECUTE FUNCTION bw_cell_served()
""",
    """
CREATE OR REPLACE FUNCTION bw_cells_served_by_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE phase_fingerprints SET served = (NEW.visibility = 'public' AND NEW.finished_at IS NOT NULL)
    WHERE run_id = NEW.id;
  RETURN NULL;
END
$$
""",
    """
CREATE TRIGGER bw_cells_served_by_run AFTER UPDATE OF visibility, finished_at ON runs FOR EACH ROW
  WHEN (NEW.visibility IS DISTINCT FROM OLD.visibility OR (NEW.finished_at IS NULL) <> (OLD.finished_at IS NULL))
  EXECUTE FUNCTION bw_cells_served_by_run()
""",
]

SQLITE = [
    f"""
CREATE TRIGGER bw_cell_served AFTER INSERT ON phase_fingerprints FOR EACH ROW BEGIN
  UPDATE phase_fingerprints SET served = COALESCE({SERVED_OF_RUN.format(run="NEW.run_id")}, 0)
    WHERE run_id = NEW.run_id AND phase = NEW.phase;
END
""",
    """
CREATE TRIGGER bw_cells_served_by_run AFTER UPDATE OF visibility, finished_at ON runs FOR EACH ROW
  WHEN NEW.visibility IS NOT OLD.visibility OR (NEW.finished_at IS NULL) <> (OLD.finished_at IS NULL) BEGIN
  UPDATE phase_fingerprints SET served = (NEW.visibility = 'public' AND NEW.finished_at IS NOT NULL)
    WHERE run_id = NEW.id;
END
""",
]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("phase_fingerprints") as batch:
        batch.add_column(sa.Column("served", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute(f"UPDATE phase_fingerprints SET served = "
               f"COALESCE({SERVED_OF_RUN.format(run='phase_fingerprints.run_id')}, {'false' if postgres else '0'})")
    # SQLite's planner uses a partial index only for a query that names its condition as written: SQLAlchemy writes
    # a Boolean column's truth as "served = 1" there, and as "served" on Postgres.
    op.create_index("ix_phase_fingerprints_served", "phase_fingerprints", ["phase", "input_hash", "created_at"],
                    sqlite_where=sa.text("served = 1"), postgresql_where=sa.text("served"))
    for statement in POSTGRES if postgres else SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS bw_cells_served_by_run ON runs")
        op.execute("DROP FUNCTION IF EXISTS bw_cells_served_by_run()")
        op.execute("DROP TRIGGER IF EXISTS bw_cell_served ON phase_fingerprints")
        op.execute("DROP FUNCTION IF EXISTS bw_cell_served()")
    else:
        op.execute("DROP TRIGGER IF EXISTS bw_cells_served_by_run")
        op.execute("DROP TRIGGER IF EXISTS bw_cell_served")
    op.drop_index("ix_phase_fingerprints_served", table_name="phase_fingerprints")
    with op.batch_alter_table("phase_fingerprints") as batch:
        batch.drop_column("served")
