"""The run page's results (issue 21) in a real Chromium: the no_answer counter, the per-group bars with their 95 %
intervals and the column chooser, and the task modal's input, reference, extracted answer and rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.helpers import launch, wait_terminal
from tests.api.test_results import IMPL, write_dataset
from tests.conftest import Stack
from tests.web.test_dashboard import _cell_centre

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_run_page_shows_no_answer_breakdown_bars_and_the_task_audit(page: Any, stack: Stack, tmp_path: Path,
                                                                          screenshots: Path) -> None:
    rows = write_dataset(tmp_path / "arith_subjects.jsonl")
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(tmp_path / "arith_subjects.jsonl"), "task_impl": IMPL,
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        by_subject = (await http.get(f"/v1/runs/{run['id']}/breakdown", params={"by": "subject"})).json()
        by_difficulty = (await http.get(f"/v1/runs/{run['id']}/breakdown", params={"by": "difficulty"})).json()
    assert final["tasks"]["summary"]["no_answer"] == 12

    await page.goto(f"/ui/#/runs/{run['id']}")
    await page.wait_for_selector("#count-no_answer[data-value='12']")
    assert "12" in await page.inner_text("#count-no_answer")

    # One bar per group, each with the API's pass rate and interval, the whisker placed at the interval.
    await page.wait_for_selector("#breakdown-card:not([hidden]) #breakdown-bars[data-by='subject'] .bd-row")
    # Queried and measured in one evaluation: eval_on_selector_all queries, then evaluates in a second round trip, and
    # a refresh redrawing the bars in between leaves it measuring detached rows (0/0, seen in CI).
    bars = await page.evaluate("""() => [...document.querySelectorAll('#breakdown-bars .bd-row')].map((r) => {
        const track = r.querySelector('.bd-track').getBoundingClientRect();
        const ci = r.querySelector('.bd-ci')?.getBoundingClientRect();
        const fill = r.querySelector('.bd-fill')?.getBoundingClientRect();
        return {group: r.dataset.group, rate: r.dataset.passRate, noAnswer: +r.dataset.noAnswer,
                low: ci ? (ci.left - track.left) / track.width : null,
                high: ci ? (ci.right - track.left) / track.width : null,
                fill: fill ? fill.width / track.width : null, text: r.innerText};
    })""")
    assert [b["group"] for b in bars] == [g["group"] for g in by_subject["groups"]]
    for bar, group in zip(bars, by_subject["groups"], strict=True):
        assert bar["noAnswer"] == group["no_answer"]
        if group["pass_rate"] is None:
            assert bar["fill"] is None and bar["low"] is None
            continue
        assert bar["fill"] == pytest.approx(group["pass_rate"], abs=0.01)
        assert bar["low"] == pytest.approx(group["pass_rate_ci"][0], abs=0.01)
        assert bar["high"] == pytest.approx(group["pass_rate_ci"][1], abs=0.01)
        assert f"n={group['total']}" in bar["text"]
    await page.screenshot(path=str(screenshots / "breakdown.png"), full_page=True)

    # The column chooser offers the data's grouping columns and switches the bars.
    options = await page.eval_on_selector_all("#breakdown-by option", "os => os.map((o) => o.value)")
    assert options == by_subject["candidates"] == ["subject", "difficulty"]
    await page.select_option("#breakdown-by", "difficulty")
    await page.wait_for_selector("#breakdown-bars[data-by='difficulty']")
    groups = await page.eval_on_selector_all("#breakdown-bars .bd-row", "rs => rs.map((r) => r.dataset.group)")
    assert groups == [g["group"] for g in by_difficulty["groups"]] == ["1", "2"]

    # The task modal: task 4 found no answer; task 2 passed with its extracted answer and rule.
    for index, extracted, rule in ((4, "no answer found", "–"), (2, rows[2]["answer"], "final_line")):
        x, y = await _cell_centre(page, index)
        await page.mouse.click(x, y)
        await page.wait_for_selector(f"#task-modal[data-index='{index}'] #task-audit")
        field = {name: await page.inner_text(f"#task-audit dd[data-field='{name}']")
                 for name in ("input", "reference", "extracted", "rule", "output")}
        assert field["input"] == f"system: Answer with a number only.\nuser: {rows[index]['question']}"
        assert field["reference"] == rows[index]["answer"]
        assert field["extracted"] == extracted
        assert field["rule"] == rule
        assert field["output"] == rows[index]["answer"]  # the dev model answers every sample question right
        if index == 4:
            await page.screenshot(path=str(screenshots / "task-audit.png"))
        await page.click("#modal-close")
        await page.wait_for_selector("#task-modal", state="detached")
