"""The reads at a run's end do not grow with its log (issue 25): a 10,000 x 5 run's long poll answered ~0.3 s after
its terminal event while they scanned its ~60,000 events. The run's artifacts (its fingerprint, read by finish_run)
and its narration and the facts the builtin narration is made of (read by a terminal ``GET /v1/runs/{id}``) are
found by type through ``ix_events_run_type`` and the errored trials through ``ix_trial_results_errored``
(migration 0016), whatever else the log holds."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlmodel import Session

from benchwright.data.blobs import DirBlobStore
from benchwright.events import (
    AnalyzeArtifact,
    FetchArtifact,
    MaterializeTaskAggregated,
    MaterializeTaskResult,
    PhaseFailed,
    PhaseStarted,
    RunHalted,
    RunNarrated,
)
from benchwright.fingerprint import is_artifact
from benchwright.registry.shape import run_events
from benchwright.report import facts as facts_module
from benchwright.report import write_run_report
from benchwright.report.facts import narration_facts, recorded_narration, report_facts, run_narration
from benchwright.report.narration import NarratorConfig, builtin_narration
from benchwright.schemas import ForkOrigin, LaunchRequest
from benchwright.store import intervals
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.intervals import terminal_intervals
from benchwright.store.models import Run
from benchwright.store.runs import create_run, finish_run, get_run, run_view


def _result(run_id: str, index: int) -> NewEvent:
    return NewEvent.of(event_key(run_id, "m", 1, index, 0, "result"), MaterializeTaskResult(
        invocation=1, index=index, trial=0, score=1.0, outcome="pass", output="42", meta={}, error=None, usage={},
        cost_usd=0.0, input="q", duration_ms=50))


class _Steps:
    """SQLite virtual-machine instructions (in thousands) run on an engine's connections, counted as they run."""

    def __init__(self) -> None:
        self.count = 0

    def on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_progress_handler(self.tick, 1000)

    def tick(self) -> int:
        self.count += 1
        return 0  # go on

    def of(self, read: Callable[[], Any]) -> int:
        before = self.count
        read()
        return self.count - before


def test_a_runs_artifacts_and_narration_are_read_by_type_not_by_scanning_its_log(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    try:
        account, _ = create_account(engine, name="reads")
        run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                         driver="builtin", trials_config={})
        append_events(engine, run.id, [
            NewEvent.of(event_key(run.id, "fetch", "started"), PhaseStarted(phase="fetch")),
            NewEvent.of(event_key(run.id, "fetch", "artifact"), FetchArtifact(source="x.jsonl", sha256="a" * 64,
                                                                               bytes=10, format="jsonl")),
            NewEvent.of(event_key(run.id, "analyze", "artifact"), AnalyzeArtifact(
                format="jsonl", rows=3, columns=["question", "answer"], input_field="question",
                reference_field="answer")),
            NewEvent.of(event_key(run.id, "narrated"), RunNarrated(text="It went well.", narrator="builtin")),
        ])

        reading = make_engine(db_url)  # its connections count their steps (SQLite) from the first
        steps = _Steps()
        if reading.dialect.name == "sqlite":
            event.listen(reading, "connect", steps.on_connect)

        def reads() -> tuple[list[tuple[int, str, dict[str, Any]]], str | None]:
            with Session(reading) as session:
                artifacts = run_events(session, run.id)
            narrated = recorded_narration(reading, run.id)
            facts = narration_facts(reading, get_run(reading, run_id=run.id))  # halts, failed phase, top errors
            assert facts.top_errors == []
            return artifacts, narrated.text if narrated else None

        reads()  # the connection made and the statements compiled
        small = steps.of(reads)
        for start in range(0, 4000, 500):
            append_events(engine, run.id, [_result(run.id, i) for i in range(start, start + 500)])
        artifacts, narration = reads()
        large = steps.of(reads)
        reading.dispose()
        everything = [(e.seq, e.type, e.data) for e in read_events(engine, run.id, after=-1, limit=10_000)]
        assert artifacts == [e for e in everything if is_artifact(e[1])]  # the same events, in seq order
        assert [t for _, t, _ in artifacts] == ["FetchArtifact", "AnalyzeArtifact"]
        assert narration == "It went well."
        if engine.dialect.name == "sqlite":
            # 4,000 more events and trial rows: the same reads, not a walk over them (without the events index: 56k
            # more steps)
            assert large <= small + 5, (small, large)
        else:
            with engine.connect() as conn:
                names = set(conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'events'"))
                            .scalars())
            assert "ix_events_run_type" in names
    finally:
        engine.dispose()


