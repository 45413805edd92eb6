"""The payloads between ``OperatorWorkflow`` and its activities (pydantic, as every Benchwright payload)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from benchwright.operator.builtin import PlannedLaunch
from benchwright.operator.goals import Evidence, SessionLimits


class OperatorInput(BaseModel):
    session_id: str
    account_id: str
    operator: str
    goal: dict[str, Any]
    """The structured goal as stored (``benchwright.operator.goals.Goal``)."""
    limits: SessionLimits


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
