"""Pydantic payloads shared by the REST API and Temporal (one schema, one validation step).

The launch body (``LaunchRequest``) is what ``POST /v1/runs`` accepts and what ``RunWorkflow`` receives; the
run views are what the API returns. Table models never cross these boundaries.
"""

from __future__ import annotations

import difflib
import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from benchwright.scoring.aggregators import TrialsConfig
from benchwright.security.bounds import MAX_PRICE_PER_TOKEN, check_json_size, check_numbers

PHASES: tuple[str, ...] = ("find", "fetch", "analyze", "setup", "attach", "atomize", "materialize")
"""The pipeline's phases in execution order (§2). ``fork`` precedes them on forked launches."""

RunStatus = Literal["running", "ok", "error"]
DisplayStatus = Literal["running", "ok", "error", "halted", "killed", "waiting", "paused"]
Outcome = Literal["pass", "fail", "err"]
Visibility = Literal["private", "unlisted", "public"]

MAX_TASK_IMPL_BYTES = 512 * 1024
REQUIREMENT = (r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?"  # name[extras]
               r"([<>=!~]=?[A-Za-z0-9.*+!_-]+(,[<>=!~]=?[A-Za-z0-9.*+!_-]+)*)?$")  # version specifiers
"""A pip requirement specifier and nothing else (no options, URLs or paths reach pip's command line)."""
RETIRED_LAUNCH_KEYS = {"operator": "driver", "agent": "driver"}

