"""The run's narration and report, after its terminal event (issue 26): a thin adapter over
``benchwright.report.write_run_report``. The workflow calls it once the run is over and swallows its failure: a
report never blocks or fails the run (``workflows/run.py``, ``patched("run-report")``)."""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps
from benchwright.narration import NarratorConfig
from benchwright.report import ReportInput, ReportResult, write_run_report


class ReportActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.narrator = NarratorConfig.of(deps.settings)

    @activity.defn(name="report_run")
    async def report(self, inp: ReportInput) -> ReportResult:
        return await write_run_report(engine=self.deps.engine, blobs=self.deps.blobs, run_id=inp.run_id,
                                      narrator=self.narrator)
