"""``benchwright up``: the embedded stack on one machine — Temporal dev server, worker, API — supervised.

Children are started on loopback. The worker is restarted if it dies; if Temporal or the API dies, the whole stack
stops (a half-up stack is worse than a clear failure). When everything answers, ``DIR/dev.json`` says where:
``{api_url, temporal_address, temporal_ui_url, api_key}``.

Nothing outlives the stack. Every child is recorded in the data directory's process registry
(``benchwright.stack.procreg``) with its start time. On Ctrl-C/SIGTERM the worker is stopped first (it cancels its
activities, kills its sandboxes, stops its model proxies), then the API and Temporal, each escalated to SIGKILL
within ``shutdown_timeout_s``; then a sweep of the data directory (``benchwright.stack.teardown.reap_stack``) kills any
process, proxy or sandbox still left. A SIGKILL of ``up`` runs none of that: the same sweep runs at the next start,
before anything is served. ``DIR/stack.lock`` (an flock held while ``up`` runs) keeps a second ``up`` from
sweeping away a live stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from benchwright.errors import Unavailable
from benchwright.security.payload_codec import embedded_stack_codec
from benchwright.stack.devstack import port_open, temporal_binary
from benchwright.stack.procreg import Kind, ProcEntry, ProcessRegistry
from benchwright.stack.teardown import reap_stack
from benchwright.stack.temporal_ui import dev_server_args

READY_TIMEOUT_S = 60.0
DEV_ACCOUNT = "dev"


API_KEEP_ALIVE_S = 65
"""How long the API keeps an idle connection open (uvicorn's ``--timeout-keep-alive``; its default is 5 s). It must
outlast its clients' own idle expiry: httpx (the SDK, the CLI) drops an idle connection after 5 s, and with both at 5 s
a request sent on a connection idle for 5 s raced the server's close and failed (``httpx.ReadError``: a
launch-and-wait whose run ended ~5 s after its last poll). Browsers keep theirs up to ~60 s."""


@dataclass
class StackConfig:
    data_dir: Path
    api_port: int = 8700
    temporal_port: int = 7233
    ui_port: int = 8233
    host: str = "127.0.0.1"
    shutdown_timeout_s: float = 30.0
    """Stopping the stack takes at most this long (plus a few seconds of SIGKILL sweep): two thirds for the worker
    to cancel its activities and release its sandboxes and proxies, the rest for the API and Temporal."""

    @property
    def temporal_address(self) -> str:
        return f"{self.host}:{self.temporal_port}"

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def child_env(self) -> dict[str, str]:
        return {**os.environ, "BENCHWRIGHT_DATA_DIR": str(self.data_dir),
                "BENCHWRIGHT_TEMPORAL_ADDRESS": self.temporal_address,
                "BENCHWRIGHT_TEMPORAL_UI_URL": self.ui_url,
                "BENCHWRIGHT_SIGNIN_KEY_FILE": str(self.data_dir / "dev.json"), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                # one machine, one user: the embedded stack may read datasets from local paths
                "BENCHWRIGHT_ALLOW_LOCAL_PATHS": os.environ.get("BENCHWRIGHT_ALLOW_LOCAL_PATHS", "true"),
                "BENCHWRIGHT_TEMPORAL_UI_CODEC": "true"}  # the UI's codec path (api/routes/codec.py)



def _write_whole(path: Path, text: str) -> None:
    """Write ``path`` (owner-only) so that a reader finds its old or its new content, never a part: beside it, then
    renamed over it."""
    tmp = path.with_suffix(".part")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)

@dataclass
class Child:
    name: Kind
    argv: list[str]
    log: Path
    env: dict[str, str]
    registry: ProcessRegistry
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.registry.record(kind=self.name, pid=self.proc.pid, group=True, owner=os.getpid())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()

    def wait_or_kill(self, deadline: float) -> bool:
        """Wait for the child until ``deadline`` (monotonic), then SIGKILL its process group; whether it had to."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
            return False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return True


def stack_holder(data_dir: Path) -> str | None:
    """The PID of the ``benchwright up`` running on ``data_dir`` (it holds ``DIR/stack.lock``), else None."""
    path = data_dir / "stack.lock"
    if not path.exists():
        return None
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            return lock.read().strip() or "?"
        fcntl.flock(lock, fcntl.LOCK_UN)
    return None


def dashboard_url(api_url: str) -> str:
    """Where the web dashboard is served (``api.routes.ui``: the API's ``/ui/``)."""
    return f"{api_url.rstrip('/')}/ui/"


