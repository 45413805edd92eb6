"""The LLM operator (issue 26): ``"operator": "<provider>://<model>"`` is an agent with tools, called through LiteLLM.

Each model call is one activity (``operator_llm_turn``); the workflow (``workflows/operator.py``) holds the
conversation, runs each tool call as an activity and feeds the answers back. Every tool call is an
``OperatorDecision`` with the reason the model gave; every model call an ``OperatorLlmTurn`` with its tokens and
their price (``benchwright.llm.prices``): the session's own cost, charged to the account's balance, never on a run's
``cost.driver``.

What the tools reach is what the session's account may reach, through the existing paths: ``launch`` and
``extend`` call ``benchwright.runs.launch.start_run``; ``replay``, ``fork`` and ``sweep`` call
``benchwright.runs.launch.plan_fork`` and then ``start_run``; ``get_run``, ``compare`` and ``frontier`` read through
``benchwright.comparison.compare.readable_run``; ``halt`` sends a run's ``stop`` update, only to a run the session
launched.

Hard ceilings (checked before every model call and every launch): ``limits.session.runs``, ``limits.session.cost``
(the runs' ``cost.incurred`` plus the operator's tokens), the deadline and the account's balance.

Where the calls go: the account's secret ``<PROVIDER>_API_KEY`` (as an LLM Driver's) to the session's ``api_base``
(checked like a launch's model ``api_base``: ``benchwright.llm.model_access``, at create and before every call) or the
provider's own endpoint. LiteLLM connects by name, so unlike a run's proxied calls the approved address is not
pinned: the check is repeated before each call.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.drivers.llm import LlmDriverSpec, _driver_key, _import_litellm, _plain
from benchwright.errors import InvalidInput
from benchwright.llm.model_access import ModelAccess, check_api_base
from benchwright.llm.prices import Prices, is_priced, prices_for
from benchwright.operator.goals import SessionCreate
from benchwright.schemas import ModelSpec

if TYPE_CHECKING:
    from benchwright.settings import Settings
    from benchwright.store.models import Account

MAX_TURNS = 40
"""Model calls per session; past them the session answers with what it read."""
MAX_TOOL_ANSWER = 6000
"""Characters of a tool's answer the model is shown (the log keeps the same)."""
NUDGE = "Reply with a tool call; end the session with answer."
LAUNCHING = ("launch", "replay", "fork", "sweep", "extend")


class OperatorLlm(BaseModel):
    """How one session's LLM operator is called (from the session body; part of the workflow's input)."""

    operator: str
    api_base: str | None = None
    input_cost_per_token: float | None = None
    output_cost_per_token: float | None = None

    @property
    def spec(self) -> LlmDriverSpec:
        return parse_operator(self.operator)

    def prices(self) -> Prices:
        return prices_for(self._model())

    def _model(self) -> ModelSpec:
        return ModelSpec(identifier=self.spec.litellm_model, input_cost_per_token=self.input_cost_per_token,
                         output_cost_per_token=self.output_cost_per_token)


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    unparsed: str | None = None
    """The raw arguments when they were not a JSON object (the call is answered with the error)."""


