"""Results you can audit (issue 21): ``task_rows.no_answer`` and ``trial_results.input``.

``no_answer`` is a projection of the log like ``outcome``: a failed task whose every trial reported
``score_meta.extracted == false`` (``benchwright.store.events``). ``input`` is what the model saw on the scorer's
last model call, bounded (``benchwright.scoring.host.MAX_INPUT_CHARS``); rows written before this revision have none.

Existing failed rows are backfilled from their trials' meta, so runs recorded before the upgrade report the same
count a fresh projection of their log would.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BATCH = 1000


def upgrade() -> None:
    op.add_column("task_rows", sa.Column("no_answer", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("trial_results", sa.Column("input", sa.Text(), nullable=True))
    _backfill()


def _backfill() -> None:
    bind = op.get_bind()
    trials = sa.table("trial_results", sa.column("run_id"), sa.column("invocation"), sa.column("index"),
                      sa.column("meta", sa.JSON()))
    rows = sa.table("task_rows", sa.column("run_id"), sa.column("invocation"), sa.column("index"),
                    sa.column("outcome"), sa.column("no_answer"))
    verdict: dict[tuple[str, int, int], bool] = {}
    failed = sa.select(trials.c.run_id, trials.c.invocation, trials.c["index"], trials.c.meta).join(
        rows, sa.and_(rows.c.run_id == trials.c.run_id, rows.c.invocation == trials.c.invocation,
                      rows.c["index"] == trials.c["index"])).where(rows.c.outcome == "fail")
    for run_id, invocation, index, meta in bind.execute(failed):
        if isinstance(meta, str):
            meta = json.loads(meta)
        key = (run_id, invocation, index)
        verdict[key] = verdict.get(key, True) and _no_answer(meta)
    keys = [k for k, v in verdict.items() if v]
    for start in range(0, len(keys), _BATCH):
        for run_id, invocation, index in keys[start:start + _BATCH]:
            bind.execute(rows.update().where(rows.c.run_id == run_id, rows.c.invocation == invocation,
                                             rows.c["index"] == index).values(no_answer=True))


def _no_answer(meta: Any) -> bool:
    return isinstance(meta, dict) and meta.get("extracted") is False


def downgrade() -> None:
    # batch mode: SQLite rebuilds the table (older SQLite has no DROP COLUMN)
    with op.batch_alter_table("trial_results") as batch:
        batch.drop_column("input")
    with op.batch_alter_table("task_rows") as batch:
        batch.drop_column("no_answer")
