"""The store reads behind a run's narration and report (issue 26): everything is read from the run row, its
projections and its log (never from a worker's disk), and the numbers are the API's own (``store.runs.run_view``,
``store.results.breakdown``), so a report and ``results.json`` say what ``GET /v1/runs/{id}`` says."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, TypeAdapter
from sqlalchemy import bindparam, func, literal_column, null, union_all
from sqlalchemy import select as sa_select
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, col, select

from benchwright.data.blobs import BlobStore
from benchwright.errors import Conflict, InvalidInput
from benchwright.events import (
    AgentTextEvent,
    AtomizeArtifact,
    DatasetResolved,
    ForkDecided,
    HumanReviewRequested,
    MaterializeTaskResult,
    PhaseCacheHit,
    PhaseCompleted,
    PhaseFailed,
    PhaseRestartRequested,
    PhaseSkipped,
    PhaseStarted,
    ReportFile,
    RunHalted,
    RunNarrated,
    RunResumed,
    ToolCallEvent,
)
from benchwright.report.narration import MAX_REASON_CHARS, Comparison, NarrationFacts, builtin_narration
from benchwright.schemas import BreakdownView, RunView
from benchwright.store.db import reader
from benchwright.store.intervals import pass_rate_interval
from benchwright.store.models import EventRow, Run, RunFork, TaskRow, TrialResult, table_of
from benchwright.store.results import breakdown
from benchwright.store.runs import run_view

__all__ = ["Decision", "ReportFacts", "TaskFact", "narration_facts", "recorded_narration", "report_facts",
           "report_files", "run_narration"]

_log = logging.getLogger(__name__)
Relation = Literal["fork", "replay", "previous"]
TOP_REASONS = 10
MAX_DECISIONS = 400
"""Entries of the Driver's decisions a report lists (the first ones: a Driver that talks longer is cut, said so)."""
_EVENT_PAGE = 5_000


class TaskFact(BaseModel):
    """One task of the latest sweep as the report draws it."""

    index: int
    outcome: str
    score: float | None = None
    no_answer: bool = False
    latency_ms: int | None = None
    """The slowest of its trials (``MaterializeTaskResult.duration_ms``), when recorded."""
    cost_usd: float = 0.0
    """The SUT's spend over its trials."""


class Decision(BaseModel):
    """One entry of the Driver's decisions: a phase marker, the Driver's text, a tool call, a halt."""

    seq: int
    phase: str | None
    kind: str
    text: str


class ReportFacts(BaseModel):
    view: RunView
    narration: str
    narrator: str
    comparison: Comparison | None = None
    breakdown: BreakdownView | None = None
    tasks: list[TaskFact] = Field(default_factory=list)
    failures: list[tuple[str, int]] = Field(default_factory=list)
    """err reasons (first line), most common first, then ``no answer found in the reply`` with its count."""
    decisions: list[Decision] = Field(default_factory=list)
    decisions_omitted: int = 0
    receipt: dict[str, Any] = Field(default_factory=dict)
    invocation: int = 1


def _latest_invocation(conn: Connection, run_id: str) -> int:
    latest = conn.execute(select(func.max(TaskRow.invocation)).where(TaskRow.run_id == run_id)).scalar_one()
    return int(latest or 1)


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or "(no message)"
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 1] + "…"


# The narration's reads, built once as Core statements: a long poll's terminal answer waits for them, and built
# through the ORM each time (aliased entities, correlated subqueries) the comparison alone cost ~3 ms of CPU on
# SQLite, most of it in building it: more than the three statements it replaced.
_RUNS, _FORKS, _TASK_ROWS = table_of(Run), table_of(RunFork), table_of(TaskRow)
_EVENTS, _TRIALS = table_of(EventRow), table_of(TrialResult)


