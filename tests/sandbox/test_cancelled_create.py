"""A sandbox's creation cancelled midway (a halt or a pause lands while a batch opens its sandbox) leaves nothing
running: no init whose directory is gone, no warm sandbox that is neither the run's nor the pool's.

The backends below are ``LocalBackend`` itself with the step of interest observed (a flag when it begins and when
it ends); what they do is the backend's own."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from benchwright.sandbox import LocalBackend
from benchwright.sandbox.local.warm import WarmPool, start_warm_pool, stop_warm_pool
from tests.sandbox.test_local import _namespaces_skip_reason
from tests.sandbox.test_warm import SPEC


def _inits_under(root: Path) -> list[int]:
    """Live sandbox helpers (supervisors and inits) whose command line names a path under ``root``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"init" in argv and any(str(root).encode() in arg for arg in argv):
            found.append(int(name))
    return found


class _ObservedStart(LocalBackend):
    """Says when its init's start begins (``began``) and when that call has returned (``ended``)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.began = threading.Event()
        self.ended = threading.Event()

    def _start_init(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.began.set()
        try:
            return super()._start_init(*args, **kwargs)
        finally:
            self.ended.set()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    return tmp_path / "data"


async def test_a_create_cancelled_while_its_init_starts_leaves_no_init_running(root: Path) -> None:
    backend = _ObservedStart(root)
    creating = asyncio.create_task(backend.create(role="work", run_id="run-1"))
    assert await asyncio.to_thread(backend.began.wait, 30), "the init's start never began"
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    # Before the fix the cancellation came back at once: the cleanup then raced the thread still starting the init
    # (it could remove the directory of an init it never saw, which then ran for good).
    assert backend.ended.is_set(), "create gave up while its init was still being started"
    assert _inits_under(root) == [], "an init of the cancelled sandbox is still running"
    assert os.listdir(backend._sandboxes_dir) == [], "the cancelled sandbox's directory is left"
    await backend.close()


class _ObservedAdoption(LocalBackend):
    """Its ``_adopt`` waits (in its first thread hop) until the test has cancelled the caller."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.adopting = asyncio.Event()
        self.release = asyncio.Event()

    async def _adopt(self, *args: Any, **kwargs: Any) -> Any:
        self.adopting.set()
        await self.release.wait()
        return await super()._adopt(*args, **kwargs)


@pytest.fixture
async def pool(root: Path) -> AsyncIterator[WarmPool]:
    started = await start_warm_pool(LocalBackend(root), size=1, runtime=SPEC)
    await started.until_ready()
    yield started
    await stop_warm_pool(started)


async def test_a_claim_cancelled_mid_adoption_kills_the_warm_sandbox(root: Path, pool: WarmPool) -> None:
    warm_id = pool.ready[0].meta.sandbox_id
    claimer = _ObservedAdoption(root)
    creating = asyncio.create_task(claimer.create(role="work", run_id="run-1"))
    await asyncio.wait_for(claimer.adopting.wait(), 30)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    alive = {info.sandbox_id for info in await claimer.list_alive()}
    assert warm_id not in alive, "the warm sandbox taken for the cancelled claim is still alive"
    assert not (claimer._sandboxes_dir / warm_id).exists()
    await claimer.close()
