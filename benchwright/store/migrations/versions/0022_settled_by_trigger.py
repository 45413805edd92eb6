"""On Postgres, a run's row settling told by a trigger (issue 25): ``bw_runs_settled`` sends
``NOTIFY bw_run_settled, '<run id>'`` when an ``UPDATE`` of the row sets its end time or raises its halt (or halts
it again for another reason), delivered when that transaction commits (``benchwright.store.settled``). It was a
``SELECT pg_notify`` of its own in each such transaction, one round trip on the way from a run's end to the long
poll's answer. An ``UPDATE`` that sets none of those columns (every append's ``next_seq``) does not evaluate the
condition. On SQLite nothing changes: the datagram goes after the commit, as before.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

FUNCTION = """
CREATE OR REPLACE FUNCTION bw_notify_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('bw_run_settled', NEW.id);
  RETURN NULL;
END
$$
"""

TRIGGER = """
CREATE TRIGGER bw_runs_settled AFTER UPDATE OF finished_at, halted, halt_reason ON runs FOR EACH ROW
  WHEN ((NEW.finished_at IS NOT NULL AND OLD.finished_at IS NULL)
        OR (NEW.halted AND (NOT OLD.halted OR NEW.halt_reason IS DISTINCT FROM OLD.halt_reason)))
  EXECUTE FUNCTION bw_notify_settled()
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(FUNCTION)
        op.execute(TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS bw_runs_settled ON runs")
        op.execute("DROP FUNCTION IF EXISTS bw_notify_settled()")
