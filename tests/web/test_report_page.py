"""The downloaded run report (issue 26) in a real Chromium: it renders with no console error, loads nothing but
itself (every request is routed and recorded), and shows the API's numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.api.helpers import launch, wait_terminal
from tests.api.test_results import IMPL, write_dataset
from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")

REPORT_URL = "http://report.invalid/report.html"


async def _open(browser: Any, url: str, body: bytes | None) -> tuple[Any, Any, list[str], list[str]]:
    """A fresh context whose every request is routed and recorded: ``url`` is loaded (answered with ``body`` when
    given), anything else is refused (a report must need nothing else)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    requests: list[str] = []
    errors: list[str] = []

    async def route(r: Any) -> None:
        if r.request.url != url:
            await r.abort()
        elif body is None:
            await r.continue_()
        else:
            await r.fulfill(status=200, body=body, headers={"Content-Type": "text/html; charset=utf-8"})

    await context.route("**/*", route)
    page = await context.new_page()
    page.on("request", lambda req: requests.append(req.url))
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type in ("error", "warning") else None)
    await page.goto(url)
    await page.wait_for_load_state("load")
    return context, page, requests, errors


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def reported(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("report-page")
    write_dataset(tmp / "arith_subjects.jsonl")
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(tmp / "arith_subjects.jsonl"), "task_impl": IMPL,
                                  "group_by": "subject", "model": {"identifier": "openai/dev",
                                                                   "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        await stack.client.get_workflow_handle(run["id"]).result()
        view = (await http.get(f"/v1/runs/{run['id']}")).json()
        groups = (await http.get(f"/v1/runs/{run['id']}/breakdown")).json()["groups"]
        report = await http.get(f"/v1/runs/{run['id']}/files/report.html")
    assert report.status_code == 200, report.text
    return {"view": view, "groups": groups, "report": report.content}


async def test_report_renders_offline_with_the_apis_numbers(browser: Any, reported: dict[str, Any], tmp_path: Path,
                                                            screenshots: Path) -> None:
    view, groups = reported["view"], reported["groups"]
    path = tmp_path / "report.html"
    path.write_bytes(reported["report"])
    s = view["tasks"]["summary"]

    # From disk: the document is the only thing the browser asks for.
    context, page, requests, errors = await _open(browser, path.as_uri(), None)
    try:
        assert requests == [path.as_uri()], requests
        assert await page.inner_text("#narration") == view["narration"]
        await page.screenshot(path=str(screenshots / "report.png"), full_page=True)
    finally:
        await context.close()
    assert errors == [], errors

    # Served over HTTP with every request routed: still only the document; the script runs without an error.
    context, page, requests, errors = await _open(browser, REPORT_URL, reported["report"])
    try:
        assert float(await page.get_attribute("#pass-rate", "data-value")) == s["pass_rate"]
        assert [float(await page.get_attribute("#pass-rate", f"data-{k}")) for k in ("low", "high")] == \
            s["pass_rate_ci"]
        assert f"{s['pass_rate'] * 100:.1f} %" in await page.inner_text("#pass-rate")
        for key in ("passed", "failed", "errored", "no_answer", "total"):
            assert int(await page.get_attribute(f"#count-{key}", "data-value")) == s[key], key
            assert str(s[key]) in await page.inner_text(f"#count-{key}")
        assert await page.inner_text("#narration") == view["narration"]
        assert await page.inner_text("#display-status") == view["display_status"]
        assert await page.inner_text("dd[data-key='fingerprint']") == view["fingerprint"]

        # The heatmap: one cell per task, coloured by its outcome, in the API's counts.
        widths = await page.eval_on_selector_all("#heatmap rect", """rs => rs.map((r) =>
            [r.getAttribute('class'), (+r.getAttribute('width') + 1) / 12])""")
        cells: dict[str, float] = {}
        for kind, n in widths:
            cells[kind] = cells.get(kind, 0) + n
        assert cells == {k: v for k, v in {"o-pass": s["passed"], "o-fail": s["failed"],
                                           "o-err": s["errored"]}.items() if v}

        # The per-group bars: the API's groups, pass rates and totals.
        bars = await page.eval_on_selector_all("#groups g.group", """gs => gs.map((g) =>
            [g.dataset.group, g.dataset.passRate, +g.dataset.total])""")
        assert bars == [[g["group"], "" if g["pass_rate"] is None else repr(g["pass_rate"]), g["total"]]
                        for g in groups]

        # The heatmap's tooltip (the report's script) names the task under the pointer.
        box = await page.locator("#heatmap").bounding_box()
        await page.mouse.move(box["x"] + 3, box["y"] + 3)
        assert (await page.inner_text("#tip")).startswith("task 0: ")
        assert "scorer bug on purpose" in await page.inner_text("#failures")
        assert requests == [REPORT_URL], requests
    finally:
        await context.close()
    assert errors == [], errors


async def test_run_page_shows_the_narration(page: Any, reported: dict[str, Any]) -> None:
    view = reported["view"]
    await page.goto(f"/ui/#/runs/{view['id']}")
    await page.wait_for_selector("#narration-card:not([hidden]) #narration")
    assert await page.inner_text("#narration") == view["narration"]
