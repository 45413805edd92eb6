"""One Materialize batch: run every trial of tasks ``start <= index < stop`` and record the results.

Resumable by construction: what an earlier attempt committed is read back from the store first and skipped, and
every result is appended with its ``(invocation, index, trial)`` key, so a batch killed at any moment and run again
ends with each trial present exactly once. Results are committed in small groups, the batch's first result at once
(a short batch used to commit everything at its end, after its sandbox was gone: the log's first result, which the
run page and the re-run bench read as the first SUT call, came with the last); the caller's ``progress`` callback
(the activity's heartbeat) runs only after a commit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python
from sqlalchemy import bindparam, null, select, union_all
from sqlalchemy.engine import Engine

from benchwright.data.datasets import read_task_rows
from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult
from benchwright.runs.limits import ScorerCeilings
from benchwright.runs.pipeline import MaterializeBatchInput, MaterializeBatchResult
from benchwright.scoring.aggregators import RowAggregate, TrialOutcome, aggregator
from benchwright.scoring.host import TrialItem, TrialLimits, TrialRecord
from benchwright.store.control import append_checking
from benchwright.store.db import outage_tolerant, reader
from benchwright.store.events import NewEvent, event_key
from benchwright.store.models import TaskRow, TrialResult, table_of

SCORER_THREAD_HEADROOM = 64
FLUSH_EVERY = 200
FLUSH_INTERVAL_S = 0.25


def scorer_threads(concurrency: int, items: int) -> int:
    """Scorer threads for a batch of ``items`` trials whose model calls are capped at ``concurrency`` in flight.

    More threads than call slots: the SUT client queues the surplus calls (its semaphore, not the thread count,
    enforces the concurrency), so when a call returns the next one is already waiting in the worker instead of a
    runner thread first having to report its result, take the next task and ask for its call, a round trip
    through two processes during which a slot would sit idle. A trial's attempt clock (``attempt.duration``)
    starts when a thread picks it up, so it includes that short wait for a slot.
    """
    return max(1, min(items, concurrency + min(concurrency, SCORER_THREAD_HEADROOM)))


_RESULT, _AGGREGATED = MaterializeTaskResult.type_name(), MaterializeTaskAggregated.type_name()


def result_event(run_id: str, invocation: int, rec: TrialRecord, *, plain: bool | None = None) -> NewEvent:
    """The ``MaterializeTaskResult`` of one trial: the same key, type and data as ``NewEvent.of`` of the model (a test
    holds them equal), built as a plain dict when every value already has its field's type (the host's records do).
    Validating the model and dumping it again cost more CPU per trial than the rest of recording it. Anything else
    (a scorer's odd output) goes through the model as before, which coerces or refuses it. ``plain``: ``_plain(rec)``
    when the caller has it already."""
    key = event_key(run_id, "materialize", invocation, rec.index, rec.trial, "result")
    if not (_plain(rec) if plain is None else plain):
        return NewEvent.of(key, MaterializeTaskResult(
            invocation=invocation, index=rec.index, trial=rec.trial, score=rec.score, outcome=rec.outcome,
            output=rec.output, meta=rec.meta, error=rec.error, usage=rec.usage, cost_usd=rec.cost_usd,
            input=rec.input, duration_ms=rec.duration_ms))
    return NewEvent(key=key, type=_RESULT, data={
        "invocation": invocation, "index": rec.index, "trial": rec.trial,
        "score": None if rec.score is None else float(rec.score), "outcome": rec.outcome, "output": rec.output,
        # the model's JSON dump of an Any dict: tuples as lists, NaN and infinities as null
        "meta": to_jsonable_python(rec.meta, inf_nan_mode="null"), "error": rec.error, "usage": dict(rec.usage),
        "cost_usd": float(rec.cost_usd), "input": rec.input, "duration_ms": rec.duration_ms})


_OUTCOMES = frozenset(("pass", "fail", "err"))


def _plain(rec: TrialRecord) -> bool:
    return (type(rec.index) is int and type(rec.trial) is int and rec.outcome in _OUTCOMES
            and (rec.score is None or type(rec.score) in (int, float)) and type(rec.cost_usd) in (int, float)
            and (rec.duration_ms is None or type(rec.duration_ms) is int)
            and all(v is None or type(v) is str for v in (rec.output, rec.error, rec.input))
            and type(rec.meta) is dict and all(type(k) is str for k in rec.meta)
            and all(type(k) is str and type(v) is int for k, v in rec.usage.items()))


def _outcome(rec: TrialRecord) -> TrialOutcome:
    """The trial as its task's aggregator takes it, validated: pydantic's core does it in ~1.7 µs, where
    ``model_construct`` (tried for the host's plain records) took ~3 µs."""
    return TrialOutcome(trial=rec.trial, score=rec.score, meta=rec.meta, error=rec.error)


def aggregated_event(run_id: str, invocation: int, index: int, row: RowAggregate) -> NewEvent:
    """The ``MaterializeTaskAggregated`` of one task, like ``result_event`` (``row`` is already validated)."""
    return NewEvent(key=event_key(run_id, "materialize", invocation, index, "aggregated"), type=_AGGREGATED,
                    data={"invocation": invocation, "index": index, "score": row.score, "outcome": row.outcome,
                          "trial_scores": row.trial_scores})


class RunHalted(Exception):
    """The run was halted (by a person, a ceiling or the balance) while this batch ran; the batch stops."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"run halted: {reason}")
        self.reason = reason


_TRIALS, _TASK_ROWS = table_of(TrialResult), table_of(TaskRow)
_RECORDED = union_all(
    select(_TRIALS.c.index, _TRIALS.c.trial, _TRIALS.c.score, _TRIALS.c.meta, _TRIALS.c.error).where(
        _TRIALS.c.run_id == bindparam("run_id_"), _TRIALS.c.invocation == bindparam("invocation_"),
        _TRIALS.c.index >= bindparam("start_"), _TRIALS.c.index < bindparam("stop_")),
    select(_TASK_ROWS.c.index, null(), null(), null(), null()).where(
        _TASK_ROWS.c.run_id == bindparam("run_id_"), _TASK_ROWS.c.invocation == bindparam("invocation_"),
        _TASK_ROWS.c.index >= bindparam("start_"), _TASK_ROWS.c.index < bindparam("stop_")))
"""A batch's trials already recorded and its tasks already aggregated (as rows with no trial), in one statement
built once: a round trip on Postgres as every batch starts, where they were two."""


def _recorded(engine: Engine, inp: MaterializeBatchInput) -> tuple[dict[int, dict[int, TrialOutcome]], set[int]]:
    """Trials already recorded for this batch (by task) and the tasks already aggregated."""
    by_task: dict[int, dict[int, TrialOutcome]] = {}
    aggregated: set[int] = set()
    with reader(engine).connect() as conn:
        for index, trial, score, meta, error in conn.execute(_RECORDED, {
                "run_id_": inp.run_id, "invocation_": inp.invocation, "start_": inp.start, "stop_": inp.stop}):
            if trial is None:
                aggregated.add(index)
            else:
                by_task.setdefault(index, {})[trial] = TrialOutcome(trial=trial, score=score, meta=meta, error=error)
    return by_task, aggregated


async def _settle_and_commit(work: asyncio.Task[None], stopped: Awaitable[None],
                             flush: Callable[[], Awaitable[None]]) -> None:
    """After a cancellation: let the batch's work wind down, stop background commits, commit what is left."""
    await asyncio.gather(work, return_exceptions=True)
    await stopped
    try:
        await flush()
    except RunHalted:
        pass  # already halted for another reason; the ceiling was recorded on the row by flush()


Execute = Callable[[list[TrialItem], Callable[[TrialRecord], Awaitable[None]], TrialLimits], Coroutine[Any, Any, None]]
"""Runs trial items through the scorer wherever it lives (one work sandbox, or a task sandbox per task) and
reports each record; see ``activities.materialize``."""


async def run_batch(*, engine: Engine, inp: MaterializeBatchInput, tasks_path: Path, execute: Execute,
                    progress: Callable[[dict[str, Any]], None],
                    ceilings: ScorerCeilings = ScorerCeilings()) -> MaterializeBatchResult:
    """Run the batch to completion and return its outcome counts.

    After every commit the run's budget is checked; with a run.cost ceiling every result is committed on its own,
    so the run halts within one task of crossing it. ``ceilings`` (the deployment's) bound scorer time where the
    launch did not: the default attempt.duration, the scorer's load time, and the batch's own wall time.

    Raises:
        RunHalted: a ceiling or the balance was crossed (the run row is halted before this is raised).
    """
    k = inp.trials.plan.k

    def recorded_and_rows() -> tuple[dict[int, dict[int, TrialOutcome]], set[int], list[dict[str, Any]]]:
        return *_recorded(engine, inp), read_task_rows(tasks_path, inp.start, inp.stop)

    by_task, aggregated, rows = await asyncio.to_thread(recorded_and_rows)  # one thread hop, not two
    items = [TrialItem(index=inp.start + i, trial=t, row=row)
             for i, row in enumerate(rows) for t in range(k) if t not in by_task.get(inp.start + i, {})]
    counts = {"pass": 0, "fail": 0, "err": 0}
    cost_ceiling = inp.run_cost_usd is not None
    pending: list[NewEvent] = []
    written = 0
    last_flush = time.monotonic()
    flush_lock = asyncio.Lock()

    reduce = aggregator(inp.trials.aggregator)

    def aggregate_task(index: int) -> None:
        # The task's trials are reduced to its row: they are dropped, so a batch holds only its unfinished tasks'
        # trials (every trial's meta held to the batch's end grew the worker ~1.4 KB a trial: issue 25).
        row = reduce(list(by_task.pop(index).values()))
        counts[row.outcome] += 1
        if index not in aggregated:
            aggregated.add(index)
            pending.append(aggregated_event(inp.run_id, inp.invocation, index, row))

    async def flush() -> None:
        nonlocal pending, last_flush, written
        async with flush_lock:
            batch, pending = pending, []
            last_flush = time.monotonic()
            reason = None
            if batch:  # committed with the budget check after it; a store outage is waited out
                reason = await outage_tolerant(append_checking, engine, inp.run_id, batch,
                                               invocation=inp.invocation, run_cost_usd=inp.run_cost_usd)
                written += sum(1 for e in batch if e.type == _RESULT)
            progress({"start": inp.start, "stop": inp.stop, "trials_recorded": written})
            if reason:
                raise RunHalted(reason)

    wake_flusher = asyncio.Event()
    stopping = False
    first_woken = False

    async def background_flushes() -> None:
        # Commits happen beside the scorer traffic, not in its path: a commit awaited inside on_record held up the
        # reading of the runner's messages (and so the next model calls) for as long as the store took.
        while not stopping:
            await wake_flusher.wait()
            wake_flusher.clear()
            if not stopping:
                await flush()

    settled = 0

    async def on_record(rec: TrialRecord) -> None:
        nonlocal first_woken, settled
        settled += 1
        plain = _plain(rec)
        by_task.setdefault(rec.index, {})[rec.trial] = _outcome(rec)
        pending.append(result_event(inp.run_id, inp.invocation, rec, plain=plain))
        if len(by_task[rec.index]) == k:
            aggregate_task(rec.index)
        if cost_ceiling:
            await flush()  # committed and checked before the next result is taken: halts within one task
        elif (not first_woken or settled == len(items) or len(pending) >= FLUSH_EVERY
              or time.monotonic() - last_flush >= FLUSH_INTERVAL_S):
            # The first result goes out at once (the log shows the batch live), and so does the last: its commit
            # then runs while the scorer runtime and its sandbox are torn down (~10 ms), not after them.
            first_woken = True
            wake_flusher.set()

    async def stop_flusher(flusher: asyncio.Task[None]) -> None:
        """Let a commit in progress finish (never cancel one half-way: its count would be lost) and end the task."""
        nonlocal stopping
        stopping = True
        wake_flusher.set()
        await asyncio.gather(flusher, return_exceptions=True)

    # Tasks whose trials were all recorded by an earlier attempt that died before aggregating them.
    for index, trials in list(by_task.items()):
        if len(trials) == k:
            aggregate_task(index)
    task_limits = ceilings.task_limits(inp.task_limits)
    limits = TrialLimits(attempts=task_limits.attempts, duration_s=task_limits.duration_s,
                         cost_usd=task_limits.cost_usd, attempt_duration_s=task_limits.attempt_duration_s,
                         load_s=ceilings.load_s, deadline=time.monotonic() + ceilings.batch_duration_s)
    flusher = asyncio.create_task(background_flushes())
    work = asyncio.create_task(execute(items, on_record, limits))
    try:
        await asyncio.wait([work, flusher], return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the flusher ended first: a commit crossed a ceiling (RunHalted) or the store failed
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            flusher.result()
        work.result()
    except asyncio.CancelledError:
        # Halted or paused: keep what was measured. The records already settled are committed before we go.
        work.cancel()
        await asyncio.shield(_settle_and_commit(work, stop_flusher(flusher), flush))
        raise
    except BaseException:
        await asyncio.shield(stop_flusher(flusher))
        raise
    await stop_flusher(flusher)
    flusher.result()  # a background commit that crossed a ceiling (RunHalted) or failed is this batch's outcome
    await flush()
    return MaterializeBatchResult(start=inp.start, stop=inp.stop, trials_recorded=written, passed=counts["pass"],
                                  failed=counts["fail"], errored=counts["err"])
