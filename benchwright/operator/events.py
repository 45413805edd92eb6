"""The events of an Operator session's log (``operator_events``): every decision with its reason and evidence."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from benchwright.events import Event


class SessionStarted(Event):
    """Seq 0, written with the session row."""

    operator: str
    account_id: str
    goal: dict[str, Any]
    limits: dict[str, Any]


class OperatorDecision(Event):
    """A choice the operator made (``plan``, ``launch``, ``skip``, ``stop``, ``compare``, ``answer``), why, and
    what it read to make it."""

    action: str
    reason: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class OperatorRunLaunched(Event):
    label: str
    run_id: str
    model: str


class OperatorRunRefused(Event):
    """``start_run`` refused a planned launch (its typed error's code and words)."""

    label: str
    code: str
    message: str


class OperatorRunRead(Event):
    """A launched run settled; the metrics read from it (``benchwright.operator.goals.Evidence``)."""

    label: str
    run_id: str
    evidence: dict[str, Any]


class OperatorLlmTurn(Event):
    """One model call of an LLM operator: what it said and called, its tokens and their price (the session's own
    cost, charged to the account's balance with the markup; never a run's ``cost.driver``)."""

    turn: int
    model: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class OperatorToolResult(Event):
    """What an LLM operator's tool call answered (the model reads the same text)."""

    turn: int
    call_id: str
    name: str
    ok: bool
    content: str


class OperatorControl(Event):
    """A person's signal: ``pause``, ``resume``, ``stop`` or ``steer`` (with its message)."""

    action: str
    message: str | None = None


class SessionAnswered(Event):
    """The session's end: the answer (``benchwright.operator.goals.Answer``) and the final status."""

    status: str
    answer: dict[str, Any]


OPERATOR_EVENTS = (SessionStarted, OperatorDecision, OperatorRunLaunched, OperatorRunRefused, OperatorRunRead,
                   OperatorControl, SessionAnswered, OperatorLlmTurn, OperatorToolResult)
