"""A real Chromium (Debian's ``chromium``) driven by Playwright against the session stack's API.

Playwright's own browser download cannot work offline, so the system browser is launched by path. When it is
missing the tests install it with apt-get (as root); if that cannot be done they fail on CI (``CI=true``) and are
skipped with the reason printed elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.conftest import Stack

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run: {reason}")
    print(f"\nSKIPPED browser tests: {reason}")
    pytest.skip(reason)


def chromium_path() -> str:
    """The system Chromium, installed with apt-get when it is missing and we are root."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        _unavailable("chromium is not installed, and apt-get cannot install it here (not root, or no apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            _unavailable(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    found = shutil.which("chromium")
    if not found:
        _unavailable("apt-get installed chromium but no `chromium` is on PATH")
    return found  # type: ignore[return-value]


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """Outside pytest's tmp dirs, which keep only the last three sessions (and other runs' sessions count)."""
    path = Path(tempfile.mkdtemp(prefix="benchwright-screenshots-"))
    print(f"\nbrowser screenshots: {path}")
    return path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    executable = chromium_path()
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (it is in the `test` extra)")
    async with async_playwright() as pw:
        instance = await pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield instance
        finally:
            await instance.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Any, stack: Stack) -> AsyncIterator[Any]:
    """A fresh browser context (its own session storage) on the dashboard, signed in with the stack's key."""
    context = await browser.new_context(base_url=stack.api_url, viewport={"width": 1440, "height": 1000})
    tab = await context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    await tab.goto("/ui/")
    await tab.wait_for_selector("#signin-form")
    await tab.fill("#api-key", stack.api_key)
    await tab.click("#signin-form button[type=submit]")
    await tab.wait_for_selector("#runs-table")
    try:
        yield tab
    finally:
        await context.close()
    # A script error or a CSP refusal is a bug even when the assertions passed. 404s of a task not settled yet are
    # the modal's expected answer; nothing else may be logged.
    unexpected = [e for e in errors if "404" not in e]
    assert not unexpected, unexpected
