"""The dashboard's task modal shows a product-sandbox run's agent steps on the task (a real Chromium)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchwright.testkit import product_double
from tests.api.helpers import launch, wait_terminal
from tests.conftest import DevModels, Stack
from tests.web.test_dashboard import _cell_centre

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_task_modal_shows_the_agents_steps(page: Any, stack: Stack, dev_models: DevModels,
                                                 screenshots: Path) -> None:
    url = await dev_models.start(product_double.config())
    recipe = product_double.recipe()
    marker = next(i for i, t in enumerate(recipe.tasks) if t.id == "setup-marker")
    async with stack.http() as http:
        run = await launch(http, {"recipe": product_double.RECIPE,
                                  "model": {"identifier": "openai/dev", "api_base": url}})
        await wait_terminal(http, run["id"])
    await page.goto(f"/ui/#/runs/{run['id']}")
    await page.wait_for_selector(f"#heatmap[data-passed='{product_double.EXPECTED['pass']}']")
    x, y = await _cell_centre(page, marker)
    await page.mouse.click(x, y)
    await page.wait_for_selector(f"#task-modal[data-index='{marker}'] #agent-steps tr.agent-step")
    rows = page.locator("#task-modal tr.agent-step")
    assert await rows.count() == 6
    cells = [await r.locator("td").all_inner_texts() for r in await rows.all()]
    assert [c[2] for c in cells] == ["read_file", "read_file", "shell", "shell", "finish", "finish"]
    assert cells[1][3] == "yes" and "setup ok" in cells[1][4]
    await page.screenshot(path=str(screenshots / "product-task-modal.png"))
