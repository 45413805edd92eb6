"""The API's heap at startup is frozen for the cyclic collector while it serves (``api.main``): a full collection
re-scanned its ~180,000 startup objects (~100 ms, every few page reads of a big run's log), and it is given back at
shutdown, so an API served inside another process leaves the collector as it found it. Checked in a fresh
interpreter: the tests' own process serves an API (the session's stack) whose heap is frozen already."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LIFESPAN = textwrap.dedent("""
    import asyncio, gc, sys
    from api.main import create_app
    from benchwright.settings import Settings

    async def main():
        before = gc.get_freeze_count()
        app = create_app(Settings(data_dir=sys.argv[1]))
        async with app.router.lifespan_context(app):
            serving = gc.get_freeze_count()
            gc.collect()  # a full collection leaves the frozen heap alone
            collected = gc.get_freeze_count()
        print(before, serving, collected, gc.get_freeze_count())

    asyncio.run(main())
""")


def test_the_startup_heap_is_frozen_while_the_api_serves(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", LIFESPAN, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, serving, collected, after = map(int, done.stdout.split())
    assert before == 0 and after == 0
    assert serving > 50_000, f"only {serving} objects frozen"
    assert collected == serving