def test_the_run_compared_with_is_summed_up_by_its_counts_beside_the_failed_phase(db_url: str) -> None:
    """The narration's comparison reads the earlier run of the same shape by its task counts alone (its latest
    sweep's), and gives the numbers its own view shows, in one statement with the fork's row (a fork or a replay
    compares with its parent whatever ran before it); the facts of the run itself (its failed phase) are unchanged by
    it."""
    engine = make_engine(db_url)
    migrate(engine)
    try:
        account, _ = create_account(engine, name="compare")
        earlier, later = (create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                                     launch=LaunchRequest(dataset="x.jsonl", model="openai/dev")) for _ in range(2))
        outcomes = ["pass"] * 7 + ["fail"] * 3 + ["err"] * 2
        append_events(engine, earlier.id, [NewEvent.of(event_key(earlier.id, "agg", sweep, i),
                                                       MaterializeTaskAggregated(
            invocation=sweep, index=i, score={"pass": 1.0, "fail": 0.0}.get(o), outcome=o, trial_scores=[]))
            for sweep in (1, 2) for i, o in enumerate(outcomes if sweep == 2 else ["fail"] * 12)])
        # another run's later sweep: each run's latest sweep is its own
        other = create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                           launch=LaunchRequest(dataset="y.jsonl", model="openai/other"))
        append_events(engine, other.id, [NewEvent.of(event_key(other.id, "agg", 5, 0), MaterializeTaskAggregated(
            invocation=5, index=0, score=1.0, outcome="pass", trial_scores=[]))])
        append_events(engine, later.id, [NewEvent.of(event_key(later.id, "fetch", "failed"), PhaseFailed(
            phase="fetch", error_type="InvalidInput", detail="no such file", stack_trace=""))])
        now = datetime.now(UTC)
        with Session(engine) as session:
            for run, at in ((earlier, now - timedelta(seconds=5)), (later, now)):
                row = session.get(Run, run.id)
                assert row is not None
                row.subset_fingerprint, row.impl_fingerprint = "s" * 64, "i" * 64
                row.created_at, row.finished_at = at, at
                session.add(row)
            session.commit()
        run = get_run(engine, run_id=later.id)
        statements: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)

        event.listen(engine, "before_cursor_execute", count)
        facts = narration_facts(engine, run, run_view(engine, run))
        event.remove(engine, "before_cursor_execute", count)
        assert len([s for s in statements if "run_forks" in s]) == 1, statements  # fork, previous and counts: one
        assert facts.failed_phase == "fetch"
        shown = run_view(engine, get_run(engine, run_id=earlier.id)).tasks.summary
        assert facts.comparison is not None and facts.comparison.run_id == earlier.id
        assert facts.comparison.relation == "previous"
        assert (facts.comparison.passed, facts.comparison.failed) == (shown.passed, shown.failed) == (7, 3)
        assert facts.comparison.pass_rate == shown.pass_rate == 0.7
        assert facts.comparison.pass_rate_ci == shown.pass_rate_ci and shown.pass_rate_ci is not None

        for kind, parent in (("replay", earlier), ("fork", later)):
            child = create_run(engine, account_id=account.id, driver="builtin", trials_config={},
                               launch=LaunchRequest(dataset="x.jsonl", model="openai/dev"),
                               fork=ForkOrigin(parent_run_id=parent.id, rewind_to="atomize", kind=kind))
            with Session(engine) as session:  # the same shape, and later than both
                row = session.get(Run, child.id)
                assert row is not None
                row.subset_fingerprint, row.impl_fingerprint = "s" * 64, "i" * 64
                row.finished_at = datetime.now(UTC) + timedelta(seconds=1)
                session.add(row)
                session.commit()
            compared = narration_facts(engine, get_run(engine, run_id=child.id)).comparison
            assert compared is not None and (compared.run_id, compared.relation) == (parent.id, kind)
            assert (compared.passed, compared.failed) == ((7, 3) if parent is earlier else (0, 0))
            assert compared.pass_rate == (0.7 if parent is earlier else None)
            assert compared.model == "openai/dev"
    finally:
        engine.dispose()


def _trial(run_id: str, invocation: int, index: int, error: str | None) -> NewEvent:
    return NewEvent.of(event_key(run_id, "m", invocation, index, 0, "result"), MaterializeTaskResult(
        invocation=invocation, index=index, trial=0, score=None if error else 1.0, outcome="err" if error else "pass",
        output="", meta={}, error=error, usage={}, cost_usd=0.0, input="q", duration_ms=50))


