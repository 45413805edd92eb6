"""The CLI's results (issue 21): the `run --watch` summary counts no_answer, `show --by subject` prints the
per-group table, `tasks` shows input, reference, extracted answer and rule. The real `benchwright` command in a
subprocess against the session stack's API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.api.test_results import IMPL, expected_outcome, subject_of, write_dataset
from tests.cli.test_cli_launch import api_env, bw
from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def watched(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run launched and watched with the CLI (the summary line it prints, and the final run as JSON)."""
    tmp = tmp_path_factory.mktemp("cli-results")
    rows = write_dataset(tmp / "arith_subjects.jsonl")
    impl = tmp / "task_impl.py"
    impl.write_text(IMPL)
    args = ("run", "--dataset", str(tmp / "arith_subjects.jsonl"), "--model", "openai/dev", "--api-base",
            stack.dev_url, "--task-impl", str(impl), "--group-by", "difficulty", "--watch")
    done = await bw(*args, env=api_env(stack))
    assert done.rc == 0, done.err
    run_id = done.out.split("run ", 1)[1].split(":", 1)[0]
    return {"run_id": run_id, "summary": done.out, "rows": rows}


async def test_watch_summary_counts_no_answer_apart(watched: dict[str, Any]) -> None:
    summary = watched["summary"]
    assert "passed 36, failed 18, errored 6 of 60" in summary, summary
    assert "no answer found in 12 of the 18 failed tasks (counted as failed)" in summary, summary


async def test_show_by_subject_prints_the_group_table(stack: Stack, watched: dict[str, Any]) -> None:
    done = await bw("show", watched["run_id"], "--by", "subject", env=api_env(stack))
    assert done.rc == 0, done.err
    assert "failed 18 (no answer 12)" in done.out, done.out
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in done.out.splitlines() if line.startswith("│") and "│" in line[1:]}
    # the algebra group, counted here from the dataset the test wrote
    algebra = [i for i in range(60) if subject_of(i) == "algebra"]
    outcomes = [expected_outcome(i) for i in algebra]
    passed = sum(o == "pass" for o, _ in outcomes)
    failed = sum(o == "fail" for o, _ in outcomes)
    row = lines["algebra"]
    assert row[0] == str(len(algebra))
    assert row[1] == f"{passed / (passed + failed):.1%}"
    assert row[2].startswith("[") and row[2].endswith("%]")
    assert row[3:] == [str(passed), str(failed), str(sum(n for _, n in outcomes)),
                       str(sum(o == "err" for o, _ in outcomes))]
    assert "(none)" in lines and "geometry" in lines and "counting" in lines

    as_json = await bw("show", watched["run_id"], "--by", "difficulty", "--json", env=api_env(stack))
    groups = json.loads(as_json.out)["breakdown"]["groups"]
    assert [(g["group"], g["total"]) for g in groups] == [("1", 30), ("2", 30)]
    # run --group-by made difficulty the run's default grouping column
    async with stack.http() as http:
        default = (await http.get(f"/v1/runs/{watched['run_id']}/breakdown")).json()
    assert default["by"] == "difficulty" and default["candidates"] == ["difficulty", "subject"]


async def test_show_by_an_unknown_column_names_the_columns(stack: Stack, watched: dict[str, Any]) -> None:
    done = await bw("show", watched["run_id"], "--by", "subjekt", env=api_env(stack))
    assert done.rc == 1
    assert "no column 'subjekt'" in done.err and "'subject'" in done.err, done.err


async def test_tasks_shows_input_reference_extracted_answer_and_rule(stack: Stack, watched: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    rows = watched["rows"]
    done = await bw("tasks", watched["run_id"], env=api_env(stack))
    assert done.rc == 0, done.err
    header = done.out.splitlines()[0].split()
    assert header == ["index", "outcome", "score", "input", "reference", "extracted", "rule", "output"]
    by_index = {int(line.split()[0]): line for line in done.out.splitlines()[1:] if line.split()[:1] != []}
    # task 2 passed: its question (the user message the model saw), the reference, the answer, the rule
    assert rows[2]["question"][:30] in by_index[2] and f" {rows[2]['answer']} " in by_index[2]
    assert "final_line" in by_index[2]
    # task 4: no answer found
    assert "(no answer)" in by_index[4] and "final_line" not in by_index[4]
    as_json = json.loads((await bw("tasks", watched["run_id"], "--json", env=api_env(stack))).out)
    assert as_json[7]["answer"] == "-1" and as_json[7]["reference"] == rows[7]["answer"]