def _errors_in(invocation: Any) -> Any:
    """The errored trials of ``invocation`` (a value or a subquery) of run ``run_id_`` by error, through the partial
    index ix_trial_results_errored, whose condition the query names as a literal (a bound parameter would leave a
    prepared statement's generic plan on Postgres unable to use it): not every trial of the run."""
    return (sa_select(_TRIALS.c.error, func.count())
            .where(_TRIALS.c.run_id == bindparam("run_id_"), _TRIALS.c.invocation == invocation,
                   _TRIALS.c.outcome == literal_column("'err'"))
            .group_by(_TRIALS.c.error))


_ERRORS = _errors_in(bindparam("invocation_"))
_LATEST_ERRORS = _errors_in(sa_select(func.coalesce(func.max(_TASK_ROWS.c.invocation), 1))
                            .where(_TASK_ROWS.c.run_id == bindparam("run_id_")).scalar_subquery())


def _top_errors(conn: Connection, run_id: str, invocation: int, limit: int) -> list[tuple[str, int]]:
    """The commonest errors of ``invocation``'s trials."""
    return _ranked(conn.execute(_ERRORS, {"run_id_": run_id, "invocation_": invocation}).all(), limit)


def _ranked(errors: Iterable[tuple[str | None, int]], limit: int) -> list[tuple[str, int]]:
    """The ``limit`` commonest of ``errors`` (an error and its count), each by its first line."""
    counts: Counter[str] = Counter()
    for error, n in errors:
        counts[_first_line(error or "")] += int(n)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]


def _compared(runs: Any) -> tuple[Any, ...]:
    """A compared run's id, model and its latest invocation's passed and failed tasks, as ``outcome_counts`` counts
    them (subqueries correlated to ``runs``)."""
    rows = _TASK_ROWS.alias("latest_rows")
    # Correlated by name: nested two deep, the latest sweep's subquery would otherwise take ``runs`` into its own FROM
    # (and read every run's latest sweep).
    latest = (sa_select(func.max(rows.c.invocation)).where(rows.c.run_id == runs.c.id).correlate(runs)
              .scalar_subquery())

    def counted(outcome: str) -> Any:
        return sa_select(func.count()).select_from(_TASK_ROWS).where(
            _TASK_ROWS.c.run_id == runs.c.id, _TASK_ROWS.c.invocation == latest,
            _TASK_ROWS.c.outcome == literal_column(f"'{outcome}'")).correlate(runs).scalar_subquery()

    return runs.c.id, runs.c.model, counted("pass"), counted("fail")


_PARENT = (sa_select(*_compared(_RUNS), _FORKS.c.kind).join(_FORKS, _FORKS.c.parent_run_id == _RUNS.c.id)
           .where(_FORKS.c.run_id == bindparam("run_id_")))
"""A fork's or a replay's parent (none for another run)."""


def _parent_else_previous(same: tuple[str, ...]) -> Any:
    """``_PARENT``, else the newest earlier terminal run of the account whose ``same`` columns are the run's."""
    earlier = _RUNS.alias("earlier")
    previous_id = (sa_select(earlier.c.id).where(
        earlier.c.account_id == bindparam("account_id_"), earlier.c.id != bindparam("run_id_"),
        *(earlier.c[name] == bindparam(f"{name}_") for name in same),
        earlier.c.finished_at.is_not(None), earlier.c.created_at < bindparam("created_at_"))
        .order_by(earlier.c.created_at.desc()).limit(1).scalar_subquery())
    forked = sa_select(_FORKS.c.run_id).where(_FORKS.c.run_id == bindparam("run_id_")).exists()
    return union_all(_PARENT, sa_select(*_compared(_RUNS), literal_column("'previous'"))
                     .where(_RUNS.c.id == previous_id, ~forked))


_SHAPES = (("benchmark_id", "subset_id", "impl_id"), ("subset_fingerprint", "impl_fingerprint"))
"""What makes an earlier run "of the same shape": its benchmark, subset and impl, else (a dataset run) its data's and
scorer's fingerprints."""
_BY_SHAPE = {same: _parent_else_previous(same) for same in _SHAPES}


