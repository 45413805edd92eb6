"""A sample of the reply-style corpus end to end through real runs: dev models answer the bundled GSM8K, MMLU and
HumanEval rows the way chat and reasoning models do (a <think> block, a separate reasoning field, LaTeX, a
self-correction, a reply cut off inside its reasoning, a comment-first code body), and the run's pass count, each
task's audit trail (extracted / answer / rule) and the output a user reads (the reasoning kept visible) are as
expected."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchwright.llm.prices import Prices
from benchwright.llm.sut import make_sut
from benchwright.schemas import ModelSpec
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (SAMPLE / name).read_text().splitlines() if line.strip()]


async def _run(stack: Stack, dataset: str, url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Launch on ``dataset`` against the dev model at ``url``; (the finished run, each task's detail by index)."""
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(SAMPLE / dataset), "model": {"identifier": "openai/dev",
                                                                              "api_base": url}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        details = []
        for index in range(final["tasks"]["summary"]["total"]):
            resp = await http.get(f"/v1/runs/{run['id']}/tasks/{index}")
            assert resp.status_code == 200, resp.text
            details.append(resp.json())
    assert final["status"] == "ok", final.get("error")
    return final, details


async def test_numeric_reasoning_replies_score_the_answer_and_show_the_reasoning(
        stack: Stack, dev_models: DevModels) -> None:
    rows = _rows("gsm8k-mini.jsonl")
    q = [r["question"].strip() for r in rows]  # finals: 72, 10, 18, 3, 70,000, 540
    replies = {
        q[0]: "<think>\nMaybe 96? 48 + 48... no, May is half of April, so 48 + 24.\n</think>\n\nShe sold **72** clips.",
        q[1]: "#### 10",  # its reasoning field below says 12
        q[2]: "Final answer: $18.00",
        q[3]: "<think>\nA robe takes 2 bolts of blue fiber and half that much white fiber, so 2 + 1 = 3 bolts, but let",
        q[4]: "The profit is $\\boxed{70{,}000}$.",
        q[5]: "540... wait, no, 180.",  # a self-correction to a wrong answer
    }
    reasoning = {q[1]: "First guess: 12 dollars an hour for a full hour is $12. Only 50 minutes though."}
    url = await dev_models.start(DevModelConfig(answers=replies, reasoning=reasoning))
    final, tasks = await _run(stack, "gsm8k-mini.jsonl", url)

    by_question = {r["question"]: i for i, r in enumerate(rows)}
    outcome = {i: tasks[i]["outcome"] for i in range(len(rows))}
    meta = {i: tasks[i]["trials"][0]["meta"] for i in range(len(rows))}
    assert final["tasks"]["summary"]["passed"] == 4 and final["tasks"]["summary"]["failed"] == 2, final["tasks"]
    assert [outcome[i] for i in range(6)] == ["pass", "pass", "pass", "fail", "pass", "fail"], meta
    assert meta[0]["rule"] == "bold" and meta[0]["answer"] == "72"
    assert meta[1] == {**meta[1], "extracted": True, "answer": "10", "rule": "hashes"}
    assert meta[3] == {**meta[3], "extracted": False, "answer": None, "rule": None}  # cut off while reasoning
    assert meta[4]["rule"] == "boxed" and meta[4]["answer"] == "70000"
    assert meta[5] == {**meta[5], "extracted": True, "answer": "180", "reference": "540"}  # wrong, not missing
    shown = tasks[by_question[rows[1]["question"]]]["trials"][0]["output"]
    assert reasoning[q[1]] in shown and shown.rstrip().endswith("#### 10"), shown  # the user sees the reasoning
    assert "<think>" in tasks[0]["trials"][0]["output"]  # an inline block stays in the output as sent


async def test_choice_and_code_styles_through_a_run(stack: Stack, dev_models: DevModels) -> None:
    mmlu = _rows("mmlu-mini.jsonl")
    letters = ["ABCD"[r["answer"]] for r in mmlu]
    wrong = ["ABCD"[(r["answer"] + 1) % 4] for r in mmlu]
    styles = [
        "Final Answer: The final answer is $\\boxed{{{l}}}$. I hope it is correct.",
        '{{"answer": "{l}"}}',
        "<think>\nThe answer is {w}? No.\n</think>\n\nThe answer is **{l}**.",
        "I'm fairly confident it's {l}: {t}",
        "{w}... wait, actually {l}.",
        "<think>\nThe answer is {l}, but let me re-check the other options first, starting with",  # no answer
    ]
    choice_replies = {r["question"]: styles[i].format(l=letters[i], w=wrong[i], t=r["choices"][r["answer"]])
                      for i, r in enumerate(mmlu)}
    humaneval = _rows("humaneval-mini.jsonl")
    code_replies = {
        humaneval[0]["prompt"]: "    # Implementation follows the docstring.\n" + humaneval[0]["canonical_solution"],
        humaneval[1]["prompt"]: "    \n" + humaneval[1]["canonical_solution"],
        humaneval[2]["prompt"]: "<think>\nDraft: return False\n</think>\n```python\nfrom typing import List\n\n\n"
                                "def below_zero(operations: List[int]) -> bool:\n"
                                + humaneval[2]["canonical_solution"] + "```",
    }
    choice_url = await dev_models.start(DevModelConfig(answers=choice_replies))
    code_url = await dev_models.start(DevModelConfig(answers=code_replies))
    choice_final, choice_tasks = await _run(stack, "mmlu-mini.jsonl", choice_url)
    code_final, code_tasks = await _run(stack, "humaneval-mini.jsonl", code_url)

    assert choice_final["tasks"]["summary"]["passed"] == 5, [t["trials"][0]["meta"] for t in choice_tasks]
    rules = [t["trials"][0]["meta"]["rule"] for t in choice_tasks]
    assert rules == ["boxed", "json", "letter_pattern", "letter_pattern", "bare_letter", None], rules
    assert choice_tasks[5]["outcome"] == "fail" and choice_tasks[5]["trials"][0]["meta"]["extracted"] is False
    assert code_final["tasks"]["summary"]["passed"] == 3, [t["trials"][0]["meta"] for t in code_tasks]
    assert [t["trials"][0]["meta"]["rule"] for t in code_tasks] == ["text", "text", "fence"]


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
async def test_the_sut_reads_the_reasoning_field_as_each_provider_names_it(dev_models: DevModels, key: str) -> None:
    question = "What is 6 times 7?"
    url = await dev_models.start(DevModelConfig(answers={question: "42"}, reasoning={question: "6 x 7 = 42, surely."},
                                                reasoning_key=key))
    sut = make_sut(ModelSpec(identifier="openai/dev", api_base=url), prices=Prices(), api_key=None, concurrency=1,
                   timeout_s=10.0, retries=0)
    try:
        reply = await sut.complete([{"role": "user", "content": question}], {})
    finally:
        await sut.aclose()
    assert reply.text == "42" and reply.reasoning == "6 x 7 = 42, surely."
