"""The event log under concurrent appends from several processes, on SQLite and Postgres."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from sqlalchemy import select, update
from sqlmodel import Session

from benchwright.events import AgentTextEvent
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.models import EventRow, Run
from benchwright.store.runs import create_run

PROCESSES = 6
PER_PROCESS = 40
SHARED_KEYS = 10
"""Keys every process appends: each must land exactly once however the processes interleave."""


def _appender(url: str, run_id: str, worker: int) -> None:
    engine = make_engine(url)
    for i in range(PER_PROCESS):
        own = NewEvent.of(event_key(run_id, "test", worker, i), AgentTextEvent(phase="test", text=f"{worker}:{i}"))
        batch = [own]
        if i < SHARED_KEYS:
            batch.append(NewEvent.of(event_key(run_id, "shared", i), AgentTextEvent(phase="test", text=f"shared {i}")))
        append_events(engine, run_id, batch)
    engine.dispose()


def _new_run(url: str, account_name: str = "appender") -> str:
    engine = make_engine(url)
    migrate(engine)
    account, _ = create_account(engine, name=account_name)
    run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                     driver="builtin", trials_config={})
    engine.dispose()
    return run.id


def test_concurrent_appends_from_processes_keep_seq_gapless(db_url: str) -> None:
    run_id = _new_run(db_url)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(db_url, run_id, w)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"appender {p.pid} exited with {p.exitcode}"

    engine = make_engine(db_url)
    events = read_events(engine, run_id, limit=100_000)
    expected = 1 + PROCESSES * PER_PROCESS + SHARED_KEYS  # RunLaunched + own keys + each shared key once
    assert [e.seq for e in events] == list(range(expected))
    texts = [e.data["text"] for e in events[1:]]
    assert len(texts) == len(set(texts))
    with Session(engine) as session:
        assert session.execute(select(Run.next_seq).where(Run.id == run_id)).scalar_one() == expected
        # each process's own events are in the order it appended them
        for w in range(PROCESSES):
            mine = [int(t.split(":")[1]) for t in texts if t.startswith(f"{w}:")]
            assert mine == list(range(PER_PROCESS))
        assert session.execute(select(EventRow).where(EventRow.run_id == run_id)).scalars().all()
    engine.dispose()


def test_append_is_idempotent_and_projects_in_the_same_transaction(db_url: str) -> None:
    from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
    from benchwright.store.runs import get_run, list_tasks, run_view

    run_id = _new_run(db_url)
    engine = make_engine(db_url)
    batch = [
        NewEvent.of(event_key(run_id, "m", 1, 0, 0), MaterializeTaskResult(
            invocation=1, index=0, trial=0, score=1.0, outcome="pass", output="42", cost_usd=0.25)),
        NewEvent.of(event_key(run_id, "m", 1, 0, "agg"), MaterializeTaskAggregated(
            invocation=1, index=0, score=1.0, outcome="pass", trial_scores=[1.0])),
    ]
    assert append_events(engine, run_id, batch) == 2
    assert append_events(engine, run_id, batch) == 0
    view = run_view(engine, get_run(engine, run_id=run_id))
    assert view.cost.model == 0.25 and view.tasks.summary.passed == 1
    assert [t.output for t in list_tasks(engine, run_id=run_id).tasks] == ["42"]
    assert [e.seq for e in read_events(engine, run_id)] == [0, 1, 2]
    engine.dispose()


# Text as replies come: markdown, LaTeX, code with tabs and backslashes, CRLF, COPY's own markers (\N, \.), quotes.
_AWKWARD = ["**Answer:** $\\frac{1}{2}$\n\n```python\n\tprint('a\\tb')\n```", "line\r\nnext\\N\n\\.\n",
            'say "hi" \\ {}', "<think>hmm…</think> 答案是 42 🙂", ""]


def _task_events(run_id: str, index: int, invocation: int = 1, output: str = "x",
                 meta: dict | None = None) -> list[NewEvent]:
    from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult

    return [NewEvent.of(event_key(run_id, "m", invocation, index, 0), MaterializeTaskResult(
                invocation=invocation, index=index, trial=0, score=0.0, outcome="fail", output=output,
                meta=meta or {}, cost_usd=0.01)),
            NewEvent.of(event_key(run_id, "m", invocation, index, "agg"), MaterializeTaskAggregated(
                invocation=invocation, index=index, score=0.0, outcome="fail", trial_scores=[0.0]))]


def test_a_large_append_lands_exactly_as_small_ones_do(db_url: str) -> None:
    """On Postgres an append of _COPY_FROM rows or more goes in by COPY, smaller ones by INSERT: the log, the task
    rows and the cost trigger must come out the same either way."""
    from benchwright.store.events import _COPY_FROM
    from benchwright.store.runs import get_run, list_tasks, run_view

    engine = make_engine(db_url)
    whole, piecemeal = _new_run(db_url), _new_run(db_url, "piecemeal")
    tasks = 30
    outputs = [_AWKWARD[i % len(_AWKWARD)] + f" #{i}" for i in range(tasks)]
    metas = [{"reply": outputs[i], "usage": {"tokens": i}, "tabs\tkey": [1, "\\"]} for i in range(tasks)]
    batch = [e for i in range(tasks) for e in _task_events(whole, i, output=outputs[i], meta=metas[i])]
    assert len(batch) >= _COPY_FROM
    assert append_events(engine, whole, batch) == 2 * tasks
    for i in range(tasks):
        small = _task_events(piecemeal, i, output=outputs[i], meta=metas[i])
        assert len(small) < _COPY_FROM
        assert append_events(engine, piecemeal, small) == 2
    assert append_events(engine, whole, batch) == 0

    def logged(run_id: str) -> list[tuple[int, str, dict]]:
        return [(e.seq, e.type, e.data) for e in read_events(engine, run_id)][1:]  # after RunLaunched

    assert logged(whole) == logged(piecemeal)
    assert [e[2]["output"] for e in logged(whole) if e[1] == "MaterializeTaskResult"] == outputs
    for run_id in (whole, piecemeal):
        listed = list_tasks(engine, run_id=run_id, limit=100).tasks
        assert [t.output for t in listed] == outputs
        view = run_view(engine, get_run(engine, run_id=run_id))
        assert view.cost.model == pytest.approx(0.01 * tasks) and view.tasks.summary.failed == tasks
    engine.dispose()


def test_a_reply_with_nul_characters_is_stored_and_counted(db_url: str) -> None:
    """An endpoint may answer with NUL characters. SQLite keeps them; Postgres, which cannot hold one in text (nor
    read a \\u0000 in JSON with ->>, as the cost trigger does), gets U+FFFD in their place. Either way the append
    lands, small or large, and the run can end with an error that quotes one."""
    from benchwright.store.runs import finish_run, get_run, list_tasks, run_view

    engine = make_engine(db_url)
    run_id = _new_run(db_url)
    reply = "answer:\x00 42\x00"
    stored = reply if db_url.startswith("sqlite") else reply.replace("\x00", "\ufffd")
    meta = {"raw\x00": ["\x00"]}
    assert append_events(engine, run_id, _task_events(run_id, 0, output=reply, meta=meta)) == 2
    large = [e for i in range(1, 21) for e in _task_events(run_id, i, output=reply, meta=meta)]
    assert append_events(engine, run_id, large) == 40
    assert append_events(engine, run_id, large) == 0  # the keys still match on a retry
    assert {t.output for t in list_tasks(engine, run_id=run_id, limit=100).tasks} == {stored}
    results = [e for e in read_events(engine, run_id) if e.type == "MaterializeTaskResult"]
    assert len(results) == 21 and {e.data["output"] for e in results} == {stored}
    assert results[0].data["meta"] == {f"raw{stored[7]}": [stored[7]]}
    assert run_view(engine, get_run(engine, run_id=run_id)).cost.model == pytest.approx(0.21)
    finish_run(engine, run_id=run_id, status="error", error="the endpoint said \x00")
    assert get_run(engine, run_id=run_id).error == "the endpoint said \ufffd"
    assert [e.data["error"] for e in read_events(engine, run_id) if e.type == "PipelineFinished"] == [
        "the endpoint said \ufffd"]  # the row and its event alike
    engine.dispose()


@pytest.mark.parametrize("way", ["copy", "append"])
def test_a_connection_lost_on_the_driver_path_reads_as_a_store_outage(postgres_url: str, way: str) -> None:
    """On Postgres a COPY, and an append's own statements (the lock, the key check, the rows, the run's update, or
    the one call that makes them all), run on the driver's cursor outside SQLAlchemy's statement path: their errors
    must still come out as SQLAlchemy's, a lost connection invalidated, so that the batch waits an outage out instead
    of failing."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    from benchwright.store.db import store_outage
    from benchwright.store.events import _COPY_FROM, _EVENTS, _insert_rows, append_in_session
    from tests.store.conftest import POSTGRES_URL

    run_id = _new_run(postgres_url)
    engine, admin = make_engine(postgres_url), create_engine(POSTGRES_URL)
    rows = [{"seq": 100 + i, "type": "AgentText", "data": {"text": str(i)}, "idem_key": f"{run_id}:lost:{i}"}
            for i in range(_COPY_FROM)]
    with Session(engine) as session:
        pid = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with admin.connect() as other:  # waits until that backend has gone
            assert other.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid}).scalar_one()
        with pytest.raises(DBAPIError) as raised:
            if way == "copy":
                _insert_rows(session, _EVENTS, rows, same={"run_id": run_id, "created_at": None})
            else:
                append_in_session(session, run_id, [NewEvent.of(event_key(run_id, "lost"), AgentTextEvent(
                    phase="test", text="after the connection went"))])
        assert session.connection().invalidated
    assert raised.value.connection_invalidated
    assert (store_outage(raised.value) or "").startswith("the store's connection was lost")
    assert [e.seq for e in read_events(engine, run_id)] == [0]  # nothing landed; the pool serves a live connection
    engine.dispose()
    admin.dispose()


