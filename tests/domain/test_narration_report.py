"""The builtin narrator and the report's renderers as plain functions (issue 26): what the text says for an ok, a
failed, a halted and a compared run; the settings' narrator check; hostile names and texts in the HTML stay text;
results.json's task naming."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from benchwright.report.facts import Decision, ReportFacts, TaskFact
from benchwright.report.html import render_html
from benchwright.report.narration import (
    Comparison,
    NarrationFacts,
    NarratorConfig,
    builtin_narration,
    check_narrator,
    narrate,
)
from benchwright.report.results_json import results_json, task_name
from benchwright.schemas import BreakdownView, CostView, GroupResult, RunView, TasksBlock, TasksSummary


def _summary(passed: int = 8, failed: int = 2, errored: int = 0, no_answer: int = 0, total: int = 10,
             ci: tuple[float, float] | None = (0.49, 0.94)) -> TasksSummary:
    scored = passed + failed
    return TasksSummary(passed=passed, failed=failed, errored=errored, no_answer=no_answer, total=total,
                        pass_rate=passed / scored if scored else None, pass_rate_ci=ci if scored else None)


def _facts(**over: Any) -> NarrationFacts:
    base: dict[str, Any] = {"run_id": "r1", "model": "openai/m", "status": "ok", "display_status": "ok",
                            "halted": False, "halt_reason": None, "error": None, "summary": _summary(),
                            "cost": CostView()}
    return NarrationFacts(**{**base, **over})


def test_an_ok_run_states_its_score_interval_and_cost() -> None:
    text = builtin_narration(_facts(cost=CostView(model=0.5, incurred=0.5)))
    assert text == ("openai/m passed 8 of 10 scored tasks: pass rate 80.0 % (95 % CI 49.0–94.0 %). It cost $0.5000 "
                    "(model $0.5000); billed $0.0000.")
    assert builtin_narration(_facts(cost=CostView(model=0.5, incurred=0.5))) == text  # deterministic


def test_errors_and_no_answers_are_explained() -> None:
    text = builtin_narration(_facts(summary=_summary(errored=3, no_answer=2, total=13),
                                    top_errors=[("limit_exceeded:attempt.duration (10 s)", 3)]))
    assert "3 tasks errored and are left out of the pass rate" in text
    assert "“limit_exceeded:attempt.duration (10 s)”, most likely a limit of the launch cut the tasks short" in text
    assert "2 of the 2 failures found no answer in the reply" in text


def test_a_failed_and_a_halted_run_say_so() -> None:
    failed = builtin_narration(_facts(status="error", display_status="error", failed_phase="fetch",
                                      error="fetch failed: DatasetError: 404", summary=_summary(0, 0, total=0)))
    assert "has no scored task" in failed and "The run failed in fetch: fetch failed: DatasetError: 404." in failed
    halted = builtin_narration(_facts(halted=True, halt_reason="limit_exceeded:run.cost", display_status="halted",
                                      summary=_summary(total=40), halts=["limit_exceeded:run.cost"]))
    assert "30 of 40 tasks never settled." in halted
    assert "It was halted (limit_exceeded:run.cost): it crossed a limit of its launch." in halted
    resumed = builtin_narration(_facts(halts=["operator_pause"]))
    assert "It was halted 1 time on the way (operator_pause) and resumed." in resumed


def test_the_comparison_says_whether_the_intervals_overlap() -> None:
    other = Comparison(run_id="p1", relation="fork", model="openai/old", passed=2, failed=8, pass_rate=0.2,
                       pass_rate_ci=(0.06, 0.45))
    apart = builtin_narration(_facts(comparison=other))
    assert "Against its parent run p1 (openai/old, 20.0 %), the pass rate moved +60.0 points; the 95 % intervals " \
           "do not overlap" in apart
    near = other.model_copy(update={"pass_rate": 0.7, "pass_rate_ci": (0.4, 0.9), "relation": "previous"})
    text = builtin_narration(_facts(comparison=near))
    assert "previous run of the same benchmark, subset and impl p1" in text and "may be noise" in text


def test_narrator_setting_is_builtin_or_a_litellm_model() -> None:
    assert check_narrator("builtin") == "builtin"
    assert check_narrator("openai/gpt-4o-mini") == "openai/gpt-4o-mini"
    for bad in ("gpt-4o", "openai://gpt", "http://x/y", "openai/ model", ""):
        with pytest.raises(ValueError):
            check_narrator(bad)
    assert "sk-" not in repr(NarratorConfig(narrator="openai/x", api_key="sk-secret"))


async def test_the_builtin_narrator_records_no_usage() -> None:
    narration = await narrate(_facts(), NarratorConfig())
    assert (narration.narrator, narration.fallback, narration.usage) == ("builtin", None, None)
    assert narration.text == builtin_narration(_facts())


HOSTILE = '</script><script>alert(1)</script><img src="http://evil.test/x.png">'


def _report(**over: Any) -> ReportFacts:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    view = RunView(id="r1", status="ok", halted=False, halt_reason=None, display_status="ok",
                   model={"identifier": "openai/m"}, driver="builtin", phase=None, visibility="private", metadata={},
                   trials_config={"plan": {"k": 1}}, cost=CostView(), tasks=TasksBlock(summary=_summary(total=12)),
                   created_at=now, finished_at=now, terminal=True, fingerprint="abc123abc123")
    groups = BreakdownView(run_id="r1", by="subject", columns=["subject"], candidates=["subject"], groups=[
        GroupResult(group=HOSTILE, passed=8, failed=2, total=12, pass_rate=0.8, pass_rate_ci=(0.49, 0.94))])
    base: dict[str, Any] = {
        "view": view, "narration": "It went fine. " + HOSTILE, "narrator": "builtin", "breakdown": groups,
        "tasks": [TaskFact(index=i, outcome="pass" if i < 8 else "fail", latency_ms=10 * i, cost_usd=0.001)
                  for i in range(10)],
        "failures": [(HOSTILE, 2)], "decisions": [Decision(seq=3, phase="atomize", kind="AgentTextEvent",
                                                           text=HOSTILE)],
        "receipt": {"run_id": "r1", "dataset": "https://data.test/sets/My Set.jsonl?x=1", "fingerprint": "abc"}}
    return ReportFacts(**{**base, **over})


def test_hostile_text_stays_text_in_the_html() -> None:
    doc = render_html(_report()).decode()
    assert HOSTILE not in doc and "alert(1)</script>" not in doc
    assert doc.count("<script") == 2  # the task data (JSON, inert) and the report's own script
    assert "http://evil.test" not in doc.replace("&quot;http://evil.test/x.png&quot;", "")
    assert "Content-Security-Policy" in doc and "default-src 'none'" in doc
    assert 'data-n="10"' in doc  # the latency histogram over the ten tasks


def test_results_json_names_the_task_and_keeps_the_summary() -> None:
    facts = _report()
    doc = results_json(facts)
    assert task_name(facts) == "My_Set"
    assert doc["results"]["My_Set"]["acc,none"] == 0.8
    assert doc["group_subtasks"]["My_Set"] == [f"My_Set:subject={HOSTILE}"]
    assert doc["benchwright"]["summary"] == facts.view.tasks.summary.model_dump(mode="json")
    assert task_name(_report(receipt={"benchmark_id": "gsm8k"})) == "gsm8k"
    assert task_name(_report(receipt={})) == "run"


def test_the_receipt_shows_a_url_without_its_credentials() -> None:
    from benchwright.report.facts import _shown_source

    assert _shown_source("https://user:tok@data.test:8443/sets/a.jsonl?X-Amz-Signature=abc") == \
        "https://data.test:8443/sets/a.jsonl?…"
    assert _shown_source("/srv/datasets/a.jsonl") == "/srv/datasets/a.jsonl"
    assert _shown_source(None) is None
