"""Fair share between accounts (issue 23): account A saturating the worker cannot block account B's run.

A worker with one activity slot is the scarcest case of a saturated worker: every phase and every Materialize batch
of every run waits for that slot in the task queue. Account A's two runs, split into many small batches, fill the
queue first; then account B launches. First-in-first-out, B's every activity would wait behind A's queued batches
and A's runs would end first. With the account as the runs' fairness key the queue hands the slot to A and B in
turn: B's run ends while both of A's are still in flight. Ordering is read from the store, never from timings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from benchwright.store.accounts import create_account
from benchwright.testkit.devmodel import DevModelConfig
from tests.conftest import DevModels
from tests.faults.kit import FaultStack, start_stack, wait_for, write_dataset

pytestmark = pytest.mark.asyncio(loop_scope="session")
A_TASKS = 24


@pytest.fixture
async def one_slot_stack(tmp_path: Path, dev_models: DevModels) -> AsyncIterator[tuple[FaultStack, str]]:
    answers = write_dataset(tmp_path / "tasks.jsonl", A_TASKS)
    url = await dev_models.start(DevModelConfig(answers=answers, latency_ms=20))
    stack = await start_stack(tmp_path, model_hosts=list(dev_models.allowed), worker_max_activities="1",
                              materialize_batch_tasks="2", materialize_parallel_batches="4")
    try:
        yield stack, url
    finally:
        await stack.close()


async def test_account_b_run_finishes_while_account_a_saturates_the_worker(
        one_slot_stack: tuple[FaultStack, str], tmp_path: Path) -> None:
    stack, url = one_slot_stack
    model = {"identifier": "openai/dev", "api_base": url}
    a_runs = [await stack.launch({"dataset": str(tmp_path / "tasks.jsonl"), "model": model, "concurrency": 4})
              for _ in range(2)]
    # A's batches are queued (each run keeps four scheduled) before B asks for anything.
    await wait_for(lambda: all(stack.results(r) for r in a_runs), "both of A's runs scoring", 240, every_s=0.1)
    _, b_key = create_account(stack.engine, name="account-b", balance_usd=100.0, local_paths=True)
    (tmp_path / "b.jsonl").write_text((tmp_path / "tasks.jsonl").read_text().split("\n", 2)[0] + "\n")
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {b_key}"},
                                 timeout=60) as http:
        resp = await http.post("/v1/runs", json={"dataset": str(tmp_path / "b.jsonl"), "model": model})
    assert resp.status_code == 201, resp.text
    b_run = resp.json()["id"]
    await wait_for(lambda: stack.finished([b_run]), "B's run finished", 300, every_s=0.05)
    at_b_end = stack.runs()
    a_left = {r: A_TASKS - sum(stack.results(r).values()) for r in a_runs}
    assert at_b_end[b_run].status == "ok"
    assert all(at_b_end[r].finished_at is None for r in a_runs), f"A's runs ended before B's: {a_left}"
    assert all(left > 0 for left in a_left.values()), a_left  # A still had tasks to score when B was done
    await wait_for(lambda: stack.finished(a_runs), "A's runs finished", 300, every_s=0.2)
    assert all(stack.runs()[r].status == "ok" for r in a_runs)
