"""A stack the fault tests own part by part, so each part can be broken and brought back: a Temporal dev server
process (stopped by its pid, started again on the same port and database file), a private PostgreSQL instance
(``initdb``/``pg_ctl`` from the machine's binaries, on a free port in a temp dir: never the shared one), a worker
process, and the API in the test's own event loop."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.main import create_app
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, port_open, temporal_binary
from benchwright.stack.temporal_ui import dev_server_args
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.models import EventRow, Run
from tests.conftest import serve_app

ROOT = Path(__file__).resolve().parents[2]


async def wait_for(check: Any, what: str, timeout_s: float = 60.0, every_s: float = 0.05) -> Any:
    """Poll ``check()`` (sync or async) until it returns something truthy; fail naming ``what`` after the bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert loop.time() < deadline, f"{what}: not reached within {timeout_s:g} s"
        await asyncio.sleep(every_s)


class TemporalDev:
    """``temporal server start-dev`` on a fixed port and database file, owned by the test."""

    def __init__(self, work: Path, *, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.db = work / "temporal.db"
        self.log = work / "temporal.log"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port), "--headless",
                 "--db-filename", str(self.db), "--log-level", "error", *dev_server_args(), *self.extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        await wait_for(lambda: port_open("127.0.0.1", self.port), "the Temporal dev server's port", 60)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class PrivatePostgres:
    """A PostgreSQL instance of our own (trust auth on loopback) in ``work``; run as the ``postgres`` user when we
    are root (initdb refuses root)."""

    def __init__(self) -> None:
        bindir = postgres_bin()
        assert bindir is not None
        self.bin = bindir
        # Its own directory under /tmp: pytest's temp dirs are 0700 root, which the postgres user cannot enter.
        self.dir = Path(tempfile.mkdtemp(prefix="bw-fault-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://bw@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, *cmd: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.getuid() == 0 else list(cmd)

    def init(self) -> None:
        if os.getuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.dir.chmod(0o700)
        subprocess.run(self._as_owner(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "bw",
                                      "--no-sync", "-E", "UTF8"), check=True, capture_output=True, timeout=120)

    def ctl(self, action: str, *extra: str) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(self._as_owner(str(self.bin / "pg_ctl"), action, "-D", str(self.data), "-w", "-t", "60",
                                      "-l", str(self.dir / "pg.log"), "-o", opts, *extra),
                       check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.ctl("start")

    def restart(self) -> None:
        """A fast restart: every connection is cut, the server is down for the time it takes to come back."""
        self.ctl("restart", "-m", "fast")

    def stop(self) -> None:
        subprocess.run(self._as_owner(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate",
                                      "-w"), capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class FaultStack:
    settings: Settings
    engine: Engine
    temporal: TemporalDev
    api_url: str
    api_key: str
    work: Path
    env: dict[str, str]
    worker: subprocess.Popen[bytes] | None = None
    _server: Any = None
    _serve: asyncio.Task[None] | None = None
    launched: list[str] = field(default_factory=list)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.api_url, headers={"Authorization": f"Bearer {self.api_key}"},
                                 timeout=60)

    def start_worker(self) -> None:
        log = (self.work / "worker.log").open("ab")
        self.worker = subprocess.Popen([sys.executable, "-m", "benchwright.cli", "worker"], env=self.env,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT)
        log.close()

    def stop_worker(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(60)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait(10)
        self.worker = None

    async def launch(self, body: dict[str, Any]) -> str:
        async with self.http() as http:
            resp = await http.post("/v1/runs", json=body)
        assert resp.status_code == 201, resp.text
        run_id: str = resp.json()["id"]
        self.launched.append(run_id)
        return run_id

    def runs(self) -> dict[str, Run]:
        with Session(self.engine) as session:
            return {r.id: r for r in session.execute(select(Run)).scalars()}

    def results(self, run_id: str) -> Counter[tuple[int, int]]:
        """How many MaterializeTaskResult events the log holds per (index, trial)."""
        with Session(self.engine) as session:
            rows = session.execute(select(EventRow.data).where(EventRow.run_id == run_id,
                                                               EventRow.type == "MaterializeTaskResult")).scalars()
            return Counter((int(d["index"]), int(d["trial"])) for d in rows)

    def finished(self, run_ids: list[str]) -> bool:
        runs = self.runs()
        return all(runs[r].finished_at is not None for r in run_ids)

    async def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            assert self._serve is not None
            await self._serve
        self.stop_worker()
        self.temporal.stop()
        self.engine.dispose()


async def start_stack(work: Path, *, model_hosts: list[str], database_url: str | None = None,
                      temporal_extra: tuple[str, ...] = (), dataset_hosts: tuple[str, ...] = (),
                      **settings_env: str) -> FaultStack:
    """Temporal, a worker process and the API on ``work`` (the data directory is ``work/data``, which the caller
    may have mounted). ``dataset_hosts``: loopback ``host:port`` dataset servers the operator allows
    (``egress_internal_allowed``)."""
    temporal = TemporalDev(work, extra=temporal_extra)
    await temporal.start()
    data_dir = work / "data"
    data_dir.mkdir(exist_ok=True)
    env = {**os.environ, "BENCHWRIGHT_DATA_DIR": str(data_dir), "BENCHWRIGHT_TASK_QUEUE": f"bw-fault-{uuid.uuid4()}",
           "BENCHWRIGHT_TEMPORAL_ADDRESS": temporal.address, "BENCHWRIGHT_ALLOW_LOCAL_PATHS": "true",
           "BENCHWRIGHT_MODEL_INTERNAL_ALLOWED": json.dumps(model_hosts), "BENCHWRIGHT_PROXY_LINGER_S": "2",
           "BENCHWRIGHT_DEFAULT_ATTEMPT_DURATION_S": "30", "PYTHONPATH": str(ROOT),
           **({"BENCHWRIGHT_DATABASE_URL": database_url} if database_url else {}),
           **({"BENCHWRIGHT_EGRESS_INTERNAL_ALLOWED": json.dumps(list(dataset_hosts))} if dataset_hosts else {}),
           **{f"BENCHWRIGHT_{k.upper()}": v for k, v in settings_env.items()}}
    settings = Settings(data_dir=data_dir, task_queue=env["BENCHWRIGHT_TASK_QUEUE"], allow_local_paths=True,
                        temporal_address=temporal.address, database_url=database_url,
                        model_internal_allowed=list(model_hosts), proxy_linger_s=2.0,
                        egress_internal_allowed=list(dataset_hosts),
                        **{k: v for k, v in settings_env.items()})  # type: ignore[arg-type]
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    _, key = create_account(engine, name="fault-tester", balance_usd=1000.0, local_paths=True)
    stack = FaultStack(settings=settings, engine=engine, temporal=temporal, api_url="", api_key=key, work=work,
                       env=env)
    stack.start_worker()
    port = free_port()
    stack._server, stack._serve = await serve_app(create_app(settings), port)
    stack.api_url = f"http://127.0.0.1:{port}"
    return stack


def write_dataset(path: Path, n: int) -> dict[str, str]:
    answers = {}
    with path.open("w") as f:
        for i in range(n):
            q = f"What is {i} plus {i + 7}? (item {i})"
            answers[q] = str(2 * i + 7)
            f.write(json.dumps({"question": q, "answer": answers[q]}) + "\n")
    return answers


def exactly_once(counts: Counter[tuple[int, int]], tasks: int, k: int = 1) -> None:
    """Every (index, trial) of ``tasks`` × ``k`` recorded once: nothing lost, nothing doubled."""
    doubled = {key: n for key, n in counts.items() if n != 1}
    assert not doubled, f"recorded more than once: {sorted(doubled)[:10]}"
    missing = {(i, t) for i in range(tasks) for t in range(k)} - set(counts)
    assert not missing, f"{len(missing)} results lost, e.g. {sorted(missing)[:10]}"
