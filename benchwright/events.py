"""One pydantic model per event type (§5). The log stores ``(run_id, seq, type, data)``; ``type`` is the class name.

Events are built here and appended through ``benchwright.store.events.append_events`` with an idempotency key
derived from (phase, invocation, what), so a retried activity never writes an event twice.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from benchwright.schemas import Outcome


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__


class RunLaunched(Event):
    """Written by the API at seq 0, before the workflow starts."""

    launch: dict[str, Any]
    account_id: str
    driver: str
    fork: dict[str, Any] | None = None
    """On a forked run: ``{parent_run_id, rewind_to, kind}`` (``benchwright.schemas.ForkOrigin``)."""


class PipelineStarted(Event):
    workflow_id: str
    phases: list[dict[str, Any]]
    """The plan: every phase with ``skip_reason`` null when it will run."""


class PipelineFinished(Event):
    status: str
    error: str | None = None
    halted: bool = False
    halt_reason: str | None = None


class PhaseStarted(Event):
    phase: str


class PhaseCompleted(Event):
    phase: str
    duration_ms: int


class PhaseFailed(Event):
    phase: str
    error_type: str
    detail: str
    stack_trace: str


class PhaseSkipped(Event):
    phase: str
    reason: str


class PhaseCacheHit(Event):
    """The phase copied a public run's cell instead of doing its work (§2): its artifacts and snapshot follow."""

    phase: str
    source_run_id: str
    """The run that did the work."""
    input_hash: str
    """The cell: (phase, input_hash) in ``phase_fingerprints``."""
    snapshot_id: str | None = None


class AgentTextEvent(Event):
    """The Driver talking (the builtin driver narrates its deterministic decisions), or a product-sandbox run's
    agent (``benchwright.product.runner``), stamped with its task's ``index``."""

    phase: str
    text: str
    index: int | None = None


class FetchArtifact(Event):
    source: str
    sha256: str
    bytes: int
    format: str
    file: str | None = None
    """The dataset's file name in the run's work directory, where the phases after Fetch find it (None in artifacts
    recorded before Fetch named it: then it is the work file whose blob id is ``sha256``, ``handoff.dataset_file``).
    Not load-bearing: the bytes' sha256 is."""


class AnalyzeArtifact(Event):
    format: str
    rows: int
    columns: list[str]
    input_field: str | None
    reference_field: str | None
    template: str | None = None
    """The scorer shape the Driver chose (``numeric``, ``multiple_choice``...); None when the launch brought
    task_impl.py. Atomize writes the scorer from it."""
    fields: dict[str, str] = Field(default_factory=dict)
    """The template's role -> column mapping (``{"input": "question", "reference": "answer"}``)."""
    splits: dict[str, int] = Field(default_factory=dict)
    """Split name -> rows, when the dataset ships splits (§13: each is a subset)."""


class DatasetResolved(Event):
    """Find's choice (§2): the catalog entry a natural-language prompt resolved to, and why."""

    prompt: str
    name: str
    source: str
    """The entry's URL, ``catalog:<name>`` for a file bundled with the catalog, or ``registry:<subset>@<version>``
    for a registered subset's snapshot."""
    format: str | None = None
    license: str | None = None
    why: str
    benchmark_id: str | None = None
    """A registered benchmark the prompt resolved to (``benchwright.registry.find``), with its subset."""
    subset_id: str | None = None
    impl_id: str | None = None
    """The official impl the run is pinned to and scores with (None: the Driver writes the scorer)."""


class SyntheticSubsetCreated(Event):
    """Analyze built the run's subset from a scoping phrase or a split (§7, §13): the tasks are these rows."""

    name: str
    recipe: str
    count: int
    source_rows: list[int]
    """Row indices of the dataset, in task order (task i is row ``source_rows[i]``)."""
    synthetic: bool = True


class DatasetTasksArtifact(Event):
    count: int


class SetupArtifact(Event):
    python: str
    requirements: list[str] = Field(default_factory=list)


class ModelProxyArtifact(Event):
    model_id: str
    litellm_config_yaml: str


class AtomizeArtifact(Event):
    invocation: int
    impl_sha256: str
    source: str
    """``launch`` when the launch brought task_impl.py, else the template the Driver used."""


