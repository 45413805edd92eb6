"""The model proxy (§4, §11) from the worker's side: a run's route at its worker's credential proxy.

Every run's model calls go through a credential proxy (``credential_proxy.py``): a process of its own, one per
worker, started on the first Attach and shared by the runs that follow. Attach registers the run there: its model
route with the real key (read from the store and handed over the proxy's control socket, then dropped by the
worker), under a per-run key made up here. The run's handle (``proxy.json`` in the run's directory, mode 0600,
never in an event) names the proxy and the per-run key, so whichever worker on the host runs Materialize can use
it; a worker that finds the proxy gone (it dies with the worker that started it) registers the run again with its
own, under the same per-run key. The run's end revokes the route (``stop_model_proxy``): its key is refused from
then on and the real key leaves the proxy. A route registered at another worker's proxy (a phase that ran on
another host) is revoked there by that worker's periodic sweep (``sweep_ended_routes``) once the store says the
run ended.

A proxy never outlives its welcome: it is started through ``_lifeline.py`` (``PR_SET_PDEATHSIG = SIGKILL``) and
recorded in the stack's process registry (``benchwright.stack.procreg``) the moment it is spawned; it exits by itself
after ``linger_s`` without a route; the worker stops the proxies it started when it shuts down; whatever a crash
leaves is found by ``reap_model_proxies``. A worker process keeps one started ahead (``keep_a_proxy_ready``: a spare,
which lingers only once its first route is gone), so a run after a quiet spell finds it up instead of waiting for one
to start (~0.1-0.2 s). Handles written by the per-run LiteLLM proxies this replaced (no
``control``) are still stopped the old way: their whole process group.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchwright.errors import Unavailable
from benchwright.llm.prices import prices_for
from benchwright.schemas import ModelSpec
from benchwright.stack.cpu import spawning
from benchwright.stack.devstack import pid_alive
from benchwright.stack.procreg import ProcEntry, ProcessRegistry, owned_tempdir, proc_starttime

_log = logging.getLogger(__name__)
READY_TIMEOUT_S = 60.0
RETRY_MAX_S = 60.0
"""The longest a worker waits before trying again to start a spare proxy that failed to start."""
STOP_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 30.0
REGISTER_LITELLM_TIMEOUT_S = 180.0
"""Bound on registering a LiteLLM-routed run: the proxy imports litellm first (~2 s idle, 40 s measured on a host
at load 11), and a timed-out registration started another proxy that imported it again."""
_LIFELINE = Path(__file__).with_name("_lifeline.py")
_SERVER = Path(__file__).with_name("credential_proxy.py")
_CONTROL_PREFIX = "bw-cp-"


class ProxyGone(Exception):
    """The credential proxy is not there (exited, exiting, or never answered)."""


@dataclass(frozen=True)
class ProxyHandle:
    """A run's route at a credential proxy (what ``proxy.json`` holds)."""

    pid: int
    port: int
    fake_key: str
    """The per-run key: the only key the scorer side ever sees, accepted for this run alone while it runs."""
    model_name: str
    started_at: float
    """Epoch seconds the route was registered (the route may be revoked by another process than the registrar)."""
    start_ticks: int | None = None
    """``/proc/<pid>/stat`` start time, so a stop never signals a process that merely reuses the PID."""
    control: str | None = None
    """The proxy's control socket; None in handles of the per-run LiteLLM proxies this replaced."""

    def alive(self) -> bool:
        if self.start_ticks is None:  # recorded before start times were kept
            return pid_alive(self.pid)
        return proc_starttime(self.pid) == self.start_ticks

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@dataclass(frozen=True)
class Revoked:
    """What revoking a run's route found."""

    lifetime_s: float
    """From registration to revocation."""
    calls: int
    cost_usd: float
    """The proxy's own meter of the run's model spend."""
    idle: bool
    """The proxy was left without a route: it now lingers ``linger_s`` (warm for the next run), then exits."""


def proxy_file(run_dir: Path) -> Path:
    return run_dir / "proxy.json"


def load_handle(run_dir: Path) -> ProxyHandle | None:
    path = proxy_file(run_dir)
    if not path.exists():
        return None
    return ProxyHandle(**json.loads(path.read_text()))