MAX_METADATA_BYTES = 64 * 1024
"""``metadata`` serialized as JSON: it is stored on the run and returned by ``GET /v1/runs/{id}``."""
MAX_OBJECT_BYTES = 16 * 1024
"""``model.params``, ``limits`` and ``constraints`` serialized as JSON."""
MAX_INDEX = 2**31 - 1
"""Bound of every integer path/query parameter (task index, ``after``): the store's integer columns and SQLite's
and Postgres's parameters stay far from 2^63, which answered 500 before (issue 15 item 5)."""
COMPUTE_VALUES = ("local", "sandbox0", "e2b", "default", "auto")
"""What ``compute`` may say; ``benchwright.sandbox.compute.COMPUTE_CHOICES`` (a test keeps the two equal)."""
DRIVER_VALUES = ("builtin",)
HARNESS_VALUES = ("benchwright", "inspect", "lmeval", "lighteval", "harbor")
"""What ``harness`` may say; ``benchwright.harness.config.HARNESSES`` (a test keeps the two equal)."""
MAX_HARNESS_CONFIG_BYTES = 512 * 1024
"""The drivers a launch may name; ``benchwright.runs.launch.DRIVERS`` (a test keeps the two equal)."""
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_LAST_LABEL = r"[A-Za-z_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PORT = r"(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
HOST_PATTERN = (rf"^(?:(?:\*\.)?(?:{_LABEL}\.)*{_LAST_LABEL}\.?|{_OCTET}(?:\.{_OCTET}){{3}}"
                rf"|\[[0-9A-Fa-f:.]{{2,45}}\]){_PORT}$")
"""A host-policy pattern as the OpenAPI schema states it (``benchwright.proxy.policy`` has the grammar): a DNS
name whose last label is not numeric, optionally ``*.``-prefixed; a canonical IPv4 quad; or a bracketed IPv6
literal; each with an optional ``:port``. Declared, not enforced here: the policy's parser refuses what is
wrong with a message saying why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Bounded(_Strict):
    """A request body: before anything else, every number in it is finite and bounded (``check_numbers``), so
    the 422 names the field and its range whichever field it is. Only what arrives over the API is held to it: a
    launch read back from the store or from a workflow's input validates as ``LaunchRequest``, so a bound tightened
    later never fails a stored launch or a running workflow's task."""

    @model_validator(mode="before")
    @classmethod
    def _numbers_bounded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_numbers(data, path="")
        return data


class ModelSpec(_Strict):
    """The system under test: a LiteLLM model string plus where and how to reach it."""

    identifier: str = Field(min_length=1, max_length=512)
    """LiteLLM model string, e.g. ``openai/gpt-4o-mini`` or ``openai/dev`` for an OpenAI-compatible endpoint."""
    source: Literal["litellm"] = "litellm"
    api_base: str | None = Field(default=None, max_length=2048)
    """Base URL of an OpenAI-compatible (or other LiteLLM-supported) endpoint."""
    # The upper bound is enforced on request bodies (``_Bounded``), not here: a stored launch re-validates as is.
    input_cost_per_token: float | None = Field(default=None, ge=0, json_schema_extra={"maximum": MAX_PRICE_PER_TOKEN})
    """USD per input token, for a model LiteLLM's cost map does not price (or to override its price)."""
    output_cost_per_token: float | None = Field(default=None, ge=0, json_schema_extra={"maximum": MAX_PRICE_PER_TOKEN})
    params: dict[str, Any] = Field(default_factory=dict)
    """Sampling parameters set once for the run (temperature, max_tokens, ...); at most 16 KiB serialized."""
    secret: str | None = Field(default=None, max_length=128)
    """Name of a provider secret (``POST /v1/secrets``) holding this model's API key."""

    @field_validator("params")
    @classmethod
    def _small_params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_json_size(v, limit=MAX_OBJECT_BYTES, what="model.params")

    @field_validator("api_base")
    @classmethod
    def _http_only(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("api_base must be an http:// or https:// URL")
        return v


MODEL_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}/[A-Za-z0-9_.:@+-]{1,200}(?:/[A-Za-z0-9_.:@+-]{1,200})*")
"""``provider/model`` as LiteLLM routes it (``openai/gpt-4o-mini``, ``openrouter/meta-llama/llama-3-8b``,
``bedrock/anthropic.claude-v2:1``): a provider, then one or more path-free segments of a conservative alphabet."""


def model_identifier_problem(identifier: str) -> str | None:
    """Why a launch's model identifier is refused (None: it is well formed). Checked where a launch, fork, replay or
    sweep is accepted (``api/routes``), so an identifier without a provider never reaches the credential proxy."""
    shown = json.dumps(identifier[:60])[1:-1] + ("…" if len(identifier) > 60 else "")
    if not identifier.strip():
        return "the model identifier is empty: write provider/model, e.g. openai/gpt-4o-mini"
    if "/" not in identifier:
        return (f"model '{shown}' names no provider: a model identifier is provider/model, e.g. openai/{shown} for "
                "an OpenAI-compatible endpoint at api_base (LiteLLM's naming)")
    if not MODEL_IDENTIFIER.fullmatch(identifier) or any(p in (".", "..") for p in identifier.split("/")):
        return (f"model '{shown}' is not a model identifier: provider/model, made of letters, digits and "
                "_ . : @ + - (no spaces, control characters or '..' segments)")
    return None


def check_model_identifier(identifier: str) -> None:
    """Raise InvalidInput (400 ``invalid_model``) naming the expected form when the identifier is refused."""
    from benchwright.errors import InvalidInput

    problem = model_identifier_problem(identifier)
    if problem is not None:
        raise InvalidInput(problem, code="invalid_model")


class LaunchRequest(_Strict):
    """Body of ``POST /v1/runs``: a dataset launch (§3)."""

    dataset: str | None = Field(default=None, min_length=1, max_length=4096)
    """An http(s) URL, or a path on the server's host where the deployment allows local paths.
    JSONL, a JSON array of objects, or CSV. A pinned launch (``benchmark`` + ``subset``) gives none."""
    prompt: str | None = Field(default=None, min_length=1, max_length=2000)
    """A natural-language launch (§3): what to evaluate, in words ("gsm8k, the first 50", "one mmlu question from
    each subject"). Without ``dataset``, Find resolves it against the deployment's catalog; with one, Analyze still
    reads its scoping phrase (docs/launches.md: Prompt launches)."""
    benchmark: str | None = Field(default=None, min_length=1, max_length=200)
    """Pinned launch (§3): a registry benchmark, by id, then by exact name. Not together with ``dataset``."""
    subset: str | None = Field(default=None, min_length=1, max_length=200)
    """Pinned launch: the benchmark's subset, by id, then by exact name; the run pins its current snapshot."""
    impl: str | None = Field(default=None, min_length=1, max_length=200)
    """Pinned launch: an impl id, or ``latest:official`` (the default): the run scores with that impl's exact
    task_impl.py."""
    replay_of: str | None = Field(default=None, min_length=1, max_length=64)
    """Replay launch (§3, §10): a reference run's id; with ``model`` and nothing else, the run is a replay of it
    (``POST /v1/runs/{id}/replay``)."""
    model: ModelSpec
    """The SUT: a LiteLLM model string, or an object with ``identifier`` and optional ``api_base`` and prices."""
    driver: str | None = Field(default=None, max_length=256, json_schema_extra={
        "pattern": rf"^(?:{'|'.join(DRIVER_VALUES)}|[a-z][a-z0-9_-]{{0,39}}://[A-Za-z0-9][\w.:@/+-]{{0,199}})$"})
    """The Driver (§8). Defaults to the deployment's configured default (``builtin`` on the embedded stack)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form labels kept on the run (at most 64 KiB serialized); not returned by the run list."""
    visibility: Visibility = "private"
    task_impl: str | None = Field(default=None, max_length=MAX_TASK_IMPL_BYTES)
    """Python source of task_impl.py. When given, Atomize uses it verbatim instead of writing one."""
    trials: TrialsConfig | None = None
    """k trials per task and the aggregator that reduces them (§7). Default: k=1, any_pass."""
    requirements: list[Annotated[str, StringConstraints(pattern=REQUIREMENT, max_length=200)]] = Field(
        default_factory=list, max_length=100)
    """Python packages the scorer needs (pip requirement specifiers, e.g. ``sympy>=1.12``); Setup installs them into
    the work sandbox through the egress proxy, so their hosts are subject to the host policy."""
    limits: dict[str, Any] | None = None
    """Ceilings nested ``<level>.<quantity>`` (§9), e.g. ``{"run": {"cost": 5.0}, "task": {"attempts": 2}}``.
    ``GET /v1/limits`` lists what is enforceable; anything else is refused with 400."""
    constraints: dict[str, Any] | None = None
    """Older spelling: ``max_cost_cents`` (run.cost), ``max_duration_ms`` (run.duration), ``max_tasks`` (caps the
    sample count without halting)."""
    compute: str | None = Field(default=None, max_length=32, json_schema_extra={"enum": [*COMPUTE_VALUES, None]})
    """Compute backend: ``local``, ``sandbox0``, ``e2b``, or ``default``/``auto`` (omit for your default, §4)."""
    concurrency: int | None = Field(default=None, ge=1, le=1024)
    """SUT calls in flight during Materialize (e.g. to respect a provider's rate limit). Default: the deployment's."""
    harness: str | None = Field(default=None, max_length=32, json_schema_extra={"enum": [*HARNESS_VALUES, None]})
    """How the evaluation runs (§4): ``benchwright`` (default: a Driver-written scorer), or a harness bridge,
    ``inspect``, ``lmeval``, ``lighteval`` or ``harbor`` (the harness brings dataset and scorer; ``harness_config``
    names its task)."""
    group_by: str | None = Field(default=None, min_length=1, max_length=128)
    """The dataset column results are grouped by by default (``GET /v1/runs/{id}/breakdown``, ``show --by``);
    unset: the first of ``benchwright.scoring.results.GROUP_COLUMNS`` the data has."""
    recipe: str | None = Field(default=None, min_length=1, max_length=4096)
    """A product-sandbox run (docs/agents.md): a bundled recipe's name (``terminal-basics``) or the path of a recipe
    YAML on the worker's host (the local-path rules of ``dataset``). Agents work the recipe's tasks in task sandboxes;
    not with ``dataset``, ``benchmark``, ``task_impl`` or a harness."""
    harness_config: dict[str, Any] | None = None
    """A bridge's task and the harness's own arguments (``benchwright.harness.config.HarnessConfig``): ``task`` or
    ``task_file`` (+ ``files``), ``limit``, ``epochs``, generation args; at most 512 KiB serialized."""

    @field_validator("harness_config")
    @classmethod
    def _small_harness_config(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_json_size(v, limit=MAX_HARNESS_CONFIG_BYTES, what="harness_config")

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_json_size(v, limit=MAX_METADATA_BYTES, what="metadata")

    @field_validator("limits", "constraints")
    @classmethod
    def _small_objects(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_json_size(v, limit=MAX_OBJECT_BYTES, what="limits/constraints")

    @model_validator(mode="before")
    @classmethod
    def _reject_retired_and_unknown(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, replacement in RETIRED_LAUNCH_KEYS.items():
                if key in data:
                    raise ValueError(f"'{key}' is a retired launch key; use '{replacement}'")
            if isinstance(data.get("model"), str):
                data = {**data, "model": {"identifier": data["model"]}}
        return data


class LaunchBody(LaunchRequest, _Bounded):
    """What ``POST /v1/runs`` accepts: a ``LaunchRequest`` whose every number is finite and bounded (422 naming the
    field and its range, ``check_numbers``)."""


class TasksSummary(BaseModel):
    passed: int = 0
    failed: int = 0
    """Every ``fail``, including ``no_answer``."""
    errored: int = 0
    no_answer: int = 0
    """Of ``failed``, the tasks where no answer was found in the reply (``benchwright.scoring.results``): still
    fails."""
    running: int = 0
    total: int = 0
    pass_rate: float | None = None
    """passed / (passed + failed); errors are excluded from the denominator (§12). None before any row settles."""
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    """Unbiased pass@k estimates over the per-trial results (``{"pass@1": .., "pass@k": ..}``) for runs with k > 1."""
    pass_rate_se: float | None = None
    """Standard error of ``pass_rate``, ``√(p(1−p)/n)`` over the n scored tasks (``benchwright.comparison.stats``)."""
    pass_rate_ci: tuple[float, float] | None = None
    """95 % Wilson score interval of ``pass_rate`` [low, high]; from the counts, so live runs have it too."""
    mean_score: ScoreEstimate | None = None
    """Mean aggregated task score with a bootstrap interval over tasks: once the run is over, for runs with k > 1
    or scores other than 0 and 1."""
    pass_at_k_ci: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """95 % bootstrap interval (over tasks) of each ``pass_at_k`` estimate, once the run is over."""


class ScoreEstimate(BaseModel):
    """A mean over tasks with its standard error and 95 % interval."""

    value: float
    se: float
    ci: tuple[float, float]
    method: Literal["wilson", "bootstrap"] = "bootstrap"
    """``wilson`` (score interval from counts) or ``bootstrap`` (percentile, 2,000 resamples of tasks, seed 0)."""


class TasksBlock(BaseModel):
    summary: TasksSummary


class ProxyLinger(BaseModel):
    cents: int = 0
    amount_usd: float = 0.0
    """Exact: a linger is routinely sub-cent."""


class NarrationCounts(BaseModel):
    """Beside cost.narration: the LLM narrator's calls and tokens (0 with the builtin narrator)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class CostView(BaseModel):
    """Spend by source, in USD (§9), maintained on the run row by a database trigger as events land."""

    driver: float = 0.0
    """Tokens the Driver spent."""
    model: float = 0.0
    """Tokens the SUT spent during Materialize."""
    sandbox: float = 0.0
    narration: float = 0.0
    """The run-summary LLM's spend (``benchwright.report.narration``); its calls and tokens are in
    ``narration_usage``."""
    narration_usage: NarrationCounts = Field(default_factory=NarrationCounts)
    incurred: float = 0.0
    """driver + model + sandbox + narration."""
    billed: float = 0.0
    """The platform portion (sandbox + driver + narration) with the deployment's markup: what hits the balance."""
    proxy_linger: ProxyLinger = Field(default_factory=ProxyLinger)
    """Metered after the run's ledger is final; not part of ``incurred``."""


class RunView(BaseModel):
    """What ``GET /v1/runs/{id}`` returns."""

    id: str
    status: RunStatus
    halted: bool
    halt_reason: str | None
    display_status: DisplayStatus
    model: dict[str, Any]
    driver: str
    phase: str | None
    visibility: Visibility
    metadata: dict[str, Any]
    trials_config: dict[str, Any] | None
    limits: dict[str, Any] | None = None
    backend: str | None = None
    materialize_mode: str | None = None
    isolation: str | None = None
    """How the run's sandboxes were isolated: ``namespaces``, or ``none`` where the operator opted in."""
    cost: CostView
    tasks: TasksBlock
    error: str | None = None
    created_at: datetime
    finished_at: datetime | None
    fingerprint: str | None = None
    """The run fingerprint (§6), stored at terminal status; ``GET /v1/runs/{id}/fingerprint`` shows its inputs."""
    benchmark_id: str | None = None
    """The run shape (§7): set at terminal status for pinned runs, at publication for dataset runs."""
    subset_id: str | None = None
    impl_id: str | None = None
    off_leaderboard: str | None = None
    """Why the run will not appear on a leaderboard (private run, private benchmark, on no benchmark...); None
    when it will, once it finishes ok (``benchwright.registry.pinned.leaderboard_note``)."""
    narration: str | None = None
    """A short prose summary of the terminal run (``benchwright.report.narration``); null while it runs. On
    ``GET /v1/runs/{id}`` only (listings leave it out)."""
    terminal: bool = False
    """The run is over: its log is closed by PipelineFinished (the SSE stream ends there, and polling the events
    says ``terminal`` at the same moment). A torn-down run keeps its ``status`` (§1: a halt is a flag, not a
    status), so wait on ``terminal``, not on ``status``; render ``display_status``."""


class RunSummary(BaseModel):
    """One run of ``GET /v1/runs``: what a listing shows, without the launch body (metadata, limits, trials);
    ``GET /v1/runs/{id}`` has the rest."""

    id: str
    status: RunStatus
    halted: bool
    halt_reason: str | None
    display_status: DisplayStatus
    model: str
    """The model's LiteLLM identifier."""
    driver: str
    phase: str | None
    visibility: Visibility
    backend: str | None = None
    cost: CostView
    tasks: TasksBlock
    error: str | None = None
    created_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, view: RunView) -> RunSummary:
        return cls(**{name: getattr(view, name) for name in cls.model_fields if name != "model"},
                   model=str(view.model.get("identifier", "")))


class RunList(BaseModel):
    runs: list[RunSummary]
    next_cursor: str | None
    """Pass as ``?cursor=`` to get the next (older) page; null on the last page."""


class EventView(BaseModel):
    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime


class EventPage(BaseModel):
    events: list[EventView]
    next_after: int | None
    """The seq to pass as ``after`` for the next page (the last seq returned), or the given ``after`` if empty."""
    terminal: bool
    """True once the run's terminal event (PipelineFinished) is in the log and was returned or precedes ``after``."""


class TrialView(BaseModel):
    trial: int
    score: float | None
    outcome: Outcome
    output: str | None
    meta: dict[str, Any]
    error: str | None
    input: str | None = None
    """What the model saw on this trial's last model call, bounded."""


class TaskRowView(BaseModel):
    index: int
    invocation: int
    outcome: Outcome | Literal["running"]
    score: float | None
    output: str | None
    trial_scores: list[float | None]
    no_answer: bool = False
    """A fail whose every trial reported ``extracted: false``."""
    input: str | None = None
    """What the model saw on the scorer's (last) model call, as ``role: content`` lines, first trial; a listing
    shows its last 1,000 characters, the task detail all of it (up to 8,000)."""
    reference: str | None = None
    """The reference answer: ``score_meta.reference``, else the row's reference column
    (``benchwright.scoring.results.reference_column``); bounded."""
    answer: str | None = None
    """The answer the scorer extracted (``score_meta.answer``), bounded; first trial."""
    extracted: bool | None = None
    """``score_meta.extracted`` of the first trial (None: the scorer did not say)."""
    rule: str | None = None
    """``score_meta.rule``: the extraction rule that found the answer."""


class GroupResult(BaseModel):
    """One group of a run's breakdown: counts over its settled tasks and the pass rate's 95 % Wilson interval."""

    group: str
    passed: int = 0
    failed: int = 0
    errored: int = 0
    no_answer: int = 0
    unsettled: int = 0
    """Tasks of the group with no settled result (yet, or ever: a halted run)."""
    total: int = 0
    pass_rate: float | None = None
    pass_rate_ci: tuple[float, float] | None = None


class BreakdownView(BaseModel):
    """``GET /v1/runs/{id}/breakdown``: the run's results per value of one dataset column."""

    run_id: str
    by: str | None
    """The column grouped by; null when none was named and the data has no grouping column (then no groups)."""
    groups: list[GroupResult]
    folded: int = 0
    """Groups past the limit, folded into the ``(other)`` group (smallest first)."""
    columns: list[str]
    """The dataset's columns, the first 500 (any column of the data may be named in ``by``)."""
    candidates: list[str]
    """Columns that look like groupings (``subject``, ``category``...; the launch's ``group_by`` first)."""


class TaskList(BaseModel):
    tasks: list[TaskRowView]
    next_after: int | None


class AgentStepView(BaseModel):
    """One logged step of a product-sandbox run's agent on this task (its latest attempt), in log order."""

    seq: int
    type: str
    """``AgentTextEvent``, ``ToolCallEvent`` or ``ToolResultEvent``."""
    data: dict[str, Any]


class TaskDetail(TaskRowView):
    trials: list[TrialView]
    agent: list[AgentStepView] = Field(default_factory=list)
    """A product-sandbox run: the agent's steps on this task (docs/agents.md); empty for every other run."""


def suggest(value: str, allowed: list[str] | tuple[str, ...]) -> str:
    """A ' (did you mean X?)' hint for a typo, or ''."""
    close = difflib.get_close_matches(value, list(allowed), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# -- forks, replays, sweeps (§10) -----------------------------------------------------------------------------------

REWIND_POINTS: tuple[str, ...] = ("fetch", "analyze", "setup", "attach", "atomize", "materialize")
"""Phases a fork may rewind to; every phase before it is inherited from the parent (``benchwright.runs.forks``)."""
RewindPoint = Literal["fetch", "analyze", "setup", "attach", "atomize", "materialize"]


class ForkOverrides(_Strict):
    """What a fork changes. Each override needs the rewind point at or before the phase that consumes it
    (``benchwright.runs.forks.OVERRIDE_NEEDS``): a later rewind point is refused with 400 naming both."""

    model: ModelSpec | None = None
    """The SUT (rewind to attach; a replay rebinds it at materialize)."""
    dataset: str | None = Field(default=None, min_length=1, max_length=4096)
    """A new source for the same data, e.g. a mirror after the original URL broke (rewind to fetch)."""
    requirements: list[Annotated[str, StringConstraints(pattern=REQUIREMENT, max_length=200)]] | None = Field(
        default=None, max_length=100)
    """The scorer's Python packages (rewind to setup)."""
    task_impl: str | None = Field(default=None, max_length=MAX_TASK_IMPL_BYTES)
    """A replacement task_impl.py (rewind to atomize)."""
    scorer_instructions: str | None = Field(default=None, min_length=1, max_length=20_000)
    """Prose for the Driver that writes the scorer (rewind to atomize)."""
    trials: TrialsConfig | None = None
    limits: dict[str, Any] | None = None
    concurrency: int | None = Field(default=None, ge=1, le=1024)

    @model_validator(mode="before")
    @classmethod
    def _model_string(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            data = {**data, "model": {"identifier": data["model"]}}
        return data

    def given(self) -> list[str]:
        """The names of the overrides set."""
        return [name for name in type(self).model_fields if getattr(self, name) is not None]


class ForkRequest(_Bounded):
    """``POST /v1/runs/{id}/fork``."""

    rewind_to: RewindPoint | None = None
    """Where the fork starts over. Optional only with ``instructions`` (the Fork phase then decides)."""
    overrides: ForkOverrides = Field(default_factory=ForkOverrides)
    instructions: str | None = Field(default=None, min_length=1, max_length=20_000)
    """Prose the Driver interprets in the Fork phase (the builtin driver's vocabulary: ``benchwright.runs.forks``)."""


class ReplayRequest(_Bounded):
    """``POST /v1/runs/{id}/replay``: the reference's benchmark, sample, impl and trials; only the model changes."""

    model: ModelSpec

    @model_validator(mode="before")
    @classmethod
    def _model_string(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            data = {**data, "model": {"identifier": data["model"]}}
        return data


class SweepRequest(_Bounded):
    """``POST /v1/runs/{id}/sweep``: one replay per model."""

    models: list[ModelSpec] = Field(min_length=1, max_length=50)

    @field_validator("models", mode="before")
    @classmethod
    def _model_strings(cls, v: Any) -> Any:
        return [{"identifier": m} if isinstance(m, str) else m for m in v] if isinstance(v, list) else v


class SweepResult(BaseModel):
    reference: str
    runs: list[RunView]
    """The replays, in the order of ``models``."""


class ForkOrigin(BaseModel):
    """Where a forked run came from (RunLaunched ``fork``, the lineage table)."""

    parent_run_id: str
    rewind_to: str | None
    """As requested; the Fork phase's ForkDecided event carries the point it settled on."""
    kind: Literal["fork", "replay"] = "fork"


class LineageNode(BaseModel):
    id: str
    parent_run_id: str | None
    rewind_to: str | None
    kind: Literal["root", "fork", "replay"]
    model: str
    status: RunStatus
    display_status: DisplayStatus
    pass_rate: float | None
    fingerprint: str | None
    """Stored at terminal status, else recomputed from the log (``benchwright.fingerprint``)."""
    created_at: datetime


class LineageView(BaseModel):
    """``GET /v1/runs/{id}/lineage``: the fork tree the run belongs to, root first, each parent before its children
    (children by creation time). Runs the caller may not read are left out."""

    run_id: str
    root: str
    runs: list[LineageNode]