def _ensure_dev_key(data_dir: Path) -> str:
    """The dev account's API key, created on first start and kept (0600) for later starts."""
    from benchwright.errors import Conflict, Unauthorized
    from benchwright.settings import Settings
    from benchwright.store.accounts import authenticate, create_account, create_key
    from benchwright.store.db import make_engine, migrate

    settings = Settings(data_dir=data_dir)
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    key_file = data_dir / "dev-account.json"
    _make_curator(engine)  # a stack made before self-curation existed: its own account gets it at the next start
    if key_file.exists():
        key = json.loads(key_file.read_text())["api_key"]
        try:
            authenticate(engine, key)
            return str(key)
        except Unauthorized:
            pass
    try:
        # The embedded stack's own account may read local datasets (accounts added later may not by default), and
        # curate its own private benchmarks (promote their impls official): one user needs no second admin account.
        _, key = create_account(engine, name=DEV_ACCOUNT, balance_usd=settings.initial_balance_usd, local_paths=True,
                                curator=True)
    except Conflict:
        key = create_key(engine, account_name=DEV_ACCOUNT)
    key_file.write_text(json.dumps({"account": DEV_ACCOUNT, "api_key": key}))
    key_file.chmod(0o600)
    engine.dispose()
    return key


def _make_curator(engine: Any) -> None:
    """The stack's own account curates its own private benchmarks (``Account.curator``)."""
    from sqlalchemy import update
    from sqlmodel import Session

    from benchwright.store.models import Account

    with Session(engine) as session:
        session.execute(update(Account).where(Account.name == DEV_ACCOUNT).values(curator=True))  # type: ignore[arg-type]
        session.commit()


