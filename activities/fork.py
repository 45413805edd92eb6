"""Fork: the pre-pipeline phase of a forked launch (§2, §10). It reads the fork request, has the Driver interpret
its prose (the builtin driver's vocabulary, ``benchwright.runs.forks.VOCABULARY``), settles the rewind point, and seeds
the run from the parent: the parent's events before the rewind point copied with ``inherited_from``, its
work-directory state and snapshot ids, then PhaseStarted(fork), ForkDecided and PhaseCompleted(fork), all in one
transaction so the copies follow RunLaunched directly.

The parent's state comes from the store, on any worker: its events (what Fetch fetched, the analysis, the snapshot
ids) are copied into the fork's log, and its work files are restored from its WorkFilesRecorded and the blob store.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from activities.common import Deps, failure, heartbeating, in_thread
from benchwright.errors import BenchwrightError
from benchwright.events import ForkDecided, PhaseCompleted, PhaseStarted
from benchwright.runs import handoff
from benchwright.runs.forks import (
    check_overrides,
    copy_workdir,
    cut_point,
    default_rewind,
    inherited_copies,
    inherited_files,
    inherited_phases,
    interpret_instructions,
    model_binding,
    tasks_total,
)
from benchwright.runs.pipeline import ForkDecision, ForkPhaseInput
from benchwright.runs.workdirs import holding
from benchwright.schemas import PHASES, LaunchRequest
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.forks import read_until_phase, seed_fork_log


class ForkActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="fork")
    async def fork(self, inp: ForkPhaseInput) -> ForkDecision:
        started = time.monotonic()
        try:
            async with heartbeating():  # like every phase (activities.common.phase): a dead worker's fork is retried
                return await in_thread(self._decide_and_seed, inp, started)
        except BenchwrightError as exc:
            await in_thread(append_events, self.deps.engine, inp.run_id, [NewEvent.of(
                event_key(inp.run_id, "fork", inp.invocation, "started"), PhaseStarted(phase="fork"))])
            raise failure(exc) from exc

    def _decide_and_seed(self, inp: ForkPhaseInput, started: float) -> ForkDecision:
        spec, launch = inp.fork, inp.launch
        notes: list[str] = []
        names = list(spec.overrides)
        if spec.instructions:
            said = interpret_instructions(spec.instructions, current_model=launch.model)
            notes = said.notes
            launch = launch.model_copy(update={k: v for k, v in (("dataset", said.dataset), ("model", said.model))
                                               if v is not None})
            names += [n for n in said.overrides() if n not in names]
            asked = [r for r in (spec.rewind_to, said.rewind_to) if r]
        else:
            asked = [spec.rewind_to] if spec.rewind_to else []
        if spec.kind == "replay":
            rewind = "materialize"
        else:
            rewind = min([*asked, default_rewind(names)], key=PHASES.index) if names or not asked else \
                min(asked, key=PHASES.index)
            if asked and rewind != min(asked, key=PHASES.index):
                notes.append(f"rewinding to {rewind} instead of {min(asked, key=PHASES.index)}: "
                             f"{', '.join(names)} take effect there")
        check_overrides(rewind_to=rewind, overrides=names, kind=spec.kind)
        inherited = inherited_phases(rewind)
        parent_log = read_until_phase(self.deps.engine, spec.parent_run_id, phase=rewind)
        cut = cut_point(parent_log, rewind)
        copies = inherited_copies(parent_log, parent_run_id=spec.parent_run_id, cut=cut,
                                  rebind=model_binding(launch.model) if "attach" in inherited else None)
        carried = inherited_files(inherited=inherited, events=parent_log, cut=cut,
                                  parent_files=handoff.latest_files(self.deps.engine, spec.parent_run_id))
        # The parent's files: a cache on any host (restored from the blob store), held so that this worker's sweep of
        # ended runs' work directories (benchwright.runs.workdirs) does not remove it while it is copied.
        with holding(self.deps.run_dir(spec.parent_run_id)):
            parent_dir = self.deps.workdir(spec.parent_run_id)
            asyncio.run(handoff.restore(engine=self.deps.engine, blobs=self.deps.blobs, run_id=spec.parent_run_id,
                                        workdir=parent_dir))  # this runs in a worker thread (in_thread)
            copy_workdir(parent=parent_dir, fork=self.deps.workdir(inp.run_id), names=carried)
        key = ("fork", inp.invocation)
        files = asyncio.run(handoff.publish(engine=self.deps.engine, blobs=self.deps.blobs, run_id=inp.run_id,
                                            phase="fork", invocation=inp.invocation,
                                            workdir=self.deps.workdir(inp.run_id)))
        own = [
            NewEvent.of(event_key(inp.run_id, *key, "started"), PhaseStarted(phase="fork")),
            NewEvent.of(event_key(inp.run_id, *key, "work-files"), files),
            NewEvent.of(event_key(inp.run_id, *key, "decided"), ForkDecided(
                parent_run_id=spec.parent_run_id, rewind_to=rewind, inherited=inherited,
                overrides=_shown(launch, names, spec.scorer_instructions), interpreted=notes)),
            NewEvent.of(event_key(inp.run_id, *key, "completed"), PhaseCompleted(
                phase="fork", duration_ms=int((time.monotonic() - started) * 1000))),
        ]
        updates: dict[str, Any] = {}
        if launch != inp.launch:  # prose changed the launch: the run row says what the run actually runs
            updates = {"model": launch.model.model_dump(mode="json", exclude_none=True),
                       "launch": launch.model_dump(mode="json", exclude_none=True)}
        seed_fork_log(self.deps.engine, run_id=inp.run_id, copies=copies, own=own, run_updates=updates)
        return ForkDecision(parent_run_id=spec.parent_run_id, rewind_to=rewind, inherited=inherited, launch=launch,
                            tasks_total=tasks_total(copies) if "analyze" in inherited else None,
                            model_proxy="attach" in inherited,  # every run has a proxy route (issue 12)
                            instructions={"atomize": spec.scorer_instructions} if spec.scorer_instructions else {})


def _shown(launch: LaunchRequest, names: list[str], scorer_instructions: str | None) -> dict[str, Any]:
    """The overrides in force, as the decision event shows them (task_impl by its sha256, not its source)."""
    shown: dict[str, Any] = {}
    for name in names:
        if name == "task_impl" and launch.task_impl is not None:
            shown[name] = {"sha256": hashlib.sha256(launch.task_impl.encode()).hexdigest()}
        elif name == "scorer_instructions":
            shown[name] = scorer_instructions
        else:
            value: Any = getattr(launch, name, None)
            shown[name] = value.model_dump(mode="json", exclude_none=True) if isinstance(value, BaseModel) else value
    return shown