def _comparison(session: Session, run: Run) -> Comparison | None:
    """The run's parent (fork/replay), else the previous terminal run of its shape in the same account, with its
    latest invocation's passed and failed tasks (its counts alone, not its whole view): one statement, a round trip on
    Postgres where the fork's row, the previous run and its counts were three."""
    same = next((same for same in _SHAPES if all(getattr(run, name) for name in same)), None)
    params: dict[str, Any] = {"run_id_": run.id}
    if same is not None:
        params |= {"account_id_": run.account_id, "created_at_": run.created_at,
                   **{f"{name}_": getattr(run, name) for name in same}}
    found = session.execute(_BY_SHAPE[same] if same is not None else _PARENT, params).first()
    if found is None:
        return None
    other_id, model, passed, failed, kind = found
    relation: Relation = "previous" if kind == "previous" else "replay" if kind == "replay" else "fork"
    scored = passed + failed
    return Comparison(run_id=other_id, relation=relation, model=str((model or {}).get("identifier", "")),
                      passed=passed, failed=failed, pass_rate=passed / scored if scored else None,
                      pass_rate_ci=pass_rate_interval(passed=passed, failed=failed)[1])


def narration_facts(engine: Engine, run: Run, view: RunView | None = None) -> NarrationFacts:
    """What the narrator is told about ``run`` (``benchwright.report.narration.NarrationFacts``)."""
    view = view or run_view(engine, run)
    with Session(reader(engine)) as session:
        return _facts(session, run, view)


class _Marks:
    """The events a narration starts from, in one read: the newest narration recorded, the halts in order and the
    last failed phase; with ``errors``, the latest sweep's commonest errors too (``_top_errors``), in the same
    statement."""

    TYPES = (RunNarrated.type_name(), RunHalted.type_name(), PhaseFailed.type_name())
    TOP = 3
    """How many of the commonest errors a narration names."""

    def __init__(self, session: Session, run_id: str, *, errors: bool = False) -> None:
        self.narrated: RunNarrated | None = None
        self.halts: list[str] = []
        self.failed: Any = None
        self.top_errors: list[tuple[str, int]] = []
        # Each statement is a round trip on Postgres, and a long poll's terminal answer waits for these: the errors
        # come in the same statement, as rows with no seq. Sorted here: an ORDER BY seq had SQLite walk the run's
        # whole log by seq instead of probing ix_events_run_type.
        rows = session.execute(_MARKS_AND_ERRORS if errors else _MARKS, {"run_id_": run_id}).all()
        self.top_errors = _ranked(((error, n) for seq, _, _, error, n in rows if seq is None), self.TOP)
        for _seq, kind, data, _, _ in sorted((row for row in rows if row[0] is not None), key=lambda row: row[0]):
            if kind == RunHalted.type_name():
                self.halts.append(str(data.get("halt_reason", "")))
            elif kind == PhaseFailed.type_name():
                self.failed = data
            elif isinstance(data, dict):
                self.narrated = RunNarrated.model_validate(data)


_MARKS = sa_select(_EVENTS.c.seq, _EVENTS.c.type, _EVENTS.c.data, null(), null()).where(
    _EVENTS.c.run_id == bindparam("run_id_"), _EVENTS.c.type.in_(_Marks.TYPES))
_MARKS_AND_ERRORS = union_all(_MARKS, _LATEST_ERRORS.with_only_columns(
    null(), null(), null(), _TRIALS.c.error, func.count()))
"""``_Marks``' read, and the same with the latest sweep's errors as rows with no seq."""