def test_an_append_through_a_readers_session_is_refused(postgres_url: str) -> None:
    """A session on ``store.db.reader`` runs each statement in autocommit: the run row's lock would end with its own
    statement and two appenders could take the same seq. The append refuses it and writes nothing."""
    from benchwright.store.db import reader
    from benchwright.store.events import append_in_session

    run_id = _new_run(postgres_url)
    engine = make_engine(postgres_url)
    with Session(reader(engine)) as session, pytest.raises(RuntimeError, match="needs a transaction"):
        append_in_session(session, run_id, [NewEvent.of(event_key(run_id, "unlocked"), AgentTextEvent(
            phase="test", text="no lock held"))])
    assert [e.seq for e in read_events(engine, run_id)] == [0]
    engine.dispose()


def test_a_small_append_lands_as_the_statements_would_write_it(db_url: str) -> None:
    """On Postgres an append whose events project no rows of their own goes as one call of ``bw_append_events``
    (migration 0017); on SQLite as the statements (a few results and aggregates: ``test_results_in_one_call.py``).
    Either way the same appends leave the same log and the same run row: a key repeated within an append lands once
    (the first), keys already in the log land nothing and take no seq, the last PhaseStarted among the new events
    moves the row's phase and a DatasetTasksArtifact its task count (a repeated one neither), a cost is counted by the
    trigger, the caller's own columns are written even when every event was a repeat, and a run that is not there is
    NotFound."""
    from benchwright.errors import NotFound
    from benchwright.events import DatasetTasksArtifact, DriverUsage, PhaseStarted, RunHalted
    from benchwright.store.events import append_in_session
    from benchwright.store.runs import get_run, run_view

    run_id = _new_run(db_url)
    engine = make_engine(db_url)

    def key(*parts: object) -> str:
        return event_key(run_id, *parts)

    opened = [NewEvent.of(key("find", "started"), PhaseStarted(phase="find")),
              NewEvent.of(key("find", "text"), AgentTextEvent(phase="find", text="first \x00")),
              NewEvent.of(key("find", "text"), AgentTextEvent(phase="find", text="a repeat within the append")),
              NewEvent.of(key("fetch", "started"), PhaseStarted(phase="fetch")),
              NewEvent.of(key("tasks"), DatasetTasksArtifact(count=7))]
    assert append_events(engine, run_id, opened) == 4
    assert (get_run(engine, run_id=run_id).phase, get_run(engine, run_id=run_id).tasks_total) == ("fetch", 7)
    again = [NewEvent.of(key("tasks"), DatasetTasksArtifact(count=99)),  # a repeat: projects nothing
             NewEvent.of(key("find", "started"), PhaseStarted(phase="find")),
             NewEvent.of(key("usage"), DriverUsage(phase="fetch", invocation=1, step=0, model="m", prompt_tokens=1,
                                                   completion_tokens=1, cost_usd=0.5))]
    assert append_events(engine, run_id, again) == 1
    halt = [NewEvent.of(key("halt"), RunHalted(halt_reason="stopped"))]
    for _ in range(2):  # the second time every event is a repeat: the columns are written all the same
        with Session(engine) as session, session.begin():
            append_in_session(session, run_id, halt, halted=True, halt_reason="stopped")
        with Session(engine) as session, session.begin():
            session.execute(update(Run).where(Run.id == run_id).values(halted=False, halt_reason=None))
    with Session(engine) as session, session.begin():
        held = session.get(Run, run_id)
        assert held is not None
        append_in_session(session, run_id, [NewEvent.of(key("analyze", "started"), PhaseStarted(phase="analyze"))])
        assert (held.phase, held.next_seq) == ("analyze", 8)  # the row the session holds moved with it
    with pytest.raises(NotFound), Session(engine) as session, session.begin():
        append_in_session(session, "no-such-run", opened)

    text = "first \x00" if db_url.startswith("sqlite") else "first \ufffd"
    assert [(e.seq, e.type, e.idem_key) for e in read_events(engine, run_id)] == [
        (0, "RunLaunched", key("launch")), (1, "PhaseStarted", key("find", "started")),
        (2, "AgentTextEvent", key("find", "text")), (3, "PhaseStarted", key("fetch", "started")),
        (4, "DatasetTasksArtifact", key("tasks")), (5, "DriverUsage", key("usage")), (6, "RunHalted", key("halt")),
        (7, "PhaseStarted", key("analyze", "started"))]
    assert read_events(engine, run_id)[2].data == {"phase": "find", "text": text, "index": None}
    run = get_run(engine, run_id=run_id)
    assert (run.next_seq, run.phase, run.tasks_total) == (8, "analyze", 7)
    assert run_view(engine, run).cost.driver == pytest.approx(0.5)
    with Session(engine) as session:  # the halt's columns were written by each of the two appends
        assert session.execute(select(Run.halted).where(Run.id == run_id)).scalar_one() is False
    engine.dispose()


