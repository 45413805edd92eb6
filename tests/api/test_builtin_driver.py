"""The builtin driver end to end on the real stack: each bundled benchmark shape scored by the template Analyze
picks, against dev models that answer right or wrong in realistic prose (fenced code, bold letters, tool_calls);
natural-language launches resolved by Find against the bundled catalog and scoped by Analyze."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (SAMPLE / name).read_text().splitlines() if line.strip()]


def _model(url: str) -> dict[str, str]:
    return {"identifier": "openai/dev", "api_base": url}


async def _run(stack: Stack, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Launch, wait for the end; (the run, its events, its task rows' per-trial results)."""
    async with stack.http() as http:
        run = await launch(http, body)
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    results = sorted((e["data"] for e in events if e["type"] == "MaterializeTaskResult"), key=lambda d: d["index"])
    return final, events, results


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


async def _right_and_wrong(stack: Stack, dev_models: DevModels, dataset: str, right: DevModelConfig,
                           wrong: DevModelConfig) -> tuple[Any, Any]:
    right_url, wrong_url = await dev_models.start(right), await dev_models.start(wrong)
    return await asyncio.gather(
        _run(stack, {"dataset": str(SAMPLE / dataset), "model": _model(right_url)}),
        _run(stack, {"dataset": str(SAMPLE / dataset), "model": _model(wrong_url)}))


def _assert_scores(run: tuple[Any, Any, Any], template: str, score: float) -> None:
    final, events, results = run
    assert final["status"] == "ok", final.get("error")
    assert _of(events, "AnalyzeArtifact")[0]["template"] == template
    assert any(f"the {template} template, because" in t["text"] for t in _of(events, "AgentTextEvent"))
    assert _of(events, "AtomizeArtifact")[0]["source"] == f"template:{template}"
    assert results and [r["score"] for r in results] == [score] * len(results), [(r["output"], r["meta"])
                                                                                 for r in results]


async def test_gsm8k_numeric_answers_from_prose(stack: Stack, dev_models: DevModels) -> None:
    rows = _rows("gsm8k-mini.jsonl")
    final_numbers = [r["answer"].rsplit("####", 1)[1].strip() for r in rows]
    styles = ["Let me think. {n} is the total.\n#### {n}", "The answer is {n}.", "So we get \\boxed{{{n}}}",
              "I think it's 3, no wait, {n}", "Total: {n}.00 dollars", "#### {n}"]
    right = {r["question"]: styles[i % len(styles)].format(n=n)
             for i, (r, n) in enumerate(zip(rows, final_numbers, strict=True))}
    wrong = {r["question"]: f"After working it out, the answer is {int(n.replace(',', '')) + 1}."
             for r, n in zip(rows, final_numbers, strict=True)}
    good, bad = await _right_and_wrong(stack, dev_models, "gsm8k-mini.jsonl", DevModelConfig(answers=right),
                                       DevModelConfig(answers=wrong))
    _assert_scores(good, "numeric", 1.0)
    _assert_scores(bad, "numeric", 0.0)
    assert [r["meta"]["answer"] for r in good[2]] == [n.replace(",", "") for n in final_numbers]


async def test_mmlu_multiple_choice_letters(stack: Stack, dev_models: DevModels) -> None:
    rows = _rows("mmlu-mini.jsonl")
    styles = ["The answer is **{l}**.", "({l})", "{l}) {t}", "Answer: {lower}", "{l}", "I'm fairly sure it is {l}."]
    right, wrong = {}, {}
    for i, r in enumerate(rows):
        letter = "ABCD"[r["answer"]]
        other = "ABCD"[(r["answer"] + 1) % 4]
        right[r["question"]] = styles[i % len(styles)].format(l=letter, lower=letter.lower(),
                                                              t=r["choices"][r["answer"]])
        wrong[r["question"]] = styles[i % len(styles)].format(l=other, lower=other.lower(),
                                                              t=r["choices"][(r["answer"] + 1) % 4])
    good, bad = await _right_and_wrong(stack, dev_models, "mmlu-mini.jsonl", DevModelConfig(answers=right),
                                       DevModelConfig(answers=wrong))
    _assert_scores(good, "multiple_choice", 1.0)
    _assert_scores(bad, "multiple_choice", 0.0)
    assert [r["meta"]["answer"] for r in good[2]] == ["ABCD"[r["answer"]] for r in rows]


