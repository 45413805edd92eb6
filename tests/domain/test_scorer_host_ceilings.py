"""The scorer host's time ceilings against the real runner in a plain subprocess: a scorer stuck at import or in
``extract`` is bounded, and the runtime that ran it is gone afterwards (issue 15 item 7)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchwright.llm.sut import SutReply
from benchwright.runs.limits import ScorerCeilings, TaskLimits, matrix
from benchwright.scoring.host import (
    RUNNER,
    ScorerLoadError,
    Spawn,
    TrialItem,
    TrialLimits,
    TrialRecord,
    run_trials,
    runner_env,
)

STUCK_AT_IMPORT = '''
import sys
if "--check" not in sys.argv:  # loads fine for Atomize's check, then never again
    while True:
        pass
class Scorer:
    def extract(self, row): return row["q"]
    def solve(self, row, call_sut): return "x"
    def score(self, row, response): return 1.0
'''

STUCK_IN_EXTRACT = '''
class Scorer:
    def extract(self, row):
        while row["q"] == "loop":
            pass
        return row["q"]
    def solve(self, row, call_sut): return self.extract(row)
    def score(self, row, response): return 1.0
'''

STUCK_IN_ONE_CALL_SCORE = '''
class Scorer:
    def extract(self, row): return row["q"]
    def one_call(self, row): return row["q"]
    def solve(self, row, call_sut): return call_sut(self.one_call(row))
    def score(self, row, response):
        while row["q"] == "loop":
            pass
        return 1.0
'''


class _AtOnce:
    """A SUT double answering every call at once."""

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        return SutReply(text="4", usage={}, cost_usd=0.0)

    async def warm(self, calls: int) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _spawner(tmp_path: Path, impl: str, pids: list[int]) -> Spawn:
    (tmp_path / "task_impl.py").write_text(impl)
    (tmp_path / "runner.py").write_bytes(RUNNER.read_bytes())

    async def spawn(args: list[str]) -> Any:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "runner.py", *args, cwd=str(tmp_path), env=runner_env(str(tmp_path)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        pids.append(proc.pid)
        return proc

    return spawn


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_scorer_stuck_at_import_fails_to_load_within_the_load_ceiling(tmp_path: Path) -> None:
    pids: list[int] = []
    started = time.monotonic()
    with pytest.raises(ScorerLoadError, match="did not finish loading within 1 s"):
        await run_trials(spawn=_spawner(tmp_path, STUCK_AT_IMPORT, pids), sut=None,  # type: ignore[arg-type]
                         items=[TrialItem(index=0, trial=0, row={"q": "a"})], threads=2,
                         on_record=_ignore, limits=TrialLimits(attempt_duration_s=5, load_s=1))
    assert time.monotonic() - started < 5
    assert pids and not any(_alive(p) for p in pids), "the stuck runtime was killed and reaped"


async def _ignore(rec: TrialRecord) -> None:
    return None


async def test_a_scorer_stuck_in_extract_errs_that_trial_only_and_leaves_no_runtime(tmp_path: Path) -> None:
    pids: list[int] = []
    records: list[TrialRecord] = []

    async def on_record(rec: TrialRecord) -> None:
        records.append(rec)

    rows = [{"q": "loop"}, {"q": "loop"}, {"q": "a"}, {"q": "b"}]  # both threads stuck, two trials queued
    await asyncio.wait_for(run_trials(
        spawn=_spawner(tmp_path, STUCK_IN_EXTRACT, pids), sut=None,  # type: ignore[arg-type]
        items=[TrialItem(index=i, trial=0, row=row) for i, row in enumerate(rows)], threads=2, on_record=on_record,
        limits=TrialLimits(attempt_duration_s=0.5)), 20)
    by_index = {r.index: r for r in records}
    assert sorted(by_index) == [0, 1, 2, 3]
    for i in (0, 1):
        assert by_index[i].outcome == "err" and by_index[i].meta["limit_exceeded"] == "attempt.duration"
    for i in (2, 3):
        assert by_index[i].outcome == "pass" and by_index[i].error is None
    assert len(pids) >= 2, "the runtime holding the stuck threads was replaced for the queued trials"
    assert not any(_alive(p) for p in pids), "no runtime outlives run_trials"


async def test_a_one_call_scorer_stuck_in_score_holds_up_its_runtime_until_the_ceiling_ends_it(tmp_path: Path) -> None:
    """A scorer that declares ``one_call`` scores on the runtime's reader (docs/launches.md): a ``score`` that never
    returns holds up the tasks started beside it, which the attempt ceiling ends with it; the tasks still queued
    are scored by a fresh runtime, and no runtime outlives the batch."""
    pids: list[int] = []
    records: list[TrialRecord] = []

    async def on_record(rec: TrialRecord) -> None:
        records.append(rec)

    rows = [{"q": "loop"}, {"q": "a"}, {"q": "b"}, {"q": "c"}, {"q": "d"}, {"q": "e"}]
    await asyncio.wait_for(run_trials(
        spawn=_spawner(tmp_path, STUCK_IN_ONE_CALL_SCORE, pids), sut=_AtOnce(),
        items=[TrialItem(index=i, trial=0, row=row) for i, row in enumerate(rows)], threads=2, on_record=on_record,
        limits=TrialLimits(attempt_duration_s=0.5)), 20)
    by_index = {r.index: r for r in records}
    assert sorted(by_index) == [0, 1, 2, 3, 4, 5]
    assert by_index[0].outcome == "err" and by_index[0].meta["limit_exceeded"] == "attempt.duration"
    # two slots: "loop" and "a" asked first, each reply freeing its slot for "b" and "c" before any scoring
    for i in (1, 2, 3):
        assert by_index[i].outcome == "pass" or by_index[i].meta["limit_exceeded"] == "attempt.duration"
    for i in (4, 5):
        assert by_index[i].outcome == "pass" and by_index[i].error is None
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


async def test_the_batch_ceiling_errs_what_is_left_and_ends(tmp_path: Path) -> None:
    pids: list[int] = []
    records: list[TrialRecord] = []

    async def on_record(rec: TrialRecord) -> None:
        records.append(rec)

    await asyncio.wait_for(run_trials(
        spawn=_spawner(tmp_path, STUCK_IN_EXTRACT, pids), sut=None,  # type: ignore[arg-type]
        items=[TrialItem(index=i, trial=0, row={"q": "loop"}) for i in range(3)], threads=1, on_record=on_record,
        limits=TrialLimits(attempt_duration_s=60, deadline=time.monotonic() + 1.0)), 20)
    assert len(records) == 3 and all(r.meta["limit_exceeded"] == "batch.duration" for r in records)
    assert not any(_alive(p) for p in pids)


def test_the_default_attempt_ceiling_applies_only_where_the_launch_set_none() -> None:
    ceilings = ScorerCeilings(attempt_duration_s=300, load_s=60, batch_duration_s=36_000)
    assert ceilings.task_limits(TaskLimits()).attempt_duration_s == 300
    assert ceilings.task_limits(TaskLimits(attempt_duration_s=900)).attempt_duration_s == 900, "a launch overrides"
    published = matrix(ceilings)
    assert published["defaults"]["attempt.duration"] == 300
    assert published["ceilings"] == {"scorer.load": 60, "batch.duration": 36_000}
    assert published["levels"]["attempt"] == ["duration"]
