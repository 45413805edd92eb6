"""On Postgres, a run's end written in one call (issue 25): ``bw_finish_run`` takes the run row's lock, appends the
terminal events as ``bw_append_events`` does (migration 0017) and sets the row's terminal columns (its status, error
and end time, and the fingerprint family that ``benchwright.registry.shape.stamp_terminal`` computed), one
transaction and one round trip in autocommit.

``benchwright.store.runs.finish_run`` wrote the run's end in a transaction of seven round trips (BEGIN, the append's
call, the row, the run's artifacts, its phase cells, the row's UPDATE, COMMIT), and the long polls waiting for the
run are told when it commits (the trigger of migration 0022). It now reads the row, the artifacts and the cells in
one statement (one snapshot), computes the fingerprint from them, and calls this function with ``p_seen_seq``, the
row's ``next_seq`` as read: the function writes only if the log has not moved since (nothing appended in between,
so the fingerprint describes exactly the log that PipelineFinished closes) and the run has not ended already.
Otherwise it writes nothing and says why (``o_state``: ``moved``, ``ended``; ``missing`` for no such run), and the
caller goes by the transaction as before. On SQLite nothing changes.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

TERMINAL_COLUMNS = ("status", "error", "finished_at", "fingerprint", "subset_fingerprint", "impl_fingerprint",
                    "fetch_fingerprint", "analyze_fingerprint", "setup_fingerprint", "atomize_fingerprint",
                    "benchmark_id", "subset_id", "impl_id")
"""The row's columns a run's end sets (``finish_run``: its status, error and end time, then ``stamp_terminal``)."""
_TYPES = {"finished_at": "timestamp with time zone"}

SIGNATURE = ("text, text[], text[], json[], text[], integer[], timestamp, integer, "
             + ", ".join(_TYPES.get(c, "text") for c in TERMINAL_COLUMNS))

FINISH = f"""
CREATE OR REPLACE FUNCTION bw_finish_run(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    p_seen_seq integer, {', '.join(f"p_{c} {_TYPES.get(c, 'text')}" for c in TERMINAL_COLUMNS)},
    OUT o_state text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  now_seq integer;
  ended timestamp with time zone;
BEGIN
  SELECT runs.next_seq, runs.finished_at INTO now_seq, ended FROM runs WHERE runs.id = p_run FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    o_state := 'missing';
  ELSIF ended IS NOT NULL THEN
    o_state := 'ended';  -- a retry, or another end first: the caller's transaction appends what is missing
  ELSIF now_seq <> p_seen_seq THEN
    o_state := 'moved';  -- appended to since the caller read it: its fingerprint may not cover the log
  ELSE
    PERFORM bw_append_events(p_run, p_keys, p_types, p_data, p_phases, p_counts, p_at);
    UPDATE runs SET {', '.join(f"{c} = p_{c}" for c in TERMINAL_COLUMNS)} WHERE runs.id = p_run;
    o_state := 'finished';
  END IF;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(FINISH)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS bw_finish_run({SIGNATURE})")
