"""Runs: creation (with RunLaunched at seq 0), terminal status, and the read projections the API serves."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import and_, bindparam, case, func, insert, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import defer
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session

from benchwright.errors import InvalidInput, NotFound
from benchwright.events import PipelineFinished, RunLaunched
from benchwright.registry.catalog import check_can_be_public
from benchwright.registry.shape import ARTIFACT_TYPES, stamp_from, stamp_terminal, terminal_inputs
from benchwright.runs.status import display_status
from benchwright.schemas import (
    AgentStepView,
    CostView,
    ForkOrigin,
    LaunchRequest,
    NarrationCounts,
    ProxyLinger,
    RunList,
    RunSummary,
    RunView,
    TaskDetail,
    TaskList,
    TaskRowView,
    TasksBlock,
    TasksSummary,
    TrialView,
)
from benchwright.scoring.results import LIST_INPUT_CHARS, MAX_INPUT_CHARS, audit_fields
from benchwright.store.db import reader, session_scope
from benchwright.store.events import (
    NewEvent,
    append_in_session,
    appends_in_one_call,
    call_params,
    event_key,
    on_driver,
    storable_on_postgres,
)
from benchwright.store.intervals import graded_rows, pass_rate_interval, terminal_intervals
from benchwright.store.models import EventRow, Run, RunFork, TaskRow, TrialResult, table_of, utcnow
from benchwright.store.nul import without_nul
from benchwright.store.settled import notify_settled


def create_run(engine: Engine, *, account_id: str, launch: LaunchRequest, driver: str,
               trials_config: dict[str, Any], limits: dict[str, Any] | None = None,
               billing_markup: float = 1.0, backend: str | None = None,
               materialize_mode: str | None = None, run_id: str | None = None,
               fork: ForkOrigin | None = None) -> Run:
    """Insert the run row and its RunLaunched event (seq 0) in one transaction (on Postgres, a run that is not a fork:
    one statement, ``_insert_launched``).

    ``run_id`` lets the caller build (and size-check) the workflow's input before anything is written. ``fork``
    names a forked run's parent and rewind point: RunLaunched carries it and the fork tree gets its row.
    """
    run = Run(
        id=run_id or str(uuid.uuid4()),
        account_id=account_id,
        model=launch.model.model_dump(mode="json", exclude_none=True),
        driver=driver,
        launch=launch.model_dump(mode="json", exclude_none=True),
        visibility=launch.visibility,
        trials_config=trials_config,
        limits=limits,
        billing_markup=billing_markup,
        backend=backend,
        materialize_mode=materialize_mode,
    )
    launched = NewEvent.of(event_key(run.id, "launch"), RunLaunched(
        launch=run.launch, account_id=account_id, driver=driver, fork=fork.model_dump(mode="json") if fork else None))
    if fork is None and engine.dialect.name == "postgresql":
        _insert_launched(engine, run, launched)
        return run
    with session_scope(engine) as session:
        session.add(run)
        session.flush()
        if fork is not None:
            session.add(RunFork(run_id=run.id, parent_run_id=fork.parent_run_id, rewind_to=fork.rewind_to,
                                kind=fork.kind))
        append_in_session(session, run.id, [launched])
    return run


_RUNS, _EVENTS = table_of(Run), table_of(EventRow)
_LAUNCHED_COLUMNS = ("run_id", "seq", "type", "data", "idem_key", "created_at")
_LAUNCHED = insert(_EVENTS).from_select(list(_LAUNCHED_COLUMNS), select(
    insert(_RUNS).values({c.name: bindparam(f"r_{c.name}", type_=c.type) for c in _RUNS.columns})
    .returning(_RUNS.c.id).cte("launched_run").c.id,
    *(bindparam(f"e_{name}", type_=_EVENTS.c[name].type) for name in _LAUNCHED_COLUMNS[1:])))
"""On Postgres, a run's row and its RunLaunched in one statement (a data-modifying ``WITH``): one round trip in
autocommit where the transaction made four (BEGIN, the row's INSERT, the append's call, COMMIT)."""


def _insert_launched(engine: Engine, run: Run, launched: NewEvent) -> None:
    """``run``'s row, its log's ``next_seq`` 1, and ``launched`` at seq 0, as one statement (``_LAUNCHED``): what the
    transaction of ``create_run`` writes for a run that is not a fork. The row is new, so no lock or key check is
    needed: the statement lands whole or not at all (an id taken already: IntegrityError)."""
    set_committed_value(run, "next_seq", 1)
    event = storable_on_postgres(launched)
    values = {f"r_{c.name}": getattr(run, c.key) for c in _RUNS.columns}
    values |= {"e_seq": 0, "e_type": event.type, "e_data": event.data, "e_idem_key": event.key,
               "e_created_at": utcnow()}
    with reader(engine).connect() as conn:
        conn.execute(_LAUNCHED, values)


def finish_run(engine: Engine, *, run_id: str, status: str, error: str | None = None,
               before: Sequence[NewEvent] = ()) -> None:
    """Set the terminal status and append ``before`` and then PipelineFinished in the same transaction
    (idempotent: keyed events already in the log are skipped). A NUL in ``error`` (an endpoint's words) becomes
    U+FFFD in the row and the event alike, on either store: Postgres holds none in a text column.

    On Postgres in two round trips when it can (``_finish_in_one_call``), else by the transaction below.
    """
    error = without_nul(error) if error else None
    finished = NewEvent.of(event_key(run_id, "pipeline", "finished"), PipelineFinished(status=status, error=error))
    if engine.dialect.name == "postgresql" and _finish_in_one_call(engine, run_id, [*before, finished], status=status,
                                                                   error=error):
        return
    with session_scope(engine) as session:
        append_in_session(session, run_id, [*before, finished])  # one append: a round trip on Postgres
        # The row's changes go in one UPDATE as it commits, not one before each read in between (autoflush): two
        # round trips fewer on Postgres on the way to the long poll's answer.
        with session.no_autoflush:
            run = session.get(Run, run_id)  # under the row lock the append took
            assert run is not None
            # A run's PipelineFinished and its end time land together (here and in finish_halted): an end time
            # means this PipelineFinished was in the log already (a retry), and the row is not written again.
            if run.finished_at is None:
                _end(run, status, error)
                stamp_terminal(session, run)
                notify_settled(session, run_id)  # the long polls waiting for it, once this commits


def _end(run: Run, status: str, error: str | None) -> None:
    run.status = status
    run.error = error[:4000] if error else None
    run.finished_at = utcnow()


TERMINAL_COLUMNS = ("status", "error", "finished_at", "fingerprint", "subset_fingerprint", "impl_fingerprint",
                    "fetch_fingerprint", "analyze_fingerprint", "setup_fingerprint", "atomize_fingerprint",
                    "benchmark_id", "subset_id", "impl_id")
"""The row's columns a run's end sets (``_end``, then ``stamp_from``): ``bw_finish_run``'s, in its order."""
_FINISH_CALL = ("SELECT o_state FROM bw_finish_run(%(run_id)s::text, %(keys)s::text[], %(types)s::text[], "
                "%(data)s::json[], %(phases)s::text[], %(counts)s::integer[], %(at)s::timestamp, "
                "%(seen_seq)s::integer, "
                + ", ".join(f"%({c})s::{'timestamp with time zone' if c == 'finished_at' else 'text'}"
                            for c in TERMINAL_COLUMNS) + ")")
"""A run's end on Postgres: the function of migration 0026."""


def _finish_in_one_call(engine: Engine, run_id: str, events: list[NewEvent], *, status: str,
                        error: str | None) -> bool:
    """``finish_run`` on Postgres in two round trips instead of seven: the row, its artifacts and its cells in one
    read (``terminal_inputs``), the fingerprint computed from them, then one call (``bw_finish_run``, migration 0026)
    that appends ``events`` and sets the row, provided nothing was appended since the read and the run has not
    ended. Returns whether it did; if not, nothing was written and the caller goes by its transaction (which also
    says NotFound for no such run). Not for events that project rows or are artifacts (the fingerprint is computed
    before they land)."""
    stored = [storable_on_postgres(e) for e in events]
    if not appends_in_one_call(stored) or any(e.type in ARTIFACT_TYPES for e in stored):
        return False
    found = terminal_inputs(engine, run_id)
    if found is None or found[0].finished_at is not None:
        return False
    run, artifacts, cells = found
    _end(run, status, error)
    stamp_from(run, artifacts, cells)
    with reader(engine).connect() as conn:
        params = call_params(conn, run_id, stored) | {"seen_seq": run.next_seq}
        params |= {column: getattr(run, column) for column in TERMINAL_COLUMNS}
        (state,), = on_driver(conn, _FINISH_CALL, params, fetch=True)
    return bool(state == "finished")


def get_run(engine: Engine, *, run_id: str, account_id: str | None = None) -> Run:
    """The run row; a run of another account is reported as not found.

    Raises:
        NotFound: no such run for this caller.
    """
    with Session(reader(engine)) as session:
        run = session.get(Run, run_id)
    if run is None or (account_id is not None and run.account_id != account_id):
        raise NotFound(f"run {run_id} not found")
    return run


def run_view(engine: Engine, run: Run, *, fresh: bool = False) -> RunView:
    """The API's view of a run: stored fields, folded display status, cost and task summary. ``fresh``: ``run`` was
    read from the store or recorded just now (the API's reads of one run, a launch's answer), so what may have changed
    since is not read again."""
    with Session(reader(engine)) as session:
        finished = run.finished_at is not None
        # A row whose log holds its launch alone (a launch's answer, its first poll) has no task rows to count.
        counts, no_answer, invocation, graded = _latest_counts(session, run.id, graded=finished) \
            if run.next_seq > 1 else _Counts({}, 0, 1, None)
        # pass@k reads every trial row and the bootstrap every task row: once the run is over, not on every poll of
        # a live run, and then cached (benchwright/store/intervals.py)
        boot = terminal_intervals(session, run_id=run.id, invocation=invocation,
                                  finished_at=run.finished_at, k=_trials_k(run), graded=graded) \
            if run.finished_at is not None else None
        from benchwright.registry.pinned import leaderboard_note

        off_leaderboard = leaderboard_note(session, run, fresh=fresh)
    passed, failed, errored = counts.get("pass", 0), counts.get("fail", 0), counts.get("err", 0)
    se, ci = pass_rate_interval(passed=passed, failed=failed)
    settled = passed + failed + errored
    # Tasks run only while Materialize is live: a paused, waiting or torn-down run has none in flight.
    in_flight = run.status == "running" and run.phase == "materialize" and not run.halted and run.finished_at is None
    summary = TasksSummary(
        passed=passed, failed=failed, errored=errored, no_answer=no_answer,
        running=max(run.tasks_total - settled, 0) if in_flight else 0,
        total=run.tasks_total,
        pass_rate=passed / (passed + failed) if passed + failed else None,
        pass_at_k=boot.pass_at_k if boot else {},
        pass_rate_se=se, pass_rate_ci=ci,
        mean_score=boot.mean_score if boot else None, pass_at_k_ci=boot.pass_at_k_ci if boot else {},
    )
    cost = CostView(driver=run.cost_driver, model=run.cost_model, sandbox=run.cost_sandbox,
                    narration=run.cost_narration, incurred=run.cost_incurred, billed=run.cost_billed,
                    narration_usage=NarrationCounts(calls=run.narration_calls,
                                                    prompt_tokens=run.narration_prompt_tokens,
                                                    completion_tokens=run.narration_completion_tokens),
                    proxy_linger=ProxyLinger(cents=round(run.proxy_linger_usd * 100), amount_usd=run.proxy_linger_usd))
    return RunView(
        id=run.id, status=run.status, halted=run.halted, halt_reason=run.halt_reason,
        display_status=display_status(status=run.status, halted=run.halted, halt_reason=run.halt_reason),
        model=run.model, driver=run.driver, phase=run.phase, visibility=run.visibility,
        metadata=run.launch.get("metadata", {}), trials_config=run.trials_config, limits=run.limits,
        backend=run.backend, materialize_mode=run.materialize_mode, isolation=run.isolation, cost=cost,
        tasks=TasksBlock(summary=summary), error=run.error, created_at=run.created_at, finished_at=run.finished_at,
        terminal=run.finished_at is not None, fingerprint=run.fingerprint, benchmark_id=run.benchmark_id,
        off_leaderboard=off_leaderboard,
        subset_id=run.subset_id, impl_id=run.impl_id,
    )


def outcome_counts(session: Session, run_id: str, invocation: int | None = None) -> tuple[dict[str, int], int]:
    """The run's tasks by outcome (``pass``/``fail``/``err``) in ``invocation`` (its latest when None), and how many
    failed for giving no answer: what a run's task summary is made of."""
    counts, no_answer, _, _ = _latest_counts(session, run_id) if invocation is None else _counts_in(
        session, run_id, invocation)
    return counts, no_answer


class _Counts(NamedTuple):
    counts: dict[str, int]
    """Tasks by outcome."""
    no_answer: int
    """Failed tasks that gave no answer."""
    invocation: int
    graded: bool | None
    """Whether a settled task has a score other than 0 and 1 (``intervals.graded``); None when not asked."""


def _latest_counts(session: Session, run_id: str, *, graded: bool = False) -> _Counts:
    """``outcome_counts`` of the run's latest invocation, and that invocation (1 before any task row, as
    ``_latest_invocation`` says): one statement (a round trip on Postgres), the latest invocation a subquery."""
    return _counts_in(session, run_id, select(func.max(TaskRow.invocation)).where(TaskRow.run_id == run_id)
                      .scalar_subquery(), graded=graded)


def _counts_in(session: Session, run_id: str, which: Any, *, graded: bool = False) -> _Counts:
    """The task rows of invocation ``which`` (a number or a subquery) by outcome; with ``graded``, whether any of
    them is graded too, in the same statement (a finished run's intervals need to know: a read fewer)."""
    counts: dict[str, int] = {}
    no_answer = 0
    any_graded = False
    invocation = which if isinstance(which, int) else 1  # no rows: the latest is the first
    columns = [TaskRow.invocation, TaskRow.outcome, TaskRow.no_answer, func.count()]
    if graded:
        columns.append(func.max(case((graded_rows(), 1), else_=0)))
    for row_invocation, outcome, unanswered, n, *more in session.execute(
        select(*columns).where(TaskRow.run_id == run_id, TaskRow.invocation == which)
        .group_by(TaskRow.invocation, TaskRow.outcome, TaskRow.no_answer)
    ).all():
        invocation = int(row_invocation)
        counts[outcome] = counts.get(outcome, 0) + n
        no_answer += n if unanswered and outcome == "fail" else 0
        any_graded = any_graded or bool(more and more[0])
    return _Counts(counts, no_answer, invocation, any_graded if graded else None)


def _trials_k(run: Run) -> int:
    return int(((run.trials_config or {}).get("plan") or {}).get("k", 1))


def _latest_invocation(session: Session, run_id: str) -> int:
    latest = session.execute(select(func.max(TaskRow.invocation)).where(TaskRow.run_id == run_id)).scalar_one()
    return int(latest or 1)


CURSOR_PATTERN = r"^[0-9]{1,17}\.[0-9a-f-]{1,36}$"
ID_PREFIX_PATTERN = r"^[0-9a-f-]{4,36}$"
"""A run id prefix ``GET /v1/runs?id_prefix=`` accepts: at least 4 characters of a (lowercase) run id."""
"""``<created_at in µs since the epoch>.<run id>``: every string of this shape is a position in the list, so the
schema says exactly which cursors are accepted (17 digits reach the year 5138, inside ``datetime``'s range)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def list_runs(engine: Engine, *, account_id: str, limit: int = 50, cursor: str | None = None,
              id_prefix: str | None = None) -> RunList:
    """The account's runs as summaries, newest first, keyset-paginated by (created_at, id).

    The launch body is not loaded: a page of 200 runs would otherwise read every run's task_impl and metadata
    (up to ~0.6 MiB each) to return none of it.
    """
    query = select(Run).options(defer(Run.launch)).where(Run.account_id == account_id)
    if id_prefix:  # the API admits only [0-9a-f-], so LIKE has nothing to escape
        query = query.where(Run.id.startswith(id_prefix))
    if cursor is not None:  # an empty cursor= is refused (invalid_cursor), not taken as absent
        created_at, run_id = _decode_cursor(cursor)
        query = query.where(or_(Run.created_at < created_at, and_(Run.created_at == created_at, Run.id < run_id)))
    with Session(reader(engine)) as session:
        runs = list(session.execute(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1)).scalars())  # type: ignore[attr-defined]
        for run in runs:
            set_committed_value(run, "launch", {})  # a summary carries no launch body; run_view reads it
    page, more = runs[:limit], len(runs) > limit
    next_cursor = _encode_cursor(page[-1]) if more else None
    return RunList(runs=[RunSummary.of(run_view(engine, r)) for r in page], next_cursor=next_cursor)


def _encode_cursor(run: Run) -> str:
    created = run.created_at if run.created_at.tzinfo else run.created_at.replace(tzinfo=UTC)
    micros = (created - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{run.id}"


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    if not re.fullmatch(CURSOR_PATTERN, cursor):
        raise InvalidInput("cursor is not one this API issued (pass next_cursor back as it is)", code="invalid_cursor")
    micros, run_id = cursor.split(".", 1)
    created = _EPOCH + timedelta(microseconds=int(micros))
    return created, run_id


def list_tasks(engine: Engine, *, run_id: str, after: int = -1, limit: int = 500,
               invocation: int | None = None) -> TaskList:
    """Settled task rows of one Materialize invocation (a sweep, §2; default the latest), by index; output is the
    first trial's."""
    with Session(reader(engine)) as session:
        invocation = invocation or _latest_invocation(session, run_id)
        rows = session.execute(
            select(TaskRow, TrialResult.output, TrialResult.meta, TrialResult.input)
            .join(TrialResult, and_(TrialResult.run_id == TaskRow.run_id, TrialResult.invocation == TaskRow.invocation,
                                    TrialResult.index == TaskRow.index, TrialResult.trial == 0), isouter=True)
            .where(TaskRow.run_id == run_id, TaskRow.invocation == invocation, TaskRow.index > after)
            .order_by(TaskRow.index).limit(limit)
        ).all()
    tasks = [_row_view(row, output, meta, model_input, input_chars=LIST_INPUT_CHARS)
             for row, output, meta, model_input in rows]
    return TaskList(tasks=tasks, next_after=tasks[-1].index if len(tasks) == limit else None)


def _row_view(row: TaskRow, output: str | None, meta: dict[str, Any] | None = None,
              model_input: str | None = None, input_chars: int = MAX_INPUT_CHARS) -> TaskRowView:
    """A task row with its first trial's output, input and score_meta audit fields (``benchwright.scoring.results``)."""
    return TaskRowView(index=row.index, invocation=row.invocation, outcome=row.outcome, score=row.score,
                       output=output, trial_scores=row.trial_scores, no_answer=row.no_answer,
                       **audit_fields(meta, model_input, input_chars=input_chars))


def task_detail(engine: Engine, *, run_id: str, index: int) -> TaskDetail:
    """One task row with each trial's score, meta and output.

    Raises:
        NotFound: the task has no settled row yet.
    """
    with Session(reader(engine)) as session:
        invocation = _latest_invocation(session, run_id)
        row = session.get(TaskRow, (run_id, invocation, index))
        trials = list(session.execute(
            select(TrialResult).where(TrialResult.run_id == run_id, TrialResult.invocation == invocation,
                                      TrialResult.index == index).order_by(TrialResult.trial)
        ).scalars())
        agent = _agent_steps(session, run_id, invocation, index) if row is not None else []
    if row is None:
        raise NotFound(f"task {index} of run {run_id} has no settled result")
    detail = _row_view(row, trials[0].output, trials[0].meta, trials[0].input) if trials else _row_view(row, None)
    return TaskDetail(**detail.model_dump(), trials=[
        TrialView(trial=t.trial, score=t.score, outcome=t.outcome, output=t.output, meta=t.meta, error=t.error,
                  input=t.input)
        for t in trials
    ], agent=agent)


MAX_AGENT_STEPS = 1000


def _agent_steps(session: Session, run_id: str, invocation: int, index: int) -> list[AgentStepView]:
    """A product run's agent steps on one task, from the latest attempt that logged any: a range scan of the
    events' unique idempotency keys (``<run>:materialize:<invocation>:<index>:agent:<attempt>:<what>``, written by
    ``benchwright.product.batch``), so a task's steps cost an index lookup, not a scan of the run's log."""
    prefix = event_key(run_id, "materialize", invocation, index, "agent") + ":"
    rows = list(session.execute(
        select(EventRow.seq, EventRow.type, EventRow.data, EventRow.idem_key)
        .where(EventRow.run_id == run_id, EventRow.idem_key >= prefix, EventRow.idem_key < prefix + "\uffff")
        .order_by(EventRow.seq).limit(MAX_AGENT_STEPS)).all())
    rows = [r for r in rows if r[3].startswith(prefix)]  # a locale collation may order the range differently
    attempts = {key[len(prefix):].split(":", 1)[0] for _, _, _, key in rows}
    latest = max(attempts, key=lambda a: int(a) if a.isdigit() else 0, default=None)
    return [AgentStepView(seq=seq, type=kind, data=data) for seq, kind, data, key in rows
            if key[len(prefix):].split(":", 1)[0] == latest]


def set_visibility(engine: Engine, *, run_id: str, account_id: str, visibility: str) -> None:
    """Change who can see a run (§12); reversible at any time."""
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        if run is None or run.account_id != account_id:
            raise NotFound(f"run {run_id} not found")
        if visibility == "public":
            check_can_be_public(session, run)
        run.visibility = visibility
