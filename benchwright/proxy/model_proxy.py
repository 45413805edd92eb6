"""The model proxy (§4, §11): the real LiteLLM proxy, one per run, the only process that holds the provider key.

Attach starts it from the run's generated LiteLLM config with the real key in its own environment and a per-run
fake key as its master key; everything else (the worker's model calls, a scorer's own HTTP calls through the
egress proxy) presents only the fake key, which the proxy checks. Its address and the fake key live in the run's
directory (``proxy.json``, mode 0600, never in an event), so whichever worker runs Materialize can use it.

By default (``Settings.model_proxy = "with_secrets"``) runs whose model names no secret have no credential to
isolate; they call the endpoint directly and skip the proxy's start-up (11 s measured here) and its per-request
CPU, which would dominate a fast sweep. ``"always"`` puts every run behind its proxy.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from benchwright.devstack import free_port, pid_alive
from benchwright.errors import Unavailable
from benchwright.proxy_config import litellm_config
from benchwright.schemas import ModelSpec

MASTER_KEY_ENV = "BW_PROXY_MASTER_KEY"
READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class ProxyHandle:
    pid: int
    port: int
    fake_key: str
    model_name: str
    started_at: float
    """Epoch seconds (the proxy may be stopped by another process than the one that started it)."""

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


def start_model_proxy(*, run_dir: Path, spec: ModelSpec, secret_value: str | None) -> ProxyHandle:
    """Start the run's LiteLLM proxy (idempotent: a live proxy already recorded for the run is reused).

    Raises:
        Unavailable: the proxy did not become ready (its log is in the run directory).
    """
    existing = load_handle(run_dir)
    if existing is not None and pid_alive(existing.pid):
        return existing
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
    log = (run_dir / "proxy.log").open("ab")
    proc = subprocess.Popen([_litellm_binary(), "--config", str(cfg_path), "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=str(run_dir))
    handle = ProxyHandle(pid=proc.pid, port=port, fake_key=fake_key, model_name=spec.identifier,
                         started_at=time.time())
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
        raise Unavailable(f"the model proxy was not ready within {READY_TIMEOUT_S:.0f} s")
    path = proxy_file(run_dir)
    path.write_text(json.dumps(handle.__dict__))
    path.chmod(0o600)
    return handle


def stop_model_proxy(run_dir: Path) -> float | None:
    """Stop the run's proxy (its whole process group); returns its lifetime in seconds, or None if none ran."""
    handle = load_handle(run_dir)
    if handle is None:
        return None
    if pid_alive(handle.pid):
        try:
            os.killpg(handle.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pid_alive(handle.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(handle.pid):
                os.killpg(handle.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proxy_file(run_dir).unlink(missing_ok=True)
    return time.time() - handle.started_at
