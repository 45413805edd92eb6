"""The dashboard in a real Chromium against the real stack: what a person sees of real runs against the dev model.

Each test launches its runs through REST, then reads the page: the runs list's rows and filters, the heatmap's cell
count and the colour of every cell's pixels against the outcomes the API reports, the counters moving while a
slow run runs, the pause and resume buttons acting on the run, the drill-down modal's trial rows, the Temporal UI
link, and a 10,000-task run's page staying responsive. Screenshots go to the session's tmp dir (printed);
``BENCHWRIGHT_UPDATE_SCREENSHOT=1`` also writes ``docs/run-page.png`` (shown in docs/ui.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.main import create_app
from benchwright.events import AFTER_TERMINAL
from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _dataset
from tests.conftest import SAMPLE, DevModels, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "run-page.png"
COLOURS = {"pass": (0x2E, 0x9E, 0x44), "fail": (0xE0, 0xB4, 0x00), "err": (0xD6, 0x45, 0x41),
           "running": (0x14, 0xA3, 0xA8)}
"""heatmap.js's cell colours: pass green, fail yellow, err red, running teal."""

# Outcomes of every kind: item i % 7 == 3 errs (solve raises), i % 5 == 1 fails (scored 0), the rest pass.
MIXED_IMPL = r'''
import re

def _item(row):
    return int(re.search(r"item (\d+)", row["question"]).group(1))

class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        if _item(row) % 7 == 3:
            raise RuntimeError(f"the scorer refuses item {_item(row)}")
        return call_sut(self.extract(row))

    def score(self, row, response):
        ok = response.strip() == row["answer"] and _item(row) % 5 != 1
        return {"score": 1.0 if ok else 0.0, "item": _item(row)}
'''

PIXELS_JS = """(indices) => {
  const c = document.getElementById("heatmap");
  const ctx = c.getContext("2d");
  const dpr = c.width / parseFloat(c.style.width);
  const pitch = +c.dataset.pitch, cell = +c.dataset.cell, cols = +c.dataset.cols;
  return indices.map((i) => {
    const x = Math.floor(((i % cols) * pitch + cell / 2) * dpr);
    const y = Math.floor((Math.floor(i / cols) * pitch + cell / 2) * dpr);
    const d = ctx.getImageData(x, y, 1, 1).data;
    return [d[0], d[1], d[2]];
  });
}"""


