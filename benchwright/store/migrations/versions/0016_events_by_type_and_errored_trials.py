"""Two indexes for the reads at a run's end, which grew with the run (issue 25: a 10,000 x 5 run's long poll answered
~0.3 s after its terminal event, most of it these reads scanning its ~60,000 events and 50,000 trial rows):

- ``ix_events_run_type`` (run_id, type, seq): a run's events of one type (its halts, its failed phase, its
  narration, its artifacts for the fingerprint, the Driver's latest event) found without reading the rest of the
  log. Measured on SQLite: the builtin narration's facts 66 -> 25 ms on such a run; the append of 10,000 result
  events costs the same within noise (~25 us an event).
- ``ix_trial_results_errored`` (run_id, invocation) over the trials that errored only: the narration's top errors
  read those rows, not every trial (an ``error`` column in the key could exceed Postgres's index row size).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

ERRORED = sa.text("outcome = 'err'")


def upgrade() -> None:
    op.create_index("ix_events_run_type", "events", ["run_id", "type", "seq"])
    op.create_index("ix_trial_results_errored", "trial_results", ["run_id", "invocation"], sqlite_where=ERRORED,
                    postgresql_where=ERRORED)


def downgrade() -> None:
    op.drop_index("ix_trial_results_errored", table_name="trial_results")
    op.drop_index("ix_events_run_type", table_name="events")
