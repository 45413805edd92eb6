"""The run's narration and report, after its terminal event (issue 26): a thin adapter over
``benchwright.report.write_run_report``. The workflow calls it once the run is over and swallows its failure: a
report never blocks or fails the run (``workflows/run.py``, ``patched("run-report")``)."""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.common import Deps
from benchwright.report import ReportInput, ReportResult, write_run_report
from benchwright.report.narration import NarratorConfig


class ReportActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.narrator = NarratorConfig.of(deps.settings)

    @activity.defn(name="report_run")
    async def report(self, inp: ReportInput) -> ReportResult:
        beat = asyncio.create_task(_heartbeat())
        try:
            return await write_run_report(engine=self.deps.engine, blobs=self.deps.blobs, run_id=inp.run_id,
                                          narrator=self.narrator)
        finally:
            beat.cancel()


HEARTBEAT_EVERY_S = 2.0


async def _heartbeat() -> None:
    """Beat while the report is written, so a worker killed mid-report is noticed within the workflow's
    heartbeat timeout (10 s) and another worker takes it over, instead of the run waiting out the attempt's
    10-minute bound (measured in tests/cli/test_stack.py: a SIGKILL right after the terminal event)."""
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY_S)
