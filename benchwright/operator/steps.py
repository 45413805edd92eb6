"""The payloads between ``OperatorWorkflow`` and its activities (pydantic, as every Benchwright payload)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from benchwright.operator.builtin import PlannedLaunch
from benchwright.operator.goals import Evidence, SessionLimits
from benchwright.operator.llm import LlmReply, OperatorLlm, ToolCall


class OperatorInput(BaseModel):
    session_id: str
    account_id: str
    operator: str
    goal: dict[str, Any]
    """The structured goal as stored (``benchwright.operator.goals.Goal``)."""
    limits: SessionLimits
    llm: OperatorLlm | None = None
    """The LLM operator's call settings (None: ``builtin``)."""


class PlanStep(BaseModel):
    session_id: str
    account_id: str
    goal: dict[str, Any]


class PlanResult(BaseModel):
    launches: list[PlannedLaunch] = []
    reference: Evidence | None = None
    refused: str | None = None
    """Why the goal cannot be planned (a reference the account cannot read, ...): the session answers with it."""


class LaunchStep(BaseModel):
    session_id: str
    account_id: str
    index: int
    planned: PlannedLaunch
    run_id: str
    """Chosen by the workflow (``workflow.uuid4()``): a retried or replayed launch finds the run it made."""


class LaunchResult(BaseModel):
    run_id: str | None
    refused: str | None = None


class WaitStep(BaseModel):
    session_id: str
    run_id: str
    label: str


class RecordStep(BaseModel):
    session_id: str
    key: str
    type: str
    data: dict[str, Any]
    status: str | None = None
    """Also set the session's status (``paused``, ``running``)."""


class AnswerStep(BaseModel):
    session_id: str
    account_id: str
    goal: dict[str, Any]
    evidence: list[Evidence]
    reference: Evidence | None = None
    cut_short: str | None = None
    stopped: bool = False


class LlmTurnStep(BaseModel):
    """One model call of the LLM operator: the conversation so far (after the system prompt and the opening)."""

    session_id: str
    account_id: str
    llm: OperatorLlm
    goal: dict[str, Any]
    limits: SessionLimits
    turn: int
    transcript: list[dict[str, Any]]


class LlmTurnResult(BaseModel):
    reply: LlmReply | None = None
    over: str | None = None
    """Why no call was made: the session's cost, deadline or the account's balance is spent, or the provider
    refused the call for good. The session then answers with what it read."""


class ToolStep(BaseModel):
    session_id: str
    account_id: str
    limits: SessionLimits
    turn: int
    index: int
    call: ToolCall
    run_ids: list[str] = []
    """Ids for the runs a launching call makes, drawn by the workflow (a retried step finds the runs it made)."""


class ToolResult(BaseModel):
    ok: bool
    content: str
    launched: list[str] = []
    labels: dict[str, str] = {}
    """The label of each run launched → its id."""


class LlmAnswerStep(BaseModel):
    session_id: str
    account_id: str
    arguments: dict[str, Any] | None = None
    """The ``answer`` call's arguments; None when the session ended before the model answered."""
    cut_short: str | None = None
    stopped: bool = False


class HaltRunsStep(BaseModel):
    session_id: str
    account_id: str


class ExtendStep(BaseModel):
    """After a ``better`` comparison: the larger runs an inconclusive one calls for, within ``runs_left``."""

    session_id: str
    account_id: str
    goal: dict[str, Any]
    evidence: list[Evidence]
    runs_left: int
