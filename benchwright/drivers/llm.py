"""The LLM driver (§8): driver strings ``<provider>://<model>`` run a tool-calling loop through LiteLLM.

``openrouter://deepseek/deepseek-v4-flash`` (the production default) calls the LiteLLM model
``openrouter/deepseek/deepseek-v4-flash`` with the account's secret ``OPENROUTER_API_KEY`` (``driver_secret_name``:
the provider, upper-cased, ``_API_KEY``). A launch naming an LLM driver whose secret the account lacks is refused
with a 400 naming the secret (``check_driver_secret``). The deployment may route every driver call through
``Settings.driver_api_base`` (a gateway; the scripted-LLM double in tests); a launch cannot, since the driver's key
goes wherever that points.

Atomize is the LLM driver's own phase: per invocation it holds one conversation with its model, whose tools
(``benchwright.drivers.llm_tools``) read the phase's context and sample rows, write task_impl.py, run it on sample
rows in the work sandbox, and end the phase (finish, restart, or requestHumanReview). Find and Analyze use the
builtin driver's deterministic logic; where no template fits, Analyze leaves the scorer to this driver.

What the model is never given: the SUT's credential, its own credential, any other secret, or a way to launch a
run: its messages hold only this module's prompts and the tools' answers.

Budgets (``benchwright.runs.limits``): ``phase.driver_steps`` model calls per invocation; spent without finishing, the
phase asks for human review (the resolution re-runs it with a fresh step budget and the reviewer's instructions).
``run.driver_tokens`` over the run; spent, the phase fails ``driver_budget_exhausted`` (a review could not buy more).

Every exchange is logged as it happens (so a live run shows the Driver working, and a phase that fails keeps its
spend): AgentTextEvent for the model's text, ToolCallEvent / ToolResultEvent per tool call, DriverUsage per model
call with ``cost_usd`` (the cost trigger folds it into cost.driver). Their keys carry a per-attempt id: an activity
retry makes new, separately paid model calls, which are new facts rather than repeats.

litellm is imported on first use (its import takes seconds and stays out of the API's and CLI's import path).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from benchwright.drivers.base import (
    AnalyzeDecision,
    AtomizeDecision,
    DriverContext,
    DriverFailed,
    FindDecision,
    ScorerPlan,
    register_driver,
)
from benchwright.drivers.builtin import BuiltinDriver
from benchwright.drivers.llm_tools import ATOMIZE_TOOLS, SCORER_CONTRACT, AtomizeToolbox
from benchwright.errors import InvalidInput
from benchwright.events import (
    AgentTextEvent,
    DriverUsage,
    Event,
    PhaseRestartRequested,
    ToolCallEvent,
    ToolResultEvent,
)
from benchwright.llm.prices import Prices, prices_for
from benchwright.runs.limits import DriverBudgets, RunLimits
from benchwright.schemas import ModelSpec
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.models import EventRow
from benchwright.store.policy import secret_value
from benchwright.store.runs import get_run

if TYPE_CHECKING:
    from benchwright.settings import Settings

DRIVER_PATTERN = re.compile(r"^(?P<provider>[a-z][a-z0-9_-]{0,39})://(?P<model>[A-Za-z0-9][\w.:@/+-]{0,199})$")
DEFAULT_LLM_DRIVER = "openrouter://deepseek/deepseek-v4-flash"
"""The production default LLM driver (the embedded stack's default stays ``builtin``)."""
NUDGE = ("Reply with a tool call. When task_impl.py is right, call finishPhase; if the approach is wrong, "
         "requestRestart; if a person must decide, requestHumanReview.")


class DriverBudgetExhausted(DriverFailed):
    code = "driver_budget_exhausted"


@dataclass(frozen=True)
class LlmDriverSpec:
    provider: str
    model: str

    @classmethod
    def parse(cls, name: str) -> LlmDriverSpec:
        """``<provider>://<model>`` → its parts.

        Raises:
            InvalidInput: not of that shape (``unknown_driver``).
        """
        match = DRIVER_PATTERN.match(name)
        if match is None:
            raise InvalidInput(f"driver '{name}' is neither 'builtin' nor '<provider>://<model>' (e.g. "
                               f"'{DEFAULT_LLM_DRIVER}')", code="unknown_driver")
        return cls(provider=match["provider"], model=match["model"])

    @property
    def litellm_model(self) -> str:
        return f"{self.provider}/{self.model}"

    @property
    def secret_name(self) -> str:
        return driver_secret_name(self.provider)


def driver_secret_name(provider: str) -> str:
    """The account secret holding an LLM driver's key: ``openrouter`` → ``OPENROUTER_API_KEY``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", provider).upper() + "_API_KEY"


def _driver_key(engine: Engine, *, account_id: str, spec: LlmDriverSpec) -> str:
    try:
        return secret_value(engine, account_id=account_id, name=spec.secret_name)
    except InvalidInput:
        raise InvalidInput(
            f"driver '{spec.provider}://{spec.model}' needs the account secret {spec.secret_name!r} (its "
            f"{spec.provider} API key), which this account does not have; add it with POST /v1/secrets "
            f"{{\"name\": \"{spec.secret_name}\", \"value\": \"...\"}}", code="missing_driver_secret") from None


def check_driver_secret(engine: Engine, *, account_id: str, driver: str) -> None:
    """At launch: an LLM driver's provider secret must exist (the builtin driver needs none).

    Raises:
        InvalidInput: the account lacks the secret (``missing_driver_secret``, naming it), or the driver string is
            malformed.
    """
    if "://" in driver:
        _driver_key(engine, account_id=account_id, spec=LlmDriverSpec.parse(driver))


@dataclass(frozen=True)
class LlmDriverConfig:
    """What a deployment decides for its LLM drivers (from its settings)."""

    api_base: str | None = None
    input_cost_per_token: float | None = None
    output_cost_per_token: float | None = None
    budgets: DriverBudgets = field(default_factory=DriverBudgets)
    timeout_s: float = 120.0
    retries: int = 2
    sample_tasks: int = 10

    @classmethod
    def of(cls, settings: Settings) -> LlmDriverConfig:
        return cls(api_base=settings.driver_api_base, input_cost_per_token=settings.driver_input_cost_per_token,
                   output_cost_per_token=settings.driver_output_cost_per_token, budgets=DriverBudgets.of(settings),
                   timeout_s=settings.driver_timeout_s, sample_tasks=settings.driver_sample_tasks)

    def prices(self, spec: LlmDriverSpec) -> Prices:
        return prices_for(ModelSpec(identifier=spec.litellm_model, input_cost_per_token=self.input_cost_per_token,
                                    output_cost_per_token=self.output_cost_per_token))


def install_llm_driver(*, engine: Engine, settings: Settings) -> None:
    """Make ``driver_for('<provider>://<model>')`` build LLM drivers with this worker's store and settings (worker
    wiring: one worker process serves one deployment)."""
    config = LlmDriverConfig.of(settings)
    register_driver("llm", lambda name: LlmDriver(name, engine=engine, config=config))


def driver_tokens_used(engine: Engine, *, run_id: str) -> int:
    """Tokens the run's LLM driver has spent so far (its DriverUsage events)."""
    with Session(engine) as session:
        rows = session.exec(select(EventRow.data).where(EventRow.run_id == run_id,
                                                         EventRow.type == DriverUsage.type_name())).all()
    return sum(int(d.get("prompt_tokens", 0)) + int(d.get("completion_tokens", 0)) for d in rows)


