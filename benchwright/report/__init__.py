"""The run report (issue 26): what every terminal run writes after its terminal event.

``write_run_report`` (called by the ``report_run`` activity, ``activities/report.py``) does, in order:

1. **Narration** (``benchwright.report.narration``): unless the run already has one, the configured narrator writes it;
   ``RunNarrated`` (and, for an LLM narrator, ``NarrationUsage``) is appended. A failing narrator is recorded in
   ``RunNarrated.fallback`` and the builtin text stands in.
2. **Files**: ``report.html`` (one self-contained page, ``benchwright.report.html``) and ``results.json``
   (lm-eval's layout, ``benchwright.report.results_json``) are built from the run view, the breakdown and the
   log, put in the deployment's blob store, and recorded as ``ReportFile`` events (name, media type, digest,
   size). ``GET /v1/runs/{id}/files/{name}`` and ``benchwright report`` download them.

Every append is keyed (``report:narration``, ``report:file:<name>``), so a retried activity writes nothing twice;
all of these are output events: none feeds the fingerprint (§6).
"""

from __future__ import annotations

import asyncio
import json

from pydantic import BaseModel
from sqlalchemy.engine import Engine

from benchwright.data.blobs import BlobStore
from benchwright.errors import Conflict
from benchwright.events import ReportFile, RunNarrated
from benchwright.report.facts import narration_facts, recorded_narration, report_facts
from benchwright.report.html import render_html
from benchwright.report.narration import NarrationFacts, NarratorConfig, narrate
from benchwright.report.results_json import results_json
from benchwright.schemas import RunView
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import get_run, run_view

__all__ = ["MEDIA_TYPES", "REPORT_HTML", "RESULTS_JSON", "ReportInput", "ReportResult", "write_run_report"]

REPORT_HTML = "report.html"
RESULTS_JSON = "results.json"
MEDIA_TYPES = {REPORT_HTML: "text/html; charset=utf-8", RESULTS_JSON: "application/json"}
"""The files a report writes, by name, with the media type they are served as."""


class ReportInput(BaseModel):
    run_id: str


class ReportResult(BaseModel):
    narrator: str
    fallback: str | None = None
    files: list[ReportFile]


async def write_run_report(*, engine: Engine, blobs: BlobStore, run_id: str,
                           narrator: NarratorConfig) -> ReportResult:
    """Narrate a terminal run and write its report files (module docstring).

    Raises:
        Conflict: the run is not over (``not_terminal``).
    """
    run = await asyncio.to_thread(get_run, engine, run_id=run_id)
    if run.finished_at is None:
        raise Conflict(f"run {run_id} has not finished; its report is written once it has", code="not_terminal")
    recorded = await asyncio.to_thread(recorded_narration, engine, run_id)
    known: tuple[RunView, NarrationFacts] | None = None
    if recorded is None:
        view = await asyncio.to_thread(run_view, engine, run)
        facts = await asyncio.to_thread(narration_facts, engine, run, view)
        narration = await narrate(facts, narrator)
        ours = RunNarrated(text=narration.text, narrator=narration.narrator, fallback=narration.fallback,
                           compared_with=facts.comparison.run_id if facts.comparison else None)
        events = []
        if narration.usage is not None:
            events.append(NewEvent.of(event_key(run_id, "report", "narration", "usage"), narration.usage))
        events.append(NewEvent.of(event_key(run_id, "report", "narration"), ours))
        if await asyncio.to_thread(append_events, engine, run_id, events) == len(events):
            recorded = ours
        else:  # another attempt's narration landed first: the report says that one
            recorded = await asyncio.to_thread(recorded_narration, engine, run_id)
            assert recorded is not None
        if recorded is ours and narration.usage is None:
            known = (view, facts)  # a narration without usage changes nothing they say: not read again
        else:
            run = await asyncio.to_thread(get_run, engine, run_id=run_id)  # its cost now includes the narration
    facts_all = await asyncio.to_thread(report_facts, engine, blobs, run=run, narration=recorded.text,
                                        narrator=recorded.narrator, known=known)
    files = {REPORT_HTML: render_html(facts_all),
             RESULTS_JSON: (json.dumps(results_json(facts_all), indent=2, ensure_ascii=False) + "\n").encode()}
    written = []
    for name, data in files.items():
        digest = await blobs.put(data)
        written.append(ReportFile(name=name, media_type=MEDIA_TYPES[name], digest=digest, size=len(data)))
    await asyncio.to_thread(append_events, engine, run_id,
                            [NewEvent.of(event_key(run_id, "report", "file", f.name), f) for f in written])
    return ReportResult(narrator=recorded.narrator, fallback=recorded.fallback, files=written)