class MaterializeTaskResult(Event):
    invocation: int
    index: int
    trial: int
    score: float | None
    outcome: Outcome
    output: str | None
    meta: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    cost_usd: float = 0.0
    input: str | None = None
    """What the model saw on the scorer's last model call, bounded (``benchwright.scoring.results.model_input``)."""
    duration_ms: int | None = None
    """The trial's latency: from the scorer runtime taking it up to its settling, retries included (None where
    the runtime does not time trials: a harness bridge, results recorded before it was kept)."""


class MaterializeTaskAggregated(Event):
    invocation: int
    index: int
    score: float | None
    outcome: Outcome
    trial_scores: list[float | None]


TERMINAL_EVENT = PipelineFinished.type_name()
EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in Event.__subclasses__()}


class RunHalted(Event):
    """The run's halted flag went up (§9); ``halt_reason`` says why (match it by prefix)."""

    halt_reason: str


class RunResumed(Event):
    """The halt was cleared: a pause resumed, or a review resolved (the resolution is the Driver's instructions)."""

    previous_reason: str
    review_resolution: str | None = None


class ControlRefused(Event):
    """A control signal (Temporal UI / ``temporal workflow signal``) the workflow refused, and why.

    Updates answer a refusal synchronously (409) and leave no trace; a signal has no caller to answer, so the
    refusal is written to the log for the operator who sent it.
    """

    control: str
    """``pause``, ``resume``, ``stop`` or ``review_resolution``."""
    code: str
    """The same code the update's 409 carries (``not_paused``, ``already_finished``, ...)."""
    reason: str


class PhaseRestartRequested(Event):
    """The Driver asked for the current phase to start over (closes that invocation instead of PhaseCompleted)."""

    phase: str
    reason: str


class HumanReviewRequested(Event):
    """The Driver's requestHumanReview tool: the run waits for a review resolution."""

    phase: str
    reason: str


EVENT_TYPES.update({cls.__name__: cls for cls in (RunHalted, RunResumed, ControlRefused, PhaseRestartRequested,
                                                  HumanReviewRequested)})


class SandboxCreated(Event):
    sandbox_id: str
    role: str
    backend: str
    instance_size: str
    isolation: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Includes ``benchwright_role`` (how events, cost reconstruction and the dashboard tell roles apart)."""


class SandboxKilled(Event):
    sandbox_id: str
    role: str
    duration_ms: int
    cost_usd: float = 0.0
    """(duration x instance size) at the backend's rate; the cost trigger adds it to cost.sandbox."""


class SnapshotCreated(Event):
    snapshot_id: str
    phase: str


class ProxyLingerMetered(Event):
    """The model proxy's post-run linger, metered after the run's own ledger (cost.proxy_linger, not incurred)."""

    seconds: float
    cost_usd: float


EVENT_TYPES.update({cls.__name__: cls for cls in (SandboxCreated, SandboxKilled, SnapshotCreated,
                                                  ProxyLingerMetered)})


class ToolCallEvent(Event):
    """The LLM driver called one of its phase tools (``benchwright.drivers.llm_tools``)."""

    phase: str
    invocation: int
    step: int
    """The driver's model call (1-based within the invocation) that asked for this tool."""
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None
    """A product-sandbox run's agent: the task it works on (None: the LLM driver)."""


class ToolResultEvent(Event):
    """What the tool answered the LLM driver (as sent to its model, truncated)."""

    phase: str
    invocation: int
    step: int
    call_id: str
    name: str
    ok: bool
    content: str
    index: int | None = None
    """A product-sandbox run's agent: the task it works on (None: the LLM driver)."""


class DriverUsage(Event):
    """Tokens one LLM-driver model call spent; the cost trigger adds ``cost_usd`` to cost.driver (billed)."""

    phase: str
    invocation: int
    step: int
    model: str
    """The LiteLLM model string called (``openrouter/deepseek/deepseek-v4-flash``)."""
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    """From the deployment's configured driver prices, else LiteLLM's price map, else 0."""


EVENT_TYPES.update({cls.__name__: cls for cls in (ToolCallEvent, ToolResultEvent, DriverUsage)})


class RegressionDetected(Event):
    """A scheduled replay (issue 17) fell significantly below its reference run: appended to the replay's log once
    the comparison is in, so it follows PipelineFinished (like ProxyLingerMetered). Raised on the firing where the
    drop first appears; later firings that still regress do not raise it again until a replay recovers."""

    schedule_id: str
    reference_run_id: str
    difference: float
    """The replay's pass rate minus the reference's on the tasks both scored (negative: a drop)."""
    difference_ci: tuple[float, float]
    p_value: float
    """McNemar's exact test."""
    lost: int
    gained: int
    alert_drop: float
    alert_p: float
    verdict: str


