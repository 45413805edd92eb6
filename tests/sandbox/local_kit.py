"""The local backend for the snapshot tests: one per test in its own data directory, skipped (with the reason
printed) where namespaces need what this host lacks."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchwright.sandbox import IsolationUnavailable, LocalBackend, SandboxInfo


async def local_backend(data_dir: Path) -> AsyncIterator[LocalBackend]:
    """A ``LocalBackend`` over ``data_dir``; every sandbox it left alive is killed after the test."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        print("SKIP: the local sandbox backend needs Linux and root (CAP_SYS_ADMIN) for namespaces")
        pytest.skip("the local sandbox backend needs Linux and root (CAP_SYS_ADMIN) for namespaces")
    b = LocalBackend(data_dir)
    yield b
    for info in await b.list_alive():
        await b.kill(info.sandbox_id)
    await b.close()


async def create_work(b: LocalBackend, snapshot_id: str) -> SandboxInfo:
    """A work sandbox restored from ``snapshot_id``; the test skips if the kernel refuses namespaces."""
    try:
        return await b.create(role="work", run_id="run-1", snapshot_id=snapshot_id)
    except IsolationUnavailable as exc:
        print(f"SKIP: kernel refused sandbox namespaces: {exc}")
        pytest.skip(f"kernel refused sandbox namespaces: {exc}")
