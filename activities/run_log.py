"""Event-log activities the workflow itself needs: its own markers (pipeline start, skips, phase failures) and
the run's terminal status."""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, in_thread
from benchwright.events import EVENT_TYPES
from benchwright.pipeline import EventsInput, FinishInput
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import finish_run


class RunLogActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="record_events")
    async def record_events(self, inp: EventsInput) -> int:
        events = [
            NewEvent.of(event_key(inp.run_id, e["key"]), EVENT_TYPES[e["type"]].model_validate(e["data"]))
            for e in inp.events
        ]
        return await in_thread(append_events, self.deps.engine, inp.run_id, events)

    @activity.defn(name="finish_run")
    async def finish(self, inp: FinishInput) -> None:
        await in_thread(finish_run, self.deps.engine, run_id=inp.run_id, status=inp.status, error=inp.error)