def _wait_for(what: str, check: Any, child: Child, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            tail = child.log.read_text(errors="replace")[-2000:] if child.log.exists() else ""
            raise Unavailable(f"{what} exited during start-up; its log ({child.log}) ends with:\n{tail}")
        if check():
            return
        time.sleep(0.05)
    raise Unavailable(f"{what} did not become ready within {timeout:.0f} s (log: {child.log})")


def _api_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


class Stack:
    def __init__(self, cfg: StackConfig, *, say: Any = print) -> None:
        self.cfg = cfg
        self.say = say
        logs = cfg.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = cfg.child_env()
        self.registry = ProcessRegistry(cfg.data_dir)
        self._lock: IO[str] | None = None
        self._me: ProcEntry | None = None
        self.temporal = Child("temporal", [
            temporal_binary(), "server", "start-dev", "--ip", cfg.host, "--port", str(cfg.temporal_port),
            "--ui-port", str(cfg.ui_port), "--db-filename", str(cfg.data_dir / "temporal.db"), "--log-level", "warn",
            # WAL: every workflow task is a few writes to this file; with the default rollback journal each one
            # paid an fsync (~4 ms per workflow task, ~90 ms of a 0.6 s run). A crash of the machine (not of the
            # process) may lose the last transactions, as with our own store.
            "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
            *dev_server_args(),
            # the deployment key (made on first start) encrypts secrets and payloads; the UI decodes through the API
            *embedded_stack_codec(cfg.data_dir, cfg.api_url)], logs / "temporal.log", env, self.registry)
        # the one worker of this machine's stack keeps its threads on one CPU (benchwright.stack.cpu)
        worker_env = {**env, "BENCHWRIGHT_WORKER_CPU": env.get("BENCHWRIGHT_WORKER_CPU", "auto")}
        self.worker = Child("worker", [sys.executable, "-m", "benchwright.cli", "worker",
                                       "--data-dir", str(cfg.data_dir)], logs / "worker.log", worker_env,
                            self.registry)
        self.api = Child("api", [sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory",
                                 "--host", cfg.host, "--port", str(cfg.api_port), "--log-level", "warning",
                                 "--no-access-log", "--timeout-keep-alive", str(API_KEEP_ALIVE_S)],
                            logs / "api.log", env, self.registry)
        self.dev_json = cfg.data_dir / "dev.json"

    def _take_lock(self) -> None:
        """Hold ``DIR/stack.lock`` while this supervisor lives (the kernel drops it when the process dies, however
        it dies); another ``up`` on the same data directory fails here instead of sweeping this stack away."""
        lock = (self.cfg.data_dir / "stack.lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            lock.close()
            raise Unavailable(f"another `benchwright up` (pid {holder}) is running on {self.cfg.data_dir}") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _sweep(self, when: str) -> None:
        """Stop whatever this data directory's stack left running (see ``reap_stack``)."""
        timeout = self.cfg.shutdown_timeout_s
        reaped = reap_stack(data_dir=self.cfg.data_dir, workers_timeout_s=timeout * 2 / 3,
                            others_timeout_s=timeout / 3)
        if reaped:
            self.say(f"{when}: stopped what was left of the stack: {reaped.describe()}")

    def start(self) -> dict[str, str]:
        cfg = self.cfg
        self._take_lock()
        self._sweep("before starting")  # a stack killed with SIGKILL left its children, proxies and sandboxes
        self._me = self.registry.record(kind="supervisor", pid=os.getpid(), group=False)
        for name, port in (("Temporal", cfg.temporal_port), ("Temporal UI", cfg.ui_port), ("API", cfg.api_port)):
            if port_open(cfg.host, port):
                raise Unavailable(f"port {port} for the {name} is already in use; "
                                  "pick another with the --*-port options")
        self.dev_json.unlink(missing_ok=True)
        self.say(f"starting Temporal dev server on {cfg.temporal_address} (UI {cfg.ui_url})")
        self.temporal.start()
        _wait_for("the Temporal dev server", lambda: port_open(cfg.host, cfg.temporal_port), self.temporal)
        key = _ensure_dev_key(cfg.data_dir)
        self.say("starting worker and API")
        self.worker.start()
        self.api.start()
        _wait_for("the API", lambda: _api_ready(cfg.api_url), self.api)
        dev = {"api_url": cfg.api_url, "temporal_address": cfg.temporal_address, "temporal_ui_url": cfg.ui_url,
               "api_key": key}
        # dev.json says the stack is up, so it comes last: a reader that waited for it finds pids.json there too (a
        # bench read pids.json right after dev.json appeared and found none).
        self._write_pids()
        _write_whole(self.dev_json, json.dumps(dev, indent=2))
        return dev

    def _write_pids(self) -> None:
        """``DIR/pids.json``: each child's PID, for operators (and tests) that need to find one."""
        pids = {c.name: c.proc.pid for c in (self.temporal, self.worker, self.api) if c.proc is not None}
        # Rewritten each time the supervisor restarts a child: a reader must never find it half-written.
        _write_whole(self.cfg.data_dir / "pids.json", json.dumps(pids))

    def supervise(self, stop: Any) -> int:
        """Watch the children until ``stop()`` is true; returns the exit status."""
        while not stop():
            if not self.temporal.alive() or not self.api.alive():
                dead = "Temporal" if not self.temporal.alive() else "the API"
                self.say(f"{dead} exited; stopping the stack (logs in {self.cfg.data_dir / 'logs'})")
                return 1
            if not self.worker.alive():
                self.worker.restarts += 1
                self.say(f"worker exited (code {self.worker.proc.returncode if self.worker.proc else '?'}); "
                         f"restarting it (restart #{self.worker.restarts})")
                self.worker.start()
                self._write_pids()
            time.sleep(0.2)
        return 0

    def _killed(self, child: Child, killed: bool, within_s: float) -> None:
        if killed:
            # A worker writes where its shutdown stood to its log after worker.SLOW_SHUTDOWN_S.
            self.say(f"the {child.name} did not stop within {within_s:.0f} s of SIGTERM: killed it (SIGKILL); its "
                     f"log: {child.log}")

    def stop(self) -> None:
        """Worker first (it releases its sandboxes and proxies while Temporal and the store are still up), then
        the API and Temporal, all within ``shutdown_timeout_s``; then the sweep, which SIGKILLs any leftover."""
        if self._lock is None:  # never started: the data directory belongs to another `up`
            return
        self.dev_json.unlink(missing_ok=True)
        (self.cfg.data_dir / "pids.json").unlink(missing_ok=True)
        started = time.monotonic()
        timeout = self.cfg.shutdown_timeout_s
        self.worker.terminate()
        self._killed(self.worker, self.worker.wait_or_kill(started + timeout * 2 / 3), timeout * 2 / 3)
        for child in (self.api, self.temporal):
            child.terminate()
        for child in (self.api, self.temporal):
            self._killed(child, child.wait_or_kill(started + timeout), timeout)
        self._sweep("stopping")
        if self._me is not None:
            self.registry.forget(self._me)
        self._lock.close()
        self._lock = None


def run_up(cfg: StackConfig, *, say: Any = print) -> int:
    """Start the stack, supervise it until SIGINT/SIGTERM, stop every child. Returns the exit status."""
    stopping = False

    def _on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    stack = Stack(cfg, say=say)
    try:
        dev = stack.start()
        say(f"Benchwright is up. Dashboard {dashboard_url(dev['api_url'])}  API {dev['api_url']}  "
            f"Temporal UI {dev['temporal_ui_url']}\n"
            f"dev account key and addresses: {stack.dev_json}  (Ctrl-C stops everything)")
        return stack.supervise(lambda: stopping)
    except Unavailable as exc:
        say(f"error: {exc}")
        return 1
    finally:
        stack.stop()
