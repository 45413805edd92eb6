"""``results.json``: a run's results in a layout lm-evaluation-harness users can read (issue 26; docs/report.md).

lm-eval writes ``results`` (task -> ``"<metric>,<filter>"`` -> value, with ``alias``), ``group_subtasks``,
``configs``, ``versions``, ``higher_is_better``, ``n-samples`` and ``config`` (the model). This file keeps those
keys and meanings: the run is one task (named by its benchmark id, else its dataset's file name); each group of
the breakdown is a subtask ``<task>:<column>=<value>`` under it, as lm-eval lists an MMLU subject under ``mmlu``.
The metric is ``acc`` (= Benchwright's pass rate, passed / (passed + failed), errors excluded, §12) with
``acc_stderr``; the filter is ``none``. Everything Benchwright-specific (the 95 % intervals, counts, cost, the
fingerprint, the narration, the run view's summary verbatim) is under ``benchwright``.
"""

from __future__ import annotations

import re
from typing import Any

from benchwright.report.facts import ReportFacts
from benchwright.schemas import GroupResult, TasksSummary

__all__ = ["SCHEMA", "results_json", "task_name"]

SCHEMA = "benchwright.scoring.results/1"


def task_name(facts: ReportFacts) -> str:
    """The run as one lm-eval task: its benchmark id, else its dataset's file name without extension."""
    receipt = facts.receipt
    if receipt.get("benchmark_id"):
        return str(receipt["benchmark_id"])
    source = str(receipt.get("dataset") or "")
    tail = re.split(r"[/\\]", source.split("?", 1)[0].rstrip("/"))[-1] if source else ""
    stem = re.sub(r"\.(jsonl|json|csv|parquet|tsv|txt)(\.gz)?$", "", tail, flags=re.IGNORECASE)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)[:100].strip("_")
    return stem or "run"


def _metrics(*, pass_rate: float | None, se: float | None, ci: tuple[float, float] | None, passed: int,
             failed: int, errored: int, no_answer: int, total: int) -> dict[str, Any]:
    return {"acc,none": pass_rate, "acc_stderr,none": se,
            "acc_ci95_low,none": ci[0] if ci else None, "acc_ci95_high,none": ci[1] if ci else None,
            "passed": passed, "failed": failed, "errored": errored, "no_answer": no_answer, "total": total}


def _summary_metrics(s: TasksSummary) -> dict[str, Any]:
    out = _metrics(pass_rate=s.pass_rate, se=s.pass_rate_se, ci=s.pass_rate_ci, passed=s.passed, failed=s.failed,
                   errored=s.errored, no_answer=s.no_answer, total=s.total)
    for name, value in s.pass_at_k.items():
        out[f"{name},none"] = value
    if s.mean_score is not None:
        out["score,none"] = s.mean_score.value
        out["score_stderr,none"] = s.mean_score.se
    return out


def _group_metrics(g: GroupResult) -> dict[str, Any]:
    n = g.passed + g.failed
    se = None if g.pass_rate is None or not n else (g.pass_rate * (1 - g.pass_rate) / n) ** 0.5
    return _metrics(pass_rate=g.pass_rate, se=se, ci=g.pass_rate_ci, passed=g.passed, failed=g.failed,
                    errored=g.errored, no_answer=g.no_answer, total=g.total)


def results_json(facts: ReportFacts) -> dict[str, Any]:
    """The document (module docstring; the schema is in docs/report.md)."""
    view = facts.view
    s = view.tasks.summary
    task = task_name(facts)
    model = str(view.model.get("identifier", ""))
    k = int(((view.trials_config or {}).get("plan") or {}).get("k", 1))
    results: dict[str, Any] = {task: {"alias": task, **_summary_metrics(s)}}
    subtasks: list[str] = []
    b = facts.breakdown
    for g in b.groups if b is not None else []:
        name = f"{task}:{b.by}={g.group}" if b is not None else g.group
        subtasks.append(name)
        results[name] = {"alias": f" - {g.group}", **_group_metrics(g)}
    higher = {"acc": True}
    duration = (view.finished_at - view.created_at).total_seconds() if view.finished_at else None
    return {
        "schema": SCHEMA,
        "results": results,
        "group_subtasks": {task: subtasks},
        "configs": {task: {
            "task": task, "dataset_path": facts.receipt.get("dataset"), "output_type": "generate_until",
            "repeats": k, "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
            "group_by": b.by if b is not None else None, "trials": view.trials_config,
            "metadata": {"impl_id": facts.receipt.get("impl_id"), "impl_sha256": facts.receipt.get("impl_sha256")}}},
        "versions": {task: facts.receipt.get("impl_id") or facts.receipt.get("impl_sha256")},
        "higher_is_better": {name: higher for name in results},
        "n-samples": {task: {"original": s.total, "effective": s.passed + s.failed}},
        "config": {"model": "benchwright", "model_name": model, "model_args": f"model={model}",
                   "driver": view.driver, "limit": None},
        "model_name": model,
        "date": view.finished_at.timestamp() if view.finished_at else None,
        "total_evaluation_time_seconds": None if duration is None else f"{duration:.3f}",
        "benchwright": {
            "run_id": view.id, "fingerprint": view.fingerprint, "status": view.status,
            "display_status": view.display_status, "halted": view.halted, "halt_reason": view.halt_reason,
            "error": view.error, "narration": facts.narration, "narrator": facts.narrator,
            "summary": s.model_dump(mode="json"), "cost": view.cost.model_dump(mode="json"),
            "breakdown": b.model_dump(mode="json", exclude={"columns"}) if b is not None else None,
            "comparison": facts.comparison.model_dump(mode="json") if facts.comparison else None,
            "receipt": facts.receipt,
        },
    }
