"""The model proxy (§4, §11): the real LiteLLM proxy, one per run, the only process that holds the provider key.

Attach starts it from the run's generated LiteLLM config with the real key in its own environment and a per-run
fake key as its master key; everything else (the worker's model calls, a scorer's own HTTP calls through the
egress proxy) presents only the fake key, which the proxy checks. Its address and the fake key live in the run's
directory (``proxy.json``, mode 0600, never in an event), so whichever worker runs Materialize can use it.

By default (``Settings.model_proxy = "with_secrets"``) runs whose model names no secret have no credential to
isolate; they call the endpoint directly and skip the proxy's start-up (11 s measured here) and its per-request
CPU, which would dominate a fast sweep. ``"always"`` puts every run behind its proxy.

A proxy never outlives its worker: it is started through ``_lifeline.py`` (``PR_SET_PDEATHSIG = SIGKILL``), is
recorded in the stack's process registry (``benchwright.procreg``) the moment it is spawned, and the worker stops
the proxies it started when it shuts down. Whatever a crash leaves is found by ``reap_model_proxies``.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import yaml

from benchwright.devstack import free_port, pid_alive
from benchwright.errors import Unavailable
from benchwright.procreg import ProcEntry, ProcessRegistry, proc_starttime
from benchwright.proxy_config import litellm_config
from benchwright.schemas import ModelSpec

MASTER_KEY_ENV = "BW_PROXY_MASTER_KEY"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
_LIFELINE = Path(__file__).with_name("_lifeline.py")


@dataclass(frozen=True)
class ProxyHandle:
    pid: int
    port: int
    fake_key: str
    model_name: str
    started_at: float
    """Epoch seconds (the proxy may be stopped by another process than the one that started it)."""
    start_ticks: int | None = None
    """``/proc/<pid>/stat`` start time, so a stop never signals a process that merely reuses the PID."""

    def alive(self) -> bool:
        if self.start_ticks is None:  # recorded before start times were kept
            return pid_alive(self.pid)
        return proc_starttime(self.pid) == self.start_ticks

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def proxy_file(run_dir: Path) -> Path:
    return run_dir / "proxy.json"


def secret_env_name(secret: str) -> str:
    return f"BW_SECRET_{secret.upper()}"


def load_handle(run_dir: Path) -> ProxyHandle | None:
    path = proxy_file(run_dir)
    if not path.exists():
        return None
    return ProxyHandle(**json.loads(path.read_text()))


def _litellm_binary() -> str:
    beside = Path(sys.executable).parent / "litellm"
    return str(beside) if beside.exists() else "litellm"


def start_model_proxy(*, run_dir: Path, spec: ModelSpec, secret_value: str | None,
                      registry: ProcessRegistry | None = None) -> ProxyHandle:
    """Start the run's LiteLLM proxy (idempotent: a live proxy already recorded for the run is reused).

    Args:
        registry: The stack's process registry; the proxy is recorded there as soon as it is spawned (before its
            ~11 s start-up), so a crash during start-up leaves nothing the reaper cannot find.

    Raises:
        Unavailable: the proxy did not become ready (its log is in the run directory).
    """
    # One proxy per run even when several batches find it dead at once (and in several workers): the first
    # starts it under the run's lock, the others then find it live.
    with (run_dir / "proxy.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existing = load_handle(run_dir)
        if existing is not None and existing.alive():
            return existing
        return _start(run_dir=run_dir, spec=spec, secret_value=secret_value, registry=registry)


def _start(*, run_dir: Path, spec: ModelSpec, secret_value: str | None,
           registry: ProcessRegistry | None) -> ProxyHandle:
    env_name = secret_env_name(spec.secret) if spec.secret else None
    config = litellm_config(spec, secret_env=env_name)
    if env_name is None:  # a keyless endpoint: LiteLLM's OpenAI route still wants some key to send
        config["model_list"][0]["litellm_params"].setdefault("api_key", "none")
    config["general_settings"] = {"master_key": f"os.environ/{MASTER_KEY_ENV}"}
    config["litellm_settings"] = {"telemetry": False, "drop_params": True}
    cfg_path = run_dir / "proxy-config.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=True))
    fake_key = "sk-bw-" + secrets.token_urlsafe(24)
    port = free_port()
    # The proxy's whole environment: the real key (under its own name), its master key, and nothing of the worker's.
    env = {"PATH": os.defpath + os.pathsep + str(Path(sys.executable).parent), "HOME": str(run_dir),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", MASTER_KEY_ENV: fake_key}
    if env_name is not None and secret_value is not None:
        env[env_name] = secret_value
    # PDEATHSIG fires when the *thread* that spawned the proxy ends, not only the process: callers spawn it from a
    # thread that lives as long as the worker (the event loop's default executor, whose threads never retire).
    argv = [sys.executable, "-E", "-s", "-S", str(_LIFELINE), str(os.getpid()), _litellm_binary(),
            "--config", str(cfg_path), "--host", "127.0.0.1", "--port", str(port)]
    with (run_dir / "proxy.log").open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=str(run_dir))
    entry = registry.record(kind="model_proxy", pid=proc.pid, group=True, owner=os.getpid(),
                            detail={"run_dir": str(run_dir)}) if registry is not None else None
    handle = ProxyHandle(pid=proc.pid, port=port, fake_key=fake_key, model_name=spec.identifier,
                         started_at=time.time(), start_ticks=proc_starttime(proc.pid))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"the model proxy exited with {proc.returncode} while starting; see {run_dir / 'proxy.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if entry is not None and registry is not None:
            registry.forget(entry)
        raise Unavailable(f"the model proxy was not ready within {READY_TIMEOUT_S:.0f} s")
    path = proxy_file(run_dir)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(asdict(handle)))
    tmp.chmod(0o600)
    tmp.replace(path)
    return handle


def _stop_group(pid: int, alive: Callable[[], bool]) -> None:
    """SIGTERM the proxy's process group, SIGKILL it if still alive after ``STOP_TIMEOUT_S``."""
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


