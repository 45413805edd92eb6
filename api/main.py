"""The FastAPI facade: launches and reads runs. Settings are read here, once, and passed down."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors
from api.body_limit import BodyLimit
from api.deps import AppState
from api.routes import (
    account,
    admin,
    breakdown,
    codec,
    compare,
    forks,
    harness,
    operator,
    policy,
    registry,
    runs,
    schedules,
    ui,
)
from api.routes import files as report_files
from benchwright.security.crypto import load_keyring
from benchwright.settings import Settings
from benchwright.store.db import make_engine, migrate
from benchwright.store.policy import prepare_secrets


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.resolved_database_url())
        migrate(engine)
        prepare_secrets(engine, load_keyring(settings))  # refuses to start with encrypted secrets and no key
        app.state.bw = AppState(settings, engine)
        # Everything loaded by now (FastAPI, pydantic, SQLAlchemy, our modules: ~180,000 objects) lives as long as
        # the process; frozen, the cyclic collector stops re-scanning it in each full collection, which took ~100 ms
        # and came every few page reads of a big run's log, as likely as not inside a long poll's answer.
        gc.freeze()
        yield
        gc.unfreeze()  # an API served inside a longer-lived process (the tests') leaves its collector as it found it
        await app.state.bw.sse.close()  # stops the feeds' readers and ends any stream still open
        await app.state.bw.session_sse.close()
        app.state.bw.close()
        engine.dispose()

    app = FastAPI(title="Benchwright", version="0.1.0", lifespan=lifespan,
                  description="Run a model against a benchmark; get a comparable score with the full event log.")
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(runs.router)
    app.include_router(breakdown.router)
    app.include_router(harness.router)
    app.include_router(report_files.router)
    app.include_router(forks.router)
    app.include_router(account.router)
    app.include_router(policy.router)
    app.include_router(admin.router)
    app.include_router(codec.router)  # the Temporal codec server (admins; the embedded stack's UI)
    app.add_middleware(codec.CodecCors, ui_origin=settings.temporal_ui_url)
    app.include_router(registry.router)
    app.include_router(compare.router)
    app.include_router(schedules.router)
    app.include_router(operator.router)
    ui.install(app)  # the dashboard: /ui/ and /v1/ui

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, bool]:
        """Liveness: the API process is up."""
        return {"ok": True}

    return app
