"""Appending to and reading the event log (§5, DESIGN.md invariant 1).

seq is assigned inside the append transaction from the run row's ``next_seq`` counter. The first statement of
every append is an UPDATE of that row, which takes the row lock on Postgres and the write lock on SQLite, so
concurrent appenders in any number of processes queue up and seq stays gapless and monotonic. Each event carries
an idempotency key; an append whose key is already in the log writes nothing (a retried activity re-appends the
same keys), and since the check happens under the same lock no seq is consumed for it. On Postgres an append whose
events project no rows makes all of that one call of ``bw_append_events`` (migration 0017: the same lock, the same
check, the same seqs), one round trip instead of four (``_append_in_one_call``).

Projections (task rows, trial rows, the run's phase; what each event projects is ``benchwright.store.projection``)
are updated in the same transaction, so a reader never sees an event without its projection or the other way round.
Cost columns are the database trigger's (migration 0002).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from sqlalchemy import String, Table, any_, bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, col

from benchwright.errors import NotFound
from benchwright.events import TERMINAL_EVENT, Event
from benchwright.scoring.results import is_no_answer
from benchwright.store import projection
from benchwright.store.db import reader, session_scope
from benchwright.store.models import EventRow, Run, TaskRow, TrialResult, table_of, utcnow
from benchwright.store.nul import NUL, REPLACEMENT, has_nul, without_nul

_KEY_CHUNK = 500
# Inserts go through the Core tables, not the ORM classes: the ORM's bulk-insert path costs several times more CPU
# per row (measured on the Materialize hot path), and these rows are plain dicts anyway.
_EVENTS, _TRIALS, _TASK_ROWS = table_of(EventRow), table_of(TrialResult), table_of(TaskRow)
# Per (dialect, table, columns): the INSERT, the COPY, the columns in order, their bind processors, positional or not.
_Insert = tuple[str, str, list[str], list[Any], bool]
_INSERTS: dict[tuple[str, str, tuple[str, ...]], _Insert] = {}
_COPY_FROM = 8
"""On Postgres, this many rows or more go in by ``COPY ... FROM STDIN`` rather than an ``executemany`` of INSERTs:
one command for the server instead of one per row. Measured with psycopg on loopback, a 1,000-task run's 2,000
events: ~60 against ~90 ms of the server's CPU and ~15 against ~48 ms of the client's; below ~8 rows an INSERT is
quicker (one round trip against COPY's two)."""

# An append's own statements, built once as Core statements: through the ORM (``update(Run)``, ``select(EventRow)``)
# each cost several times more CPU in statement building and ORM compile state than the database's work on a small
# append (measured: 1.24 ms of CPU for a two-event append on SQLite, 3.2 ms on Postgres, most of it there).
_RUNS = table_of(Run)
_LOCK = (update(_RUNS).where(_RUNS.c.id == bindparam("run_id_")).values(next_seq=_RUNS.c.next_seq)
         .returning(_RUNS.c.next_seq))
# On Postgres the keys go as one array: one statement text whatever their number (psycopg prepares it once).
_RECORDED_ANY = select(_EVENTS.c.idem_key).where(_EVENTS.c.idem_key == any_(bindparam("keys_", type_=ARRAY(String))))
_DRIVER_SQL: dict[str, tuple[str, str]] = {}
_RUN_UPDATES: dict[tuple[str, ...], tuple[str, list[str], dict[str, Any]]] = {}
_ONE_CALL = ("SELECT o_fresh, o_next_seq, o_phase, o_tasks_total FROM bw_append_events(%(run_id)s::text, "
             "%(keys)s::text[], %(types)s::text[], %(data)s::json[], %(phases)s::text[], %(counts)s::integer[], "
             "%(at)s::timestamp)")
"""A small append on Postgres (``_append_in_one_call``): the function of migration 0017, its values as psycopg
binds them."""
_ONE_CALL_PROCS: dict[str, tuple[Any, Any]] = {}
_CLOSE_CALL = ("SELECT o_fresh, o_next_seq, o_phase, o_tasks_total, o_incurred, o_billed, o_balance FROM "
               "bw_close_phase(%(run_id)s::text, %(keys)s::text[], %(types)s::text[], %(data)s::json[], "
               "%(phases)s::text[], %(counts)s::integer[], %(at)s::timestamp, %(phase)s::text, %(input_hash)s::text, "
               "%(artifacts)s::json, %(snapshot_id)s::text, %(files)s::json, %(result)s::json, "
               "%(source_run_id)s::text)")
"""A cached phase's close on Postgres (``append_spending``): the function of migration 0019."""
_SPEND_CALL = ("SELECT o_fresh, o_incurred, o_billed, o_balance FROM bw_append_spend(%(run_id)s::text, "
               "%(keys)s::text[], %(types)s::text[], %(data)s::json[], %(phases)s::text[], %(counts)s::integer[], "
               "%(at)s::timestamp)")
"""Another phase's close on Postgres (``append_spending``): the function of migration 0020."""
_ISOLATED_CALL = ("SELECT o_fresh, o_next_seq, o_phase, o_tasks_total FROM bw_append_isolated(%(run_id)s::text, "
                  "%(keys)s::text[], %(types)s::text[], %(data)s::json[], %(phases)s::text[], %(counts)s::integer[], "
                  "%(at)s::timestamp, %(isolation)s::text)")
"""A small append on Postgres that records the run's isolation too (``append_events``): migration 0019's."""
_READING_CALL = ("SELECT o_fresh, o_read FROM bw_append_reading(%(run_id)s::text, %(keys)s::text[], "
                 "%(types)s::text[], %(data)s::json[], %(phases)s::text[], %(counts)s::integer[], %(at)s::timestamp, "
                 "%(read)s::text)")
"""A small append on Postgres and then a read of the run's newest event of a type (``append_reading``): migration
0019's."""
_RESULTS_CALL = ("SELECT o_fresh, o_incurred, o_billed, o_balance FROM bw_append_results(%(run_id)s::text, "
                 "%(keys)s::text[], %(types)s::text[], %(data)s::json[], %(phases)s::text[], %(counts)s::integer[], "
                 "%(at)s::timestamp, %(t_of)s::integer[], %(t_invocation)s::integer[], %(t_index)s::integer[], "
                 "%(t_trial)s::integer[], %(t_outcome)s::text[], %(t_score)s::double precision[], "
                 "%(t_output)s::text[], %(t_meta)s::json[], %(t_error)s::text[], %(t_input)s::text[], "
                 "%(r_of)s::integer[], %(r_invocation)s::integer[], %(r_index)s::integer[], %(r_outcome)s::text[], "
                 "%(r_score)s::double precision[], %(r_trial_scores)s::json[], %(r_no_answer)s::boolean[], "
                 "%(r_trials_scored)s::integer[], %(r_trials_passed)s::integer[])")
"""A small append of results on Postgres, their trial and task rows, and the run's spend after them
(``append_spending``): the function of migration 0021."""
_CELL_JSON = ("artifacts", "files", "result")


def _insert_rows(session: Session, table: Table, rows: list[dict[str, Any]],
                 same: dict[str, Any] | None = None) -> None:
    """``INSERT`` ``rows`` (dicts with the same keys), each completed by ``same``, in one ``executemany`` on the
    driver's cursor: the statement and the bound values of ``session.execute(insert(table), rows)`` (compiled by the
    dialect once; each value through its column type's bind processor, a value of ``same`` once), without
    SQLAlchemy's per-row parameter handling, which held the GIL for most of an append's time on the Materialize
    hot path (2,000 events and 1,000 projection rows per 1,000 tasks, appended beside the scorer's traffic). On
    Postgres, ``_COPY_FROM`` rows or more go in by ``COPY`` instead, the same values through the same processors."""
    conn = session.connection()
    dialect = conn.dialect
    same = same or {}
    keys = (*rows[0], *same)
    cache_key = (dialect.name, table.name, keys)
    found = _INSERTS.get(cache_key)
    if found is None:
        compiled = insert(table).compile(dialect=dialect, column_keys=list(keys))
        order = list(compiled.positiontup or []) if compiled.positional else list(keys)
        procs = [table.c[key].type._cached_bind_processor(dialect) for key in order]
        preparer = dialect.identifier_preparer
        copy = f"COPY {preparer.format_table(table)} ({', '.join(map(preparer.quote, order))}) FROM STDIN"
        found = _INSERTS[cache_key] = (compiled.string, copy, order, procs, bool(compiled.positional))
    sql, copy, order, procs, positional = found
    copying = dialect.name == "postgresql" and len(rows) >= _COPY_FROM
    fixed = {key: proc(same[key]) if proc else same[key] for key, proc in zip(order, procs, strict=True) if key in same}
    if positional or copying:
        # column by column, then zipped into rows: less than half the CPU of a generator over every value
        columns: list[Iterable[Any]] = [
            repeat(fixed[key], len(rows)) if key in fixed else map(proc, [row[key] for row in rows]) if proc
            else [row[key] for row in rows] for key, proc in zip(order, procs, strict=True)]
        params: list[Any] = list(zip(*columns, strict=True))
    else:
        per_row = [(key, proc) for key, proc in zip(order, procs, strict=True) if key not in same]
        params = [{**fixed, **{key: proc(row[key]) if proc else row[key] for key, proc in per_row}} for row in rows]
    if copying:
        _copy(conn, copy, params)
    else:  # on the driver's cursor directly, as the lock (``on_driver``)
        on_driver(conn, sql, params, many=True)


def _copy(conn: Connection, statement: str, rows: list[tuple[Any, ...]]) -> None:
    """``rows`` into Postgres by ``statement`` (a ``COPY ... FROM STDIN``) on ``conn``'s own driver connection, inside
    its transaction.

    Raises:
        DBAPIError: the driver failed (``_driver_errors``).
    """
    driver: Any = conn.connection.dbapi_connection  # a psycopg connection
    with _driver_errors(conn, statement), driver.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


@contextmanager
def _driver_errors(conn: Connection, statement: str) -> Iterator[None]:
    """A driver error from statements sent on ``conn``'s driver connection directly comes out as SQLAlchemy raises one
    from a statement: a ``DBAPIError``, and a lost connection invalidated and said to be, so that ``store_outage``
    tells an outage from a wrong statement here too.

    Raises:
        DBAPIError: the driver failed (``connection_invalidated`` when the connection was lost).
    """
    dialect = conn.dialect
    try:
        yield
    except dialect.loaded_dbapi.Error as exc:
        lost = dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
        if lost:
            conn.invalidate(exc)
        raise DBAPIError.instance(statement, None, exc, dialect.loaded_dbapi.Error, connection_invalidated=lost,
                                  dialect=dialect) from exc


@dataclass(frozen=True)
class NewEvent:
    """An event to append, with the idempotency key that makes the append safe to repeat."""

    key: str
    type: str
    data: dict[str, Any]

    @classmethod
    def of(cls, key: str, event: Event) -> NewEvent:
        return cls(key=key, type=event.type_name(), data=event.model_dump(mode="json"))


def event_key(run_id: str, *parts: object) -> str:
    """The idempotency key ``{run_id}:{part}:{part}...`` (phase, invocation, task index, trial, what)."""
    return ":".join((run_id, *map(str, parts)))


def append_events(engine: Engine, run_id: str, events: list[NewEvent], **run_updates: Any) -> int:
    """Append ``events`` to the run's log in one transaction, with ``run_updates`` to its row's columns (plain values)
    if any; returns how many events were new.

    Raises:
        NotFound: the run does not exist.
    """
    if not events and not run_updates:
        return 0
    if engine.dialect.name == "postgresql" and events and set(run_updates) <= {"isolation"} \
            and appends_in_one_call(events):
        # The call alone, in autocommit: its own transaction, one round trip instead of three (BEGIN, the call,
        # COMMIT), the lock held until it commits; a run's first sandbox records the run's isolation in the same
        # call (four before: the UPDATE too).
        with reader(engine).connect() as conn:
            stored = [storable_on_postgres(e) for e in events]
            if not run_updates:
                return _call_append(conn, run_id, stored)[0]
            rows = on_driver(conn, _ISOLATED_CALL, call_params(conn, run_id, stored) | run_updates, fetch=True)
        if rows[0][0] is None:
            raise NotFound(f"run {run_id} not found")
        return int(rows[0][0])
    if engine.dialect.name == "postgresql" and not run_updates and results_in_one_call(events):
        with reader(engine).connect() as conn:  # a few results: one call in autocommit, as above
            return _call_results(conn, run_id, [storable_on_postgres(e) for e in events])[0]
    with session_scope(engine) as session:
        return append_in_session(session, run_id, events, **run_updates)


def lock_run(session: Session, run_id: str) -> Run:
    """Take the run row's write lock (a no-op UPDATE: row lock on Postgres, write lock on SQLite) and read it.

    Writing first matters on SQLite: a transaction that reads before it writes can fail to upgrade its lock.

    Raises:
        NotFound: the run does not exist.
    """
    _lock(session, run_id)
    run: Run = session.execute(select(Run).where(Run.id == run_id)
                               .execution_options(populate_existing=True)).scalar_one()
    return run


def _lock(session: Session, run_id: str) -> int:
    """Take the run row's write lock with a no-op UPDATE; returns its ``next_seq``.

    Raises:
        NotFound: the run does not exist.
    """
    next_seq = session.connection().execute(_LOCK, {"run_id_": run_id}).scalar_one_or_none()
    if next_seq is None:
        raise NotFound(f"run {run_id} not found")
    return int(next_seq)


def _update_run(session: Session, run_id: str, values: dict[str, Any]) -> None:
    """``UPDATE`` the run row's ``values`` (plain values) by its SQL compiled once per column set, on the driver's
    cursor (``on_driver``), each value through its column's bind processor; and keep a ``Run`` the session holds in
    step, as the ORM's own update would."""
    conn = session.connection()
    keys = (conn.dialect.name, *values)
    found = _RUN_UPDATES.get(keys)
    if found is None:
        compiled = (update(_RUNS).where(_RUNS.c.id == bindparam("run_id_"))
                    .values({key: bindparam(key) for key in values})).compile(dialect=conn.dialect)
        procs = {key: _RUNS.c[key].type._cached_bind_processor(conn.dialect) for key in values}
        found = _RUN_UPDATES[keys] = (compiled.string, list(compiled.positiontup or []), procs)
    sql, order, procs = found
    params = {key: proc(value) if (proc := procs[key]) else value for key, value in values.items()}
    params["run_id_"] = run_id
    on_driver(conn, sql, [params[key] for key in order] if order else params)
    held = session.identity_map.get(session.identity_key(Run, run_id))
    if held is not None:
        for key, value in values.items():
            set_committed_value(held, key, value)


def append_in_session(session: Session, run_id: str, events: list[NewEvent], **run_updates: Any) -> int:
    """Like ``append_events`` inside a caller's transaction, optionally updating columns of the run row too."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        if conn.connection.dbapi_connection.autocommit:  # type: ignore[union-attr]
            # A reader's session (store.db.reader): the lock would end with its statement and seq could repeat.
            raise RuntimeError("an append needs a transaction: not a session on store.db.reader(engine)")
        events = [storable_on_postgres(e) for e in events]
        if events and not any(e.type in projection.ROW_PROJECTED for e in events):
            return _append_in_one_call(session, run_id, events, run_updates)
    return _append_by_statements(session, run_id, events, run_updates)


def _append_by_statements(session: Session, run_id: str, events: list[NewEvent], run_updates: dict[str, Any]) -> int:
    """``append_in_session`` as statements: the lock, the key check, the rows (and their projection rows) and the
    run row's update; returns how many events were new."""
    # The hot path: take the lock and read which keys the log holds, without reloading the row.
    next_seq, seen = _lock_and_recorded(session, run_id, [e.key for e in events])
    fresh = _without(events, seen)
    now = utcnow()
    if fresh:
        _insert_rows(session, _EVENTS, [{"seq": next_seq + i, "type": e.type, "data": e.data, "idem_key": e.key}
                                        for i, e in enumerate(fresh)], same={"run_id": run_id, "created_at": now})
    _update_run(session, run_id, {**_project(session, run_id, fresh), **run_updates, "next_seq": next_seq + len(fresh)})
    return len(fresh)


def _append_in_one_call(session: Session, run_id: str, events: list[NewEvent], run_updates: dict[str, Any]) -> int:
    """``append_in_session`` on Postgres for events that project no rows (a phase's brackets, halts, the run's end):
    the lock, the key check, the inserts and the row's ``next_seq`` and projected columns in one call
    (``_call_append``) instead of four statements; ``run_updates`` after it, as their own ``UPDATE``. Returns how
    many events were new.

    Raises:
        NotFound: the run does not exist.
    """
    fresh, next_seq, phase, tasks_total = _call_append(session.connection(), run_id, events)
    held = session.identity_map.get(session.identity_key(Run, run_id))
    if held is not None:
        for key, value in (("next_seq", next_seq), ("phase", phase), ("tasks_total", tasks_total)):
            if value is not None:
                set_committed_value(held, key, value)
    updates = {key: value for key, value in run_updates.items() if key != "next_seq"}
    if updates:
        _update_run(session, run_id, updates)
    return fresh


def _call_append(conn: Connection, run_id: str, events: list[NewEvent]) -> tuple[int, int, str | None, int | None]:
    """Append ``events`` (none of them projecting rows, each storable on Postgres) by one call of
    ``bw_append_events`` (migration 0017) on ``conn``'s driver connection; returns how many were new, the run's
    ``next_seq`` after them, and the phase and task count they moved the row to (None where they did not).

    Raises:
        NotFound: the run does not exist.
        DBAPIError: the driver failed (``on_driver``).
    """
    rows = on_driver(conn, _ONE_CALL, call_params(conn, run_id, events), fetch=True)
    fresh, next_seq, phase, tasks_total = rows[0]
    if fresh is None:
        raise NotFound(f"run {run_id} not found")
    return int(fresh), int(next_seq), phase, tasks_total


def call_params(conn: Connection, run_id: str, events: list[NewEvent]) -> dict[str, Any]:
    """``bw_append_events``'s arguments for ``events``, each value as the column's bind processor makes it."""
    data_proc, at_proc = _procs(conn)
    projected = [projection.projected(e) for e in events]
    now = utcnow()
    return {"run_id": run_id, "keys": [e.key for e in events], "types": [e.type for e in events],
            "data": [data_proc(e.data) if data_proc else e.data for e in events],
            "phases": [values.get("phase") for values in projected],
            "counts": [values.get("tasks_total") for values in projected],
            "at": at_proc(now) if at_proc else now}


def _procs(conn: Connection) -> tuple[Any, Any]:
    """The bind processors of a JSON column and a timestamp column on ``conn``'s dialect (None: the value as is)."""
    procs = _ONE_CALL_PROCS.get(conn.dialect.name)
    if procs is None:
        procs = _ONE_CALL_PROCS[conn.dialect.name] = (_EVENTS.c.data.type._cached_bind_processor(conn.dialect),
                                                      _EVENTS.c.created_at.type._cached_bind_processor(conn.dialect))
    return procs


def append_reading(engine: Engine, run_id: str, events: list[NewEvent], read: str) -> dict[str, Any] | None:
    """On Postgres, append ``events`` (``appends_in_one_call``) and then read the data of the run's newest event of
    type ``read``, in one call (``bw_append_reading``, migration 0019) in autocommit: one transaction and one round
    trip (a phase's opening and the work files it goes by: two before). None when the run has no such event.

    Raises:
        NotFound: the run does not exist (nothing is written).
        DBAPIError: the driver failed (``on_driver``).
    """
    with reader(engine).connect() as conn:
        params = call_params(conn, run_id, [storable_on_postgres(e) for e in events]) | {"read": read}
        rows = on_driver(conn, _READING_CALL, params, fetch=True)
    fresh, data = rows[0]
    if fresh is None:
        raise NotFound(f"run {run_id} not found")
    found: dict[str, Any] | None = data  # decoded by the connection's JSON loader, as psycopg reads a json value
    return found


def appends_in_one_call(events: list[NewEvent]) -> bool:
    """Whether Postgres appends ``events`` by one call of its function (none of them projects rows)."""
    return not any(e.type in projection.ROW_PROJECTED for e in events)


def results_in_one_call(events: list[NewEvent]) -> bool:
    """Whether Postgres appends ``events``, some of which project rows, by one call of ``bw_append_results``
    (migration 0021): fewer than ``_COPY_FROM`` of them, and each task row's ``no_answer`` decided by this append's
    own trials (``projection.result_rows``)."""
    return (bool(events) and len(events) < _COPY_FROM and not appends_in_one_call(events)
            and projection.result_rows("", events) is not None)


def append_spending(engine: Engine, run_id: str, events: list[NewEvent], *, cell: dict[str, Any] | None = None
                    ) -> tuple[float, float, float]:
    """On Postgres, an append and the run's spend after it in one call in autocommit, one transaction and one round
    trip. Returns the run's ``cost_incurred``, ``cost_billed`` and its account's ``balance_usd``.

    - A phase's close (``appends_in_one_call``): append ``events``, upsert the phase's cache cell if it has one
      (``cell``: the ``phase_fingerprints`` row's ``phase``, ``input_hash``, ``artifacts``, ``snapshot_id``,
      ``files``, ``result`` and ``source_run_id``, as ``benchwright.registry.cache.record_cell_in`` writes it;
      ``bw_close_phase``, migration 0019) and read the spend (without a cell ``bw_append_spend``, migration 0020).
    - A few results (``results_in_one_call``; no cell): append them with their trial and task rows and read the spend
      (``bw_append_results``, migration 0021).

    Raises:
        NotFound: the run does not exist (nothing is written).
        ValueError: ``events`` are results with a ``cell``, or too many results for one call.
        DBAPIError: the driver failed (``on_driver``).
    """
    stored = [storable_on_postgres(e) for e in events]
    with reader(engine).connect() as conn:
        if not appends_in_one_call(stored):
            if cell is not None:
                raise ValueError("a phase's cache cell is written with its close's events, not with results")
            _, incurred, billed, balance = _call_results(conn, run_id, stored)
            return incurred, billed, balance
        data_proc, _ = _procs(conn)
        params = call_params(conn, run_id, stored)
        if cell is None:
            rows = on_driver(conn, _SPEND_CALL, params, fetch=True)
        else:
            params |= {key: (data_proc(value) if data_proc else value) if key in _CELL_JSON else value
                       for key, value in cell.items()}
            rows = on_driver(conn, _CLOSE_CALL, params, fetch=True)
    fresh, *_, incurred, billed, balance = rows[0]
    if fresh is None:
        raise NotFound(f"run {run_id} not found")
    return float(incurred), float(billed), float(balance)


def _call_results(conn: Connection, run_id: str, events: list[NewEvent]) -> tuple[int, float, float, float]:
    """Append ``events`` (``results_in_one_call``, each storable on Postgres) with the trial and task rows they
    project by one call of ``bw_append_results`` (migration 0021) on ``conn``'s driver connection; returns how many
    were new and the run's spend after them (``append_spending``).

    Raises:
        NotFound: the run does not exist.
        ValueError: ``events`` cannot go in one call (``results_in_one_call``).
        DBAPIError: the driver failed (``on_driver``).
    """
    made = projection.result_rows(run_id, events) if len(events) < _COPY_FROM else None
    if made is None:
        raise ValueError("these results go by the statements (results_in_one_call)")
    trials, rows = made
    data_proc, _ = _procs(conn)
    params = call_params(conn, run_id, events)
    for prefix, kept, columns in (("t_", trials, projection.TRIAL_COLUMNS), ("r_", rows, projection.TASK_COLUMNS)):
        params[f"{prefix}of"] = [of for of, _ in kept]
        for column in columns:
            values: list[Any] = [row[column] for _, row in kept]
            if column in ("meta", "trial_scores"):
                values = [data_proc(value) if data_proc else value for value in values]
            elif column == "score":  # one array type for the lot: an int score (a bool even) as the float it means
                values = [None if value is None else float(value) for value in values]
            params[prefix + column] = values
    found = on_driver(conn, _RESULTS_CALL, params, fetch=True)
    fresh, incurred, billed, balance = found[0]
    if fresh is None:
        raise NotFound(f"run {run_id} not found")
    return int(fresh), float(incurred), float(billed), float(balance)


def storable_on_postgres(event: NewEvent) -> NewEvent:
    """``event`` with each NUL character in its strings (keys of its data included) replaced by U+FFFD, the
    replacement character: Postgres holds no NUL in a text column nor a ``\\u0000`` that ``->>`` can read, and an
    endpoint under test may well answer with one. The event itself when it has none (the usual case)."""
    if NUL not in event.key and NUL not in event.type and not has_nul(event.data):
        return event
    return NewEvent(key=event.key.replace(NUL, REPLACEMENT), type=event.type.replace(NUL, REPLACEMENT),
                    data=without_nul(event.data))


def _lock_and_recorded(session: Session, run_id: str, keys: list[str]) -> tuple[int, set[str]]:
    """Take the run row's lock (``_lock``: its ``next_seq``) and then, under it, read which of ``keys`` the log holds.

    The check runs once the lock is taken, and at READ COMMITTED (Postgres) its snapshot is its own, so it sees every
    key the lock's previous holder committed. On Postgres both go on the driver's cursor (``on_driver``), the keys
    as one array (one statement whatever their number, which psycopg prepares once); sent together in a psycopg
    pipeline they saved no time on loopback and cost more CPU.

    Raises:
        NotFound: the run does not exist.
    """
    conn = session.connection()
    lock_sql, check_sql = _DRIVER_SQL.get(conn.dialect.name) or _driver_sql(conn)
    if conn.dialect.name != "postgresql":  # SQLite: the keys as many parameters, in chunks under its limit
        row = on_driver(conn, lock_sql, (run_id,), fetch=True)
        if not row:
            raise NotFound(f"run {run_id} not found")
        seen = set[str]()
        for start in range(0, len(keys), _KEY_CHUNK):
            chunk = keys[start : start + _KEY_CHUNK]
            seen.update(key for (key,) in on_driver(conn, check_sql.format(", ".join("?" * len(chunk))), chunk,
                                                     fetch=True))
        return int(row[0][0]), seen
    row = on_driver(conn, lock_sql, {"run_id_": run_id}, fetch=True)
    if not row:
        raise NotFound(f"run {run_id} not found")
    return int(row[0][0]), {key for (key,) in on_driver(conn, check_sql, {"keys_": keys}, fetch=True)}


def _driver_sql(conn: Connection) -> tuple[str, str]:
    """The lock and the key check as ``conn``'s driver takes them (compiled once per dialect). On SQLite the check is
    a template whose ``{}`` takes the keys' placeholders (an ``IN`` of as many as the chunk holds)."""
    if conn.dialect.name == "postgresql":
        check = str(_RECORDED_ANY.compile(dialect=conn.dialect))
    else:
        preparer = conn.dialect.identifier_preparer
        check = (f"SELECT {preparer.quote(_EVENTS.c.idem_key.name)} FROM {preparer.format_table(_EVENTS)} "
                 f"WHERE {preparer.quote(_EVENTS.c.idem_key.name)} IN ({{}})")
    found = _DRIVER_SQL[conn.dialect.name] = (str(_LOCK.compile(dialect=conn.dialect)), check)
    return found


def on_driver(conn: Connection, sql: str, params: Any, *, many: bool = False, fetch: bool = False
               ) -> list[tuple[Any, ...]]:
    """``sql`` (as the dialect compiled it) with ``params`` (bound values, each already through its column's bind
    processor) on ``conn``'s own driver connection, inside its transaction; the rows when ``fetch``.

    An append's statements go this way: through SQLAlchemy's execution each cost ~0.1 ms more of this process's CPU
    than the driver's own work (the statement's context, its result's set-up), and an append makes four or more; two
    dozen appends are on a run's way to its first model call (``bench/append.py``: on Postgres a two-event append
    1.9 → ~1.2 ms, 1.0 → ~0.5 ms of CPU; on SQLite, session 40, the lock, the key check and the row's update).
    ``params`` in the driver's style: names for psycopg, a sequence for sqlite3's ``?``. Errors come out as
    SQLAlchemy's would (``_driver_errors``).

    Raises:
        DBAPIError: the driver failed.
    """
    driver: Any = conn.connection.dbapi_connection  # a psycopg or sqlite3 connection
    with _driver_errors(conn, sql), closing(driver.cursor()) as cursor:
        if many:
            cursor.executemany(sql, params)
            return []
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if fetch else []


def _without(events: list[NewEvent], seen: set[str]) -> list[NewEvent]:
    """``events`` but those whose key is in ``seen`` and repeats of a key (the first kept); adds the kept keys to
    ``seen``."""
    fresh: list[NewEvent] = []
    for e in events:
        if e.key not in seen:
            seen.add(e.key)
            fresh.append(e)
    return fresh


def _project(session: Session, run_id: str, events: list[NewEvent]) -> dict[str, Any]:
    """Maintain the projections for newly appended events; returns updates for the run row."""
    run_updates: dict[str, Any] = {}
    trials: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for e in events:
        run_updates.update(projection.projected(e))
        if e.type == projection.RESULT:
            trials.append(projection.trial_row(run_id, e.data))
        elif e.type == projection.AGGREGATED:
            rows.append(projection.task_row(run_id, e.data))
    if trials:
        _insert_rows(session, _TRIALS, trials)
    if rows:
        _mark_no_answer(session, run_id, rows, trials)
        _insert_rows(session, _TASK_ROWS, rows)
    return run_updates


def _mark_no_answer(session: Session, run_id: str, rows: list[dict[str, Any]], trials: list[dict[str, Any]]) -> None:
    """Set each task row's ``no_answer`` from its trials' meta (``benchwright.scoring.results.is_no_answer``).

    A task's trials usually land in the same append as its aggregate (k = 1 always does), and only a failed task
    whose trials here all said ``extracted: false`` needs a look at trials appended earlier: the hot path reads
    nothing.
    """
    here: dict[tuple[int, int], list[Any]] = {}
    for t in trials:
        here.setdefault((t["invocation"], t["index"]), []).append(t["meta"])
    for row in rows:
        key = (row["invocation"], row["index"])
        metas = here.get(key, [])
        no_answer = projection.no_answer_of(row, metas)
        if no_answer is None:  # its trials here (this append's are inserted already) and before
            no_answer = is_no_answer(row["outcome"], session.execute(select(col(TrialResult.meta)).where(
                col(TrialResult.run_id) == run_id, col(TrialResult.invocation) == key[0],
                col(TrialResult.index) == key[1])).scalars())
        row["no_answer"] = no_answer


def read_events(engine: Engine, run_id: str, *, after: int = -1, limit: int = 1000) -> list[EventRow]:
    """Events with seq > ``after`` in seq order, at most ``limit`` (one statement: through ``reader``)."""
    with Session(reader(engine)) as session:
        return list(
            session.execute(
                select(EventRow).where(EventRow.run_id == run_id, EventRow.seq > after)
                .order_by(EventRow.seq).limit(limit)
            ).scalars()
        )


def terminal_seq(engine: Engine, run_id: str) -> int | None:
    """The seq of the run's terminal event (PipelineFinished), or None while the run has not finished."""
    with Session(reader(engine)) as session:
        return session.execute(
            select(col(EventRow.seq)).where(col(EventRow.run_id) == run_id, col(EventRow.type) == TERMINAL_EVENT)
            .order_by(col(EventRow.seq)).limit(1)
        ).scalar_one_or_none()
