"""Event-log activities the workflow itself needs: its own markers (pipeline start, skips, phase failures) and
the run's terminal status."""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, in_thread, maybe_stall_local, workflow_events
from benchwright.proxy.revocation import revoke_route
from benchwright.runs.pipeline import EventsInput, FinishInput, HaltInput, ResumeInput
from benchwright.store.control import clear_halt, finish_halted, halt_run
from benchwright.store.events import append_events
from benchwright.store.runs import finish_run


class RunLogActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="record_events")
    async def record_events(self, inp: EventsInput) -> int:
        return await in_thread(append_events, self.deps.engine, inp.run_id, workflow_events(inp.run_id, inp.events))

    @activity.defn(name="finish_run")
    async def finish(self, inp: FinishInput) -> None:
        """The run's end in one transaction: what the workflow left pending (``preface``), the model route's
        revocation when asked (``revoke_route``), then the terminal event and the row's status."""
        before = workflow_events(inp.run_id, inp.preface)
        if inp.revoke_route:
            before += await in_thread(revoke_route, self.deps.settings, self.deps.run_dir(inp.run_id), inp.run_id)
        await in_thread(finish_run, self.deps.engine, run_id=inp.run_id, status=inp.status, error=inp.error,
                        before=before)
        await maybe_stall_local(self.deps, {"fault_injection": inp.fault_injection}, "finish")


class ControlActivities:
    """The run row's halt flag, written only on the workflow's behalf (so row and workflow state agree)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="halt_run")
    async def halt(self, inp: HaltInput) -> bool:
        return await in_thread(halt_run, self.deps.engine, run_id=inp.run_id, reason=inp.reason, key=inp.key,
                               replace=inp.replace)

    @activity.defn(name="clear_halt")
    async def clear(self, inp: ResumeInput) -> bool:
        return await in_thread(clear_halt, self.deps.engine, run_id=inp.run_id, key=inp.key,
                               resolution=inp.resolution)

    @activity.defn(name="finish_halted")
    async def finish_halted(self, inp: FinishInput) -> None:
        await in_thread(finish_halted, self.deps.engine, run_id=inp.run_id)
