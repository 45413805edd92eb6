"""The data directory's disk fills up mid-run (issue 23): clear errors, the store is not corrupted, and the run goes
on once space is back.

The data directory (SQLite store, run work directories, sandboxes) is a small tmpfs mounted for the test (root
only: without the right to mount, the test says so and is skipped); a filler file takes its last byte mid-run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from benchwright.testkit.devmodel import DevModelConfig
from tests.conftest import DevModels
from tests.faults.kit import FaultStack, exactly_once, start_stack, wait_for, write_dataset

pytestmark = pytest.mark.asyncio(loop_scope="session")
TASKS = 300
SIZE_MB = 96


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(data)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the data directory here ({mounted.stderr.strip()}); "
                    "run as root to test a full disk")
    try:
        yield data
    finally:
        subprocess.run(["umount", "-l", str(data)], capture_output=True)


def fill(path: Path) -> int:
    """Write zeros into ``path`` until the file system refuses; returns the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                written += os.write(fd, chunk)
            except OSError:
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 16 or 1]
    finally:
        os.close(fd)


@pytest.fixture
async def disk_stack(tmp_path: Path, small_disk: Path, dev_models: DevModels) -> AsyncIterator[tuple[FaultStack, str]]:
    answers = write_dataset(tmp_path / "tasks.jsonl", TASKS)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=20))
    stack = await start_stack(tmp_path, model_hosts=list(dev_models.allowed))
    try:
        yield stack, url
    finally:
        await stack.close()


async def test_full_disk_gives_clear_errors_keeps_the_store_whole_and_the_run_resumes(
        disk_stack: tuple[FaultStack, str], tmp_path: Path) -> None:
    stack, url = disk_stack
    body = {"dataset": str(tmp_path / "tasks.jsonl"), "concurrency": 4,
            "model": {"identifier": "openai/dev", "api_base": url}}
    run_id = await stack.launch(body)
    await wait_for(lambda: sum(stack.results(run_id).values()) >= 30, "30 results before the disk fills", 120)
    filler = stack.settings.data_dir / "filler"
    fill(filler)
    log = stack.work / "worker.log"
    # The worker says what is wrong, in plain words, and waits (its results are not dropped, nor the run failed).
    await wait_for(lambda: "the store's disk is full" in log.read_text(errors="replace"),
                   "the worker reported the full disk", 120, every_s=0.2)
    async with stack.http() as http:
        # A launch answered 201 once in a CI rehearsal: something had freed space since the disk filled (plausibly
        # the worker removing a warm sandbox it could not make; not confirmed). So the launch first takes whatever is
        # free again, so that its write finds the disk full. At most three times: a store that keeps accepting
        # launches on a full disk fails here.
        for attempt in range(3):
            fill(stack.settings.data_dir / f"filler-{attempt}")
            refused = await http.post("/v1/runs", json=body)
            if refused.status_code != 201:
                break
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "store_unavailable"
    assert "disk is full" in refused.json()["error"]["message"]
    stalled = sum(stack.results(run_id).values())
    assert stalled < TASKS and stack.runs()[run_id].finished_at is None
    for taken in (filler, *stack.settings.data_dir.glob("filler-*")):
        taken.unlink()  # space is back
    await wait_for(lambda: stack.finished([run_id]), "the run finished once space was back", 240, every_s=0.2)
    run = stack.runs()[run_id]
    assert (run.status, run.halted, run.error) == ("ok", False, None)
    exactly_once(stack.results(run_id), TASKS)
    with stack.engine.connect() as conn:
        assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    async with stack.http() as http:
        view = (await http.get(f"/v1/runs/{run_id}")).json()
    assert view["tasks"]["summary"]["passed"] == TASKS