def _restart_reasons(engine: Engine, *, run_id: str, phase: str) -> list[str]:
    with Session(engine) as session:
        rows = session.exec(select(EventRow.data).where(EventRow.run_id == run_id,
                                                         EventRow.type == PhaseRestartRequested.type_name())
                            .order_by(EventRow.seq)).all()  # type: ignore[arg-type]
    return [str(d.get("reason", "")) for d in rows if d.get("phase") == phase]



@dataclass(frozen=True)
class _Reply:
    content: str | None
    tool_calls: list[tuple[str, str, str]]
    """(id, name, JSON arguments) per call."""
    prompt_tokens: int
    completion_tokens: int


class LlmDriver:
    """A Driver backed by a language model (``<provider>://<model>``)."""

    def __init__(self, name: str, *, engine: Engine, config: LlmDriverConfig) -> None:
        self.name = name
        self.spec = LlmDriverSpec.parse(name)
        self.engine, self.config = engine, config

    async def find(self, ctx: DriverContext) -> FindDecision | None:
        return await self._builtin().find(ctx)

    async def analyze(self, ctx: DriverContext) -> AnalyzeDecision | None:
        """The builtin driver's template choice; where none fits, the scorer is left to Atomize's loop."""
        try:
            return await self._builtin().analyze(ctx)
        except DriverFailed as exc:
            if ctx.launch.task_impl is not None:
                raise
            return AnalyzeDecision(plan=ScorerPlan(template="custom", fields={}, why=(
                f"No template fits ({exc}); the LLM driver writes task_impl.py in Atomize.")))

    @staticmethod
    def _builtin() -> BuiltinDriver:
        return BuiltinDriver()

    async def atomize(self, ctx: DriverContext) -> AtomizeDecision | None:
        """The tool-calling loop: write, try on samples, fix; ends with finishPhase, a restart or a review.

        Raises:
            DriverFailed: the provider refused the call (bad key, unknown model), or the secret is gone.
            DriverBudgetExhausted: ``run.driver_tokens`` is spent.
        """
        run = await asyncio.to_thread(get_run, self.engine, run_id=ctx.run_id)
        api_key = await asyncio.to_thread(_driver_key, self.engine, account_id=run.account_id, spec=self.spec)
        limits = RunLimits.model_validate(run.limits or {})
        steps = limits.driver_steps(ctx.phase) or self.config.budgets.steps
        token_cap = limits.run_driver_tokens or self.config.budgets.tokens
        used = await asyncio.to_thread(driver_tokens_used, self.engine, run_id=ctx.run_id)
        restarts = await asyncio.to_thread(_restart_reasons, self.engine, run_id=ctx.run_id, phase=ctx.phase)
        toolbox = AtomizeToolbox(ctx, origin=self.name, max_sample=self.config.sample_tasks)
        log = _ExchangeLog(self.engine, ctx)
        prices = self.config.prices(self.spec)
        messages: list[dict[str, Any]] = [{"role": "system", "content": _system_prompt(steps)},
                                          {"role": "user", "content": _opening(ctx, restarts)}]
        for step in range(1, steps + 1):
            if used >= token_cap:
                raise DriverBudgetExhausted(
                    f"the LLM driver spent its token budget (run.driver_tokens = {token_cap}; {used} used) before "
                    f"finishing {ctx.phase}")
            reply = await self._complete(messages, api_key)
            used += reply.prompt_tokens + reply.completion_tokens
            await log.write(step, "usage", DriverUsage(
                phase=ctx.phase, invocation=ctx.invocation, step=step, model=self.spec.litellm_model,
                prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                cost_usd=prices.cost({"prompt_tokens": reply.prompt_tokens,
                                      "completion_tokens": reply.completion_tokens})))
            if reply.content and reply.content.strip():
                await log.write(step, "text", AgentTextEvent(phase=ctx.phase, text=reply.content.strip()))
            messages.append(_assistant_message(reply))
            if not reply.tool_calls:
                messages.append({"role": "user", "content": NUDGE})
                continue
            for i, (call_id, name, raw) in enumerate(reply.tool_calls):
                if toolbox.ended:  # a call after the one that ended the phase is answered, not run
                    answer_ok, content = False, "not run: an earlier call in this reply ended the phase"
                    args: dict[str, Any] = {}
                else:
                    args, answer_ok, content = await self._run_tool(toolbox, name, raw)
                await log.write(step, f"call:{i}", ToolCallEvent(
                    phase=ctx.phase, invocation=ctx.invocation, step=step, call_id=call_id, name=name,
                    arguments=args))
                await log.write(step, f"result:{i}", ToolResultEvent(
                    phase=ctx.phase, invocation=ctx.invocation, step=step, call_id=call_id, name=name, ok=answer_ok,
                    content=content))
                messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            if toolbox.ended:
                return toolbox.decision
        ctx.request_review(f"the LLM driver used its {steps} steps (phase.driver_steps) without finishing "
                           f"{ctx.phase}; instructions would help it finish")
        return None

    @staticmethod
    async def _run_tool(toolbox: AtomizeToolbox, name: str, raw: str) -> tuple[dict[str, Any], bool, str]:
        try:
            args = json.loads(raw or "{}")
        except ValueError as exc:
            return {"_unparsed": raw[:2000]}, False, f"the arguments are not valid JSON ({exc}); send a JSON object"
        if not isinstance(args, dict):
            return {"_unparsed": raw[:2000]}, False, "the arguments must be a JSON object"
        answer = await toolbox.run(name, args)
        return args, answer.ok, answer.content

    async def _complete(self, messages: list[dict[str, Any]], api_key: str) -> _Reply:
        """One model call through LiteLLM. Refusals that retrying cannot cure (bad key, unknown model, a
        malformed request) fail the phase; other faults (connection, 429, 5xx) propagate for the activity's
        retry after LiteLLM's own."""
        litellm = await asyncio.to_thread(_import_litellm)
        from litellm.exceptions import (
            AuthenticationError,
            BadRequestError,
            NotFoundError,
            PermissionDeniedError,
        )

        try:
            response = await litellm.acompletion(
                model=self.spec.litellm_model, messages=messages, tools=ATOMIZE_TOOLS, api_key=api_key,
                api_base=self.config.api_base, timeout=self.config.timeout_s, num_retries=self.config.retries)
        except (AuthenticationError, PermissionDeniedError, NotFoundError, BadRequestError) as exc:
            raise DriverFailed(f"the driver's provider refused the call ({type(exc).__name__}): "
                               f"{_plain(str(exc), api_key)}") from None
        message = response.choices[0].message
        usage = getattr(response, "usage", None)
        calls = [(str(c.id), str(c.function.name), str(c.function.arguments or "{}"))
                 for c in (getattr(message, "tool_calls", None) or [])]
        return _Reply(content=message.content, tool_calls=calls,
                      prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                      completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0))