def _facts(session: Session, run: Run, view: RunView, marks: _Marks | None = None) -> NarrationFacts:
    marks = marks or _Marks(session, run.id, errors=True)
    halts, failed, top = marks.halts, marks.failed, marks.top_errors
    comparison = _comparison(session, run)
    duration = None
    if run.finished_at is not None:
        duration = max((run.finished_at - run.created_at).total_seconds(), 0.0)
    return NarrationFacts(
        run_id=run.id, model=str(run.model.get("identifier", "")), status=run.status,
        display_status=view.display_status, halted=run.halted, halt_reason=run.halt_reason, error=run.error,
        failed_phase=str(failed.get("phase")) if isinstance(failed, dict) else None, summary=view.tasks.summary,
        cost=view.cost, halts=halts, top_errors=top, comparison=comparison, duration_s=duration)


def recorded_narration(engine: Engine, run_id: str) -> RunNarrated | None:
    """The run's recorded narration (its newest RunNarrated), if any."""
    with Session(reader(engine)) as session:
        return _Marks(session, run_id).narrated


def run_narration(engine: Engine, run: Run, view: RunView) -> str | None:
    """The narration the run view shows: the recorded one; for a terminal run without one yet (the report is
    being written, or the run ended before narration existed) the builtin text computed now; None while running.
    One read transaction for all of it: the long poll's terminal answer waits for this."""
    with Session(reader(engine)) as session:
        marks = _Marks(session, run.id, errors=run.finished_at is not None)
        if marks.narrated is not None:
            return marks.narrated.text
        if run.finished_at is None:
            return None
        try:
            return builtin_narration(_facts(session, run, view, marks))
        except Exception:  # noqa: BLE001 - a narration never costs the caller the run view
            _log.exception("run %s: the builtin narration could not be computed", run.id)
            return None


# The sweep's task rows and its result events' three fields, as Core statements built once and run on a connection:
# through the ORM session, its loading machinery cost ~4 µs a row (1,000 task rows: 5.2 ms of CPU against 1.3 ms).
_TASK_FACTS = (sa_select(_TASK_ROWS.c.index, _TASK_ROWS.c.outcome, _TASK_ROWS.c.score, _TASK_ROWS.c.no_answer)
               .where(_TASK_ROWS.c.run_id == bindparam("run_id_"), _TASK_ROWS.c.invocation == bindparam("invocation_"))
               .order_by(_TASK_ROWS.c.index))
# Three fields of each result, extracted by the database: decoding each event's whole JSON (its output and input text
# too) was a third of the report's time on a 1,000-task run (issue 25).
_RESULT_FIELDS = (sa_select(_EVENTS.c.seq, _EVENTS.c.data["invocation"].as_integer(),
                            _EVENTS.c.data["index"].as_integer(), _EVENTS.c.data["cost_usd"].as_float(),
                            _EVENTS.c.data["duration_ms"].as_integer())
                  .where(_EVENTS.c.run_id == bindparam("run_id_"),
                         _EVENTS.c.type == MaterializeTaskResult.type_name(),
                         _EVENTS.c.seq > bindparam("after_"))
                  .order_by(_EVENTS.c.seq).limit(bindparam("page_")))


_TASK_FACT_LIST = TypeAdapter(list[TaskFact])


def _tasks(conn: Connection, run_id: str, invocation: int) -> list[TaskFact]:
    rows = conn.execute(_TASK_FACTS, {"run_id_": run_id, "invocation_": invocation}).all()
    latency: dict[int, int] = {}
    cost: dict[int, float] = {}
    after = -1
    while True:  # the sweep's result events, in pages (a 10,000-task run with k = 5 has 50,000)
        page = conn.execute(_RESULT_FIELDS, {"run_id_": run_id, "after_": after, "page_": _EVENT_PAGE}).all()
        for _seq, inv, index, usd, ms in page:
            if inv != invocation or index is None:
                continue
            cost[index] = cost.get(index, 0.0) + float(usd or 0.0)
            if ms is not None and ms >= 0:
                latency[index] = max(latency.get(index, 0), ms)
        if len(page) < _EVENT_PAGE:
            break
        after = page[-1][0]
    # Validated as one list (pydantic's core, not a Python call per fact): 1,000 facts in ~1.3 ms, where
    # ``model_construct`` each took ~3.6 ms and ``TaskFact(...)`` each ~5.6 ms.
    return _TASK_FACT_LIST.validate_python([
        {"index": index, "outcome": outcome, "score": score, "no_answer": no_answer, "latency_ms": latency.get(index),
         "cost_usd": cost.get(index, 0.0)} for index, outcome, score, no_answer in rows])