async def _all_tasks(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = -1
    while True:
        resp = await http.get(f"/v1/runs/{run_id}/tasks", params={"after": after, "limit": 5000})
        assert resp.status_code == 200, resp.text
        page = resp.json()
        out += page["tasks"]
        if not page["tasks"] or page["next_after"] is None:
            return out
        after = page["next_after"]


async def _until(http: httpx.AsyncClient, run_id: str, check: Any, timeout_s: float = 60) -> dict[str, Any]:
    """Poll the run through the API until ``check(run)`` holds (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run: dict[str, Any] = (await http.get(f"/v1/runs/{run_id}")).json()
        if check(run):
            return run
        assert time.monotonic() < deadline, f"condition not reached: {run}"
        await asyncio.sleep(0.05)


async def _cell_centre(page: Any, index: int) -> tuple[float, float]:
    box = await page.locator("#heatmap").bounding_box()
    geo = await page.eval_on_selector("#heatmap", "c => [+c.dataset.pitch, +c.dataset.cell, +c.dataset.cols]")
    pitch, cell, cols = geo
    return box["x"] + (index % cols) * pitch + cell / 2, box["y"] + (index // cols) * pitch + cell / 2


async def _counter(page: Any, name: str) -> int:
    return int(await page.get_attribute(f"#count-{name}", "data-value"))


async def _assert_heatmap_matches(page: Any, tasks: list[dict[str, Any]], total: int) -> None:
    await page.wait_for_function(
        "([n, settled]) => { const c = document.getElementById('heatmap');"
        " return c && +c.dataset.cells === n"
        " && (+c.dataset.passed + +c.dataset.failed + +c.dataset.errored) === settled; }",
        arg=[total, len(tasks)], timeout=30_000)
    pixels = await page.evaluate(PIXELS_JS, [t["index"] for t in tasks])
    wrong = [(t["index"], t["outcome"], px) for t, px in zip(tasks, pixels, strict=True)
             if tuple(px) != COLOURS[t["outcome"]]]
    assert not wrong, f"{len(wrong)} cells coloured unlike their outcome, e.g. {wrong[:5]}"


async def test_runs_list_shows_runs_and_filters_by_status_and_model(page: Any, stack: Stack, browser: Any,
                                                                    screenshots: Path) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
    row = page.locator(f'tr.run-row[data-run-id="{run["id"]}"]')
    await row.wait_for(timeout=15_000)  # the list refreshes itself every 3 s
    await page.wait_for_selector(f'tr.run-row[data-run-id="{run["id"]}"][data-status="ok"]', timeout=15_000)
    cells = await row.locator("td").all_inner_texts()
    assert cells[0] == "ok" and cells[2] == "openai/dev" and cells[3] == "builtin" and cells[4] == "arithmetic.jsonl"
    assert cells[5] == "100.0%" and cells[6].startswith("$"), cells
    await page.screenshot(path=str(screenshots / "runs-list.png"), full_page=True)

    await page.select_option("#filter-status", "error")
    await row.wait_for(state="detached")
    assert "status=error" in page.url
    await page.select_option("#filter-status", "ok")
    await row.wait_for()
    await page.select_option("#filter-model", "openai/dev")
    await row.wait_for()
    assert all(m == "openai/dev" for m in await page.locator("tr.run-row td:nth-child(3)").all_inner_texts())

    await row.click()
    await page.wait_for_selector("#heatmap[data-cells='60']")
    assert page.url.endswith(f"#/runs/{run['id']}")

    # A wrong key is refused on the sign-in page and never reaches the list.
    context = await browser.new_context(base_url=stack.api_url)
    other = await context.new_page()
    await other.goto("/ui/#/runs")
    await other.wait_for_selector("#signin-form")
    await other.fill("#api-key", "bw_not-a-key")
    await other.click("#signin-form button[type=submit]")
    await other.wait_for_function("() => document.querySelector('.signin .error').textContent.includes('not accepted')")
    assert await other.evaluate("sessionStorage.length") == 0
    await context.close()


@pytest.fixture
async def slow_mixed(dev_models: DevModels, tmp_path: Path) -> tuple[str, str]:
    """300 tasks against a dev model with 60 ms latency: at concurrency 3 Materialize lasts ~6 s."""
    answers = _dataset(tmp_path / "slow.jsonl", 300)
    return str(tmp_path / "slow.jsonl"), await dev_models.start(DevModelConfig(answers=answers, latency_ms=60))


async def test_run_page_moves_live_pauses_resumes_and_colours_every_task(
        page: Any, stack: Stack, slow_mixed: tuple[str, str], screenshots: Path) -> None:
    dataset, url = slow_mixed
    async with stack.http() as http:
        run = await launch(http, {"dataset": dataset, "task_impl": MIXED_IMPL, "concurrency": 3,
                                  "model": {"identifier": "openai/dev", "api_base": url,
                                            "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}})
        await page.goto(f"/ui/#/runs/{run['id']}")
        await page.wait_for_selector("#heatmap[data-cells='300']", timeout=30_000)

        # Counters move while the run runs; the unsettled cells are teal while Materialize is live.
        await page.wait_for_function("() => +document.getElementById('count-passed').dataset.value > 0",
                                     timeout=30_000)
        first = await _counter(page, "passed") + await _counter(page, "failed") + await _counter(page, "errored")
        await page.wait_for_function(
            "(n) => ['passed', 'failed', 'errored'].reduce((s, k) => s + +document.getElementById('count-' + k)"
            ".dataset.value, 0) > n", arg=first, timeout=30_000)
        assert await _counter(page, "running") > 0
        pending = await page.evaluate(
            "() => { const c = document.getElementById('heatmap'); return +c.dataset.cells - 1; }")
        assert (await page.evaluate(PIXELS_JS, [pending]))[0] == list(COLOURS["running"])
        assert await page.get_attribute("#stream-state", "data-state") == "live"
        await page.wait_for_selector('tr.phase[data-phase="materialize"][data-state="running"]')
        # The cost panel follows the run's ledger while it runs (the run view is re-read as events arrive).
        await page.wait_for_function(
            "() => document.querySelector('#cost-panel tr[data-cost=\"model\"] td.num').textContent !== '$0.0000'")
        await page.screenshot(path=str(screenshots / "run-page-live.png"), full_page=True)
        if os.environ.get("BENCHWRIGHT_UPDATE_SCREENSHOT"):
            shutil.copy(screenshots / "run-page-live.png", DOCS_SCREENSHOT)

        # The pause button pauses the run (the API says so) and the page follows; resume resumes.
        await page.click("#btn-pause")
        paused = await _until(http, run["id"], lambda r: r["display_status"] == "paused" or r["terminal"])
        assert paused["display_status"] == "paused", "the run finished before the pause reached it"
        await page.wait_for_selector('.run[data-display-status="paused"]')
        await page.wait_for_selector("#btn-resume:enabled")
        await page.wait_for_function("() => +document.getElementById('count-running').dataset.value === 0")
        assert await page.is_disabled("#btn-pause")
        await page.screenshot(path=str(screenshots / "run-page-paused.png"), full_page=True)
        await page.click("#btn-resume")
        resumed = await _until(http, run["id"], lambda r: r["display_status"] != "paused")
        assert resumed["display_status"] in ("running", "ok")

        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        tasks = await _all_tasks(http, run["id"])
    assert final["display_status"] == "ok" and len(tasks) == 300
    assert {t["outcome"] for t in tasks} == {"pass", "fail", "err"}
    await page.wait_for_selector('#stream-state[data-state="done"]')
    await page.wait_for_selector('.run[data-display-status="ok"]')
    await _assert_heatmap_matches(page, tasks, 300)
    summary = final["tasks"]["summary"]
    assert [await _counter(page, k) for k in ("passed", "failed", "errored", "running")] == [
        summary["passed"], summary["failed"], summary["errored"], 0]
    assert await page.locator('tr.phase[data-phase="materialize"]').get_attribute("data-state") == "completed"
    cost = await page.locator('#cost-panel tr[data-cost="model"] td.num').inner_text()
    assert final["cost"]["model"] > 0
    assert float(cost.removeprefix("$")) == pytest.approx(final["cost"]["model"], abs=1e-6)
    # The live stream closes at the terminal event; the narration and report that follow it are not streamed.
    assert await page.get_attribute("#event-log", "data-last-seq") == str(max(
        e["seq"] for e in (await _events(stack, run["id"])) if e["type"] not in AFTER_TERMINAL))
    await page.screenshot(path=str(screenshots / "run-page-done.png"), full_page=True)


async def _events(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    async with stack.http() as http:
        return (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 5000})).json()["events"]  # type: ignore[no-any-return]


async def test_task_modal_lists_every_trial_and_the_temporal_link(browser: Any, stack: Stack,
                                                                  screenshots: Path) -> None:
    # A second API on the same store and Temporal, configured with a Temporal UI (the session's has none).
    settings = stack.settings.model_copy(update={"temporal_ui_url": "http://127.0.0.1:8233/"})
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    try:
        async with stack.http() as http:
            run = await launch(http, {"dataset": DATASET, "trials": {"plan": {"k": 3}},
                                      "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
            await wait_terminal(http, run["id"])
            detail = (await http.get(f"/v1/runs/{run['id']}/tasks/5")).json()
        context = await browser.new_context(base_url=f"http://127.0.0.1:{port}",
                                            viewport={"width": 1440, "height": 1000})
        page = await context.new_page()
        await page.goto("/ui/")
        await page.fill("#api-key", stack.api_key)
        await page.click("#signin-form button[type=submit]")
        await page.wait_for_selector("#runs-table")
        await page.goto(f"/ui/#/runs/{run['id']}")
        await page.wait_for_selector("#heatmap[data-passed='60']")
        href = await page.get_attribute("#temporal-link", "href")
        assert href == f"http://127.0.0.1:8233/namespaces/{settings.temporal_namespace}/workflows/{run['id']}"
        assert await page.is_visible("#temporal-link")
        assert "k=3" in await page.inner_text('#receipt dd[data-field="trials"]')

        x, y = await _cell_centre(page, 5)
        await page.mouse.click(x, y)
        await page.wait_for_selector("#task-modal[data-index='5'] tr.trial-row")
        rows = page.locator("#task-modal tr.trial-row")
        assert await rows.count() == 3
        outcomes = [await r.get_attribute("data-outcome") for r in await rows.all()]
        assert outcomes == [t["outcome"] for t in detail["trials"]]
        texts = await rows.nth(0).locator("td").all_inner_texts()
        assert texts[0] == "0" and texts[4] == detail["trials"][0]["output"]
        await page.screenshot(path=str(screenshots / "task-modal.png"))
        await page.click("#modal-close")
        await page.wait_for_selector("#task-modal", state="detached")
        await context.close()
    finally:
        server.should_exit = True
        await task


async def test_ten_thousand_task_run_page_stays_responsive(page: Any, stack: Stack, dev_models: DevModels,
                                                           tmp_path: Path, screenshots: Path) -> None:
    answers = _dataset(tmp_path / "big.jsonl", 10_000)
    url = await dev_models.start(DevModelConfig(answers=answers, accuracy=0.9))
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(tmp_path / "big.jsonl"), "concurrency": 128,
                                  "model": {"identifier": "openai/dev", "api_base": url}})
        opened = time.monotonic()
        await page.goto(f"/ui/#/runs/{run['id']}")
        # While the run streams its ~20,000 events in, a frame still comes round promptly.
        await page.wait_for_selector("#heatmap[data-cells='10000']", timeout=120_000)
        frame_ms = await page.evaluate(
            "() => new Promise((r) => { const t = performance.now();"
            " requestAnimationFrame(() => r(performance.now() - t)); })")
        await wait_terminal(http, run["id"])
        tasks = await _all_tasks(http, run["id"])
    await page.wait_for_selector('#stream-state[data-state="done"]', timeout=60_000)
    painted_s = time.monotonic() - opened
    await _assert_heatmap_matches(page, tasks, 10_000)
    clicked = time.monotonic()
    x, y = await _cell_centre(page, 9_999)
    await page.mouse.click(x, y)
    await page.wait_for_selector("#task-modal[data-index='9999'] tr.trial-row")
    modal_s = time.monotonic() - clicked
    nodes = await page.evaluate("document.getElementsByTagName('*').length")
    draw_ms = float(await page.get_attribute("#heatmap", "data-draw-ms"))
    await page.screenshot(path=str(screenshots / "run-page-10k.png"), full_page=True)
    print(f"\n10k-task page: first frame during streaming {frame_ms:.0f} ms, all cells painted {painted_s:.1f} s after "
          f"opening (run included), last full redraw {draw_ms:.1f} ms, modal {modal_s * 1000:.0f} ms, "
          f"{nodes} DOM nodes")
    assert frame_ms < 2000, f"a frame took {frame_ms:.0f} ms while events streamed in"
    assert modal_s < 10, f"the modal took {modal_s:.1f} s to open"
    assert nodes < 2000, f"{nodes} DOM nodes: the heatmap must not be one node per task"


async def test_dashboard_files_and_reads_are_same_origin_and_scoped_to_the_caller(stack: Stack) -> None:
    async with stack.http() as http, stack.http(stack.other_key) as other, stack.http(None) as anonymous:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        mine = (await http.get("/v1/ui/runs", params={"limit": 200})).json()["runs"]
        theirs = (await other.get("/v1/ui/runs", params={"limit": 200})).json()["runs"]
        assert (await anonymous.get("/v1/ui/runs")).status_code == 401
        assert (await anonymous.get("/v1/ui/config")).status_code == 401
        root = await anonymous.get("/", follow_redirects=False)
        index = await anonymous.get("/ui/")
        script = await anonymous.get("/ui/app.js")
        await wait_terminal(http, run["id"])
    assert [r["dataset"] for r in mine if r["id"] == run["id"]] == [DATASET]
    assert run["id"] not in {r["id"] for r in theirs}
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    assert index.status_code == 200 and '<script type="module" src="app.js">' in index.text
    assert "default-src 'self'" in index.headers["content-security-policy"]
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    # Nothing the page loads names another origin (no CDN at run time).
    web = Path(__file__).resolve().parents[2] / "api" / "web"
    for path in web.iterdir():
        assert "http://" not in path.read_text() and "https://" not in path.read_text(), path.name


async def test_review_box_appears_while_waiting_and_its_resolution_resumes_the_run(page: Any, stack: Stack,
                                                                                  screenshots: Path) -> None:
    hooks = {"review": {"phase": "atomize", "reason": "which field is the answer?"}}
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "metadata": {"test_hooks": hooks},
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await page.goto(f"/ui/#/runs/{run['id']}")
        await page.wait_for_selector("#review-box:not([hidden]) #review-text", timeout=60_000)
        assert "which field is the answer?" in await page.inner_text("#review-box")
        assert await page.is_disabled("#btn-pause") and await page.is_disabled("#btn-resume")
        await page.screenshot(path=str(screenshots / "run-page-waiting.png"), full_page=True)
        await page.fill("#review-text", "Use the answer column.")
        await page.click("#review-send")
        await wait_terminal(http, run["id"])
        events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
    resumed = [e["data"] for e in events if e["type"] == "RunResumed"]
    assert resumed == [{"previous_reason": "agent_review: which field is the answer?",
                        "review_resolution": "Use the answer column."}]
    await page.wait_for_selector('.run[data-display-status="ok"]')
    assert await page.is_hidden("#review-box")
