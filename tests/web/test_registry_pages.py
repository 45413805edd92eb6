"""The dashboard's registry pages in a real Chromium against the real stack (issue 14's last bullet).

A finished run is published as a public benchmark through REST; the Benchmarks page must then show its card with an
identicon that the browser actually decoded, and the subset page must list the run's model in the leaderboard with
the pass rate the API reports, linking to the run's page.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


async def test_benchmark_card_with_identicon_and_subset_leaderboard(page: Any, stack: Stack,
                                                                    screenshots: Path) -> None:
    name = f"ui-bench-{uuid.uuid4().hex[:6]}"
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        resp = await http.post("/v1/registry/publish", json={"run_id": run["id"], "benchmark": name,
                                                             "subset": "all", "visibility": "public"})
        assert resp.status_code == 200, resp.text
        published = resp.json()
        assert published["visibility"] == "public"
        bench = (await http.get(f"/v1/registry/benchmarks/{published['benchmark_id']}")).json()
        assert bench["visibility"] == "public", bench
        board = (await http.get(f"/v1/registry/subsets/{published['subset_id']}/leaderboard")).json()
    row = next(r for r in board["rows"] if r["model"] == "openai/dev")
    assert row["pass_rate"] is not None and row["best_run_id"] == run["id"], board

    detail_reads: list[str] = []  # the list carries the subsets: the page reads no benchmark's detail
    page.on("request", lambda req: detail_reads.append(req.url)
            if "/v1/registry/benchmarks/" in req.url and not req.url.endswith(".svg") else None)
    await page.click("#nav-benchmarks")
    card = page.locator(f'article.bench-card[data-benchmark-id="{published["benchmark_id"]}"]')
    await card.wait_for(timeout=15_000)
    await card.locator(f'a.subset-link[data-subset-id="{published["subset_id"]}"]').wait_for(timeout=15_000)
    assert detail_reads == []
    assert await card.locator(".bench-name").inner_text() == name
    assert "public" in await card.inner_text()
    img = card.locator("img.identicon")
    await page.wait_for_function("img => img.complete", arg=await img.element_handle(), timeout=10_000)
    assert await img.evaluate("img => img.naturalWidth") > 0, "the identicon did not load"
    await page.screenshot(path=str(screenshots / "benchmarks.png"), full_page=True)

    await card.locator(f'a.subset-link[data-subset-id="{published["subset_id"]}"]').click()
    assert page.url.endswith(f"#/subsets/{published['subset_id']}")
    board_row = page.locator('#leaderboard tr.board-row[data-model="openai/dev"]')
    await board_row.wait_for(timeout=15_000)
    assert await page.locator("#subset-name").inner_text() == "all"
    headers = await page.locator("#leaderboard thead th").all_inner_texts()
    cells = dict(zip(headers, await board_row.locator("td").all_inner_texts(), strict=True))
    assert cells["Model"] == "openai/dev"
    assert cells["Pass rate"] == f"{100 * row['pass_rate']:.1f}%", cells
    assert int(cells["Runs"]) == row["runs"] >= 1
    await page.screenshot(path=str(screenshots / "subset.png"), full_page=True)

    await board_row.locator("a").click()
    await page.wait_for_selector("#heatmap", timeout=15_000)
    assert page.url.endswith(f"#/runs/{row['best_run_id']}")
