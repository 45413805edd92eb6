"""What an appended event projects (§5): the run row's columns it sets (a PhaseStarted's phase, a
DatasetTasksArtifact's task count) and the rows of its own (a MaterializeTaskResult's trial row, a
MaterializeTaskAggregated's task row, with the task's ``no_answer`` from its trials' meta).

Pure: ``benchwright.store.events`` writes these in the append's transaction, by its statements or, on Postgres, in
one call of a plpgsql function, and both make the rows here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from benchwright.events import DatasetTasksArtifact, MaterializeTaskAggregated, MaterializeTaskResult, PhaseStarted
from benchwright.scoring.aggregators import outcome_for
from benchwright.scoring.results import is_no_answer

PHASE_STARTED, TASKS_ARTIFACT = PhaseStarted.type_name(), DatasetTasksArtifact.type_name()
RESULT, AGGREGATED = MaterializeTaskResult.type_name(), MaterializeTaskAggregated.type_name()
ROW_PROJECTED = frozenset({RESULT, AGGREGATED})
"""Events that project rows of their own (a trial row, a task row)."""
TRIAL_COLUMNS = ("invocation", "index", "trial", "outcome", "score", "output", "meta", "error", "input")
TASK_COLUMNS = ("invocation", "index", "outcome", "score", "trial_scores", "no_answer", "trials_scored",
                "trials_passed")
"""The columns of a trial row and of a task row but their run's id, in the order the one call takes them."""

Rows = list[tuple[int, dict[str, Any]]]
"""Rows, each with its event's position (from 1) in the append."""


class Appended(Protocol):
    """An event as appended (``benchwright.store.events.NewEvent``)."""

    @property
    def type(self) -> str: ...

    @property
    def data(self) -> dict[str, Any]: ...


def projected(event: Appended) -> dict[str, Any]:
    """The run row's columns ``event`` sets when it is appended: a PhaseStarted's phase, a DatasetTasksArtifact's
    task count (the last such event of an append wins)."""
    if event.type == PHASE_STARTED:
        return {"phase": event.data["phase"]}
    if event.type == TASKS_ARTIFACT:
        return {"tasks_total": event.data["count"]}
    return {}


def trial_row(run_id: str, d: dict[str, Any]) -> dict[str, Any]:
    """The ``trial_results`` row a MaterializeTaskResult's data projects."""
    return {"run_id": run_id, "invocation": d["invocation"], "index": d["index"], "trial": d["trial"],
            "outcome": d["outcome"], "score": d["score"], "output": d["output"], "meta": d["meta"],
            "error": d.get("error"), "input": d.get("input")}


def task_row(run_id: str, d: dict[str, Any]) -> dict[str, Any]:
    """The ``task_rows`` row a MaterializeTaskAggregated's data projects, but its ``no_answer``."""
    scores = d["trial_scores"]  # one per trial, None for one that errored (its outcome ``err``)
    return {"run_id": run_id, "invocation": d["invocation"], "index": d["index"], "outcome": d["outcome"],
            "score": d["score"], "trial_scores": scores,
            "trials_scored": sum(outcome_for(s) != "err" for s in scores),
            "trials_passed": sum(outcome_for(s) == "pass" for s in scores)}


def no_answer_of(row: dict[str, Any], metas: list[Any]) -> bool | None:
    """A task row's ``no_answer`` from the meta of those of its trials at hand (``is_no_answer``); None when that
    depends on trials not at hand (it would be true by these, and some of the row's trials are missing)."""
    no_answer = is_no_answer(row["outcome"], metas) if metas else row["outcome"] == "fail"
    return None if no_answer and len(metas) < len(row["trial_scores"]) else no_answer


def result_rows(run_id: str, events: Sequence[Appended]) -> tuple[Rows, Rows] | None:
    """The trial rows and task rows ``events`` project, each with its event's position in ``events``, the task rows'
    ``no_answer`` set from this append's trials (``no_answer_of``); None when one needs a trial committed before (a
    k > 1 task whose other trials all said ``extracted: false``): those go by the statements, which read it. A trial
    whose key the log holds already counts here, where the statements count the new ones alone: the two differ only
    if a task's last trial was committed without the aggregate it is appended with, which the batch's writers never
    do (they append both together)."""
    trials: Rows = []
    rows: Rows = []
    for position, e in enumerate(events, 1):
        if e.type == RESULT:
            trials.append((position, trial_row(run_id, e.data)))
        elif e.type == AGGREGATED:
            rows.append((position, task_row(run_id, e.data)))
    for _, row in rows:
        metas = [t["meta"] for _, t in trials if (t["invocation"], t["index"]) == (row["invocation"], row["index"])]
        no_answer = no_answer_of(row, metas)
        if no_answer is None:
            return None
        row["no_answer"] = no_answer
    return trials, rows