EVENT_TYPES[RegressionDetected.type_name()] = RegressionDetected


class ForkDecided(Event):
    """The Fork phase's decision (§2, §10): where the fork starts over, what it inherited and what it overrides."""

    parent_run_id: str
    rewind_to: str
    inherited: list[str]
    """Phases inherited from the parent (their events are copied above, marked ``inherited_from``)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Override name -> the value in force (task_impl as its sha256)."""
    interpreted: list[str] = Field(default_factory=list)
    """How the Driver read each clause of the prose instructions."""


EVENT_TYPES[ForkDecided.__name__] = ForkDecided


class HarnessLogArtifact(Event):
    """A harness-bridge run's native log (inspect ``.eval``, lm-eval samples JSONL), kept as a run artifact:
    ``GET /v1/runs/{id}/harness-log`` downloads it (``benchwright.harness.artifacts``)."""

    harness: str
    filename: str
    sha256: str
    bytes: int


EVENT_TYPES[HarnessLogArtifact.type_name()] = HarnessLogArtifact


class HarnessTaskArtifact(Event):
    """What a harness-bridge run evaluates: the harness, its installed version, and a digest of the launch's
    ``harness_config`` (task name or task file, data files, arguments). It stands where Fetch/Analyze/Atomize's
    artifacts stand for a benchwright run, so two bridge runs of different tasks never share a fingerprint."""

    harness: str
    version: str
    task: str | None
    config_sha256: str


EVENT_TYPES[HarnessTaskArtifact.type_name()] = HarnessTaskArtifact


class TemplateProbeArtifact(Event):
    """What a product-sandbox run's base holds, probed in a ``template_probe`` sandbox before Setup: the OS, the
    shells and interpreters found (name -> version line) and how many base files the recipe put in place."""

    os: str
    kernel: str
    shells: dict[str, str]
    interpreters: dict[str, str]
    base_files: int


class ProductRecipeArtifact(Event):
    """The recipe a product-sandbox run evaluates (frozen at Setup): its name (the subset id its impls are keyed
    on), the sha256 of its canonical JSON, the task count, and the generated impl's id."""

    name: str
    recipe_sha256: str
    tasks: int
    impl_id: str


EVENT_TYPES.update({cls.__name__: cls for cls in (TemplateProbeArtifact, ProductRecipeArtifact)})


class WorkFilesRecorded(Event):
    """The run's work files when a phase invocation completed (path -> blob id in the blob store): how the next
    phase, on any worker, gets them (``benchwright.runs.handoff``)."""

    phase: str
    invocation: int
    files: dict[str, str]


EVENT_TYPES[WorkFilesRecorded.type_name()] = WorkFilesRecorded


class RunNarrated(Event):
    """The run's narration (issue 26, ``benchwright.report.narration``): a short prose summary written once the run is
    over. An output event: it follows PipelineFinished and never feeds the fingerprint."""

    text: str
    narrator: str
    """``builtin``, or the LiteLLM model that wrote it."""
    fallback: str | None = None
    """Why the configured LLM narrator's text is not the one recorded (its error): the builtin text stands in."""
    compared_with: str | None = None
    """The run the narration compares against (the parent of a fork/replay, else the previous run of its shape)."""


class NarrationUsage(Event):
    """Tokens the LLM narrator spent on the run's narration; the cost trigger adds ``cost_usd`` to cost.narration
    (billed, with the markup) and the call and token counts beside it (migration 0013)."""

    model: str
    calls: int = 1
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class ReportFile(Event):
    """A file the run's report wrote (issue 26, ``benchwright.report``): its bytes are a blob in the deployment's
    blob store under ``digest``; ``GET /v1/runs/{id}/files/{name}`` downloads it. An output event (§6): never a
    fingerprint input."""

    name: str
    media_type: str
    digest: str
    """sha256 of the bytes, hex (the blob id)."""
    size: int


EVENT_TYPES.update({cls.__name__: cls for cls in (RunNarrated, NarrationUsage, ReportFile)})
AFTER_TERMINAL: frozenset[str] = frozenset(cls.__name__ for cls in (RunNarrated, NarrationUsage, ReportFile))
"""The output events a run's log may hold after its terminal PipelineFinished (its narration and report, written
once the run is over). An SSE stream closes at the terminal event; polling (or a stream resumed with
``Last-Event-ID``) reads these."""