def stop_model_proxy(run_dir: Path) -> float | None:
    """Stop the run's proxy (its whole process group); returns its lifetime in seconds, or None if none ran."""
    handle = load_handle(run_dir)
    if handle is None:
        return None
    _stop_group(handle.pid, handle.alive)
    proxy_file(run_dir).unlink(missing_ok=True)
    return time.time() - handle.started_at


def reap_model_proxies(*, registry: ProcessRegistry, runs_dir: Path, finished_at: Callable[[str], float | None],
                       linger_s: float, everything: bool = False) -> int:
    """Stop the proxies nobody will stop; returns how many were running.

    Stopped: every proxy with ``everything`` (the stack is going down, or its previous incarnation crashed); else
    proxies whose starting process is gone (its worker died: PDEATHSIG normally took them already) and proxies of
    runs that ended (``finished_at(run_id)``: epoch seconds, or None while running) more than ``linger_s`` ago,
    or whose run the store does not know (``finished_at`` returns 0). A proxy never lives past its linger because
    its workflow's delayed stop did not come.
    """
    orphans = [e for e in registry.live(kinds=("model_proxy",))
               if everything or e.owner is None or proc_starttime(e.owner) is None]
    stopped = _stop_entries(registry, orphans)
    if not runs_dir.exists():
        return stopped
    for path in runs_dir.glob("*/proxy.json"):
        handle = load_handle(path.parent)
        if handle is None:
            continue
        if not handle.alive():
            path.unlink(missing_ok=True)
            continue
        ended = None if everything else finished_at(path.parent.name)
        if everything or (ended is not None and time.time() >= ended + linger_s):
            stop_model_proxy(path.parent)
            stopped += 1
    return stopped


def _stop_entries(registry: ProcessRegistry, entries: list[ProcEntry]) -> int:
    """Stop these proxies together (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``) and drop their run's handle."""
    stopped = registry.stop(entries, timeout_s=STOP_TIMEOUT_S)
    for entry in entries:
        run_dir = entry.detail.get("run_dir")
        handle = load_handle(Path(run_dir)) if isinstance(run_dir, str) else None
        if handle is not None and handle.pid == entry.pid and not handle.alive():
            proxy_file(Path(str(run_dir))).unlink(missing_ok=True)
    return len(stopped)


def stop_owned_proxies(registry: ProcessRegistry) -> int:
    """Stop every proxy this process started (a worker shutting down); returns how many were running."""
    return _stop_entries(registry, registry.live(kinds=("model_proxy",), owner=os.getpid()))
