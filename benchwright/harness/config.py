"""The ``harness`` launch field (§4) and its ``harness_config``: what a launch may say, checked before a run exists.

``benchwright`` (the default) is the pipeline with a Driver-written scorer; ``inspect``, ``lmeval`` and
``lighteval`` are harness bridges: the harness brings the dataset and the scorer, Benchwright runs it in the work
sandbox behind the run's model route (``benchwright.harness.bridge``). ``harbor`` runs a harbor task directory
(instruction, environment, tests, optional solution) with harbor itself in a ``harbor_orchestrator`` sandbox, each
trial's environment a ``harbor_task_env`` sandbox (``benchwright.harness.harbor``). Anything else is a typo: 400,
never a fallback.

Folding rules (one place): the harness's ``limit``, ``max_tasks`` and ``metadata.limit`` cap the samples together,
narrowest wins (§9); inspect's ``epochs`` and harbor's attempts (``epochs`` here too) are the run's trials (k), so a
launch's ``trials.plan.k`` must agree; lm-eval reduces its ``repeats`` with the task's filter before it scores a doc,
so an lm-eval doc is one trial, and so is a lighteval doc.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from benchwright.errors import InvalidInput
from benchwright.runs.limits import RunLimits, TaskLimits
from benchwright.schemas import LaunchRequest, suggest
from benchwright.scoring.aggregators import AggregatorConfig, TrialPlan, TrialsConfig

Harness = Literal["inspect", "lmeval", "lighteval", "harbor"]
HARNESSES: tuple[str, ...] = ("benchwright", "inspect", "lmeval", "lighteval", "harbor")
"""What ``harness`` may say (``benchwright.schemas.HARNESS_VALUES``; a test keeps the two equal)."""
BRIDGES: tuple[str, ...] = ("inspect", "lmeval", "lighteval", "harbor")
NOT_YET: tuple[str, ...] = ()
"""Harnesses the spec names that this deployment cannot run yet (answered 400 ``harness_not_supported``)."""
HARBOR_AGENTS = ("oracle", "nop")
"""harbor agents that need no model."""
HARBOR_MODEL_AGENTS = ("terminus-2",)
"""harbor agents that run inside harbor's own process and call the model through LiteLLM: pointed at the run's
relay (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` = the relay's URL and per-batch key), never at a provider."""
HARBOR_REFUSED = ("harbor's other agents are installed agents (claude-code, codex, aider, openhands, ...): each "
                  "installs its own CLI into the task environment from the network (npm, pip, curl) and calls its "
                  "provider from there, with the key handed to that environment, so its calls cannot be pinned to "
                  "the run's relay and it cannot install offline")
"""Why every harbor agent but ``oracle``, ``nop`` and ``terminus-2`` answers 400 (docs/harness.md)."""
HARBOR_PATH = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.?(?:/|$))[A-Za-z0-9._/-]{1,300}$")
"""``harness_config.path`` of a harbor run: relative, no ``.``/``..`` segments; resolved under the bundled task sets
(``bundled/<name>``) or the deployment's harbor task root, never elsewhere on the host."""
FILE_NAME = re.compile(r"^(?!bw_)[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
"""A file carried in ``harness_config.files``: a plain name in the sandbox's working directory (no directories, no
``..``); ``bw_*`` is the bridge's own."""
MAX_FILES = 32


class HarnessConfig(BaseModel):
    """``harness_config`` of a bridge launch."""

    model_config = ConfigDict(extra="forbid")

    task: str | None = Field(default=None, min_length=1, max_length=300)
    """A registered task of the installed harness (inspect: a registry name or ``file.py@name`` of ``files``;
    lm-eval: a task name). Exactly one of ``task`` and ``task_file``."""
    task_file: str | None = Field(default=None, min_length=1, max_length=256 * 1024)
    """The task carried in the launch: an inspect ``@task`` Python file, or an lm-eval task YAML (its ``task:`` key
    names it). Local data it reads goes in ``files``; nothing is downloaded at run time."""
    task_name: str | None = Field(default=None, min_length=1, max_length=200)
    """inspect: which ``@task`` of ``task_file`` to run when it defines several."""
    files: dict[str, str] = Field(default_factory=dict)
    """Data files (name -> text) put beside the task file, e.g. the JSONL its dataset reads."""
    limit: int | None = Field(default=None, ge=1)
    """The harness's own sample limit; folded with ``max_tasks`` and ``metadata.limit`` (narrowest wins)."""
    epochs: int | None = Field(default=None, ge=1, le=100)
    """inspect: epochs per sample, recorded as the run's trials."""
    args: dict[str, Any] = Field(default_factory=dict)
    """inspect: task arguments (``-T name=value``)."""
    generate: dict[str, Any] = Field(default_factory=dict)
    """inspect: generation config (``temperature``, ``max_tokens``, ``seed``...)."""
    max_connections: int | None = Field(default=None, ge=1, le=256)
    """inspect: model calls in flight (default: the launch's ``concurrency``, at most 64)."""
    num_fewshot: int | None = Field(default=None, ge=0, le=100)
    """lm-eval: ``--num_fewshot``."""
    gen_kwargs: dict[str, Any] = Field(default_factory=dict)
    """lm-eval: ``--gen_kwargs``."""
    metric: str | None = Field(default=None, min_length=1, max_length=100)
    """lm-eval and lighteval: the per-doc metric that is the sample's score (default: the task's first metric)."""
    path: str | None = Field(default=None, min_length=1, max_length=300)
    """harbor: a task directory or a directory of task directories (``bundled/<set>``, or relative to the
    deployment's harbor task root)."""
    agent: str | None = Field(default=None, min_length=1, max_length=100)
    """harbor: the agent (``oracle`` runs the task's solution, ``nop`` does nothing)."""

    @field_validator("files")
    @classmethod
    def _plain_names(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > MAX_FILES:
            raise ValueError(f"at most {MAX_FILES} files")
        for name in files:
            if not FILE_NAME.match(name):
                raise ValueError(f"file name {name!r} must be a plain name (letters, digits, '.', '_', '-'; "
                                 "no directories; not starting with 'bw_')")
        return files


def is_bridge(launch: LaunchRequest) -> bool:
    """A harness-bridge launch (the workflow asks, to plan Materialize as one harness process)."""
    return launch.harness in BRIDGES


def check_harness(launch: LaunchRequest) -> HarnessConfig | None:
    """The launch's harness, validated: its config for a bridge, None for the Benchwright pipeline.

    Raises:
        InvalidInput: an unknown harness (``unknown_harness``, with a suggestion), one not supported yet
            (``harness_not_supported``), a bridge launch that also names a dataset/benchmark/task_impl, a missing or
            malformed ``harness_config``, or a ``harness_config`` on a pipeline launch.
    """
    harness = launch.harness or "benchwright"
    if harness in NOT_YET:  # pragma: no cover - none today; kept so a future named-but-unbuilt harness says so
        raise InvalidInput(f"harness '{harness}' is not supported yet; supported: {', '.join(HARNESSES)}",
                           code="harness_not_supported")
    if harness not in HARNESSES:
        raise InvalidInput(f"unknown harness '{harness}'{suggest(harness, HARNESSES + NOT_YET)}; supported: "
                           f"{', '.join(HARNESSES)}", code="unknown_harness")
    if harness == "benchwright":
        if launch.harness_config is not None:
            raise InvalidInput("harness_config is for harness-bridge runs (harness: inspect, lmeval, lighteval or "
                               "harbor)",
                               code="invalid_harness_config")
        return None
    extra = [name for name in ("dataset", "benchmark", "subset", "impl", "task_impl")
             if getattr(launch, name, None) is not None]
    if extra:
        raise InvalidInput(f"a {harness} bridge run takes its task from harness_config; drop {', '.join(extra)}",
                           code="invalid_harness_config")
    if launch.harness_config is None:
        raise InvalidInput(f"harness '{harness}' needs harness_config naming its task (task or task_file)",
                           code="invalid_harness_config")
    try:
        config = HarnessConfig.model_validate(launch.harness_config)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'harness_config'}: {e['msg']}"
                             for e in exc.errors())
        raise InvalidInput(f"harness_config: {problems}", code="invalid_harness_config") from None
    if harness == "harbor":
        return _check_harbor(config)
    if (config.task is None) == (config.task_file is None):
        raise InvalidInput("harness_config needs exactly one of task (a registered task) and task_file",
                           code="invalid_harness_config")
    own = {"inspect": {"task_name", "epochs", "args", "generate", "max_connections"},
           "lmeval": {"num_fewshot", "gen_kwargs", "metric"},
           "lighteval": {"task_name", "metric"},
           "harbor": {"path", "agent", "epochs"}}
    foreign = sorted(name for other, names in own.items() if other != harness for name in names
                     if name in config.model_fields_set and name not in own[harness])
    if foreign:
        raise InvalidInput(f"harness_config: {', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not "
                           f"{harness} options", code="invalid_harness_config")
    if harness == "lmeval" and config.task_file is not None:
        lmeval_task_name(config.task_file)
    if harness == "lighteval":
        lighteval_task_spec(config)
    return config


def lighteval_task_spec(config: HarnessConfig) -> str:
    """The lighteval task spec a bridge runs: ``task`` (a registered task), or the ``task_file``'s task named by
    ``task_name`` (``name`` or ``name|fewshot``); one task, no suite list.

    Raises:
        InvalidInput: a custom task file without ``task_name``, or a spec that is not one ``name[|fewshot]``.
    """
    spec = config.task if config.task is not None else config.task_name
    if spec is None:
        raise InvalidInput("harness_config.task_name must name the task_file's task (TASKS_TABLE name, optionally "
                           "'|<fewshot>')", code="invalid_harness_config")
    if not re.match(r"^[A-Za-z0-9_.:-]{1,100}(\|[A-Za-z0-9_.:-]{1,100})?(\|[0-9]{1,3})?$", spec):
        raise InvalidInput(f"lighteval task {spec!r} must be one 'name', 'name|fewshot' or 'suite|name|fewshot'",
                           code="invalid_harness_config")
    return spec


def _check_harbor(config: HarnessConfig) -> HarnessConfig:
    used = config.model_fields_set - {"path", "agent", "epochs", "limit"}
    if used:
        raise InvalidInput(f"harness_config: {', '.join(sorted(used))} {'is' if len(used) == 1 else 'are'} not "
                           "harbor options (path, agent, epochs, limit)", code="invalid_harness_config")
    if config.path is None or not HARBOR_PATH.match(config.path):
        raise InvalidInput("harness_config.path must name a harbor task directory or a directory of tasks, relative "
                           "(bundled/<set>, or under the deployment's harbor task root), without '..'",
                           code="invalid_harness_config")
    agent = config.agent or "oracle"
    if agent not in HARBOR_AGENTS + HARBOR_MODEL_AGENTS:
        raise InvalidInput(f"harbor agent {agent!r} is not supported here: only "
                           f"{', '.join(HARBOR_AGENTS + HARBOR_MODEL_AGENTS)} run on a bridge ({HARBOR_REFUSED})",
                           code="harness_not_supported")
    return config


def lmeval_task_name(task_yaml: str) -> str:
    """The ``task:`` an lm-eval task YAML declares.

    Raises:
        InvalidInput: not YAML, or no ``task`` name in it.
    """
    try:
        doc = yaml.safe_load(task_yaml)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"harness_config.task_file is not valid YAML: {exc}",
                           code="invalid_harness_config") from None
    name = doc.get("task") if isinstance(doc, dict) else None
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_.-]{1,100}$", name):
        raise InvalidInput("harness_config.task_file must be an lm-eval task YAML with a 'task:' name",
                           code="invalid_harness_config")
    return name


def bridge_trials(config: HarnessConfig, trials: TrialsConfig, *, given: bool) -> TrialsConfig:
    """The run's trials for a bridge: k = inspect's epochs or harbor's attempts (1 for lm-eval and lighteval),
    reduced by ``mean`` unless the launch chose an aggregator (inspect's default epoch reducer is the mean too).

    Raises:
        InvalidInput: the launch's ``trials.plan.k`` disagrees with the harness's epochs.
    """
    k = config.epochs or (trials.plan.k if given else 1)
    if given and trials.plan.k != k:
        raise InvalidInput(f"trials.plan.k ({trials.plan.k}) and harness_config.epochs ({k}) disagree: a bridge "
                           "run's trials are the harness's epochs", code="invalid_harness_config")
    aggregator = trials.aggregator if given else AggregatorConfig(name="mean")
    return TrialsConfig(plan=TrialPlan(k=k), aggregator=aggregator)


def check_bridge_limits(limits: RunLimits) -> None:
    """Per-task ceilings are the scorer host's; a harness runs its own samples, so they cannot be enforced.

    Raises:
        InvalidInput: the launch set a ``task.*`` or ``attempt.*`` limit.
    """
    if limits.task != TaskLimits():
        raise InvalidInput("task.* and attempt.* limits cannot be enforced on a harness-bridge run (the harness "
                           "runs its own samples); use the harness's own options, or run.* limits",
                           code="unenforceable_limit")


def sample_limit(config: HarnessConfig, limits: RunLimits) -> int | None:
    """§9: ``max_tasks`` (already folded with ``metadata.limit``) and the harness's own limit, narrowest wins."""
    caps = [c for c in (config.limit, limits.max_tasks) if c is not None]
    return min(caps) if caps else None
