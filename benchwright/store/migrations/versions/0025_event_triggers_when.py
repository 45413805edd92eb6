"""On Postgres, the two row triggers on ``events`` fire only for the events they act on (issue 25), as SQLite's do.

``events_cost`` (migration 0002) and ``events_narration_usage`` (0013) were created without a ``WHEN`` clause on
Postgres: every inserted event, a Materialize batch's thousands of results and aggregates among them, queued an
after-trigger event and then called a plpgsql function that looked at the row's type (and parsed its ``data`` for
``cost_usd``) and returned. With the condition on the trigger, Postgres evaluates it as the row is inserted, in the
executor, and queues nothing for a row it does not match. The conditions are SQLite's (0002, 0013); the functions
keep their own checks, so a row the condition lets through is handled exactly as before.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_COST_TYPES = ("MaterializeTaskResult", "SandboxKilled", "DriverUsage", "NarrationUsage", "ProxyLingerMetered")
"""``SOURCES`` of migration 0002: the event types that carry a cost (each ``data.cost_usd``)."""
_COST_WHEN = (f"NEW.type IN ({', '.join(repr(t) for t in _COST_TYPES)}) "
              "AND COALESCE((NEW.data->>'cost_usd')::double precision, 0) <> 0")
_USAGE_WHEN = "NEW.type = 'NarrationUsage'"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER events_cost ON events")
    op.execute(f"CREATE TRIGGER events_cost AFTER INSERT ON events FOR EACH ROW WHEN ({_COST_WHEN}) "
               "EXECUTE FUNCTION bw_events_cost()")
    op.execute("DROP TRIGGER events_narration_usage ON events")
    op.execute(f"CREATE TRIGGER events_narration_usage AFTER INSERT ON events FOR EACH ROW WHEN ({_USAGE_WHEN}) "
               "EXECUTE FUNCTION bw_events_narration_usage()")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER events_cost ON events")
    op.execute("CREATE TRIGGER events_cost AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION bw_events_cost()")
    op.execute("DROP TRIGGER events_narration_usage ON events")
    op.execute("CREATE TRIGGER events_narration_usage AFTER INSERT ON events FOR EACH ROW "
               "EXECUTE FUNCTION bw_events_narration_usage()")
