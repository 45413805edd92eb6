"""What a prompt launch resolved to, said before its progress bar (issue 22): Find's DatasetResolved, read from the
run's event log, so the person knows which dataset their words picked, and why, before any score appears."""

from __future__ import annotations

from typing import Any

from benchwright.events import DatasetResolved, PhaseCompleted, PhaseFailed, PhaseSkipped, PipelineFinished

TERMINAL = PipelineFinished.type_name()
_FIND_OVER = tuple(cls.type_name() for cls in (PhaseFailed, PhaseCompleted, PhaseSkipped))


def find_resolution(client: Any, run_id: str) -> dict[str, Any] | None:
    """The run's DatasetResolved data once Find has recorded it; None when Find ends without a choice (it failed:
    the run's summary gives the reason, with the nearest entries) or the run ends first.

    Follows the live event stream (SSE, resumed on a drop) only until Find is over, so the progress bar follows.
    """
    for event in client.stream_events(run_id):
        if event["type"] == DatasetResolved.type_name():
            return dict(event["data"])
        data = event.get("data") or {}
        if event["type"] == TERMINAL or (event["type"] in _FIND_OVER
                                         and data.get("phase") == "find"):
            return None
    return None


def resolution_lines(found: dict[str, Any]) -> list[str]:
    """``dataset: <name> (<source>)`` and ``why: ...``; a registered subset names its benchmark and impl."""
    lines = [f"dataset: {found['name']} ({found['source']})"]
    if found.get("benchmark_id"):
        lines.append(f"  registered benchmark {found['benchmark_id']}, subset {found.get('subset_id')}"
                     + (f", official impl {found['impl_id']}" if found.get("impl_id") else ""))
    lines.append(f"  why: {found['why']}")
    return lines
