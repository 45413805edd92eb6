"""Results you can audit (issue 21) through the API: no_answer in the run summary, the per-group breakdown checked
against an independent computation, its 400 and cross-account 404, and the task listing's input, reference,
extracted answer and rule."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")

SUBJECTS = ("algebra", "geometry", "counting")
LONG_SUBJECT = "s" * 300

# Outcomes by the last digit of the task index (a scorer that tells no answer from a wrong one, as the builtin
# templates do): 1, 4 no answer found; 7 a wrong answer; 9 the scorer raises (err); the rest pass.
IMPL = '''
SYSTEM = "Answer with a number only."

class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut([{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.extract(row)}])

    def score(self, row, response):
        digit = int(row["id"][-1])
        if digit in (1, 4):
            return {"score": 0.0, "extracted": False, "answer": None, "rule": None}
        if digit == 7:
            return {"score": 0.0, "extracted": True, "answer": "-1", "rule": "final_line"}
        if digit == 9:
            raise ValueError("scorer bug on purpose")
        ok = response.strip() == row["answer"]
        return {"score": 1.0 if ok else 0.0, "extracted": True, "answer": response.strip(), "rule": "final_line",
                "reference": row["answer"]}
'''


def expected_outcome(index: int) -> tuple[str, bool]:
    digit = index % 10
    if digit in (1, 4):
        return "fail", True
    if digit == 7:
        return "fail", False
    if digit == 9:
        return "err", False
    return "pass", False


def subject_of(index: int) -> str | None:
    if index % 20 == 19:
        return None  # no subject key at all: the "(none)" group
    if index == 10:
        return LONG_SUBJECT
    return SUBJECTS[index % 3]


def write_dataset(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (SAMPLE / "arithmetic.jsonl").read_text().splitlines() if line.strip()]
    out = []
    for i, row in enumerate(rows):
        row = {**row, "difficulty": 1 + i % 2}
        if subject_of(i) is not None:
            row["subject"] = subject_of(i)
        out.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return out


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval, written out here independently of benchwright.comparison.stats."""
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def graded(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dataset = tmp_path_factory.mktemp("results") / "arith_subjects.jsonl"
    rows = write_dataset(dataset)
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(dataset), "task_impl": IMPL, "group_by": "difficulty",
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    return {"run": final, "rows": rows}


async def test_no_answer_is_counted_apart_from_wrong_answers_and_stays_a_fail(graded: dict[str, Any]) -> None:
    s = graded["run"]["tasks"]["summary"]
    outcomes = [expected_outcome(i) for i in range(len(graded["rows"]))]
    passed = sum(o == "pass" for o, _ in outcomes)
    failed = sum(o == "fail" for o, _ in outcomes)
    assert (s["passed"], s["failed"], s["errored"]) == (passed, failed, sum(o == "err" for o, _ in outcomes))
    assert s["no_answer"] == sum(n for _, n in outcomes) == 12
    assert s["pass_rate"] == pytest.approx(passed / (passed + failed))  # no_answer is in the denominator


async def test_breakdown_by_subject_matches_an_independent_count(stack: Stack, graded: dict[str, Any]) -> None:
    run_id = graded["run"]["id"]
    async with stack.http() as http:
        resp = await http.get(f"/v1/runs/{run_id}/breakdown", params={"by": "subject"})
        default = await http.get(f"/v1/runs/{run_id}/breakdown")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert default.json()["by"] == "difficulty"  # the launch's group_by is the default
    assert body["candidates"] == ["difficulty", "subject"]
    assert {"id", "question", "answer", "subject", "difficulty"} <= set(body["columns"])

    want: dict[str, dict[str, int]] = {}
    for i in range(len(graded["rows"])):
        label = subject_of(i)
        label = "(none)" if label is None else label if len(label) <= 100 else label[:99] + "…"
        c = want.setdefault(label, {"passed": 0, "failed": 0, "errored": 0, "no_answer": 0, "total": 0})
        outcome, no_answer = expected_outcome(i)
        c[{"pass": "passed", "fail": "failed", "err": "errored"}[outcome]] += 1
        c["no_answer"] += no_answer
        c["total"] += 1
    got = {g["group"]: g for g in body["groups"]}
    assert set(got) == set(want)
    assert all(len(g) <= 100 for g in got)
    for label, c in want.items():
        g = got[label]
        assert {k: g[k] for k in c} == c, label
        n = c["passed"] + c["failed"]
        assert g["pass_rate"] == (pytest.approx(c["passed"] / n) if n else None)
        assert g["pass_rate_ci"] == (pytest.approx(list(wilson(c["passed"], n))) if n else None), label
    assert sum(g["total"] for g in body["groups"]) == len(graded["rows"])


async def test_breakdown_by_a_number_column(stack: Stack, graded: dict[str, Any]) -> None:
    async with stack.http() as http:
        body = (await http.get(f"/v1/runs/{graded['run']['id']}/breakdown", params={"by": "difficulty"})).json()
    assert [(g["group"], g["total"]) for g in body["groups"]] == [("1", 30), ("2", 30)]


async def test_unknown_column_is_a_400_naming_the_columns(stack: Stack, graded: dict[str, Any]) -> None:
    async with stack.http() as http:
        resp = await http.get(f"/v1/runs/{graded['run']['id']}/breakdown", params={"by": "subjekt"})
        too_long = await http.get(f"/v1/runs/{graded['run']['id']}/breakdown", params={"by": "x" * 200})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unknown_column"
    assert "'subjekt'" in error["message"] and "'subject'" in error["message"] and "'question'" in error["message"]
    assert too_long.status_code == 422


async def test_breakdown_of_another_accounts_run_is_404(stack: Stack, graded: dict[str, Any]) -> None:
    async with stack.http(stack.other_key) as http:
        resp = await http.get(f"/v1/runs/{graded['run']['id']}/breakdown", params={"by": "subject"})
    assert resp.status_code == 404
    assert "subject" not in resp.text


async def test_task_listing_shows_input_reference_extracted_answer_and_rule(stack: Stack,
                                                                          graded: dict[str, Any]) -> None:
    rows = graded["rows"]
    async with stack.http() as http:
        tasks = (await http.get(f"/v1/runs/{graded['run']['id']}/tasks")).json()["tasks"]
        detail = (await http.get(f"/v1/runs/{graded['run']['id']}/tasks/4")).json()
    by_index = {t["index"]: t for t in tasks}
    assert len(by_index) == len(rows)
    for i, task in by_index.items():
        assert task["input"] == f"system: Answer with a number only.\nuser: {rows[i]['question']}"
        # score_meta's reference where the scorer gave one, else the dataset's reference column
        assert task["reference"] == rows[i]["answer"]
        outcome, no_answer = expected_outcome(i)
        assert task["no_answer"] is no_answer
        if no_answer:
            assert (task["extracted"], task["answer"], task["rule"]) == (False, None, None)
        elif outcome == "pass":
            assert (task["extracted"], task["answer"], task["rule"]) == (True, rows[i]["answer"], "final_line")
        elif outcome == "fail":
            assert (task["extracted"], task["answer"], task["rule"]) == (True, "-1", "final_line")
    assert detail["trials"][0]["input"] == by_index[4]["input"]
    assert detail["reference"] == rows[4]["answer"] and detail["extracted"] is False


async def test_data_without_a_grouping_column_answers_by_null(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"),
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        default = (await http.get(f"/v1/runs/{run['id']}/breakdown")).json()
        by_id = (await http.get(f"/v1/runs/{run['id']}/breakdown", params={"by": "id"})).json()
    assert (default["by"], default["groups"], default["candidates"]) == (None, [], [])
    assert "question" in default["columns"]
    # any column may still be named: one group per row here, each passed (the dev model answers all correctly)
    assert len(by_id["groups"]) == 60 and all(g["passed"] == g["total"] == 1 for g in by_id["groups"])