def test_a_terminal_narration_is_two_statements_and_names_the_latest_sweeps_errors(
        store_run: tuple[Any, str]) -> None:
    """The long poll's terminal answer waits for the narration's reads, each a round trip on Postgres: the events it
    starts from (the recorded narration, the halts, the failed phase) and the latest sweep's errors (its invocation
    read in the same statement) in one, the fork in one; a run of no benchmark compares with nothing."""
    engine, run_id = store_run
    append_events(engine, run_id, [
        _trial(run_id, 1, 0, "TimeoutError: the first sweep's"), _trial(run_id, 1, 1, None),
        *[_trial(run_id, 2, i, "ValueError: the second sweep's") for i in range(3)], _trial(run_id, 2, 3, None),
        *[NewEvent.of(event_key(run_id, "agg", 2, i), MaterializeTaskAggregated(
            invocation=2, index=i, score=None if i < 3 else 1.0, outcome="err" if i < 3 else "pass",
            trial_scores=[])) for i in range(4)],
        NewEvent.of(event_key(run_id, "halted"), RunHalted(halt_reason="limit_exceeded:run.cost")),
    ])
    finish_run(engine, run_id=run_id, status="ok")
    run = get_run(engine, run_id=run_id)
    view = run_view(engine, run)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    narration = run_narration(engine, run, view)
    event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 2, statements
    facts = narration_facts(engine, run, view)
    assert facts.top_errors == [("ValueError: the second sweep's", 3)]
    assert facts.halts == ["limit_exceeded:run.cost"]
    assert narration is not None and narration == builtin_narration(facts)

    append_events(engine, run_id, [NewEvent.of(event_key(run_id, "narrated"), RunNarrated(
        text="Recorded.", narrator="builtin"))])
    assert run_narration(engine, run, view) == "Recorded."  # the recorded one, from the same read


def test_the_apis_view_of_a_row_it_just_read_does_not_read_the_row_again(store_run: tuple[Any, str]) -> None:
    """``run_view(..., fresh=True)`` (the API's GET, which reads the row in the same thread hop) gives the same view
    with one statement fewer: the leaderboard note takes the run's pin from the row it was given."""
    engine, run_id = store_run
    finish_run(engine, run_id=run_id, status="ok")
    run = get_run(engine, run_id=run_id)
    run_view(engine, run)  # pass@k's intervals cached, as the first terminal read leaves them
    counted: dict[bool, tuple[int, Any]] = {}
    for fresh in (False, True):
        statements: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)  # noqa: B023 - listened to and removed within this iteration

        event.listen(engine, "before_cursor_execute", count)
        view = run_view(engine, run, fresh=fresh)
        event.remove(engine, "before_cursor_execute", count)
        counted[fresh] = (len(statements), view)
    assert counted[True][0] == counted[False][0] - 1, counted
    assert counted[True][1] == counted[False][1]
    assert counted[True][1].off_leaderboard is not None and "on no benchmark" in counted[True][1].off_leaderboard


def test_a_views_task_summary_is_one_statement_of_the_latest_sweep(store_run: tuple[Any, str]) -> None:
    """A run's view (every long poll's answer, every report) counts the latest sweep's tasks and learns which sweep
    that is in one statement (the latest invocation a subquery): a sweep's counts are its own. A row whose log holds
    its launch alone (a launch's answer, its first poll) has no task rows, and they are not counted; a run with no
    task row yet is at its first sweep."""
    engine, run_id = store_run
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    def view() -> Any:
        run = get_run(engine, run_id=run_id)  # as the API does: the row, then its view in the same hop
        statements.clear()
        event.listen(engine, "before_cursor_execute", count)
        try:
            return run_view(engine, run, fresh=True)
        finally:
            event.remove(engine, "before_cursor_execute", count)

    launched = view()
    assert launched.tasks.summary.passed == 0 and statements == [], statements
    append_events(engine, run_id, [NewEvent.of(event_key(run_id, "started"), PhaseStarted(phase="fetch"))])
    assert view().tasks.summary.passed == 0 and len(statements) == 1, statements
    append_events(engine, run_id, [
        _trial(run_id, 1, 0, "TimeoutError: first"), _trial(run_id, 1, 1, None),
        *[NewEvent.of(event_key(run_id, "agg", 1, i), MaterializeTaskAggregated(
            invocation=1, index=i, score=None if i == 0 else 1.0, outcome="err" if i == 0 else "pass",
            trial_scores=[])) for i in range(2)]])
    summary = view().tasks.summary
    assert (summary.passed, summary.errored, len(statements)) == (1, 1, 1)
    append_events(engine, run_id, [
        *[_trial(run_id, 2, i, None) for i in range(3)],
        *[NewEvent.of(event_key(run_id, "agg", 2, i), MaterializeTaskAggregated(
            invocation=2, index=i, score=1.0, outcome="pass", trial_scores=[])) for i in range(3)]])
    summary = view().tasks.summary
    assert (summary.passed, summary.errored, len(statements)) == (3, 0, 1)
    engine.dispose()


