"""What every phase activity shares: dependencies, the phase's event bracket, and error translation.

A phase activity is an adapter: it opens the phase (PhaseStarted), calls the domain, and closes the phase with
its artifacts and PhaseCompleted in one transaction. Every event key is derived from (phase, invocation, what),
so a Temporal retry of the same invocation appends nothing twice.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from benchwright.errors import BenchwrightError
from benchwright.events import Event, PhaseCompleted, PhaseStarted
from benchwright.pipeline import PhaseInput
from benchwright.settings import Settings
from benchwright.store.events import NewEvent, append_events, event_key

T = TypeVar("T")


@dataclass
class Deps:
    engine: Engine
    settings: Settings

    def workdir(self, run_id: str) -> Path:
        path = self.settings.runs_dir() / run_id / "work"
        path.mkdir(parents=True, exist_ok=True)
        return path


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking store I/O off the worker's event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


@dataclass
class PhaseScope:
    inp: PhaseInput
    artifacts: list[tuple[str, Event]] = field(default_factory=list)

    def emit(self, what: str, event: Event) -> None:
        """Queue an event to land with PhaseCompleted (artifacts, driver narration)."""
        self.artifacts.append((what, event))


def failure(exc: BaseException) -> ApplicationError:
    """A permanent failure as Temporal should carry it: our error type's name, message and stack trace."""
    return ApplicationError(str(exc), {"stack_trace": traceback.format_exc()[-8000:]}, type=type(exc).__name__,
                            non_retryable=True)


@asynccontextmanager
async def phase(deps: Deps, inp: PhaseInput) -> AsyncIterator[PhaseScope]:
    """Bracket one phase invocation with PhaseStarted / artifacts + PhaseCompleted.

    Domain errors (``BenchwrightError``) are permanent: they fail the activity without retry. Anything else is
    treated as transient and retried by the workflow's RetryPolicy.
    """
    started = time.monotonic()
    key = (inp.phase, inp.invocation)
    await in_thread(append_events, deps.engine, inp.run_id,
                    [NewEvent.of(event_key(inp.run_id, *key, "started"), PhaseStarted(phase=inp.phase))])
    scope = PhaseScope(inp)
    try:
        yield scope
    except BenchwrightError as exc:
        raise failure(exc) from exc
    closing = [NewEvent.of(event_key(inp.run_id, *key, what), ev) for what, ev in scope.artifacts]
    closing.append(NewEvent.of(event_key(inp.run_id, *key, "completed"),
                               PhaseCompleted(phase=inp.phase, duration_ms=int((time.monotonic() - started) * 1000))))
    await in_thread(append_events, deps.engine, inp.run_id, closing)
    maybe_inject_fault(deps, inp.launch.metadata, inp.phase)


def maybe_inject_fault(deps: Deps, metadata: dict[str, Any], phase_name: str) -> None:
    """Tests only (``allow_fault_injection``): fail the first attempt of a phase after its events are committed,
    so the retry must append the same events again and the log must still hold each once."""
    fault = metadata.get("fault_injection") if deps.settings.allow_fault_injection else None
    if isinstance(fault, dict) and fault.get("phase") == phase_name and activity.info().attempt == 1:
        raise RuntimeError(f"injected fault after {phase_name} committed its events (attempt 1)")
