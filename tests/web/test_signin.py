"""The sign-in page names where the stack's own key really is (issue 22): the embedded stack's dev.json in its data
directory, wherever that is, never a guessed ~/.benchwright; a deployment that names no key file names none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _signin_text(browser: Any, stack: Stack) -> str:
    context = await browser.new_context(base_url=stack.api_url)
    try:
        tab = await context.new_page()
        await tab.goto("/ui/")
        await tab.wait_for_selector("#signin-form")
        await tab.wait_for_load_state("networkidle")
        return str(await tab.inner_text("#signin-form"))
    finally:
        await context.close()


async def test_signin_page_names_the_stacks_real_key_file(browser: Any, stack: Stack, tmp_path: Path) -> None:
    key_file = str(tmp_path / "elsewhere" / "dev.json")
    stack.settings.signin_key_file = key_file  # what `benchwright up` sets for its data directory
    try:
        text = await _signin_text(browser, stack)
    finally:
        stack.settings.signin_key_file = None
    assert f"this stack's is in {key_file}" in text
    assert "~/.benchwright" not in text
    plain = await _signin_text(browser, stack)  # a shared deployment: no server path at all
    assert "dev.json" not in plain and "~/.benchwright" not in plain and "benchwright accounts create" in plain
