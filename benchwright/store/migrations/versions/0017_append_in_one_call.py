"""On Postgres, a small append in one call (issue 25): ``bw_append_events`` takes the run row's lock, reads which of
the events' keys the log holds, inserts the rest with the next seqs and moves the row's ``next_seq`` (with the phase
and task count the new events project): the four statements ``benchwright.store.events`` sent one round trip each.
The lock is the one the no-op ``UPDATE`` took (``FOR NO KEY UPDATE``) without writing the row a second time.

A loop of plain statements, each planned once per connection: a single statement over the arrays (``unnest``, a
``DISTINCT ON`` for repeated keys, a window for the seqs) cost the server 0.6-1.1 ms of CPU an append, more than the
four statements it replaced (0.48 ms). Measured with psycopg on loopback (``bench/append.py --postgres``), a
two-event append in a transaction of its own: the wall 1.27-1.38 -> 0.88-1.13 ms, the client's CPU 0.63-0.66 ->
0.41-0.55 ms, the server's 0.48 -> 0.30-0.40 ms; the call alone in autocommit (``append_events``) 0.57-0.80 ms.
A phase's opening and closing are such appends, a dozen of them on a run's way to its first model call.

The function is plpgsql and ``VOLATILE``: at READ COMMITTED each of its statements takes a snapshot of its own, so
the key check, which runs once the lock is taken, sees every key the lock's previous holder committed, as the
separate statements did. What an event projects (a PhaseStarted's phase, a DatasetTasksArtifact's count) is
decided in Python and passed beside it (``p_phases``, ``p_counts``): the event types are not named here. On SQLite
nothing changes.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

APPEND = """
CREATE OR REPLACE FUNCTION bw_append_events(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    OUT o_fresh integer, OUT o_next_seq integer, OUT o_phase text, OUT o_tasks_total integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  first_seq integer;
BEGIN
  SELECT runs.next_seq INTO first_seq FROM runs WHERE runs.id = p_run FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN;  -- every OUT null: no such run
  END IF;
  o_fresh := 0;
  FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
    -- A key in the log already, or earlier in this append (this transaction's own rows are seen), lands nothing.
    CONTINUE WHEN EXISTS (SELECT 1 FROM events WHERE events.idem_key = p_keys[i]);
    INSERT INTO events (run_id, seq, type, data, idem_key, created_at)
    VALUES (p_run, first_seq + o_fresh, p_types[i], p_data[i], p_keys[i], p_at);
    o_fresh := o_fresh + 1;
    o_phase := coalesce(p_phases[i], o_phase);
    o_tasks_total := coalesce(p_counts[i], o_tasks_total);
  END LOOP;
  o_next_seq := first_seq + o_fresh;
  UPDATE runs SET next_seq = o_next_seq, phase = coalesce(o_phase, runs.phase),
                  tasks_total = coalesce(o_tasks_total, runs.tasks_total)
   WHERE runs.id = p_run;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS bw_append_events(text, text[], text[], json[], text[], integer[], "
                   "timestamp)")
