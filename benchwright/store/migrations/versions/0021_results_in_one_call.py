"""On Postgres, a small append of results in one call (issue 25): ``bw_append_results`` appends events as
``bw_append_events`` does (migration 0017), inserts the trial and task rows the new ones project, and reads the
run's spend after them, one transaction and one round trip. A batch's commit of a few results was eight round trips
(BEGIN, the lock, the key check, the events, the trial rows, the task rows, the row's ``next_seq``, COMMIT) and its
budget check a ninth: a one-task run's last result waited for all of them on its way to the run's end.

Each projection row names the event it comes from (``p_t_of``, ``p_r_of``: its position in ``p_keys``) and lands
only if that event does: an event whose key the log holds already projects nothing, as in
``benchwright.store.events._append_by_statements``. The rows themselves (a task row's ``no_answer`` included) are
made in Python, as they are for the statements; an append whose ``no_answer`` needs a trial committed earlier goes
by the statements. Larger appends go by ``COPY`` (``benchwright.store.events._COPY_FROM``). On SQLite nothing
changes.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

SIGNATURE = ("text, text[], text[], json[], text[], integer[], timestamp, "
             "integer[], integer[], integer[], integer[], text[], double precision[], text[], json[], text[], text[], "
             "integer[], integer[], integer[], text[], double precision[], json[], boolean[], integer[], integer[]")

RESULTS = """
CREATE OR REPLACE FUNCTION bw_append_results(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    p_t_of integer[], p_t_invocation integer[], p_t_index integer[], p_t_trial integer[], p_t_outcome text[],
    p_t_score double precision[], p_t_output text[], p_t_meta json[], p_t_error text[], p_t_input text[],
    p_r_of integer[], p_r_invocation integer[], p_r_index integer[], p_r_outcome text[], p_r_score double precision[],
    p_r_trial_scores json[], p_r_no_answer boolean[], p_r_scored integer[], p_r_passed integer[],
    OUT o_fresh integer, OUT o_incurred double precision, OUT o_billed double precision,
    OUT o_balance double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  first_seq integer;
  landed boolean[] := '{}';
  new_phase text;
  new_total integer;
BEGIN
  SELECT runs.next_seq INTO first_seq FROM runs WHERE runs.id = p_run FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN;  -- every OUT null: no such run
  END IF;
  o_fresh := 0;
  FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
    -- A key in the log already, or earlier in this append (this transaction's own rows are seen), lands nothing.
    landed[i] := NOT EXISTS (SELECT 1 FROM events WHERE events.idem_key = p_keys[i]);
    CONTINUE WHEN NOT landed[i];
    INSERT INTO events (run_id, seq, type, data, idem_key, created_at)
    VALUES (p_run, first_seq + o_fresh, p_types[i], p_data[i], p_keys[i], p_at);
    o_fresh := o_fresh + 1;
    new_phase := coalesce(p_phases[i], new_phase);
    new_total := coalesce(p_counts[i], new_total);
  END LOOP;
  FOR j IN 1 .. coalesce(array_length(p_t_of, 1), 0) LOOP
    CONTINUE WHEN NOT landed[p_t_of[j]];
    INSERT INTO trial_results (run_id, invocation, "index", trial, outcome, score, output, meta, error, input)
    VALUES (p_run, p_t_invocation[j], p_t_index[j], p_t_trial[j], p_t_outcome[j], p_t_score[j], p_t_output[j],
            p_t_meta[j], p_t_error[j], p_t_input[j]);
  END LOOP;
  FOR j IN 1 .. coalesce(array_length(p_r_of, 1), 0) LOOP
    CONTINUE WHEN NOT landed[p_r_of[j]];
    INSERT INTO task_rows (run_id, invocation, "index", outcome, score, trial_scores, no_answer, trials_scored,
                           trials_passed)
    VALUES (p_run, p_r_invocation[j], p_r_index[j], p_r_outcome[j], p_r_score[j], p_r_trial_scores[j],
            p_r_no_answer[j], p_r_scored[j], p_r_passed[j]);
  END LOOP;
  UPDATE runs SET next_seq = first_seq + o_fresh, phase = coalesce(new_phase, runs.phase),
                  tasks_total = coalesce(new_total, runs.tasks_total)
   WHERE runs.id = p_run;
  SELECT runs.cost_incurred, runs.cost_billed, accounts.balance_usd INTO o_incurred, o_billed, o_balance
    FROM runs JOIN accounts ON accounts.id = runs.account_id WHERE runs.id = p_run;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(RESULTS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS bw_append_results({SIGNATURE})")
