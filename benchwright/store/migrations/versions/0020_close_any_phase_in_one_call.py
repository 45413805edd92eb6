"""On Postgres, any phase's close in one call (issue 25): ``bw_append_spend`` appends the closing events
(``bw_append_events``, migration 0017) and reads the run's spend after them, one transaction and one round trip. A
phase without a cache cell (Attach, Atomize) closed by the append's call and then the spend's read, two round trips
on every run's way to its first model call; a cached phase's close has been one since migration 0019
(``bw_close_phase``: the same, with the cell). ``benchwright.store.control.append_closing`` decides on the halt a
crossed ceiling calls for from what this returns; the halt stays a transaction of its own (rare). A run that does
not exist gets every OUT null, as the append alone does. On SQLite nothing changes.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

SPEND = """
CREATE OR REPLACE FUNCTION bw_append_spend(
    p_run text, p_keys text[], p_types text[], p_data json[], p_phases text[], p_counts integer[], p_at timestamp,
    OUT o_fresh integer, OUT o_incurred double precision, OUT o_billed double precision,
    OUT o_balance double precision)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  SELECT a.o_fresh INTO o_fresh FROM bw_append_events(p_run, p_keys, p_types, p_data, p_phases, p_counts, p_at) AS a;
  IF o_fresh IS NULL THEN
    RETURN;  -- every OUT null: no such run
  END IF;
  SELECT runs.cost_incurred, runs.cost_billed, accounts.balance_usd INTO o_incurred, o_billed, o_balance
    FROM runs JOIN accounts ON accounts.id = runs.account_id WHERE runs.id = p_run;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(SPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS bw_append_spend(text, text[], text[], json[], text[], integer[], "
                   "timestamp)")
