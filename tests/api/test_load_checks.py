"""Atomize remembers a passed load check (``benchwright.scoring.load_checks``): a scorer that loaded on the same
filesystem before, for the same account, is not loaded again in a sandbox; its snapshot is made from the same
files and is the same snapshot. A scorer that failed to load is checked, and reported, every time; another
account's identical run is checked for itself."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")

EXACT_IMPL = '''
class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut(self.extract(row))

    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''


def _atomize(events: list[dict[str, Any]]) -> tuple[int, str | None]:
    """Work sandboxes created while Atomize ran, and the snapshot Atomize left."""
    inside, sandboxes, snapshot = False, 0, None
    for e in events:
        if e["type"] == "PhaseStarted" and e["data"]["phase"] == "atomize":
            inside = True
        elif e["type"] in ("PhaseCompleted", "PhaseFailed") and e["data"]["phase"] == "atomize":
            inside = False
        elif inside and e["type"] == "SandboxCreated" and e["data"]["role"] == "work":
            sandboxes += 1
        elif e["type"] == "SnapshotCreated" and e["data"]["phase"] == "atomize":
            snapshot = e["data"]["snapshot_id"]
    return sandboxes, snapshot


async def _run(stack: Stack, impl: str, key: str = "default") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with stack.http(key) as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "task_impl": impl})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    return final, events


async def test_a_scorer_that_loaded_before_is_not_loaded_again(stack: Stack) -> None:
    impl = f"# {uuid.uuid4().hex}: a scorer this session has not loaded yet\n{EXACT_IMPL}"
    first, first_events = await _run(stack, impl)
    again, again_events = await _run(stack, impl)
    other, other_events = await _run(stack, impl, stack.other_key)

    assert [r["status"] for r in (first, again, other)] == ["ok"] * 3
    assert first["tasks"]["summary"] == again["tasks"]["summary"] == other["tasks"]["summary"]
    assert first["tasks"]["summary"]["pass_rate"] == 1.0
    (checked, snapshot), (remembered, same) = _atomize(first_events), _atomize(again_events)
    assert checked == 1, "the first run loads the scorer in a work sandbox"
    assert remembered == 0, "the same scorer on the same filesystem: no sandbox"
    assert snapshot is not None and same == snapshot, "the snapshot from files is the one the sandbox gave"
    assert _atomize(other_events) == (1, snapshot), "another account's run is checked for itself"
    assert first["fingerprint"] == again["fingerprint"]


async def test_a_scorer_that_failed_to_load_is_checked_every_time(stack: Stack) -> None:
    broken = f"# {uuid.uuid4().hex}\nclass Scorer:\n    def extract(self, row): return 1\n"
    for _ in range(2):
        final, events = await _run(stack, broken)
        failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
        assert final["status"] == "error"
        assert failed and failed[0]["phase"] == "atomize" and failed[0]["error_type"] == "ScorerInvalid"
        assert "Scorer has no method solve" in failed[0]["detail"]
        assert _atomize(events)[0] == 1, "loaded (and refused) in a sandbox each time"
