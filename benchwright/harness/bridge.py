"""Running a harness task as a Materialize batch: what goes into the work sandbox, and what comes back into the log.

``plan_bridge`` lays out the sandbox's working directory (the sandbox-side script for the harness, its
``bw_bridge.json``, the launch's task file and data files) and the harness's environment: the model endpoint
(``BridgeEndpoint``: the relay's URL and its per-batch key; inspect as ``openai-api/bw/<model>`` with
``BW_BASE_URL``/``BW_API_KEY``, lm-eval as ``local-chat-completions`` with the key in ``OPENAI_API_KEY``, lighteval
as its LiteLLM backend's ``openai/<model>`` with ``base_url``/``api_key``) and nothing that could reach a hub
(``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``, LiteLLM's local cost map). harbor is planned by
``benchwright.harness.harbor`` (its trials run in task sandboxes of their own).

``BridgeRecorder`` turns the script's lines into events while the harness runs: each scored sample is a
``MaterializeTaskResult`` (index = the sample's position in the harness's dataset, trial = epoch - 1, the
harness's id/input/output/target/metadata in ``meta``), each task whose trials are all in a
``MaterializeTaskAggregated``; the dataset size is a ``DatasetTasksArtifact`` (the run's tasks total). Results are
committed in small groups (every ``FLUSH_INTERVAL_S``, or one by one under a run.cost ceiling, checked after each
commit), and a resumed batch first reads what was recorded and tells the harness to skip those samples, so a batch
killed at any moment and run again records every trial once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from sqlalchemy.engine import Engine

from benchwright.errors import InvalidInput
from benchwright.events import (
    DatasetTasksArtifact,
    MaterializeTaskAggregated,
    MaterializeTaskResult,
)
from benchwright.harness.config import HarnessConfig, lighteval_task_spec, lmeval_task_name
from benchwright.harness.relay import BridgeEndpoint, Meter
from benchwright.runs.materialize import RunHalted, _recorded
from benchwright.runs.pipeline import MaterializeBatchInput, MaterializeBatchResult
from benchwright.scoring.aggregators import TrialOutcome, aggregate, outcome_for
from benchwright.store.control import append_checking
from benchwright.store.events import NewEvent, event_key

SCRIPT = "bw_bridge.py"
CONFIG = "bw_bridge.json"
INSPECT_LOG_DIR = "bw_logs"
LMEVAL_LOG = "bw_lmeval_samples.jsonl"
LIGHTEVAL_OUTPUT = "bw_lighteval"
FLUSH_INTERVAL_S = 0.25
MAX_TEXT = 16 * 1024
"""Input/output text kept per sample in the log (the native log keeps everything)."""


class BridgeFailed(InvalidInput):
    """The harness ended without finishing its task (its own error is in the message)."""

    code = "harness_failed"


@dataclass(frozen=True)
class BridgePlan:
    files: dict[str, bytes]
    """Into the sandbox's working directory."""
    env: dict[str, str]
    """The harness's environment beyond the sandbox's (endpoint, offline switches)."""
    log_dir: str
    """Where the harness's native log ends up, relative to the working directory."""