class LlmReply(BaseModel):
    content: str | None = None
    calls: list[ToolCall] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def message(self) -> dict[str, Any]:
        """The assistant message as the conversation carries it."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.unparsed if c.unparsed is not None else json.dumps(c.arguments)}}
                for c in self.calls]
        return out


def parse_operator(name: str) -> LlmDriverSpec:
    """``<provider>://<model>`` → its parts.

    Raises:
        InvalidInput: not ``builtin`` nor of that shape (``unknown_operator``).
    """
    try:
        return LlmDriverSpec.parse(name)
    except InvalidInput:
        raise InvalidInput(f"operator '{name}' is neither 'builtin' nor '<provider>://<model>' (an LLM operator, "
                           "e.g. 'openai://gpt-4.1')", code="unknown_operator") from None


def model_access(settings: Settings, engine: Engine, *, account: Account) -> ModelAccess:
    """The account's rules for a model endpoint it names (as a run's Attach applies them)."""
    from benchwright.proxy.addresses import parse_endpoints
    from benchwright.store.policy import get_policy

    return ModelAccess(policy=get_policy(engine, account_id=account.id),
                       internal_allowed=parse_endpoints(settings.model_internal_allowed),
                       trusted_local=settings.allow_local_paths and account.local_paths)


def admit_operator(settings: Settings, engine: Engine, *, account: Account, req: SessionCreate) -> OperatorLlm | None:
    """The LLM operator's checks at ``POST /v1/operator/sessions`` (None for ``builtin``, which takes none of the
    LLM fields). Blocking (store reads, DNS): call it from a thread.

    Raises:
        InvalidInput: an unknown operator; ``api_base`` or prices given to ``builtin``; the account lacks the
            provider's secret (``missing_driver_secret``); a session cost limit on an operator nobody can price
            (``unpriced_operator``).
        ModelEndpointRefused: ``api_base`` is refused by the account's host policy or is internal.
    """
    if req.operator == "builtin":
        given = [k for k in ("api_base", "input_cost_per_token", "output_cost_per_token")
                 if getattr(req, k) is not None]
        if given:
            raise InvalidInput(f"{', '.join(given)} is for an LLM operator; the builtin operator calls no model",
                               code="builtin_operator_options")
        return None
    spec = parse_operator(req.operator)
    _driver_key(engine, account_id=account.id, spec=spec)  # missing_driver_secret, naming it
    llm = OperatorLlm(operator=req.operator, api_base=req.api_base, input_cost_per_token=req.input_cost_per_token,
                      output_cost_per_token=req.output_cost_per_token)
    if req.api_base is not None:
        check_api_base(req.api_base, model_access(settings, engine, account=account))
    if req.limits.session.cost is not None and not is_priced(llm._model()):
        raise InvalidInput(
            f"operator '{req.operator}' has no known price, so limits.session.cost could not count its tokens; give "
            "input_cost_per_token and output_cost_per_token in the session body", code="unpriced_operator")
    return llm


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    reason = {"reason": {"type": "string", "description": "Why: recorded with the decision."}}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {**reason, **properties}, "required": ["reason", *required]}}}


RUN_REF = {"type": "string", "description": "A run id, or the label this session gave a run it launched."}
MODEL = {"type": "object", "description": "A launch body's model: identifier, api_base, prices, secret."}
TOOLS: list[dict[str, Any]] = [
    _fn("launch", "Launch a run: a POST /v1/runs body (dataset or prompt, or a pinned benchmark/subset/impl; "
        "model; driver: 'builtin' or '<provider>://<model>'; constraints.max_tasks; ...).",
        {"label": {"type": "string"}, "launch": {"type": "object"}}, ["launch"]),
    _fn("replay", "Replay a run against a model: its benchmark, sample, impl and trials pinned.",
        {"label": {"type": "string"}, "run_id": RUN_REF, "model": MODEL}, ["run_id", "model"]),
    _fn("fork", "Fork a run: a POST /v1/runs/{id}/fork body (rewind_to, overrides, instructions).",
        {"label": {"type": "string"}, "run_id": RUN_REF, "fork": {"type": "object"}}, ["run_id", "fork"]),
    _fn("sweep", "One replay of a run per model.",
        {"run_id": RUN_REF, "models": {"type": "array", "items": MODEL}}, ["run_id", "models"]),
    _fn("extend", "Re-launch a run's body over more tasks (constraints.max_tasks), for a decisive measurement.",
        {"label": {"type": "string"}, "run_id": RUN_REF, "max_tasks": {"type": "integer", "minimum": 1}},
        ["run_id", "max_tasks"]),
    _fn("get_run", "A run's metrics: status, pass rate and interval, no-answer and error counts, halt, error, "
        "cost.", {"run_id": RUN_REF}, ["run_id"]),
    _fn("compare", "Paired comparison of two runs of one shape: difference, interval, p-value.",
        {"a": RUN_REF, "b": RUN_REF}, ["a", "b"]),
    _fn("frontier", "The cost-quality frontier of runs of one shape.",
        {"run_ids": {"type": "array", "items": RUN_REF}}, ["run_ids"]),
    _fn("halt", "Stop a run this session launched.", {"run_id": RUN_REF}, ["run_id"]),
    _fn("wait", "Wait until runs this session launched settle (all of them still going when run_ids is "
        "omitted) and read their metrics.", {"run_ids": {"type": "array", "items": RUN_REF}}, []),
    _fn("answer", "End the session: the sentence that answers the goal, the runs that are its evidence, the "
        "pairs compared, and what could not be established.",
        {"sentence": {"type": "string"}, "outcome": {"type": "string"},
         "runs": {"type": "array", "items": RUN_REF},
         "comparisons": {"type": "array", "items": {"type": "array", "items": RUN_REF}},
         "unestablished": {"type": "array", "items": {"type": "string"}}}, ["sentence"]),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


def system_prompt() -> str:
    return (
        "You are the Operator of Benchwright, an LLM-evaluation platform: you work across evaluation runs to answer "
        "the person's goal. You launch runs, pick each one's Driver (the agent that turns a dataset into a scorer: "
        "'builtin', or '<provider>://<model>'), wait for them, read their metrics and compare them with paired "
        "statistics. When a run's Driver struggles (the run errors at Analyze or Atomize, hits the restart cap or "
        "parks for review), re-run it with a different Driver. When a comparison is inconclusive you may extend "
        "a run within the budget. Work only through the tools; give every call a reason. End with answer: one "
        "sentence that answers the goal, the runs that are the evidence, and what you could not establish.")


def opening(*, session_id: str, goal: dict[str, Any], limits: dict[str, Any]) -> str:
    stated = str(goal.get("text")) if goal.get("question") == "ask" else \
        "(structured) " + json.dumps(goal, sort_keys=True)
    return (f"Operator session {session_id}.\nGoal: {stated}\nBudget: {json.dumps(limits, sort_keys=True)} "
            "(runs: most runs you may launch; cost: most USD, your own tokens included).")


def clip(text: str) -> str:
    return text if len(text) <= MAX_TOOL_ANSWER else text[: MAX_TOOL_ANSWER - 1] + "…"


@dataclass(frozen=True)
class LlmRefused(Exception):
    """The provider refused the call in a way retrying cannot cure (bad key, unknown model, a malformed
    request): the session answers with it."""

    message: str


async def complete(llm: OperatorLlm, *, api_key: str, messages: list[dict[str, Any]],
                   timeout_s: float = 120.0) -> LlmReply:
    """One model call through LiteLLM (the LLM Driver's path), priced.

    Raises:
        LlmRefused: a refusal retrying cannot cure. Other faults (connection, 429, 5xx) propagate for the
            activity's retry after LiteLLM's own.
    """
    litellm = await asyncio.to_thread(_import_litellm)
    from litellm.exceptions import AuthenticationError, BadRequestError, NotFoundError, PermissionDeniedError

    spec = llm.spec
    try:
        response = await litellm.acompletion(model=spec.litellm_model, messages=messages, tools=TOOLS,
                                             api_key=api_key, api_base=llm.api_base, timeout=timeout_s,
                                             num_retries=2)
    except (AuthenticationError, PermissionDeniedError, NotFoundError, BadRequestError) as exc:
        raise LlmRefused(f"the operator's provider refused the call ({type(exc).__name__}): "
                         f"{_plain(str(exc), api_key)}") from None
    message = response.choices[0].message
    usage = getattr(response, "usage", None)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    calls = []
    for c in getattr(message, "tool_calls", None) or []:
        raw = str(c.function.arguments or "{}")
        try:
            args = json.loads(raw)
        except ValueError:
            args = None
        calls.append(ToolCall(id=str(c.id), name=str(c.function.name), arguments=args if isinstance(args, dict)
                              else {}, unparsed=None if isinstance(args, dict) else raw[:2000]))
    return LlmReply(content=message.content, calls=calls, prompt_tokens=prompt, completion_tokens=completion,
                    cost_usd=llm.prices().cost({"prompt_tokens": prompt, "completion_tokens": completion}))


def run_label(engine: Engine, *, session_id: str, ref: str) -> str:
    """A run reference as the model gives it: the label the session gave a run it launched, else a run id."""
    from benchwright.store.models import OperatorEvent

    with Session(engine) as session:
        rows = session.execute(select(col(OperatorEvent.data)).where(
            col(OperatorEvent.session_id) == session_id, col(OperatorEvent.type) == "OperatorRunLaunched")
            .order_by(col(OperatorEvent.seq))).scalars().all()
    for data in reversed(rows):
        if data.get("label") == ref:
            return str(data["run_id"])
    return ref


def operator_cost(engine: Engine, *, session_id: str) -> float:
    """USD of the LLM operator's own tokens so far (its ``OperatorLlmTurn`` events)."""
    from benchwright.store.models import OperatorEvent

    with Session(engine) as session:
        rows = session.execute(select(col(OperatorEvent.data)).where(
            col(OperatorEvent.session_id) == session_id, col(OperatorEvent.type) == "OperatorLlmTurn")).scalars()
        return float(sum(float(d.get("cost_usd") or 0.0) for d in rows))
