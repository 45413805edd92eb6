"""A phase's close (``benchwright.store.control.append_closing``), on SQLite and Postgres: the closing events, the
phase's cache cell and the spend's check land together; on Postgres in one round trip (``bw_close_phase``, migration
0019; without a cell ``bw_append_spend``, migration 0020). A retried close adds no event and rewrites the cell, a
later invocation's replaces what the cell says (its creation time kept), a ceiling crossed halts after the cell is
written, and a run that does not exist gets nothing."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.errors import NotFound
from benchwright.events import DatasetTasksArtifact, Event, PhaseCompleted
from benchwright.registry.cache import Cell, run_cell
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.control import append_closing
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, event_key, read_events
from benchwright.store.models import PhaseCell
from benchwright.store.runs import create_run, get_run
from tests.store.conftest import round_trips


class SandboxKilled(Event):  # the shape the sandbox runtime emits; its cost_usd is what the cost trigger reads
    sandbox_id: str
    cost_usd: float


def _cell(run_id: str, n: int) -> Cell:
    return Cell(run_id=run_id, phase="analyze", input_hash=f"{n:064x}",
                artifacts=[{"type": "DatasetTasksArtifact", "data": {"tasks": n, "note": "naïve \u201cquoted\u201d"}}],
                snapshot_id=None if n == 1 else f"snap-{n}", files={"tasks.jsonl": f"{n:064x}"},
                result={"tasks": n, "detail": {"rows": [1, 2.5, None]}},
                source_run_id=None if n == 1 else "another-run")


def _closing(run_id: str, invocation: int, *, tasks: int, cost: float = 0.0) -> list[NewEvent]:
    key = ("analyze", invocation)
    return [NewEvent.of(event_key(run_id, *key, "tasks"), DatasetTasksArtifact(count=tasks)),
            NewEvent.of(event_key(run_id, *key, "sandbox"), SandboxKilled(sandbox_id=f"sb{invocation}",
                                                                          cost_usd=cost)),
            NewEvent.of(event_key(run_id, *key, "completed"), PhaseCompleted(phase="analyze", duration_ms=12))]


def _close(engine: Engine, run_id: str, invocation: int, cell: Cell, *, tasks: int, cost: float = 0.0) -> str | None:
    return append_closing(engine, run_id, _closing(run_id, invocation, tasks=tasks, cost=cost), cell=cell,
                          run_cost_usd=0.5, budget_key=f"analyze-{invocation}-budget")


def test_a_cached_close_lands_its_events_and_its_cell_together(store_run: tuple[Engine, str]) -> None:
    engine, run_id = store_run
    if engine.dialect.name == "postgresql":  # bw_close_phase in autocommit: BEGIN, call, cell, read, COMMIT before
        with round_trips(engine) as trips:
            assert _close(engine, run_id, 1, _cell(run_id, 1), tasks=7) is None
        assert trips == [1]
    else:
        assert _close(engine, run_id, 1, _cell(run_id, 1), tasks=7) is None
    log = read_events(engine, run_id)
    assert [e.type for e in log[-3:]] == ["DatasetTasksArtifact", "SandboxKilled", "PhaseCompleted"]
    assert [e.seq for e in log] == list(range(len(log)))
    assert run_cell(engine, run_id=run_id, phase="analyze") == _cell(run_id, 1)
    run = get_run(engine, run_id=run_id)
    assert run.tasks_total == 7 and run.next_seq == len(log) and not run.halted
    with Session(engine) as session:
        made = session.get(PhaseCell, (run_id, "analyze")).created_at  # type: ignore[union-attr]

    assert _close(engine, run_id, 1, _cell(run_id, 1), tasks=7) is None  # a retried close
    assert len(read_events(engine, run_id)) == len(log)
    assert _close(engine, run_id, 2, _cell(run_id, 2), tasks=9) is None  # the phase's next invocation
    assert run_cell(engine, run_id=run_id, phase="analyze") == _cell(run_id, 2)
    assert get_run(engine, run_id=run_id).tasks_total == 9
    with Session(engine) as session:
        assert session.get(PhaseCell, (run_id, "analyze")).created_at == made  # type: ignore[union-attr]
    engine.dispose()


def test_a_cached_close_that_crosses_the_ceiling_halts_after_its_cell(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="payer", balance_usd=5.0)
    run_id = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                        driver="builtin", trials_config={}).id
    assert _close(engine, run_id, 1, _cell(run_id, 1), tasks=3, cost=0.2) is None
    assert _close(engine, run_id, 2, _cell(run_id, 2), tasks=3, cost=0.4) == "limit_exceeded:run.cost"  # 0.6 > 0.5
    run = get_run(engine, run_id=run_id)
    assert run.halted and run.halt_reason == "limit_exceeded:run.cost"
    log = read_events(engine, run_id)
    assert [e.type for e in log[-2:]] == ["PhaseCompleted", "RunHalted"]
    assert log[-1].idem_key == event_key(run_id, "halt", "analyze-2-budget")
    assert run_cell(engine, run_id=run_id, phase="analyze") == _cell(run_id, 2)
    assert _close(engine, run_id, 2, _cell(run_id, 2), tasks=3, cost=0.4) is None, "halted already: no second halt"
    assert len(read_events(engine, run_id)) == len(log)
    engine.dispose()


def test_a_cached_close_of_no_run_or_of_another_runs_cell_writes_nothing(store_run: tuple[Engine, str]) -> None:
    engine, run_id = store_run
    with pytest.raises(NotFound):
        _close(engine, "no-such-run", 1, _cell("no-such-run", 1), tasks=1)
    assert run_cell(engine, run_id="no-such-run", phase="analyze") is None
    with pytest.raises(ValueError, match="cell"):
        _close(engine, run_id, 1, _cell("no-such-run", 1), tasks=1)
    assert run_cell(engine, run_id=run_id, phase="analyze") is None
    assert not [e for e in read_events(engine, run_id) if e.type == "PhaseCompleted"]
    engine.dispose()


def test_a_close_without_a_cell_is_one_round_trip_and_halts_on_a_crossed_ceiling(db_url: str) -> None:
    """Attach's and Atomize's closes (no cache cell): the events and the spend's read in one call on Postgres (the
    call and then the read before), the halt after them when the run's cost crosses its ceiling, once."""
    engine = make_engine(db_url)
    migrate(engine)
    account, _ = create_account(engine, name="payer", balance_usd=5.0)
    run_id = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                        driver="builtin", trials_config={}).id

    def close(invocation: int, cost: float) -> str | None:
        return append_closing(engine, run_id, _closing(run_id, invocation, tasks=4, cost=cost), run_cost_usd=0.5,
                              budget_key=f"analyze-{invocation}-budget")

    if engine.dialect.name == "postgresql":
        with round_trips(engine) as trips:
            assert close(1, 0.2) is None
        assert trips == [1]
    else:
        assert close(1, 0.2) is None
    assert [e.type for e in read_events(engine, run_id)[-3:]] == ["DatasetTasksArtifact", "SandboxKilled",
                                                                  "PhaseCompleted"]
    assert run_cell(engine, run_id=run_id, phase="analyze") is None
    assert get_run(engine, run_id=run_id).tasks_total == 4
    assert close(1, 0.2) is None  # retried: nothing new, the same spend
    assert close(2, 0.4) == "limit_exceeded:run.cost"  # 0.6 > 0.5
    log = read_events(engine, run_id)
    assert [e.type for e in log[-2:]] == ["PhaseCompleted", "RunHalted"]
    assert [e.seq for e in log] == list(range(len(log)))
    assert close(2, 0.4) is None, "halted already: no second halt"
    assert len(read_events(engine, run_id)) == len(log)
    with pytest.raises(NotFound):
        append_closing(engine, "no-such-run", _closing("no-such-run", 1, tasks=1), run_cost_usd=0.5,
                       budget_key="analyze-1-budget")
    engine.dispose()