def plan_bridge(*, harness: str, config: HarnessConfig, model: str, endpoint: BridgeEndpoint, home: str,
                limit: int | None, done: list[int], concurrency: int) -> BridgePlan:
    """The sandbox's files and the harness's environment for one bridge batch.

    Args:
        model: The model name the harness is told (the relay serves the run's model whatever it is called).
        home: The sandbox's working directory as its commands see it.
        limit: The folded sample limit (``benchwright.harness.config.sample_limit``).
        done: Task indices already recorded in full; the harness skips them.
        concurrency: The run's model calls in flight (inspect's ``max_connections`` unless the config sets it).
    """
    files = {name: text.encode() for name, text in config.files.items()}
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HOME": f"{home}/.bw_hf", "XDG_CACHE_HOME": f"{home}/.bw_cache", "NO_COLOR": "1",
               "TOKENIZERS_PARALLELISM": "false"}
    name = model.rsplit("/", 1)[-1] or "model"
    if harness == "inspect":
        spec = config.task
        if config.task_file is not None:
            files["bw_task.py"] = config.task_file.encode()
            spec = "bw_task.py" + (f"@{config.task_name}" if config.task_name else "")
        settings: dict[str, Any] = {
            "task": spec, "args": config.args, "limit": limit, "epochs": config.epochs,
            "done": done, "model": f"openai-api/bw/{name}", "log_dir": f"{home}/{INSPECT_LOG_DIR}",
            "max_connections": config.max_connections or min(concurrency, 64), "generate": config.generate}
        env = {"BW_BASE_URL": endpoint.base_url, "BW_API_KEY": endpoint.key, "INSPECT_DISPLAY": "none",
               "INSPECT_LOG_DIR": f"{home}/{INSPECT_LOG_DIR}", **offline}
        log_dir = INSPECT_LOG_DIR
    elif harness == "lmeval":
        task = config.task
        include = None
        if config.task_file is not None:
            task = lmeval_task_name(config.task_file)
            files[f"bw_{task}.yaml"] = config.task_file.encode()
            include = home
        settings = {"task": task, "include_path": include, "limit": limit, "done": done, "model": name,
                    "base_url": f"{endpoint.base_url}/chat/completions", "num_fewshot": config.num_fewshot,
                    "gen_kwargs": config.gen_kwargs, "metric": config.metric, "log_path": f"{home}/{LMEVAL_LOG}"}
        env = {"OPENAI_API_KEY": endpoint.key, **offline}
        log_dir = LMEVAL_LOG
    elif harness == "lighteval":
        custom = None
        if config.task_file is not None:
            files["bw_task.py"] = config.task_file.encode()
            custom = f"{home}/bw_task.py"
        settings = {"task": lighteval_task_spec(config), "custom_tasks": custom, "limit": limit, "done": done,
                    "model": name, "base_url": endpoint.base_url, "api_key": endpoint.key, "metric": config.metric,
                    "output_dir": f"{home}/{LIGHTEVAL_OUTPUT}",
                    "cache_dir": f"{home}/.bw_cache/lighteval"}
        env = {"OPENAI_API_KEY": endpoint.key, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": home, **offline}
        log_dir = LIGHTEVAL_OUTPUT
    else:
        raise InvalidInput(f"{harness!r} is not a harness bridge")
    script = resources.files("benchwright.harness").joinpath(f"sandbox_side/{harness}_bridge.py").read_bytes()
    files[SCRIPT] = script
    files[CONFIG] = json.dumps(settings).encode()
    return BridgePlan(files=files, env=env, log_dir=log_dir)


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"... [{len(value) - MAX_TEXT} more characters in the harness log]"
    return value


@dataclass
class BridgeRecorder:
    """Records the harness's samples as they settle (see the module docstring)."""

    engine: Engine
    inp: MaterializeBatchInput
    harness: str
    meter: Meter
    progress: Callable[[dict[str, Any]], None]
    by_task: dict[int, dict[int, TrialOutcome]] = field(default_factory=dict)
    aggregated: set[int] = field(default_factory=set)
    pending: list[NewEvent] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"pass": 0, "fail": 0, "err": 0})
    written: int = 0
    total: int | None = None
    done_line: dict[str, Any] | None = None
    _attributed_usd: float = 0.0
    _last_flush: float = field(default_factory=time.monotonic)

    async def load(self) -> list[int]:
        """Read back what earlier attempts recorded; returns the task indices recorded in full."""
        self.by_task, self.aggregated = await asyncio.to_thread(_recorded, self.engine, self.inp.model_copy(
            update={"start": 0, "stop": 2**31 - 1}))
        k = self.inp.trials.plan.k
        for index, trials in self.by_task.items():
            if len(trials) == k:
                self._aggregate(index)
        return sorted(i for i, trials in self.by_task.items() if len(trials) == k)

    def _aggregate(self, index: int) -> None:
        row = aggregate(self.inp.trials.aggregator, sorted(self.by_task[index].values(), key=lambda t: t.trial))
        self.counts[row.outcome] += 1
        if index not in self.aggregated:
            self.aggregated.add(index)
            self.pending.append(NewEvent.of(
                event_key(self.inp.run_id, "materialize", self.inp.invocation, index, "aggregated"),
                MaterializeTaskAggregated(invocation=self.inp.invocation, index=index, score=row.score,
                                          outcome=row.outcome, trial_scores=row.trial_scores)))

    async def line(self, raw: bytes) -> None:
        """One line of the sandbox-side script (malformed lines are the harness's own chatter: ignored)."""
        try:
            msg = json.loads(raw)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        kind = msg.get("kind")
        if kind == "dataset":
            self.total = int(msg["count"])
            self.pending.append(NewEvent.of(event_key(self.inp.run_id, "materialize", self.inp.invocation, "dataset"),
                                            DatasetTasksArtifact(count=self.total)))
        elif kind == "sample":
            self._sample(msg)
        elif kind == "done":
            self.done_line = msg
        if self.inp.run_cost_usd is not None or time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            await self.flush()

    def _sample(self, msg: dict[str, Any]) -> None:
        index, trial = msg.get("index"), int(msg.get("epoch") or 1) - 1
        if not isinstance(index, int) or not 0 <= trial < self.inp.trials.plan.k:
            return  # a sample outside the planned dataset (cannot happen with a deterministic dataset)
        if trial in self.by_task.get(index, {}):
            return  # recorded by an earlier attempt
        score = msg.get("score")
        error = msg.get("error")
        if score is None and not error:
            error = "the harness recorded no score for this sample"
        # The relay's spend since the previous sample: exact in sum, per sample only approximately (calls
        # overlap, and lm-eval scores a chunk's docs together).
        cost = max(0.0, self.meter.cost_usd - self._attributed_usd)
        self._attributed_usd = self.meter.cost_usd
        usage: dict[str, int] = {}
        for used in (msg.get("usage") or {}).values():
            usage["prompt_tokens"] = usage.get("prompt_tokens", 0) + int(used.get("input_tokens") or 0)
            usage["completion_tokens"] = usage.get("completion_tokens", 0) + int(used.get("output_tokens") or 0)
        meta = {"harness": self.harness, "sample_id": msg.get("id"), "epoch": msg.get("epoch"),
                "value": msg.get("value"), "input": _clip(msg.get("input")), "target": _clip(msg.get("target")),
                "metadata": msg.get("metadata") or {}}
        outcome = "err" if error else outcome_for(score)
        self.by_task.setdefault(index, {})[trial] = TrialOutcome(trial=trial, score=None if error else score,
                                                                 meta=meta, error=error)
        self.pending.append(NewEvent.of(
            event_key(self.inp.run_id, "materialize", self.inp.invocation, index, trial, "result"),
            MaterializeTaskResult(invocation=self.inp.invocation, index=index, trial=trial,
                                  score=None if error else score, outcome=outcome,
                                  output=_clip(msg.get("output")), meta=meta, error=error, usage=usage,
                                  cost_usd=cost)))
        if len(self.by_task[index]) == self.inp.trials.plan.k:
            self._aggregate(index)

    async def flush(self) -> None:
        """Commit what is pending, report progress, and halt the run if the commit crossed run.cost.

        Raises:
            RunHalted: the run's cost ceiling or balance was crossed (the row is halted first).
        """
        batch, self.pending = self.pending, []
        self._last_flush = time.monotonic()
        reason = None
        if batch:
            reason = await asyncio.to_thread(append_checking, self.engine, self.inp.run_id, batch,
                                             invocation=self.inp.invocation, run_cost_usd=self.inp.run_cost_usd)
            self.written += sum(1 for e in batch if e.type == MaterializeTaskResult.type_name())
        self.progress({"harness": self.harness, "trials_recorded": self.written, "tasks_total": self.total,
                       "calls": self.meter.calls})
        if reason:
            raise RunHalted(reason)

    def result(self) -> MaterializeBatchResult:
        return MaterializeBatchResult(start=self.inp.start, stop=self.inp.stop, trials_recorded=self.written,
                                      passed=self.counts["pass"], failed=self.counts["fail"],
                                      errored=self.counts["err"])
