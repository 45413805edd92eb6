"""Narration's call and token counts beside cost.narration (issue 26, §9: "with call and token counts beside it").

``NarrationUsage`` already lands in ``cost_narration`` (and, with the markup, ``cost_billed``) through the
``events_cost`` trigger of 0002. This revision adds the counts and a second, additive trigger that maintains them
as NarrationUsage rows land, so the cost trigger itself is untouched:

    runs.narration_calls              += data.calls
    runs.narration_prompt_tokens      += data.prompt_tokens
    runs.narration_completion_tokens  += data.completion_tokens

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COLUMNS = ("narration_calls", "narration_prompt_tokens", "narration_completion_tokens")
_FIELDS = {"narration_calls": "calls", "narration_prompt_tokens": "prompt_tokens",
           "narration_completion_tokens": "completion_tokens"}


def upgrade() -> None:
    # Plain ADD COLUMNs (as in 0004-0008): batch mode would copy runs, which the events_cost trigger names.
    for column in COLUMNS:
        op.add_column("runs", sa.Column(column, sa.Integer(), nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        sets = ", ".join(f"{c} = {c} + COALESCE((NEW.data->>'{f}')::bigint, 0)" for c, f in _FIELDS.items())
        op.execute(f"""
        CREATE OR REPLACE FUNCTION bw_events_narration_usage() RETURNS trigger AS $$
        BEGIN
          IF NEW.type = 'NarrationUsage' THEN
            UPDATE runs SET {sets} WHERE id = NEW.run_id;
          END IF;
          RETURN NEW;
        END
        $$ LANGUAGE plpgsql
        """)
        op.execute("CREATE TRIGGER events_narration_usage AFTER INSERT ON events FOR EACH ROW "
                   "EXECUTE FUNCTION bw_events_narration_usage()")
    else:
        sets = ", ".join(f"{c} = {c} + COALESCE(json_extract(NEW.data, '$.{f}'), 0)" for c, f in _FIELDS.items())
        op.execute(f"""
        CREATE TRIGGER events_narration_usage AFTER INSERT ON events
        WHEN NEW.type = 'NarrationUsage'
        BEGIN
          UPDATE runs SET {sets} WHERE id = NEW.run_id;
        END
        """)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_narration_usage ON events")
        op.execute("DROP FUNCTION IF EXISTS bw_events_narration_usage()")
    else:
        op.execute("DROP TRIGGER IF EXISTS events_narration_usage")
    for column in reversed(COLUMNS):
        op.drop_column("runs", column)