def _import_litellm() -> Any:
    """litellm, imported off the event loop: its first import took 8.6 s here, which on the worker's loop would
    stall every other activity (batch heartbeats included) for as long."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return importlib.import_module("litellm")


def _plain(text: str, api_key: str) -> str:
    """A provider's error message for the log, never carrying the key back out."""
    return text.replace(api_key, "[redacted]")[:1000] if api_key else text[:1000]


def _assistant_message(reply: _Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": name, "arguments": raw}}
                                 for cid, name, raw in reply.tool_calls]
    return message


def _system_prompt(steps: int) -> str:
    return (
        "You are the Driver of a Benchwright evaluation run, in its Atomize phase: write task_impl.py, the scorer "
        "that turns each dataset row into a prompt for the model under test and scores its reply.\n\n"
        f"{SCORER_CONTRACT}\n\n"
        "Work only through the tools: readContext and readSamples to understand the data, writeTaskImpl to write "
        "the file, runScorer to try it on sample rows (check that right answers score 1.0 and wrong ones 0.0), "
        "then finishPhase. Call requestRestart if your approach is wrong from the start, requestHumanReview if a "
        f"person must decide. You have at most {steps} replies in this phase.")


def _opening(ctx: DriverContext, restarts: list[str]) -> str:
    lines = [f"Atomize, invocation {ctx.invocation}."]
    if ctx.schema is not None:
        lines.append(f"Dataset: {ctx.schema.format}, {ctx.schema.rows} rows, columns {ctx.schema.columns}.")
    if ctx.plan is not None:
        lines.append(f"Analyze's plan: template {ctx.plan.template!r}, fields {ctx.plan.fields}. {ctx.plan.why}")
    if restarts:
        lines.append("Earlier invocations of this phase were restarted because: " + "; ".join(restarts))
    if ctx.instructions:
        lines.append(f"A person reviewed this run and instructs: {ctx.instructions}")
    lines.append("Write the scorer.")
    return "\n".join(lines)


class _ExchangeLog:
    """Appends the Driver's exchanges to the run's log as they happen (keys: phase, invocation, attempt id, step)."""

    def __init__(self, engine: Engine, ctx: DriverContext) -> None:
        self.engine, self.ctx = engine, ctx
        self.attempt = uuid.uuid4().hex[:12]

    async def write(self, step: int, what: str, event: Event) -> None:
        key = event_key(self.ctx.run_id, self.ctx.phase, self.ctx.invocation, "driver", self.attempt, step, what)
        await asyncio.to_thread(append_events, self.engine, self.ctx.run_id, [NewEvent.of(key, event)])
