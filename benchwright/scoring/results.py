"""What a run's results say beyond pass and fail (issue 21): ``no_answer``, results per group, and what a person
needs to check one task. Pure functions; the store reads are in ``benchwright.store.results``.

**no_answer.** A settled task is *no_answer* when

* its outcome is ``fail`` (the aggregated outcome, §12: a pass or an err is never no_answer), and
* every one of its trials reported ``score_meta["extracted"]`` as JSON ``false`` (a trial whose meta lacks the key,
  or holds anything else, answered as far as we know; so does an errored trial, whose meta is the pipeline's).

It stays a ``fail``: it counts in ``failed`` and in the pass rate's denominator; ``no_answer`` says how many of the
failures were "we could not find an answer in the reply" rather than "the answer was wrong". The builtin templates
set ``extracted``; a launch's own task_impl.py may. The flag is a projection of the log: ``task_rows.no_answer`` is
set when MaterializeTaskAggregated lands, from its trials' MaterializeTaskResult meta (``store.events``).

**Breakdown.** The run's settled tasks grouped by one column of the dataset rows (``tasks.jsonl`` as the run
recorded it: line i is task i). A value becomes a label: a string as it is, a number or bool spelled as JSON,
null or a missing key ``(none)``, anything else its JSON; cut to ``MAX_LABEL_CHARS``. At most ``MAX_GROUPS`` groups;
past that the smallest are folded into one ``(other)`` group. Each group's pass rate and 95 % interval come from
``store.intervals.pass_rate_interval``, the run summary's own, so a one-group breakdown equals the summary.

**The task view.** ``score_meta``'s ``answer``, ``rule``, ``extracted`` and ``reference`` (cut to
``MAX_FIELD_CHARS``), and the input of the scorer's last model call (``model_input``, cut to ``MAX_INPUT_CHARS``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchwright.schemas import GroupResult
from benchwright.store.intervals import pass_rate_interval

__all__ = ["GROUP_COLUMNS", "LIST_INPUT_CHARS", "MAX_GROUPS", "MAX_INPUT_CHARS", "MAX_LABEL_CHARS", "NONE_LABEL",
           "OTHER_LABEL", "REFERENCE_COLUMNS", "audit_fields", "candidate_columns", "group_label", "group_results",
           "is_no_answer", "model_input", "reference_column"]

GROUP_COLUMNS = ("subject", "category", "difficulty", "level", "topic", "domain", "type", "language", "source")
"""Columns that name a grouping (MMLU's ``subject``, MATH's ``level`` and ``type``...), in the order a default is
chosen when the launch names none (``LaunchRequest.group_by``). Matched case-insensitively."""
REFERENCE_COLUMNS = ("answer", "reference", "target", "label", "solution", "expected", "output")
"""Where a task view looks for the reference answer when score_meta has none and Analyze chose no reference column
(a launch that brought its own task_impl.py): the first of these the data has, matched case-insensitively."""
MAX_GROUPS = 100
"""Groups in one breakdown (MMLU has 57 subjects); the rest are folded into ``(other)``."""
MAX_LABEL_CHARS = 100
MAX_FIELD_CHARS = 2_000
"""The reference and extracted answer in a task view."""
MAX_INPUT_CHARS = 8_000
"""The model input recorded per trial: one bounded string (a few-shot MMLU prompt is ~3-5 k characters)."""
LIST_INPUT_CHARS = 1_000
"""The input as a task *listing* shows it (5,000 rows a page; the dashboard reads every page): its tail, where the
question is; the task detail has it whole."""
NONE_LABEL = "(none)"
OTHER_LABEL = "(other)"


def is_no_answer(outcome: str, metas: Iterable[Mapping[str, Any] | None]) -> bool:
    """Whether a task is no_answer (module docstring): a fail whose every trial said ``extracted: false``."""
    if outcome != "fail":
        return False
    seen = False
    for meta in metas:
        if not isinstance(meta, Mapping) or meta.get("extracted") is not False:
            return False
        seen = True
    return seen


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    return _cut(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str), limit)


def model_input(messages: Any) -> str | None:
    """The messages of a model call as ``role: content`` lines (content parts' text joined), bounded."""
    if not isinstance(messages, list):
        return _text(messages, MAX_INPUT_CHARS)
    lines: list[str] = []
    size = 0
    for message in messages:
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "\n".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
            line = f"{message.get('role', '?')}: {content if isinstance(content, str) else _text(content, 500)}"
        else:
            line = str(message)
        lines.append(line)
        size += len(line) + 1
        if size > MAX_INPUT_CHARS:
            break
    return _cut("\n".join(lines), MAX_INPUT_CHARS)


def audit_fields(meta: Mapping[str, Any] | None, recorded_input: str | None = None, *,
                 input_chars: int = MAX_INPUT_CHARS) -> dict[str, Any]:
    """The task view's ``input``, ``answer``, ``rule``, ``extracted`` and ``reference`` from one trial's recorded
    input and score_meta (a harness bridge's trials carry ``input`` and ``target`` in their meta). An input longer
    than ``input_chars`` keeps its tail (the last user message), marked with a leading "…"."""
    meta = meta if isinstance(meta, Mapping) else {}
    extracted = meta.get("extracted")
    rule = meta.get("rule")
    reference = meta.get("reference", meta.get("target"))
    meta_input = meta.get("input") if isinstance(meta.get("input"), str) else None
    shown = recorded_input or _text(meta_input, MAX_INPUT_CHARS)
    if shown is not None and len(shown) > input_chars:
        shown = "…" + shown[len(shown) - input_chars + 1:]
    return {"input": shown,
            "answer": _text(meta.get("answer"), MAX_FIELD_CHARS),
            "rule": _cut(rule, MAX_LABEL_CHARS) if isinstance(rule, str) else None,
            "extracted": extracted if isinstance(extracted, bool) else None,
            "reference": _text(reference, MAX_FIELD_CHARS)}


def group_label(value: Any) -> str:
    """A row's value of the grouping column as a group label (module docstring)."""
    if value is None or value == "":
        return NONE_LABEL
    return _cut(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str),
                MAX_LABEL_CHARS)