def _decision(seq: int, kind: str, data: dict[str, Any]) -> Decision | None:
    phase = data.get("phase") if isinstance(data.get("phase"), str) else None
    text: str | None
    if kind == AgentTextEvent.type_name():
        text = str(data.get("text", ""))
    elif kind == PhaseStarted.type_name():
        text = "started"
    elif kind == PhaseCompleted.type_name():
        text = f"completed in {int(data.get('duration_ms') or 0) / 1000:.1f} s"
    elif kind == PhaseFailed.type_name():
        text = f"failed: {data.get('error_type', '')}: {data.get('detail', '')}"
    elif kind == PhaseSkipped.type_name():
        text = f"skipped: {data.get('reason', '')}"
    elif kind == PhaseCacheHit.type_name():
        text = f"reused the cached work of run {data.get('source_run_id', '?')}"
    elif kind == PhaseRestartRequested.type_name():
        text = f"the Driver restarted the phase: {data.get('reason', '')}"
    elif kind == HumanReviewRequested.type_name():
        text = f"the Driver asked for a human review: {data.get('reason', '')}"
    elif kind == ToolCallEvent.type_name():
        text = f"tool call {data.get('name', '?')}"
    elif kind == DatasetResolved.type_name():
        text = f"resolved the prompt to {data.get('name', '?')}: {data.get('why', '')}"
    elif kind == ForkDecided.type_name():
        text = (f"forked from {data.get('parent_run_id', '?')} at {data.get('rewind_to', '?')}; "
                + "; ".join(str(x) for x in data.get("interpreted") or []))
    elif kind == RunHalted.type_name():
        text = f"halted: {data.get('halt_reason', '')}"
    elif kind == RunResumed.type_name():
        text = "resumed" + (f" with instructions: {data['review_resolution']}" if data.get("review_resolution") else "")
    elif kind == AtomizeArtifact.type_name():
        text = f"scorer from {data.get('source', '?')} (task_impl.py sha256 {str(data.get('impl_sha256', ''))[:12]})"
    else:
        return None
    text = " ".join(text.split())
    return Decision(seq=seq, phase=phase, kind=kind, text=text[:2000])


_DECISION_TYPES = tuple(cls.type_name() for cls in (
    AgentTextEvent, PhaseStarted, PhaseCompleted, PhaseFailed, PhaseSkipped, PhaseCacheHit, PhaseRestartRequested,
    HumanReviewRequested, ToolCallEvent, DatasetResolved, ForkDecided, RunHalted, RunResumed, AtomizeArtifact))


_DECISIONS = (select(EventRow.seq, EventRow.type, EventRow.data)
              .where(col(EventRow.run_id) == bindparam("run_id_"), col(EventRow.type).in_(_DECISION_TYPES))
              .order_by(col(EventRow.seq)).limit(MAX_DECISIONS))
_DECISIONS_COUNTED = select(func.count()).where(col(EventRow.run_id) == bindparam("run_id_"),
                                                col(EventRow.type).in_(_DECISION_TYPES))
"""``_decisions``' reads, built once (an ``IN`` of fourteen types: its cache key cost more than the read)."""


