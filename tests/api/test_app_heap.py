"""The API's heap at startup is frozen for the cyclic collector while it serves (``api.main``): a full collection
re-scanned its ~180,000 startup objects (~100 ms, every few page reads of a big run's log, as likely as not inside a
long poll's answer), and is given back at shutdown, so an API served inside another process leaves it as it was."""

from __future__ import annotations

import gc
from pathlib import Path

from api.main import create_app
from benchwright.settings import Settings


async def test_the_startup_heap_is_frozen_while_the_api_serves(tmp_path: Path) -> None:
    assert gc.get_freeze_count() == 0
    app = create_app(Settings(data_dir=tmp_path))
    async with app.router.lifespan_context(app):
        frozen = gc.get_freeze_count()
        assert frozen > 50_000, f"only {frozen} objects frozen"
        gc.collect()  # a full collection leaves the frozen heap alone
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0
