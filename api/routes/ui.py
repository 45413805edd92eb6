"""The web dashboard: its static files (``api/web/``, no build step) and the two JSON reads it needs beyond REST.

The page is served by the API process under ``/ui/`` and holds the API key in the browser's session storage after
its sign-in page; every request it makes carries ``Authorization: Bearer``, the same auth as any client. Nothing is
loaded from another origin: the Content-Security-Policy sent with every file says so to the browser too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import RedirectResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from api.deps import AccountDep, StateDep
from api.errors import responses
from benchwright.schemas import RunSummary
from benchwright.store.dashboard import launch_datasets
from benchwright.store.runs import CURSOR_PATTERN, list_runs

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
"""Same origin only: no CDN, no inline script, and no page may frame the dashboard."""

router = APIRouter(prefix="/v1/ui", tags=["dashboard"])


class UiConfig(BaseModel):
    temporal_ui_url: str | None
    """Base URL of the Temporal UI (a run's page is ``{url}/namespaces/{namespace}/workflows/{run_id}``); null when
    the deployment did not configure one."""
    temporal_namespace: str


class SignIn(BaseModel):
    key_file: str | None
    """Where the embedded stack's API key is (its ``dev.json``); null on a deployment that names none."""


class DashboardRun(RunSummary):
    dataset: str
    """What the run was launched on (a URL or a path), as the launch gave it."""


class DashboardRunList(BaseModel):
    runs: list[DashboardRun]
    next_cursor: str | None


@router.get("/config", response_model=UiConfig, responses=responses())
def ui_config(account: AccountDep, state: StateDep) -> UiConfig:
    """What the dashboard links to: the Temporal UI's base URL and namespace."""
    url = state.settings.temporal_ui_url
    return UiConfig(temporal_ui_url=url.rstrip("/") if url else None,
                    temporal_namespace=state.settings.temporal_namespace)


@router.get("/signin", response_model=SignIn)
def ui_signin(state: StateDep) -> SignIn:
    """What the sign-in page tells a person who has no key yet (no key needed): the embedded stack's key file."""
    return SignIn(key_file=state.settings.signin_key_file)


@router.get("/runs", response_model=DashboardRunList, responses=responses(400))
async def dashboard_runs(account: AccountDep, state: StateDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
                         cursor: Annotated[str | None, Query(max_length=64,
                                                             json_schema_extra={"pattern": CURSOR_PATTERN})] = None,
                         ) -> DashboardRunList:
    """``GET /v1/runs`` with each run's dataset, for the dashboard's runs list."""
    page = await run_in_threadpool(list_runs, state.engine, account_id=account.id, limit=limit, cursor=cursor)
    datasets = await run_in_threadpool(launch_datasets, state.engine, account_id=account.id,
                                       run_ids=[r.id for r in page.runs])
    return DashboardRunList(runs=[DashboardRun(**r.model_dump(), dataset=datasets.get(r.id, "")) for r in page.runs],
                            next_cursor=page.next_cursor)


class _WebFiles(StaticFiles):
    """The dashboard's files with the CSP, and revalidated on every load (an upgraded API serves new files at once)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/ui/`` (``/`` redirects there) and its JSON reads under ``/v1/ui``."""
    app.include_router(router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    app.mount("/ui", _WebFiles(directory=WEB_DIR, html=True), name="ui")
