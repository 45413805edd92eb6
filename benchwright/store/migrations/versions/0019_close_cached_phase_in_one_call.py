"""On Postgres, a cached phase's close in one call (issue 25): ``bw_close_phase`` appends the closing events
(``bw_append_events``, migration 0017), upserts the phase's cache cell and reads the run's spend, one transaction
and one round trip where ``benchwright.store.control.append_closing`` sent five (BEGIN, the append's call, the cell's
upsert, the spend's read, COMMIT). Fetch, Analyze and Setup close this way on every run, on the way to its first
model call; the cell still lands with the events it names. And two more of a phase's or a batch's steps in one
call each: ``bw_append_isolated``, a run's first sandbox's ``SandboxCreated`` with the run row's ``isolation``
(``benchwright.store.events.append_events`` with ``isolation=``; four round trips before), and ``bw_append_reading``,
a phase's opening events and then its run's newest event of a type, the work files its restore goes by
(``benchwright.runs.handoff.append_reading_files``; two round trips before, as the append and the read in their own
transactions).

The cell's upsert is ``benchwright.registry.cache.record_cell_in``'s (a restarted phase's later invocation replaces
the cell, its ``created_at`` stays the first's). A run that does not exist gets every OUT null and no cell, as the
append alone does. The halt a crossed ceiling calls for stays a transaction of its own (rare), as a close without a
cell does since migration 0017's use in autocommit. On SQLite nothing changes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

CLOSE = """
CREATE OR REPLACE FUNCTION bw_close_phase(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    p_phase text, p_input_hash text, p_artifacts json, p_snapshot_id text, p_files json, p_result json,
    p_source_run_id text,
    OUT o_fresh integer, OUT o_next_seq integer, OUT o_phase text, OUT o_tasks_total integer,
    OUT o_incurred double precision, OUT o_billed double precision, OUT o_balance double precision)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  SELECT a.o_fresh, a.o_next_seq, a.o_phase, a.o_tasks_total INTO o_fresh, o_next_seq, o_phase, o_tasks_total
    FROM bw_append_events(p_run, p_keys, p_types, p_data, p_phases, p_counts, p_at) AS a;
  IF o_fresh IS NULL THEN
    RETURN;  -- every OUT null: no such run
  END IF;
  INSERT INTO phase_fingerprints (run_id, phase, input_hash, artifacts, snapshot_id, files, result, source_run_id,
                                  created_at)
  VALUES (p_run, p_phase, p_input_hash, p_artifacts, p_snapshot_id, p_files, p_result, p_source_run_id, p_at)
  ON CONFLICT (run_id, phase) DO UPDATE
    SET input_hash = excluded.input_hash, artifacts = excluded.artifacts, snapshot_id = excluded.snapshot_id,
        files = excluded.files, result = excluded.result, source_run_id = excluded.source_run_id;
  SELECT runs.cost_incurred, runs.cost_billed, accounts.balance_usd INTO o_incurred, o_billed, o_balance
    FROM runs JOIN accounts ON accounts.id = runs.account_id WHERE runs.id = p_run;
END
$$
"""


ISOLATED = """
CREATE OR REPLACE FUNCTION bw_append_isolated(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    p_isolation text,
    OUT o_fresh integer, OUT o_next_seq integer, OUT o_phase text, OUT o_tasks_total integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  SELECT a.o_fresh, a.o_next_seq, a.o_phase, a.o_tasks_total INTO o_fresh, o_next_seq, o_phase, o_tasks_total
    FROM bw_append_events(p_run, p_keys, p_types, p_data, p_phases, p_counts, p_at) AS a;
  IF o_fresh IS NOT NULL THEN  -- the run exists: its row is locked already
    UPDATE runs SET isolation = p_isolation WHERE runs.id = p_run;
  END IF;
END
$$
"""


READING = """
CREATE OR REPLACE FUNCTION bw_append_reading(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    p_read text, OUT o_fresh integer, OUT o_read json)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  SELECT a.o_fresh INTO o_fresh FROM bw_append_events(p_run, p_keys, p_types, p_data, p_phases, p_counts, p_at) AS a;
  IF o_fresh IS NULL THEN
    RETURN;  -- no such run
  END IF;
  SELECT events.data INTO o_read FROM events WHERE events.run_id = p_run AND events.type = p_read
   ORDER BY events.seq DESC LIMIT 1;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(CLOSE)
        op.execute(ISOLATED)
        op.execute(READING)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS bw_close_phase(text, text[], text[], json[], text[], integer[], timestamp, "
                   "text, text, json, text, json, json, text)")
        op.execute("DROP FUNCTION IF EXISTS bw_append_isolated(text, text[], text[], json[], text[], integer[], "
                   "timestamp, text)")
        op.execute("DROP FUNCTION IF EXISTS bw_append_reading(text, text[], text[], json[], text[], integer[], "
                   "timestamp, text)")