def reference_column(columns: Sequence[str], chosen: str | None) -> str | None:
    """The column a task's reference answer is read from: Analyze's choice, else the first of
    ``REFERENCE_COLUMNS`` the data has."""
    if chosen and chosen in columns:
        return chosen
    lower = {c.lower(): c for c in reversed(columns)}
    return next((lower[name] for name in REFERENCE_COLUMNS if name in lower), None)


def candidate_columns(columns: Sequence[str], preferred: str | None = None) -> list[str]:
    """The dataset's columns that look like groupings, the launch's ``group_by`` first (when the data has it)."""
    lower = {c.lower(): c for c in reversed(columns)}
    out = [preferred] if preferred and preferred in columns else []
    out += [lower[name] for name in GROUP_COLUMNS if name in lower and lower[name] not in out]
    return out


def group_results(labels: Sequence[str], settled: Iterable[tuple[int, str, bool]],
                  max_groups: int = MAX_GROUPS) -> tuple[list[GroupResult], int]:
    """Counts, pass rate and interval per group.

    Args:
        labels: The group label of each task, by task index (the dataset rows the run scored).
        settled: ``(index, outcome, no_answer)`` of each settled task; an index past ``labels`` is ignored.
        max_groups: Groups kept; the smallest of the rest are folded into ``(other)``.

    Returns:
        The groups sorted by label (``(other)`` last) and how many groups were folded.
    """
    totals: dict[str, int] = {}
    for label in labels:
        totals[label] = totals.get(label, 0) + 1
    kept = set(sorted(totals, key=lambda g: (-totals[g], g))[:max_groups]) if len(totals) > max_groups else set(totals)
    folded = len(totals) - len(kept)

    def name(label: str) -> str:
        return label if label in kept else OTHER_LABEL

    counts: dict[str, dict[str, int]] = {}
    for label, n in totals.items():
        c = counts.setdefault(name(label), {"pass": 0, "fail": 0, "err": 0, "no_answer": 0, "total": 0})
        c["total"] += n
    for index, outcome, no_answer in settled:
        if 0 <= index < len(labels) and outcome in ("pass", "fail", "err"):
            c = counts[name(labels[index])]
            c[outcome] += 1
            c["no_answer"] += 1 if no_answer and outcome == "fail" else 0
    groups = []
    for group in sorted(counts, key=lambda g: (g == OTHER_LABEL, g)):
        c = counts[group]
        _se, ci = pass_rate_interval(passed=c["pass"], failed=c["fail"])
        scored = c["pass"] + c["fail"]
        groups.append(GroupResult(group=group, passed=c["pass"], failed=c["fail"], errored=c["err"],
                                  no_answer=c["no_answer"], unsettled=max(c["total"] - scored - c["err"], 0),
                                  total=c["total"], pass_rate=c["pass"] / scored if scored else None,
                                  pass_rate_ci=ci))
    return groups, folded