def _decisions(conn: Connection, run_id: str) -> tuple[list[Decision], int]:
    rows = conn.execute(_DECISIONS, {"run_id_": run_id}).all()
    total = conn.execute(_DECISIONS_COUNTED, {"run_id_": run_id}).scalar_one()
    out = [d for seq, kind, data in rows if (d := _decision(int(seq), str(kind), dict(data))) is not None]
    return out, max(int(total) - len(rows), 0)


def _shown_source(source: Any) -> str | None:
    """A dataset source as a report shows it: a URL without its userinfo and query (a report is shared more widely
    than the run: a signed URL's token or a password in it stays in the run's own log)."""
    if not isinstance(source, str):
        return None
    parts = urlsplit(source)
    if parts.scheme in ("http", "https") and parts.hostname:
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, host, parts.path, "…" if parts.query else "", ""))
    return source


def _receipt(conn: Connection, run: Run, view: RunView) -> dict[str, Any]:
    atomize = conn.execute(select(EventRow.data).where(
        col(EventRow.run_id) == run.id, col(EventRow.type) == AtomizeArtifact.type_name())
        .order_by(col(EventRow.seq).desc()).limit(1)).scalar()
    launch = run.launch or {}
    return {
        "run_id": run.id, "fingerprint": run.fingerprint, "impl_id": run.impl_id,
        "impl_sha256": atomize.get("impl_sha256") if isinstance(atomize, dict) else None,
        "model": run.model.get("identifier"), "driver": run.driver,
        "dataset": _shown_source(launch.get("dataset") or launch.get("prompt")), "benchmark_id": run.benchmark_id,
        "subset_id": run.subset_id, "subset_fingerprint": run.subset_fingerprint,
        "trials_config": run.trials_config, "backend": run.backend, "status": run.status,
        "display_status": view.display_status, "halt_reason": run.halt_reason,
        "created_at": run.created_at.isoformat(), "finished_at": run.finished_at.isoformat() if run.finished_at
        else None,
    }


def report_facts(engine: Engine, blobs: BlobStore, *, run: Run, narration: str, narrator: str,
                 known: tuple[RunView, NarrationFacts] | None = None) -> ReportFacts:
    """Everything the report shows, read once the run is over. ``known``: the run's view and narration facts, read
    for ``run`` as it is (its narration's writer read them and changed nothing they say), not read again."""
    if known is None:
        view = run_view(engine, run)
        known = view, narration_facts(engine, run, view)
    view, facts = known
    try:
        grouped: BreakdownView | None = breakdown(engine, blobs, run=run, by=None)
    except (InvalidInput, Conflict):
        grouped = None  # no dataset rows recorded (a run that failed early)
    if grouped is not None and grouped.by is None:
        grouped = None  # the data has no grouping column: nothing to split the score by
    with reader(engine).connect() as conn:
        invocation = _latest_invocation(conn, run.id)
        tasks = _tasks(conn, run.id, invocation)
        failures = _top_errors(conn, run.id, invocation, TOP_REASONS)
        decisions, omitted = _decisions(conn, run.id)
        receipt = _receipt(conn, run, view)
    if view.tasks.summary.no_answer:
        failures.append(("no answer found in the reply (no_answer)", view.tasks.summary.no_answer))
    return ReportFacts(view=view, narration=narration, narrator=narrator, comparison=facts.comparison,
                       breakdown=grouped, tasks=tasks, failures=failures, decisions=decisions,
                       decisions_omitted=omitted, receipt=receipt, invocation=invocation)


def report_files(engine: Engine, run_id: str) -> dict[str, ReportFile]:
    """The run's report files by name (the newest ReportFile of each name), in the order first written."""
    with Session(reader(engine)) as session:
        rows = session.exec(select(EventRow.data).where(
            col(EventRow.run_id) == run_id, col(EventRow.type) == ReportFile.type_name())
            .order_by(col(EventRow.seq))).all()
    files: dict[str, ReportFile] = {}
    for data in rows:
        found = ReportFile.model_validate(data)
        files[found.name] = found
    return files
