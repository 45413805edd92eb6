"""A run's row and its RunLaunched (``create_run``): on Postgres one statement, one round trip (a data-modifying
``WITH``; the transaction made four), writing what the ORM's transaction writes on SQLite, column by column; a fork
(its tree's row too) stays a transaction. An id taken already lands nothing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import read_events
from benchwright.store.models import Run
from benchwright.store.runs import create_run, get_run
from tests.store.conftest import round_trips

LAUNCH = LaunchRequest.model_validate({
    "dataset": "hf://openai/gsm8k?split=test",
    "model": {"identifier": "openai/gpt-x", "api_base": "http://127.0.0.1:9/v1"},
    "metadata": {"team": "evals \x00 nul"}, "visibility": "unlisted"})


def _launch(engine: Engine, run_id: str) -> tuple[list[int], dict[str, Any], tuple[Any, ...], tuple[Any, ...]]:
    """Launch ``run_id`` (its account made first); returns the launch's round trips (Postgres), the row as read
    back (but its id, account and time), its one event (the run id taken out of its key, its account out of its
    data) and which of three nullable columns hold SQL NULL."""
    account, _ = create_account(engine, name=f"launch-{run_id}")
    counting = round_trips(engine) if engine.dialect.name == "postgresql" else contextlib.nullcontext([])
    with counting as trips:
        create_run(engine, account_id=account.id, launch=LAUNCH, driver="builtin", trials_config={"plan": {"k": 3}},
                   billing_markup=1.25, backend="local", materialize_mode="sequential", run_id=run_id)
    run = get_run(engine, run_id=run_id)
    row = {c.key: getattr(run, c.key) for c in Run.__table__.columns  # type: ignore[attr-defined]
           if c.key not in ("id", "account_id", "created_at")}
    (event,) = read_events(engine, run_id)
    with engine.connect() as conn:
        nulls = conn.execute(text("SELECT limits IS NULL, pinned IS NULL, phase IS NULL FROM runs WHERE id = :id"),
                             {"id": run_id}).one()
    return trips, row, (event.seq, event.type, event.idem_key.replace(run_id, "R"),
                        {**event.data, "account_id": None}), tuple(bool(v) for v in nulls)


def test_a_launch_on_postgres_is_one_statement_that_writes_what_the_transaction_writes(
        postgres_url: str, tmp_path: Path) -> None:
    sqlite, postgres = make_engine(f"sqlite:///{tmp_path / 'store.db'}"), make_engine(postgres_url)
    for engine in (sqlite, postgres):
        migrate(engine)
    _, row, event, nulls = _launch(sqlite, "run-1")
    trips, landed_row, landed_event, landed_nulls = _launch(postgres, "run-1")
    assert trips == [1]
    assert landed_row == row
    assert (row["next_seq"], row["status"], row["visibility"], row["billing_markup"]) == (1, "running", "unlisted",
                                                                                          1.25)
    assert landed_nulls == nulls == (False, False, True)  # None in a JSON column is JSON null, as the ORM writes it
    # The event: the same, but a NUL in it, which Postgres holds as U+FFFD (as every append there does).
    assert landed_event[:3] == event[:3] == (0, "RunLaunched", "R:launch")
    assert event[3]["launch"]["metadata"] == {"team": "evals \x00 nul"}
    assert landed_event[3]["launch"]["metadata"] == {"team": "evals \ufffd nul"}
    account_id = get_run(postgres, run_id="run-1").account_id
    with pytest.raises(IntegrityError):  # the id is taken: neither a row nor an event lands
        create_run(postgres, account_id=account_id, launch=LAUNCH, driver="other", trials_config={}, run_id="run-1")
    assert [e.seq for e in read_events(postgres, "run-1")] == [0]
    assert get_run(postgres, run_id="run-1").driver == "builtin"
    for engine in (sqlite, postgres):
        engine.dispose()