def _expected_calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    truth = row["ground_truth"]
    if isinstance(truth, dict):
        return [truth]
    return [{"name": name, "arguments": {k: v[0] for k, v in args.items() if v[0] != ""}}
            for item in truth for name, args in item.items()]


async def test_tool_calls_compared_structurally(stack: Stack, dev_models: DevModels) -> None:
    rows = _rows("toolcall-mini.jsonl")
    right: dict[str, list[dict[str, Any]]] = {}
    wrong: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        calls = [{"name": c["name"].replace(".", "_"), "arguments": dict(reversed(list(c["arguments"].items())))}
                 for c in _expected_calls(r)]
        # Types as a model may send them: integers as strings are still right per the schema.
        right[r["question"]] = [{**c, "arguments": {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                                                    for k, v in c["arguments"].items()}} for c in calls]
        wrong[r["question"]] = [{**c, "arguments": {**c["arguments"], next(iter(c["arguments"])): "Atlantis"}}
                                for c in calls]
    good, bad = await _right_and_wrong(stack, dev_models, "toolcall-mini.jsonl",
                                       DevModelConfig(answers={}, tool_calls=right),
                                       DevModelConfig(answers={}, tool_calls=wrong))
    _assert_scores(good, "tool_call", 1.0)
    _assert_scores(bad, "tool_call", 0.0)


async def test_humaneval_canonical_passes_broken_fails_infinite_loop_times_out(stack: Stack,
                                                                                dev_models: DevModels) -> None:
    rows = _rows("humaneval-mini.jsonl")
    canonical = (f"Here is the implementation:\n\n```python\n{rows[0]['prompt']}{rows[0]['canonical_solution']}```\n"
                 "It compares every pair.")
    broken = "```python\ndef truncate_number(number: float) -> float:\n    return int(number)\n```"
    looping = "Sure.\n```python\ndef below_zero(operations):\n    while True:\n        pass\n```"
    url = await dev_models.start(DevModelConfig(answers={
        rows[0]["prompt"].strip(): canonical, rows[1]["prompt"].strip(): broken, rows[2]["prompt"].strip(): looping}))
    final, events, results = await _run(stack, {"dataset": str(SAMPLE / "humaneval-mini.jsonl"),
                                                "model": _model(url)})
    assert final["status"] == "ok", final.get("error")
    assert _of(events, "AnalyzeArtifact")[0]["template"] == "code"
    assert [(r["outcome"], r["meta"].get("timed_out")) for r in results] == [
        ("pass", False), ("fail", False), ("fail", True)], [(r["outcome"], r["meta"], r["error"]) for r in results]

    body_only = {r["prompt"].strip(): r["canonical_solution"] for r in rows}
    _, _, results = await _run(stack, {"dataset": str(SAMPLE / "humaneval-mini.jsonl"),
                                           "model": _model(await dev_models.start(DevModelConfig(answers=body_only)))})
    assert [r["outcome"] for r in results] == ["pass"] * 3, [(r["output"], r["meta"]) for r in results]