def _save_handle(run_dir: Path, handle: ProxyHandle) -> None:
    path = proxy_file(run_dir)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(asdict(handle)))
    tmp.chmod(0o600)
    tmp.replace(path)


def control_call(path: str, command: dict[str, Any], *, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
    """One command on a proxy's control socket, its JSON answer.

    Raises:
        ProxyGone: nobody answered (the proxy exited or is exiting).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(json.dumps(command).encode() + b"\n")
            reply = sock.makefile("rb").readline()
    except OSError as exc:
        raise ProxyGone(f"the credential proxy at {path} did not answer: {exc}") from exc
    if not reply:
        raise ProxyGone(f"the credential proxy at {path} closed the connection")
    answer: dict[str, Any] = json.loads(reply)
    return answer


@dataclass
class _Proxy:
    pid: int
    start_ticks: int
    port: int
    control: str


class _Proxies:
    """The credential proxy this worker started, per data directory (one for a worker; tests run several stacks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine: dict[Path, _Proxy] = {}

    def get(self, *, registry: ProcessRegistry, linger_s: float, spare: bool = False) -> _Proxy:
        """This worker's proxy for the registry's stack, started if there is none (or it lingered out); started as a
        spare (no linger before its first route) when ``spare``."""
        with self._lock:
            proxy = self._mine.get(registry.dir)
            if proxy is not None and _alive(proxy):
                return proxy
            proxy = _spawn(registry=registry, linger_s=linger_s, spare=spare)
            self._mine[registry.dir] = proxy
            return proxy

    def up(self, registry: ProcessRegistry) -> bool:
        """Whether this worker has a live proxy for the registry's stack (exiting or not)."""
        with self._lock:
            proxy = self._mine.get(registry.dir)
            return proxy is not None and _alive(proxy)

    def forget(self, proxy: _Proxy) -> None:
        with self._lock:
            for key, known in list(self._mine.items()):
                if known is proxy:
                    del self._mine[key]


_PROXIES = _Proxies()


def _alive(proxy: _Proxy) -> bool:
    """Whether the process ``proxy`` names still runs (not a later process that got its PID)."""
    return proc_starttime(proxy.pid) == proxy.start_ticks


def keep_a_proxy_ready(*, registry: ProcessRegistry, linger_s: float) -> bool:
    """Start a spare credential proxy for this worker unless it has one up; returns whether one was started.

    A proxy lingers ``linger_s`` after its last route, then exits: a run after a quiet spell would wait for a new
    one to start (a Python process and its imports, ~0.1-0.2 s on the path to its first model call). A worker calls
    this at its start and every few seconds (``worker.py``), so one is always up. A spare holds no key and no route;
    it lingers, and exits, only once a route has come and gone (the linger billed to the run that left it, as ever).

    Raises:
        Unavailable: the proxy could not be started.
    """
    if _PROXIES.up(registry):
        return False
    _PROXIES.get(registry=registry, linger_s=linger_s, spare=True)
    return True


async def keep_proxies_ready(*, registry: ProcessRegistry, linger_s: float, every_s: float,
                             stop: asyncio.Event) -> None:
    """Until ``stop`` is set: ``keep_a_proxy_ready`` now and every ``every_s`` seconds (in a thread of the event
    loop's default executor, which lives as long as the worker: the proxy's lifeline watches the spawning thread). A
    failed start is logged and tried again later, each time twice as late (up to ``RETRY_MAX_S``)."""
    wait_s = every_s
    while not stop.is_set():
        try:
            await asyncio.to_thread(keep_a_proxy_ready, registry=registry, linger_s=linger_s)
            wait_s = every_s
        except Exception:  # noqa: BLE001 - a proxy that cannot start now is started on demand by the next Attach
            wait_s = min(wait_s * 2, RETRY_MAX_S)
            _log.exception("could not start a spare credential proxy; trying again in %.1f s", wait_s)
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait_s)
        except TimeoutError:
            pass


def _spawn(*, registry: ProcessRegistry, linger_s: float, spare: bool = False) -> _Proxy:
    """Start a credential proxy and wait until its control socket answers (~0.4 s measured here, idle machine)."""
    control_dir = owned_tempdir("cp")  # 0700, a short path (a Unix socket's); removed if this process dies
    control = control_dir / "control.sock"
    # Nothing of the worker's environment: no key ever enters it (keys arrive over the control socket).
    env = {"PATH": os.defpath, "HOME": str(control_dir), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_LOG": "ERROR", "PYTHONDONTWRITEBYTECODE": "1"}
    # PDEATHSIG fires when the *thread* that spawned the proxy ends, not only the process: callers spawn it from a
    # thread that lives as long as the worker (the event loop's default executor, whose threads never retire).
    # -P: the script's directory stays off sys.path (its siblings are package modules, not top-level ones).
    argv = [sys.executable, "-E", "-s", "-S", str(_LIFELINE), str(os.getpid()), sys.executable, "-P", str(_SERVER),
            "--control", str(control), "--linger", repr(float(linger_s)), *(["--spare"] if spare else [])]
    log_path = registry.dir.parent / "credential-proxy.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log, spawning():  # the proxy on every CPU, not a pinned worker's one
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=str(control_dir))
    except BaseException:  # nothing started: its socket's directory goes now, not at the worker's end
        shutil.rmtree(control_dir, ignore_errors=True)
        raise
    entry = registry.record(kind="model_proxy", pid=proc.pid, group=True, owner=os.getpid(),
                            detail={"control": str(control)})
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            shutil.rmtree(control_dir, ignore_errors=True)
            raise Unavailable(f"the credential proxy exited with {proc.returncode} while starting; see {log_path}")
        if control.exists():
            try:
                hello = control_call(str(control), {"op": "hello"}, timeout_s=5.0)
                return _Proxy(pid=proc.pid, start_ticks=entry.start if entry else proc_starttime(proc.pid) or 0,
                              port=int(hello["port"]), control=str(control))
            except ProxyGone:
                pass
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if entry is not None:
        registry.forget(entry)
    shutil.rmtree(control_dir, ignore_errors=True)
    raise Unavailable(f"the credential proxy was not ready within {READY_TIMEOUT_S:.0f} s")


def _route(spec: ModelSpec, *, concurrency: int, connect_address: str | None = None) -> dict[str, Any]:
    """The route as the proxy takes it: prices from the launch, else from LiteLLM's cost map."""
    prices = prices_for(spec)
    return {"model_name": spec.identifier, "identifier": spec.identifier, "api_base": spec.api_base,
            "connect_address": connect_address,
            "params": spec.params, "input_cost_per_token": prices.input_cost_per_token,
            "output_cost_per_token": prices.output_cost_per_token,
            "launch_prices": spec.input_cost_per_token is not None or spec.output_cost_per_token is not None,
            "max_idle": max(concurrency, 1)}


def start_model_proxy(*, run_dir: Path, spec: ModelSpec, secret_value: str | None, registry: ProcessRegistry,
                      linger_s: float, concurrency: int = 256, connect_address: str | None = None) -> ProxyHandle:
    """Register the run's route at this worker's credential proxy (started if needed); returns the run's handle.

    Idempotent: registering again replaces the route (a retried Attach, or a worker whose proxy replaced a dead
    one) and keeps the run's per-run key, so the key a scorer already holds stays valid.

    Args:
        secret_value: The real key, or None for a keyless endpoint. Handed to the proxy; the caller drops it.
        linger_s: How long a proxy started here stays up without a route before it exits.
        concurrency: Calls the run may have in flight (the upstream connections the route keeps open).
        connect_address: The address ``benchwright.llm.model_access`` approved for ``spec.api_base``: the proxy
            connects there (OpenAI-compatible routes; LiteLLM resolves the name itself for the others).

    Raises:
        Unavailable: no proxy could be started.
    """
    with (run_dir / "proxy.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existing = load_handle(run_dir)
        fake_key = existing.fake_key if existing is not None else "sk-bw-" + secrets.token_urlsafe(24)
        command = {"op": "register", "run_id": run_dir.name, "key": fake_key,
                   "route": _route(spec, concurrency=concurrency, connect_address=connect_address),
                   "secret": secret_value}
        for _ in range(3):
            proxy = _PROXIES.get(registry=registry, linger_s=linger_s)
            try:
                # A LiteLLM-routed route imports litellm in the proxy first: seconds, more on a loaded host.
                answer = control_call(proxy.control, command, timeout_s=CONTROL_TIMEOUT_S if spec.identifier
                                      .startswith("openai/") else REGISTER_LITELLM_TIMEOUT_S)
            except ProxyGone:
                answer = {"ok": False, "error": "gone"}
            if answer.get("ok"):
                break
            _PROXIES.forget(proxy)  # it lingered out just now: start another
        else:
            raise Unavailable("the credential proxy refused the run's route: " + str(answer.get("error")))
        if existing is not None and existing.control is None and existing.alive():
            _stop_group(existing.pid, existing.alive)  # a per-run LiteLLM proxy from before: ours now
        handle = ProxyHandle(pid=proxy.pid, port=proxy.port, fake_key=fake_key, model_name=spec.identifier,
                             started_at=time.time(), start_ticks=proxy.start_ticks, control=proxy.control)
        _save_handle(run_dir, handle)
        return handle


def _stop_group(pid: int, alive: Callable[[], bool]) -> None:
    """SIGTERM a process group, SIGKILL it if still alive after ``STOP_TIMEOUT_S``."""
    try:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            if not alive():
                return
            os.killpg(pid, signum)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while alive() and time.monotonic() < deadline:
                time.sleep(0.05)
    except ProcessLookupError:
        pass


def stop_model_proxy(run_dir: Path) -> Revoked | None:
    """Revoke the run's route (its per-run key refused from now on, its real key dropped); None if it had none.

    A proxy that is gone took the route with it: the revocation is then only the handle's removal.
    """
    handle = load_handle(run_dir)
    if handle is None:
        return None
    revoked = Revoked(lifetime_s=time.time() - handle.started_at, calls=0, cost_usd=0.0, idle=False)
    if handle.control is None:  # a per-run LiteLLM proxy from before this design: the route is the process
        _stop_group(handle.pid, handle.alive)
    elif handle.alive():
        try:
            answer = control_call(handle.control, {"op": "revoke", "run_id": run_dir.name})
        except ProxyGone:
            answer = {}
        if answer.get("found"):
            revoked = Revoked(lifetime_s=float(answer["lifetime_s"]), calls=int(answer["calls"]),
                              cost_usd=float(answer["cost_usd"]), idle=bool(answer["idle"]))
    proxy_file(run_dir).unlink(missing_ok=True)
    return revoked


EndedAt = Callable[[Sequence[str]], Mapping[str, float]]
"""Which of these runs ended, in one look at the store: run id → epoch seconds it ended (0.0 for a run the store
does not know); runs still going are absent."""


def reap_model_proxies(*, registry: ProcessRegistry, runs_dir: Path, finished_at: Callable[[str], float | None],
                       linger_s: float, everything: bool = False) -> int:
    """Stop the proxies and revoke the routes nobody will; returns how many proxies or routes were live.

    Stopped: every proxy with ``everything`` (the stack is going down, or its previous incarnation crashed); else
    proxies whose starting process is gone (its worker died: PDEATHSIG normally took them already). Revoked: the
    routes of runs that ended (``finished_at(run_id)``: epoch seconds, or None while running; 0 for a run the
    store does not know), whose workflow's own revocation did not come (a terminated workflow). A per-run LiteLLM
    proxy from before this design is stopped once its run ended more than ``linger_s`` ago.
    """
    orphans = [e for e in registry.live(kinds=("model_proxy",))
               if everything or e.owner is None or proc_starttime(e.owner) is None]
    stopped = _stop_entries(registry, orphans)
    if not runs_dir.exists():
        return stopped
    for path in runs_dir.glob("*/proxy.json"):  # a dead proxy took its routes with it: only the handle is left
        handle = load_handle(path.parent)
        if handle is not None and not handle.alive():
            path.unlink(missing_ok=True)

    def ended_at(run_ids: Sequence[str]) -> dict[str, float]:
        if everything:
            return dict.fromkeys(run_ids, 0.0)
        return {run_id: at for run_id in run_ids if (at := finished_at(run_id)) is not None}

    return stopped + revoke_ended_routes(runs_dir=runs_dir, ended_at=ended_at,
                                         linger_s=0.0 if everything else linger_s)


def sweep_ended_routes(*, registry: ProcessRegistry, runs_dir: Path, ended_at: EndedAt, linger_s: float) -> int:
    """The periodic sweep of a worker: ``revoke_ended_routes``, skipped while no credential proxy of the data
    directory holds a route (one ``hello`` per live proxy, none when none is up). The proxies name the runs they
    route, so only those run directories are read, however many a worker's disk keeps."""
    runs = _routed_runs(registry)
    if runs is not None and not runs:
        return 0
    return revoke_ended_routes(runs_dir=runs_dir, ended_at=ended_at, linger_s=linger_s, only=runs)


def _routed_runs(registry: ProcessRegistry) -> set[str] | None:
    """The runs whose routes the registry's live proxies hold (each proxy names them in its ``hello``); None when a
    proxy cannot say (a per-run LiteLLM proxy from before this design): then every run directory is looked at."""
    runs: set[str] = set()
    for entry in registry.live(kinds=("model_proxy",)):
        control = entry.detail.get("control")
        if not isinstance(control, str):
            return None
        try:
            hello = control_call(control, {"op": "hello"}, timeout_s=5.0)
        except ProxyGone:  # exiting (it lingered out): its routes, if any, went with it
            continue
        named = hello.get("runs")
        if not isinstance(named, list):
            return None if int(hello.get("routes", 1)) > 0 else runs
        runs.update(str(r) for r in named)
    return runs


def revoke_ended_routes(*, runs_dir: Path, ended_at: EndedAt, linger_s: float,
                        only: set[str] | None = None) -> int:
    """Revoke the routes this data directory's handles hold for runs that ended; returns how many were live.

    What keeps a per-run key from outliving its run on a worker that did not run the run's own revocation (the
    ``stop_model_proxy`` activity revokes only the route on the worker that runs it, and a phase on another host
    registered the run at that host's proxy). A worker runs this every ``proxy_route_sweep_s``
    (``sweep_ended_routes``): a listing of the run directories, and one ``ended_at`` call (one query) for all the
    handles it finds, none when it finds none.
    ``only``: the runs to look at (what the proxies say they route), else every run directory.
    Nothing is billed here: the run's own revocation bills its route. A handle of a dead proxy whose run ended is
    dropped; one whose run still goes is kept (its per-run key is reused when a phase registers the run again).
    A per-run LiteLLM proxy from before this design is stopped once its run ended more than ``linger_s`` ago.
    """
    if not runs_dir.exists():
        return 0
    handles: dict[str, ProxyHandle] = {}
    paths = runs_dir.glob("*/proxy.json") if only is None else (runs_dir / run / "proxy.json" for run in sorted(only))
    for path in paths:
        try:
            handle = load_handle(path.parent)
        except (OSError, ValueError, TypeError):  # revoked (unlinked) meanwhile, or a handle being replaced
            continue
        if handle is not None:
            handles[path.parent.name] = handle
    if not handles:
        return 0
    ended = ended_at(list(handles))
    now = time.time()
    revoked = 0
    for run_id, handle in handles.items():
        at = ended.get(run_id)
        if at is None or now < at + (linger_s if handle.control is None else 0.0):
            continue
        live = handle.alive()
        stop_model_proxy(runs_dir / run_id)
        revoked += live
    return revoked


def _stop_entries(registry: ProcessRegistry, entries: list[ProcEntry]) -> int:
    """Stop these proxies together (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``) and remove their control sockets."""
    stopped = registry.stop(entries, timeout_s=STOP_TIMEOUT_S)
    for entry in entries:
        control = entry.detail.get("control")
        if isinstance(control, str) and Path(control).parent.name.startswith(_CONTROL_PREFIX):
            shutil.rmtree(Path(control).parent, ignore_errors=True)
    return len(stopped)


def stop_owned_proxies(registry: ProcessRegistry) -> int:
    """Stop every proxy this process started (a worker shutting down); returns how many were running."""
    return _stop_entries(registry, registry.live(kinds=("model_proxy",), owner=os.getpid()))