@pytest.mark.parametrize(("scores", "reads"), [((1.0, 0.0, 1.0), 1), ((1.0, 0.5, 0.25), 2)])
def test_a_finished_runs_first_view_learns_whether_it_is_graded_with_its_counts(
        store_run: tuple[Any, str], scores: tuple[float, ...], reads: int) -> None:
    """The first view of a finished run (the long poll's answer; its intervals not cached yet) learns whether a task
    was scored other than 0 and 1 in its counts' statement: a pass/fail run is then one read, a graded one reads its
    task rows for the mean score's bootstrap too; the same intervals as ``terminal_intervals`` probing alone."""
    engine, run_id = store_run
    append_events(engine, run_id, [NewEvent.of(event_key(run_id, "agg", 1, i), MaterializeTaskAggregated(
        invocation=1, index=i, score=score, outcome="pass" if score >= 0.5 else "fail", trial_scores=[score]))
        for i, score in enumerate(scores)])
    finish_run(engine, run_id=run_id, status="ok")
    run = get_run(engine, run_id=run_id)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        summary = run_view(engine, run, fresh=True).tasks.summary
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == reads, statements
    assert (summary.mean_score is not None) == (reads == 2)
    with intervals._lock:
        intervals._cache.clear()
    with Session(engine) as session:
        probed = terminal_intervals(session, run_id=run_id, invocation=1, finished_at=run.finished_at, k=1)
    assert summary.mean_score == probed.mean_score and summary.pass_at_k == probed.pass_at_k == {}
    engine.dispose()


def test_a_runs_end_updates_its_row_once(store_run: tuple[Any, str]) -> None:
    """``finish_run`` sets the status, the end time, the fingerprint and its family in one UPDATE as it commits (not
    one before each of the reads it makes in between): round trips on the way to the long poll's answer. On Postgres
    that UPDATE is inside ``bw_finish_run`` (migration 0026, ``test_finish_in_one_call``), so none is sent."""
    engine, run_id = store_run
    append_events(engine, run_id, [
        NewEvent.of(event_key(run_id, "fetch"), FetchArtifact(source="x.jsonl", sha256="a" * 64, bytes=3,
                                                             format="jsonl", file="x.jsonl")),
        _trial(run_id, 1, 0, None)])
    updates: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("UPDATE runs SET") and "next_seq" not in statement:
            updates.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        finish_run(engine, run_id=run_id, status="ok")
        finish_run(engine, run_id=run_id, status="error", error="a retry")  # the run had ended: nothing changes
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(updates) == (1 if engine.dialect.name == "sqlite" else 0), updates
    for column in ("status", "finished_at", "fingerprint"):
        assert all(column in update for update in updates)
    run = get_run(engine, run_id=run_id)
    assert (run.status, run.error, run.finished_at is not None, run.fingerprint is not None) == ("ok", None, True, True)
    assert [e.type for e in read_events(engine, run_id)].count("PipelineFinished") == 1
    engine.dispose()


def test_a_run_torn_down_halted_is_not_ended_again_by_a_late_finish(store_run: tuple[Any, str]) -> None:
    """A run closed by its teardown (``finish_halted``: PipelineFinished and its end time together) keeps its status
    and end time when a late ``finish_run`` comes (a retried activity): its events land, the row is not written, and
    PipelineFinished stays the one the teardown wrote."""
    from benchwright.store.control import finish_halted, halt_run

    engine, run_id = store_run
    halt_run(engine, run_id=run_id, reason="operator_stop", key="stop")
    finish_halted(engine, run_id=run_id)
    ended = get_run(engine, run_id=run_id)
    late = NewEvent.of(event_key(run_id, "late"), RunNarrated(text="late", narrator="builtin"))
    finish_run(engine, run_id=run_id, status="error", error="a late finish", before=[late])
    run = get_run(engine, run_id=run_id)
    assert (run.status, run.error, run.finished_at, run.halted) == (ended.status, ended.error, ended.finished_at, True)
    log = read_events(engine, run_id)
    assert [e.type for e in log][-2:] == ["PipelineFinished", "RunNarrated"]
    assert [e.type for e in log].count("PipelineFinished") == 1 and log[-2].data["halted"] is True
    engine.dispose()