def test_postgres_appends_through_its_function(postgres_url: str) -> None:
    """The one call is what a small append on Postgres runs: without migration 0017's function it fails, with it
    back (the migration's upgrade after its downgrade) it lands."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy.exc import DBAPIError

    from benchwright.store.db import _MIGRATIONS

    run_id = _new_run(postgres_url)
    engine = make_engine(postgres_url)
    event = [NewEvent.of(event_key(run_id, "once"), AgentTextEvent(phase="test", text="x"))]
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0016")
    with pytest.raises(DBAPIError, match="bw_append_events"):
        append_events(engine, run_id, event)
    migrate(engine)
    assert append_events(engine, run_id, event) == 1
    assert [e.seq for e in read_events(engine, run_id)] == [0, 1]
    engine.dispose()


def test_a_runs_first_sandbox_records_its_isolation_with_its_event(db_url: str) -> None:
    """A run's first sandbox appends its SandboxCreated with the run row's ``isolation`` (``append_events`` with
    ``isolation=``): together, in one round trip on Postgres (``bw_append_isolated``, migration 0019; four before), as
    one transaction on SQLite. A retried append lands no second event and writes the column again; a run that is not
    there gets neither."""
    from benchwright.errors import NotFound
    from benchwright.events import SandboxCreated
    from benchwright.store.runs import get_run
    from tests.store.conftest import round_trips

    run_id = _new_run(db_url)
    engine = make_engine(db_url)
    created = [NewEvent.of(event_key(run_id, "materialize", 1, "sandbox", "sb-1", "created"), SandboxCreated(
        sandbox_id="sb-1", role="task", backend="local", instance_size="local-2cpu-1gb", isolation="namespaces",
        metadata={"isolation": "namespaces"}))]
    if engine.dialect.name == "postgresql":
        with round_trips(engine) as trips:
            assert append_events(engine, run_id, created, isolation="namespaces") == 1
        assert trips == [1]
    else:
        assert append_events(engine, run_id, created, isolation="namespaces") == 1
    run = get_run(engine, run_id=run_id)
    assert (run.isolation, run.next_seq) == ("namespaces", 2)
    with Session(engine) as session, session.begin():
        session.execute(update(Run).where(Run.id == run_id).values(isolation=None))
    assert append_events(engine, run_id, created, isolation="none") == 0  # a retry: the column, no event
    assert (get_run(engine, run_id=run_id).isolation, [e.type for e in read_events(engine, run_id)]) == (
        "none", ["RunLaunched", "SandboxCreated"])
    with pytest.raises(NotFound):
        append_events(engine, "no-such-run", created, isolation="namespaces")
    engine.dispose()
