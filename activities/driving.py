"""What the Driver-calling phases (Find, Analyze, Atomize) share: the DriverContext bound to a phase scope, the
Driver's restart/review request turned into the phase's control, earlier phases' decisions read from the event log,
and the Workbench that runs candidate scorers in the work sandbox (``benchwright.drivers.base``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from activities.attach import live_proxy
from activities.common import Deps, PhaseScope, in_thread
from benchwright.data.dataset_access import DatasetAccess
from benchwright.drivers import DriverContext, DriverFailed, SampleResult
from benchwright.drivers.base import DriverPhase
from benchwright.drivers.catalog import (
    BUNDLED_CATALOG,
    Catalog,
    catalog_fetch,
    load_catalog,
)
from benchwright.events import AgentTextEvent, DatasetResolved, Event
from benchwright.llm.prices import prices_for
from benchwright.llm.sut import run_sut
from benchwright.runs.pipeline import PhaseControl, PhaseInput
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.lifecycle import Sandbox, put_runtime
from benchwright.scoring.host import (
    ScorerLoadError,
    TrialItem,
    TrialLimits,
    TrialRecord,
    check_impl,
    run_trials,
)
from benchwright.settings import Settings
from benchwright.store.db import reader
from benchwright.store.models import EventRow

CHECK_LIMITS = ExecLimits(cpu_seconds=60, memory_mb=1024, wall_seconds=120, max_processes=64)
SAMPLE_LIMITS = ExecLimits(cpu_seconds=300, memory_mb=2048, wall_seconds=600, max_processes=128)


_CATALOGS: dict[Path, tuple[tuple[int, int], Catalog]] = {}


def catalog_of(settings: Settings) -> Catalog:
    """The deployment's catalog (the bundled one unless ``catalog_path`` is set), parsed again only once its file
    changes: Fetch asks for it for every dataset, and parsing the bundled YAML took ~3 ms each time.

    Raises:
        InvalidInput: the file is missing or malformed (``load_catalog``).
    """
    path = Path(settings.catalog_path or BUNDLED_CATALOG)
    try:
        st = path.stat()
    except OSError:
        return load_catalog(path)  # raises, in plain words
    stamp = (st.st_mtime_ns, st.st_size)
    found = _CATALOGS.get(path)
    if found is None or found[0] != stamp:
        found = _CATALOGS[path] = (stamp, load_catalog(path))
    return found[1]


def latest_event(engine: Engine, run_id: str, event_type: type[Event]) -> dict[str, Any] | None:
    """The data of the run's last event of ``event_type`` (a decision an earlier phase recorded), or None."""
    with Session(reader(engine)) as session:
        row = session.exec(select(EventRow).where(EventRow.run_id == run_id, EventRow.type == event_type.type_name())
                           .order_by(col(EventRow.seq).desc()).limit(1)).first()
        return None if row is None else dict(row.data)


def driver_context(scope: PhaseScope, inp: PhaseInput, phase: DriverPhase, **fields: Any) -> DriverContext:
    """A DriverContext whose narration and events land with the phase's close (keys numbered in emission order,
    so a retried invocation that says the same things writes them once)."""
    counter = iter(range(1, 1_000_000))

    def narrate(text: str) -> None:
        scope.emit(f"driver:{next(counter)}", AgentTextEvent(phase=phase, text=text))

    def emit(event: Event) -> None:
        scope.emit(f"driver:{next(counter)}", event)

    return DriverContext(run_id=inp.run_id, phase=phase, invocation=inp.invocation, launch=inp.launch,
                         narrate=narrate, emit=emit, instructions=inp.instructions, **fields)


def take_request(ctx: DriverContext, scope: PhaseScope) -> bool:
    """Turn the Driver's restart/review request into the phase's control; True when there was one."""
    if ctx.request is None:
        return False
    scope.control = PhaseControl(kind=ctx.request.kind, reason=ctx.request.reason)
    return True


def no_decision(phase: str) -> DriverFailed:
    return DriverFailed(f"the Driver returned no {phase} decision and asked for neither a restart nor a review")


class SandboxWorkbench:
    """Runs candidate task_impl.py in the Atomize invocation's work sandbox (never in the worker): a load check,
    or sample rows end to end with model calls made by the host through the run's route (the one Attach probed).

    The sandbox is opened (``open_box``) on first use only: an Atomize whose load check is already known
    (``benchwright.scoring.load_checks``) and whose Driver tries no samples starts none."""

    def __init__(self, deps: Deps, open_box: Callable[[], Awaitable[Sandbox]], inp: PhaseInput) -> None:
        self.deps, self.inp = deps, inp
        self._open_box = open_box
        self.box: Sandbox | None = None

    async def sandbox(self) -> Sandbox:
        if self.box is None:
            self.box = await self._open_box()
        return self.box

    async def check(self, source: str) -> str | None:
        box = await self.sandbox()
        await put_runtime(box, source)
        try:
            await check_impl(spawn=box.spawn(box.scorer_env(), CHECK_LIMITS))
        except ScorerLoadError as exc:
            return str(exc)
        return None

    async def run_samples(self, source: str, rows: list[dict[str, Any]]) -> list[SampleResult]:
        error = await self.check(source)
        if error is not None:
            raise DriverFailed(error)
        settings, model = self.deps.settings, self.inp.launch.model
        proxy = await live_proxy(self.deps, run_id=self.inp.run_id, spec=model)
        sut = run_sut(model, prices=prices_for(model), proxy=proxy, concurrency=min(8, max(len(rows), 1)),
                      timeout_s=settings.sut_timeout_s, retries=settings.sut_retries)
        records: dict[int, TrialRecord] = {}

        async def on_record(record: TrialRecord) -> None:
            records[record.index] = record

        try:
            box = await self.sandbox()
            await run_trials(spawn=box.spawn(box.scorer_env(), SAMPLE_LIMITS),
                             items=[TrialItem(index=i, trial=0, row=row) for i, row in enumerate(rows)], sut=sut,
                             threads=min(8, max(len(rows), 1)), on_record=on_record,
                             limits=TrialLimits(attempt_duration_s=settings.default_attempt_duration_s,
                                                load_s=settings.scorer_load_s))
        finally:
            await sut.aclose()
        return [SampleResult(index=i, outcome=r.outcome, score=r.score, output=r.output, meta=r.meta, error=r.error)
                for i, r in sorted(records.items())]


async def require_event(deps: Deps, run_id: str, event_type: type[Event], *, needed_by: str) -> dict[str, Any]:
    data = await in_thread(latest_event, deps.engine, run_id, event_type)
    if data is None:
        raise DriverFailed(f"{needed_by} needs {event_type.type_name()} from an earlier phase, and the log has none")
    return data


async def resolved_source(deps: Deps, run_id: str) -> str:
    """The dataset Find resolved a prompt to (a launch without ``dataset``)."""
    return str((await require_event(deps, run_id, DatasetResolved, needed_by="Fetch"))["source"])


def fetch_source(source: str, access: DatasetAccess, settings: Settings) -> tuple[str, DatasetAccess]:
    """Fetch's reading of ``source``: a catalog entry's file under the catalog's rules, anything else as given."""
    return catalog_fetch(source, catalog=catalog_of(settings), access=access)


__all__ = ["SandboxWorkbench", "catalog_of", "driver_context", "fetch_source", "latest_event", "no_decision",
           "require_event", "resolved_source", "take_request"]
