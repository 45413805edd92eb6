"""A run's report files (issue 26): ``report.html`` and ``results.json``, as its ReportFile events name them.

Same visibility as every run read (``readable_run``: the owner's, or anyone's when unlisted or public; any other
run is a 404). The bytes come from the deployment's blob store under the event's digest, checked against it.
``report.html`` is served as an attachment with a sandboxing Content-Security-Policy: opened from the API's origin
anyway, its script runs in an opaque origin and can reach nothing (the dashboard's key stays out of its reach).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import responses
from benchwright.data.blobs import BlobError, BlobNotFound
from benchwright.errors import NotFound, Unavailable
from benchwright.events import ReportFile
from benchwright.registry.shape import readable_run
from benchwright.report.facts import report_files
from benchwright.report.html import CSP

router = APIRouter(prefix="/v1/runs", tags=["runs"])
RunId = Annotated[str, Path(max_length=64)]
FileName = Annotated[str, Path(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]


class RunFiles(BaseModel):
    """``GET /v1/runs/{id}/files``: the files the run's report wrote (empty while it runs or is being reported)."""

    run_id: str
    files: list[ReportFile]


@router.get("/{run_id}/files", response_model=RunFiles, responses=responses(404))
def list_files(run_id: RunId, account: AccountDep, state: StateDep) -> RunFiles:
    """The run's report files: name, media type, digest (sha256) and size of each."""
    run = readable_run(state.engine, run_id=run_id, account_id=account.id)
    return RunFiles(run_id=run.id, files=list(report_files(state.engine, run.id).values()))


@router.get("/{run_id}/files/{name}", response_class=Response, responses={
    **responses(404, 503), 200: {"content": {"text/html": {}, "application/json": {}},
                                 "description": "The file's bytes (their sha256 is the ReportFile's digest)"}})
async def get_file(run_id: RunId, name: FileName, account: AccountDep, state: StateDep) -> Response:
    """Download one of the run's report files (``report.html``, ``results.json``)."""
    from benchwright.sandbox.factory import blob_store  # the deployment's blob store, made on first use

    run = await run_in_threadpool(readable_run, state.engine, run_id=run_id, account_id=account.id)
    found = (await run_in_threadpool(report_files, state.engine, run.id)).get(name)
    if found is None:
        raise NotFound(f"run {run.id} has no file {name!r} (a run's report is written once it has finished; "
                       "GET /v1/runs/{id}/files lists what it has)")
    try:
        data = await blob_store(state.settings).get(found.digest)
    except BlobNotFound as exc:
        raise NotFound(f"the bytes of {name!r} ({found.digest}) are not in this deployment's blob store") from exc
    except BlobError as exc:
        raise Unavailable(f"the blob store could not return {name!r}: {exc}") from exc
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff",
               "ETag": f'"{found.digest}"', "Cache-Control": "private, max-age=0"}
    if found.media_type.startswith("text/html"):
        headers["Content-Security-Policy"] = "sandbox allow-scripts; " + CSP
    return Response(content=data, media_type=found.media_type, headers=headers)