async def test_prompt_launch_finds_the_dataset_and_scopes_a_split(stack: Stack, dev_models: DevModels) -> None:
    rows = _rows("gsm8k-mini.jsonl")
    url = await dev_models.start(DevModelConfig(answers={r["question"]: r["answer"] for r in rows}))
    final, events, _ = await _run(stack, {"prompt": "GSM8K please: the test split, the first 2",
                                          "model": _model(url)})
    assert final["status"] == "ok", final.get("error")
    assert [e["data"]["phase"] for e in events if e["type"] == "PhaseSkipped"] == []
    [found] = _of(events, "DatasetResolved")
    assert found["name"] == "gsm8k-mini" and found["source"] == "catalog:gsm8k-mini" and "gsm8k" in found["why"]
    assert _of(events, "FetchArtifact")[0]["source"] == "catalog:gsm8k-mini"
    [subset] = _of(events, "SyntheticSubsetCreated")
    test_rows = [i for i, r in enumerate(rows) if r["split"] == "test"][:2]
    assert subset["source_rows"] == test_rows and subset["count"] == 2
    assert _of(events, "AnalyzeArtifact")[0]["splits"] == {"train": 2, "test": 4}
    assert final["tasks"]["summary"]["total"] == 2 and final["tasks"]["summary"]["passed"] == 2


async def test_prompt_one_per_column_and_only_a_value(stack: Stack, dev_models: DevModels) -> None:
    rows = _rows("mmlu-mini.jsonl")
    url = await dev_models.start(DevModelConfig(answers={r["question"]: "ABCD"[r["answer"]] for r in rows}))
    (each, each_events, _), (only, only_events, _) = await asyncio.gather(
        _run(stack, {"prompt": "one mmlu question from each subject", "model": _model(url)}),
        _run(stack, {"prompt": "MMLU, only the anatomy questions", "model": _model(url)}))
    assert each["status"] == "ok" and only["status"] == "ok"
    assert _of(each_events, "SyntheticSubsetCreated")[0]["source_rows"] == [0, 2, 4]
    assert _of(only_events, "SyntheticSubsetCreated")[0]["source_rows"] == [2, 3]
    assert each["tasks"]["summary"]["passed"] == 3 and only["tasks"]["summary"]["passed"] == 2


async def test_unresolvable_prompt_fails_find_with_the_three_nearest(stack: Stack) -> None:
    final, events, _ = await _run(stack, {"prompt": "ancient sumerian poetry translation", "model": "openai/dev"})
    assert final["status"] == "error"
    [failed] = _of(events, "PhaseFailed")
    assert failed["phase"] == "find" and failed["error_type"] == "DriverFailed"
    assert "nearest are" in failed["detail"] and failed["detail"].count("-mini'") + failed["detail"].count(
        "'arithmetic'") == 3


async def test_no_template_fits_fails_analyze_naming_the_columns(stack: Stack, tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"sentence": "a b", "polarity": "positive"}\n{"sentence": "c", "polarity": "negative"}\n')
    final, events, _ = await _run(stack, {"dataset": str(odd), "model": "openai/dev"})
    [failed] = _of(events, "PhaseFailed")
    assert final["status"] == "error" and failed["phase"] == "analyze"
    assert "['sentence', 'polarity']" in failed["detail"]


async def test_scope_naming_a_missing_column_fails_clearly(stack: Stack) -> None:
    _, events, _ = await _run(stack, {"dataset": str(SAMPLE / "trivia-mini.jsonl"),
                                          "prompt": "one question per category", "model": "openai/dev"})
    [failed] = _of(events, "PhaseFailed")
    assert failed["phase"] == "analyze" and "no column is called that" in failed["detail"]
    assert "'question', 'answer'" in failed["detail"]


async def test_cli_run_prompt_watch(stack: Stack, dev_models: DevModels) -> None:
    from tests.cli.test_cli_launch import api_env, bw

    rows = _rows("trivia-mini.jsonl")
    url = await dev_models.start(DevModelConfig(answers={r["question"]: f"{r['answer']}." for r in rows}))
    done = await bw("run", "--prompt", "general knowledge trivia, the first 3", "--model", "openai/dev",
                    "--api-base", url, "--watch", "--json", env=api_env(stack))
    assert done.rc == 0, done.err
    final = json.loads(done.out[done.out.index("{"):])
    assert final["status"] == "ok" and final["tasks"]["summary"]["passed"] == 3 == final["tasks"]["summary"]["total"]