async def test_a_reports_first_writing_reads_the_runs_view_and_facts_once(store_run: tuple[Any, str],
                                                                         tmp_path: Any) -> None:
    """The report, written while the long poll's terminal answer is read beside it, reads the run's view and the
    narration's facts once: the builtin narration changes nothing they say (twice each before: the run row, its
    task counts, the narration's events and the compared run again after the narration landed). A report written
    again finds the narration recorded and writes the same files."""
    engine, run_id = store_run
    append_events(engine, run_id, [_result(run_id, i) for i in range(3)] + [
        NewEvent.of(event_key(run_id, "agg", 1, i), MaterializeTaskAggregated(
            invocation=1, index=i, score=1.0, outcome="pass", trial_scores=[1.0])) for i in range(3)])
    finish_run(engine, run_id=run_id, status="ok")
    blobs = DirBlobStore(tmp_path / "blobs")
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", count)
    written = await write_run_report(engine=engine, blobs=blobs, run_id=run_id, narrator=NarratorConfig())
    event.remove(engine, "before_cursor_execute", count)
    row_reads = [s for s in statements if s.startswith("SELECT runs.id, runs.account_id")]
    counts = [s for s in statements if s.startswith("SELECT task_rows.invocation, task_rows.outcome")]
    marks = [s for s in statements if s.startswith("SELECT events.seq, events.type, events.data, NULL")]
    # The row once at the start and once by the leaderboard's note; the counts once; the narration's events by the
    # check for a recorded narration and by the narration's facts, once each.
    assert (len(row_reads), len(counts), len(marks)) == (2, 1, 2), statements
    narrated = recorded_narration(engine, run_id)
    assert narrated is not None and written.narrator == "builtin"
    assert "passed 3 of 3 scored tasks" in narrated.text

    again = await write_run_report(engine=engine, blobs=blobs, run_id=run_id, narrator=NarratorConfig())
    assert [f.digest for f in again.files] == [f.digest for f in written.files]
    assert [e.type for e in read_events(engine, run_id)].count("RunNarrated") == 1


def test_a_reports_task_facts_are_each_tasks_row_with_its_slowest_trial_and_its_spend(
        store_run: tuple[Any, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The report's heatmap and distributions draw each task of the latest sweep from its row (outcome, score,
    no_answer) and its trials' result events (the slowest trial's duration, the sum of their cost), read in pages; an
    earlier sweep's results and other events are not counted."""
    engine, run_id = store_run
    monkeypatch.setattr(facts_module, "_EVENT_PAGE", 2)  # pages of two events: the paging is exercised

    def result(invocation: int, index: int, trial: int, ms: int | None, usd: float) -> NewEvent:
        return NewEvent.of(event_key(run_id, "m", invocation, index, trial, "result"), MaterializeTaskResult(
            invocation=invocation, index=index, trial=trial, score=1.0 if index == 0 else 0.0,
            outcome="pass" if index == 0 else "fail", output="x", meta={}, error=None, usage={}, cost_usd=usd,
            input="q", duration_ms=ms))

    append_events(engine, run_id, [
        result(1, 0, 0, 999, 5.0),  # the first sweep's: not the report's
        result(2, 0, 0, 40, 0.25), result(2, 0, 1, 70, 0.5),
        NewEvent.of(event_key(run_id, "started"), PhaseStarted(phase="materialize")),
        result(2, 1, 0, None, 0.125), result(2, 1, 1, 30, 0.0),
        result(2, 2, 0, None, 0.0),
        *[NewEvent.of(event_key(run_id, "agg", 2, i), MaterializeTaskAggregated(
            invocation=2, index=i, score=1.0 if i == 0 else 0.0, outcome="pass" if i == 0 else "fail",
            trial_scores=[])) for i in range(3)],
    ])
    finish_run(engine, run_id=run_id, status="ok")
    run = get_run(engine, run_id=run_id)
    got = report_facts(engine, DirBlobStore(tmp_path / "blobs"), run=run, narration="n", narrator="builtin")
    assert got.invocation == 2
    assert [(t.index, t.outcome, t.score, t.latency_ms, t.cost_usd) for t in got.tasks] == [
        (0, "pass", 1.0, 70, 0.75), (1, "fail", 0.0, 30, 0.125), (2, "fail", 0.0, None, 0.0)]
    assert all(type(t.no_answer) is bool and type(t.score) is float for t in got.tasks)
