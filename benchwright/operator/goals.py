"""What an Operator session is asked and what it may spend (issue 26): the structured goals of the builtin
operator, the session's limits, and the answer it ends with."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from benchwright.operator.sizing import MAX_PLANNED_TASKS
from benchwright.schemas import ForkOverrides, ModelSpec

OPERATORS = ("builtin",)
"""Operators by a word. ``builtin`` is deterministic and offline; besides it, any ``<provider>://<model>`` names an
LLM operator (``benchwright.operator.llm``)."""
MAX_PROSE_GOAL = 4000
MAX_SESSION_RUNS = 50
MAX_SESSION_COST = 1_000_000.0
MAX_DATASET = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Goal(_Strict):
    halfwidth: float = Field(default=0.02, gt=0, le=0.5, allow_inf_nan=False)
    """The precision (±, a fraction: 0.02 = 2 points) sample-size advice is given for when a result is
    inconclusive."""


class BetterGoal(_Goal):
    """Is ``candidate`` better than ``baseline`` on ``dataset``?"""

    question: Literal["better"]
    dataset: str = Field(min_length=1, max_length=MAX_DATASET)
    baseline: ModelSpec
    candidate: ModelSpec
    tasks: int | None = Field(default=None, ge=1, le=MAX_PLANNED_TASKS)
    """Measure both on this many tasks first (``constraints.max_tasks``); when that comparison is inconclusive the
    session extends: both again over the tasks the sample-size plan asks for (the dataset may hold fewer), if
    the budget has two more runs. Unset: the whole dataset, once."""


class CheapestGoal(_Goal):
    """Which of ``models`` is cheapest with a pass rate of at least ``min_score`` on ``dataset``?"""

    question: Literal["cheapest"]
    dataset: str = Field(min_length=1, max_length=MAX_DATASET)
    models: list[ModelSpec] = Field(min_length=1, max_length=MAX_SESSION_RUNS)
    min_score: float = Field(ge=0, le=1, allow_inf_nan=False)


class RegressedGoal(_Goal):
    """Did the reference run's model regress? (a replay of the reference with its own model, compared)"""

    question: Literal["regressed"]
    reference_run: str = Field(min_length=1, max_length=64)


class HelpsGoal(_Goal):
    """Does ``change`` (fork overrides: a model, a task_impl, trials, ...) help or hurt the reference run?"""

    question: Literal["helps"]
    reference_run: str = Field(min_length=1, max_length=64)
    change: ForkOverrides


class AskGoal(_Goal):
    """A goal in prose (``"goal": "..."`` in the body): only an LLM operator takes it."""

    question: Literal["ask"]
    text: str = Field(min_length=1, max_length=MAX_PROSE_GOAL)


Goal = Annotated[BetterGoal | CheapestGoal | RegressedGoal | HelpsGoal | AskGoal, Field(discriminator="question")]


class SessionBudget(_Strict):
    runs: int = Field(default=10, ge=1, le=MAX_SESSION_RUNS)
    """Most runs the session may launch."""
    cost: float | None = Field(default=None, gt=0, le=MAX_SESSION_COST, allow_inf_nan=False)
    """Most USD (``cost.incurred`` summed over its runs) the session may spend; checked before each launch."""
    deadline: AwareDatetime | None = None
    """No launch after this instant (UTC); the session answers with what it has."""


class SessionLimits(_Strict):
    session: SessionBudget = Field(default_factory=SessionBudget)


class SessionCreate(_Strict):
    """Body of ``POST /v1/operator/sessions``."""

    operator: str = Field(default="builtin", min_length=1, max_length=64)
    """``builtin`` or ``<provider>://<model>`` (an LLM operator, its key the account's ``<PROVIDER>_API_KEY``)."""
    goal: Goal
    """A structured goal, or (LLM operator) a sentence: ``"goal": "..."`` is read as ``{"question": "ask", ...}``."""
    limits: SessionLimits = Field(default_factory=SessionLimits)
    api_base: str | None = Field(default=None, min_length=1, max_length=2048)
    """Where an LLM operator's calls go (checked like a launch's model ``api_base``); default: its provider's."""
    input_cost_per_token: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    output_cost_per_token: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    """An LLM operator's token prices (USD) where LiteLLM's cost map does not price it."""

    @model_validator(mode="before")
    @classmethod
    def _prose(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("goal"), str):
            return {**data, "goal": {"question": "ask", "text": data["goal"]}}
        return data


class Evidence(BaseModel):
    """One run the session read: what the answer's table shows."""

    label: str
    run_id: str
    model: str
    status: str
    pass_rate: float | None = None
    pass_rate_ci: tuple[float, float] | None = None
    scored: int = 0
    no_answer: int = 0
    errored: int = 0
    halt_reason: str | None = None
    error: str | None = None
    """Why the run ended ``error`` (a phase's failure: what a Driver that struggled left)."""
    cost: float = 0.0
    """USD the run spent in all (``cost.incurred``: the model's tokens, the Driver, sandboxes, narration)."""
    model_cost: float = 0.0
    """USD of the model under test's tokens (``cost.model``): what "cheapest" ranks by."""


class PairedEvidence(BaseModel):
    a: str
    b: str
    difference: float
    difference_ci: tuple[float, float]
    p_value: float
    significant: bool
    compared: int
    verdict: str


class Answer(BaseModel):
    """How a session ends: the sentence, the evidence table, and what could not be established."""

    outcome: str
    """A machine-readable verdict: ``candidate_better``, ``candidate_worse``, ``no_significant_difference``,
    ``cheapest``, ``none_meets_bar``, ``regressed``, ``not_regressed``, ``helps``, ``hurts``,
    ``budget_exhausted``, ``stopped``, ``failed``."""
    sentence: str
    evidence: list[Evidence] = Field(default_factory=list)
    comparisons: list[PairedEvidence] = Field(default_factory=list)
    unestablished: list[str] = Field(default_factory=list)
    chosen: str | None = None
    """The run the answer points at (``cheapest``: the cheapest run above the bar)."""
    needed_tasks: int | None = None
    """Tasks a decisive measurement would need (sample-size planning), when the answer is inconclusive."""


class SessionView(BaseModel):
    """``GET /v1/operator/sessions/{id}``."""

    id: str
    operator: str
    status: str
    goal: dict[str, Any]
    limits: dict[str, Any]
    runs: list[str]
    cost: float
    """USD spent so far: the session's runs (``cost.incurred`` summed) and the operator's own tokens."""
    operator_cost: float = 0.0
    """USD of the LLM operator's own tokens (never on a run's ``cost.driver``); 0 for ``builtin``."""
    answer: Answer | None
    created_at: datetime
    finished_at: datetime | None
