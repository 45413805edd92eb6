"""A harness-bridge run's native log (inspect ``.eval``, lm-eval samples JSONL) as a download."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import responses
from benchwright.errors import NotFound
from benchwright.events import HarnessLogArtifact
from benchwright.harness.artifacts import artifact_path
from benchwright.store.events import read_events
from benchwright.store.runs import get_run

router = APIRouter(prefix="/v1/runs", tags=["runs"])
RunId = Annotated[str, Path(max_length=64)]
MAX_SCAN = 100_000
"""Events read to find the artifact (a bridge run's log is one event per sample plus a few)."""


def _latest_log(state: StateDep, run_id: str) -> HarnessLogArtifact:
    found: HarnessLogArtifact | None = None
    after = -1
    while after < MAX_SCAN:
        page = read_events(state.engine, run_id, after=after, limit=5000)
        if not page:
            break
        for row in page:
            if row.type == HarnessLogArtifact.type_name():
                found = HarnessLogArtifact.model_validate(row.data)
        after = page[-1].seq
    if found is None:
        raise NotFound(f"run {run_id} has no harness log (not a harness-bridge run, or its harness has not "
                       "finished)")
    return found


@router.get("/{run_id}/harness-log", response_class=FileResponse, responses=responses(404))
async def get_harness_log(run_id: RunId, account: AccountDep, state: StateDep) -> FileResponse:
    """Download the harness's own log of the run's latest sweep (inspect .eval, lm-eval samples JSONL)."""
    run = await run_in_threadpool(get_run, state.engine, run_id=run_id, account_id=account.id)
    artifact = await run_in_threadpool(_latest_log, state, run.id)
    path = artifact_path(state.settings.data_dir, run_id=run.id, digest=artifact.sha256)
    media = "application/zip" if artifact.filename.endswith(".eval") else "application/x-ndjson"
    return FileResponse(path, media_type=media, filename=artifact.filename)
