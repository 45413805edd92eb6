"""harbor run directly: its own CLI (``harbor run``) on the host, outside Benchwright's runs, against the bundled task
set, for comparison with a bridge run. There is no Docker engine here, so its environment is the same plugin the
bridge gives it (``bw_harbor_env``), served by a ``TaskEnvBroker`` over a plain ``LocalBackend`` in this process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

from benchwright.harness.harbor import (
    HARBOR_AGENT_KWARGS,
    EnvPlan,
    TaskEnvBroker,
    bundled_root,
    environment_plans,
    harbor_model_name,
    resolve_task_set,
)
from benchwright.harness.install import install, python_candidates, venv_dir
from benchwright.sandbox.lifecycle import Sandbox
from benchwright.sandbox.local import ROOT_LINKS_KEY, WORK_INSIDE, LocalBackend
from tests.harness.qa import CACHE

SIDE = Path(str(resources.files("benchwright.harness").joinpath("sandbox_side")))


def harbor_skip_reason() -> str | None:
    """Why harbor cannot run on this machine (no Python >= 3.12 to build its venv), else None."""
    if sys.version_info >= (3, 12) or python_candidates((3, 12)):
        return None
    return "harbor needs Python >= 3.12 and none was found on PATH or under ~/.pyenv/versions"


def harbor_runtime(data_dir: Path) -> float:
    """Install harbor into the cache (when missing) and link it into the stack's harness dir; install seconds."""
    path, took = install(CACHE, "harbor")
    link = venv_dir(data_dir / "harness", "harbor")
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(path)
    return took


async def run_harbor_directly(workdir: Path, *, agent: str, attempts: int = 1, path: str = "bundled/demo",
                              model_base_url: str | None = None) -> dict[str, list[float | None]]:
    """``harbor run -p <bundled task set> -a <agent>``: task name -> its trials' rewards, from harbor's own results.

    A model-driven agent (``terminus-2``) gets the bridge's model name and agent options and ``model_base_url``
    (a keyless loopback double) as its ``OPENAI_BASE_URL``; its task environments get the bridge's tmux server."""
    tasks = resolve_task_set(path, harness_dir=workdir)
    backend = LocalBackend(workdir / "sandboxes")

    @contextlib.asynccontextmanager
    async def open_env(session: str, plan: EnvPlan) -> AsyncIterator[Sandbox]:
        info = await backend.create(role="harbor_task_env", run_id="harbor-direct",
                                    metadata={ROOT_LINKS_KEY: plan.root_links})
        try:
            yield Sandbox(backend=backend, info=info, home=WORK_INSIDE, python=sys.executable)
        finally:
            await backend.kill(info.sandbox_id)

    broker = TaskEnvBroker(environment_plans(tasks), open_env, tasks_root=str(bundled_root() / "demo"),
                           terminal=model_base_url is not None)
    model_args: list[str] = []
    model_env: dict[str, str] = {}
    if model_base_url is not None:
        model_args = ["-m", harbor_model_name("openai/dev"), *(
            f"--ak={k}={json.dumps(v)}" for k, v in HARBOR_AGENT_KWARGS[agent].items())]
        model_env = {"OPENAI_BASE_URL": model_base_url, "OPENAI_API_KEY": "none"}
    harbor = venv_dir(CACHE, "harbor") / "bin" / "harbor"
    try:
        async with broker as (url, key, _port):
            env = {**os.environ, "BW_HARBOR_ENV_URL": url, "BW_HARBOR_ENV_KEY": key, "HARBOR_TELEMETRY": "off",
                   "DO_NOT_TRACK": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1",
                   "PYTHONPATH": str(SIDE), "HOME": str(workdir), **model_env}
            proc = await asyncio.create_subprocess_exec(
                str(harbor), "run", "-p", str(tasks.root), "-a", agent, "--env",
                "bw_harbor_env:BenchwrightEnvironment", "-o", str(workdir / "jobs"), "--job-name", "direct",
                "-k", str(attempts), "-n", "1", "--yes", *model_args, cwd=workdir, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out, _ = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"harbor run failed ({proc.returncode}): {out.decode(errors='replace')[-3000:]}")
    finally:
        await backend.close()
    rewards: dict[str, list[float | None]] = {}
    for result in sorted((workdir / "jobs" / "direct").glob("*/result.json")):
        trial = json.loads(result.read_text())
        verifier = trial.get("verifier_result") or {}
        reward = (verifier.get("rewards") or {}).get("reward")
        rewards.setdefault(trial["task_name"].rsplit("/", 1)[-1], []).append(
            None if trial.get("exception_info") else reward)
    return rewards
