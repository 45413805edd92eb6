"""Cost by source on the run row, maintained by a database trigger; account balances; run limits and backend.

Cost is never summed by application code: every cost-bearing event carries ``data.cost_usd`` and the trigger adds
it to the run's column for its source as the event row lands, and debits the account by the billed part.

    event type              source      in incurred   billed (x markup, debits the balance)
    MaterializeTaskResult   model       yes           no   (the SUT's spend: BYOK)
    SandboxKilled           sandbox     yes           yes
    DriverUsage             driver      yes           yes
    NarrationUsage          narration   yes           yes
    ProxyLingerMetered      linger      no            no   (reported separately, §9)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COST_COLUMNS = ("cost_driver", "cost_model", "cost_sandbox", "cost_narration", "cost_incurred", "cost_billed",
                "proxy_linger_usd")

SOURCES = {"MaterializeTaskResult": "model", "SandboxKilled": "sandbox", "DriverUsage": "driver",
           "NarrationUsage": "narration", "ProxyLingerMetered": "linger"}
INCURRED = ("MaterializeTaskResult", "SandboxKilled", "DriverUsage", "NarrationUsage")
BILLED = ("SandboxKilled", "DriverUsage", "NarrationUsage")


def _in(types: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{t}'" for t in types) + ")"


def _sqlite_trigger() -> str:
    c = "json_extract(NEW.data, '$.cost_usd')"
    per_source = ",\n        ".join(
        f"{col} = {col} + CASE WHEN NEW.type = '{t}' THEN {c} ELSE 0 END"
        for t, col in (("MaterializeTaskResult", "cost_model"), ("SandboxKilled", "cost_sandbox"),
                       ("DriverUsage", "cost_driver"), ("NarrationUsage", "cost_narration"),
                       ("ProxyLingerMetered", "proxy_linger_usd")))
    return f"""
    CREATE TRIGGER events_cost AFTER INSERT ON events
    WHEN NEW.type IN {_in(tuple(SOURCES))} AND COALESCE({c}, 0) != 0
    BEGIN
      UPDATE runs SET
        {per_source},
        cost_incurred = cost_incurred + CASE WHEN NEW.type IN {_in(INCURRED)} THEN {c} ELSE 0 END,
        cost_billed = cost_billed + CASE WHEN NEW.type IN {_in(BILLED)} THEN {c} * billing_markup ELSE 0 END
      WHERE id = NEW.run_id;
      UPDATE accounts SET balance_usd = balance_usd - {c} * (SELECT billing_markup FROM runs WHERE id = NEW.run_id)
      WHERE NEW.type IN {_in(BILLED)} AND id = (SELECT account_id FROM runs WHERE id = NEW.run_id);
    END
    """


def _postgres_trigger() -> list[str]:
    per_source = ",\n          ".join(
        f"{col} = {col} + CASE WHEN NEW.type = '{t}' THEN c ELSE 0 END"
        for t, col in (("MaterializeTaskResult", "cost_model"), ("SandboxKilled", "cost_sandbox"),
                       ("DriverUsage", "cost_driver"), ("NarrationUsage", "cost_narration"),
                       ("ProxyLingerMetered", "proxy_linger_usd")))
    return [f"""
    CREATE OR REPLACE FUNCTION bw_events_cost() RETURNS trigger AS $$
    DECLARE
      c double precision := COALESCE((NEW.data->>'cost_usd')::double precision, 0);
      markup double precision;
      acct varchar;
    BEGIN
      IF c = 0 OR NEW.type NOT IN {_in(tuple(SOURCES))} THEN
        RETURN NEW;
      END IF;
      UPDATE runs SET
          {per_source},
          cost_incurred = cost_incurred + CASE WHEN NEW.type IN {_in(INCURRED)} THEN c ELSE 0 END,
          cost_billed = cost_billed + CASE WHEN NEW.type IN {_in(BILLED)} THEN c * billing_markup ELSE 0 END
        WHERE id = NEW.run_id
        RETURNING billing_markup, account_id INTO markup, acct;
      IF NEW.type IN {_in(BILLED)} THEN
        UPDATE accounts SET balance_usd = balance_usd - c * markup WHERE id = acct;
      END IF;
      RETURN NEW;
    END
    $$ LANGUAGE plpgsql
    """, "CREATE TRIGGER events_cost AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION bw_events_cost()"]


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cost_model_usd")
        for col in COST_COLUMNS:
            batch_op.add_column(sa.Column(col, sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("billing_markup", sa.Float(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("limits", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("backend", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True))
        batch_op.add_column(sa.Column("materialize_mode", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True))
        batch_op.add_column(sa.Column("isolation", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True))
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("balance_usd", sa.Float(), nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        for statement in _postgres_trigger():
            op.execute(statement)
    else:
        op.execute(_sqlite_trigger())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_cost ON events")
        op.execute("DROP FUNCTION IF EXISTS bw_events_cost()")
    else:
        op.execute("DROP TRIGGER IF EXISTS events_cost")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("balance_usd")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for col in ("isolation", "materialize_mode", "backend", "limits", "billing_markup", *COST_COLUMNS):
            batch_op.drop_column(col)
        batch_op.add_column(sa.Column("cost_model_usd", sa.Float(), nullable=False, server_default="0"))
