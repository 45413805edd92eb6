"""An Operator session's dashboard page in a real Chromium (issue 26): opened while the session runs, it follows
the session live to its answer (status, budget, its runs with score and interval, the decision log, the answer's
evidence table, all equal to the API's), lists it on the sessions page, links to its run's page, where the
"Download report" link saves the run's report.html byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _dataset
from tests.conftest import DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
TASKS, LATENCY_MS = 40, 150
"""One task at a time at 150 ms a call: the session's replay runs for at least 6 s, while the page is open."""


async def test_session_page_follows_the_session_to_its_answer_and_the_run_report_downloads(
        page: Any, stack: Stack, dev_models: DevModels, tmp_path: Path, screenshots: Path) -> None:
    answers = _dataset(tmp_path / "slow.jsonl", TASKS)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=LATENCY_MS))
    async with stack.http() as http:
        ref = await launch(http, {"dataset": str(tmp_path / "slow.jsonl"), "concurrency": 1,
                                  "model": {"identifier": "openai/dev", "api_base": url}})
        await wait_terminal(http, ref["id"])
        resp = await http.post("/v1/operator/sessions", json={"goal": {"question": "regressed",
                                                                        "reference_run": ref["id"]},
                                                               "limits": {"session": {"runs": 3}}})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]

        await page.goto(f"/ui/#/sessions/{sid}")
        await page.evaluate("() => { window.notReloaded = true; }")
        # Live: seen running with its replay under way, then answered without a reload.
        await page.wait_for_selector('#session-status [data-status="running"]')
        await page.wait_for_selector('#session-runs tr.session-run[data-status="running"]', timeout=60_000)
        await page.wait_for_selector('#session-status [data-status="answered"]', timeout=120_000)
        await page.wait_for_selector("#answer-card:not([hidden])")
        await page.wait_for_selector('#stream-state[data-state="done"]')
        assert await page.evaluate("() => window.notReloaded === true")
        done = (await http.get(f"/v1/operator/sessions/{sid}")).json()
        events = (await http.get(f"/v1/operator/sessions/{sid}/events")).json()["events"]
        [replay] = done["runs"]
        run = (await http.get(f"/v1/runs/{replay}")).json()
        report = await http.get(f"/v1/runs/{replay}/files/report.html")

    answer = done["answer"]
    assert await page.inner_text("#answer-sentence") == answer["sentence"]
    assert await page.get_attribute("#answer-sentence", "data-outcome") == answer["outcome"]
    assert await page.eval_on_selector_all("#evidence-table tr.evidence-row", "rs => rs.map(r => r.dataset.runId)") \
        == [e["run_id"] for e in answer["evidence"]] == [ref["id"], replay]
    assert await page.inner_text('#session-budget dd[data-field="runs"]') == "1 of 3"
    # Its run: a link to the run page, with the run's score and interval as the API gives them.
    row = page.locator(f'#session-runs tr.session-run[data-run-id="{replay}"]')
    await page.wait_for_selector(f'#session-runs tr.session-run[data-run-id="{replay}"][data-status="ok"]')
    s = run["tasks"]["summary"]
    assert float(await row.get_attribute("data-pass-rate")) == s["pass_rate"]
    assert f"[{s['pass_rate_ci'][0] * 100:.1f}%, {s['pass_rate_ci'][1] * 100:.1f}%]" in await row.inner_text()
    # The decision log: every event of the session's log, in order.
    assert await page.eval_on_selector_all("#decision-log li", "ls => ls.map(l => [+l.dataset.seq, l.dataset.type])") \
        == [[e["seq"], e["type"]] for e in events]
    await page.screenshot(path=str(screenshots / "session-page.png"), full_page=True)

    # The sessions list has it, linking to the page.
    await page.goto("/ui/#/sessions")
    await page.wait_for_selector(f'#sessions-body tr[data-session-id="{sid}"][data-status="answered"]')

    # The run page, from the session's run link, offers the report once it exists; the download is its bytes.
    await page.goto(f"/ui/#/sessions/{sid}")
    await page.click(f'#session-runs a.run-link[data-run-id="{replay}"]')
    await page.wait_for_selector("#download-report")
    assert await page.get_attribute("#download-results", "download") == "results.json"
    async with page.expect_download() as waiting:
        await page.click("#download-report")
    downloaded = await waiting.value
    assert downloaded.suggested_filename == "report.html"
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert Path(await downloaded.path()).read_bytes() == report.content
