"""Runs a harbor job inside the ``harbor_orchestrator`` sandbox, with harbor's own venv (never imported by the
worker). Same line protocol as ``inspect_bridge.py`` (``dataset``, ``sample``, ``done``).

The job is harbor's own (``Job.create`` + ``run``): the tasks of ``bw_tasks/`` not yet recorded in full, the agent
(``oracle``, ``nop``, or ``terminus-2`` with ``model`` = ``openai/<name>``: LiteLLM in this process, its endpoint
the relay from ``OPENAI_BASE_URL``/``OPENAI_API_KEY``), ``n_attempts`` = the run's trials, environments from
``bw_harbor_env:BenchwrightEnvironment`` (each trial's container is a Benchwright task sandbox). Every trial harbor
ends is one ``sample`` line as harbor's END hook sees it: index = the task's position in the sorted task list,
epoch = the how-many-th attempt of that task ended so far, score = harbor's reward (``reward``, else the first
reward, clamped to [0, 1]); a trial harbor ended with an exception is an error. The native log is harbor's job
``result.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "bw_bridge.json")) as _config:
    CONFIG = json.load(_config)
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.path.insert(0, HERE)


def emit(**line: Any) -> None:
    _OUT.write(json.dumps(line, default=str) + "\n")
    _OUT.flush()


from harbor.job import Job
from harbor.models.job.config import JobConfig
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig
from harbor.trial.hooks import TrialHookEvent

tasks: list[str] = CONFIG["tasks"]
limit = CONFIG.get("limit")
count = min(len(tasks), limit) if limit else len(tasks)
emit(kind="dataset", count=count)
done = set(CONFIG.get("done") or [])
todo = [i for i in range(count) if i not in done]
INDEX = {os.path.basename(tasks[i].rstrip("/")): i for i in range(count)}
ended: dict[int, int] = {}


def score_of(rewards: dict[str, Any] | None) -> tuple[float | None, Any]:
    if not rewards:
        return None, None
    value = rewards.get("reward", next(iter(rewards.values())))
    try:
        return min(1.0, max(0.0, float(value))), value
    except (TypeError, ValueError):
        return None, value


async def on_end(event: TrialHookEvent) -> None:
    result = event.result
    index = INDEX.get(event.task_name, INDEX.get(result.task_name.rsplit("/", 1)[-1]))
    if index is None:
        return
    ended[index] = ended.get(index, 0) + 1
    rewards = result.verifier_result.rewards if result.verifier_result else None
    score, value = score_of(rewards)
    error = None
    if result.exception_info is not None:
        error = f"{result.exception_info.exception_type}: {result.exception_info.exception_message}"[-3000:]
    elif score is None:
        error = "harbor's verifier recorded no reward for this trial"
    emit(kind="sample", index=index, id=event.task_name, epoch=ended[index], score=None if error else score,
         value=value, input=None, output=None, target=None, usage={}, error=error,
         metadata={"trial_name": result.trial_name, "rewards": rewards, "agent": CONFIG["agent"]})


async def main() -> int:
    if not todo:
        emit(kind="done", log=None, status="success", metrics={})
        return 0
    config = JobConfig(job_name=CONFIG["job_name"], jobs_dir=CONFIG["jobs_dir"], n_attempts=CONFIG["attempts"],
                       n_concurrent_trials=CONFIG.get("concurrency") or 1, quiet=True,
                       agents=[AgentConfig(name=CONFIG["agent"], model_name=CONFIG.get("model"),
                                           kwargs=CONFIG.get("agent_kwargs") or {})],
                       environment=EnvironmentConfig(import_path="bw_harbor_env:BenchwrightEnvironment"),
                       tasks=[TaskConfig(path=tasks[i]) for i in todo])
    job = await Job.create(config)
    job.on_trial_ended(on_end)
    result = await job.run()
    path = os.path.join(CONFIG["jobs_dir"], CONFIG["job_name"], "result.json")
    stats = result.model_dump(mode="json").get("stats") if hasattr(result, "model_dump") else None
    emit(kind="done", log=path if os.path.exists(path) else None, status="success", metrics={"stats": stats})
    return 0


sys.exit(asyncio.run(main()))
