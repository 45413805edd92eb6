"""The LLM operator's steps (``benchwright.operator.llm``): one model call (a turn), one tool call, the answer.
Each is what one activity of ``activities/operator.py`` runs; every event key is derived from the session and the
workflow's step, so a retried step appends nothing twice and a paid-for turn is never called or charged twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from benchwright.comparison.compare import frontier, readable_run
from benchwright.drivers.llm import _driver_key
from benchwright.errors import BenchwrightError, Conflict
from benchwright.llm.model_access import check_api_base
from benchwright.operator.builtin import pair_evidence, read_evidence
from benchwright.operator.events import OperatorDecision, OperatorLlmTurn, OperatorRunLaunched, OperatorToolResult
from benchwright.operator.goals import MAX_SESSION_RUNS, Answer, SessionLimits
from benchwright.operator.llm import (
    LAUNCHING,
    TOOL_NAMES,
    LlmRefused,
    LlmReply,
    ToolCall,
    clip,
    complete,
    model_access,
    opening,
    run_label,
    system_prompt,
)
from benchwright.operator.steps import LlmAnswerStep, LlmTurnResult, LlmTurnStep, ToolResult, ToolStep
from benchwright.operator.store import (
    append_session_events,
    finish_session,
    get_session,
    read_event,
    record_llm_turn,
    session_key,
    session_spent,
)
from benchwright.runs.control import control_run
from benchwright.runs.launch import plan_fork, start_run
from benchwright.runs.pipeline import StopRequest
from benchwright.schemas import ForkOverrides, ForkRequest, LaunchRequest, ModelSpec
from benchwright.store.accounts import get_account
from benchwright.store.db import outage_tolerant as in_thread
from benchwright.store.events import NewEvent

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from temporalio.client import Client

    from benchwright.settings import Settings
    from benchwright.store.models import Account, Run


async def llm_turn(settings: Settings, engine: Engine, step: LlmTurnStep) -> LlmTurnResult:
    """One model call, unless the session's budget or the account's balance is spent. A turn already recorded
    (a retry after the call was paid for) is answered from the log: never called or charged twice."""
    sid = step.session_id
    key = session_key(sid, "llm", step.turn)
    done = await in_thread(read_event, engine, key=key)
    if done is not None:
        return LlmTurnResult(reply=_reply(done.data))
    over = await in_thread(over_budget, engine, sid, step.account_id, step.limits)
    if over is not None:
        return LlmTurnResult(over=over)
    account = await in_thread(get_account, engine, account_id=step.account_id)
    try:
        if step.llm.api_base is not None:  # again before each call: the account's rules may have changed
            await in_thread(check_api_base, step.llm.api_base, model_access(settings, engine, account=account))
        api_key = await in_thread(_driver_key, engine, account_id=step.account_id, spec=step.llm.spec)
    except BenchwrightError as exc:
        return LlmTurnResult(over=f"the operator cannot be called: {exc.message}")
    messages = [{"role": "system", "content": system_prompt()},
                {"role": "user", "content": opening(session_id=sid, goal=step.goal,
                                                    limits=step.limits.model_dump(mode="json", exclude_none=True))},
                *step.transcript]
    try:
        reply = await complete(step.llm, api_key=api_key, messages=messages, timeout_s=settings.driver_timeout_s)
    except LlmRefused as exc:
        return LlmTurnResult(over=exc.message)
    turn = OperatorLlmTurn(turn=step.turn, model=step.llm.spec.litellm_model, content=reply.content,
                           tool_calls=[c.model_dump(mode="json") for c in reply.calls],
                           prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                           cost_usd=reply.cost_usd)
    events = [NewEvent.of(key, turn)] + [NewEvent.of(
        session_key(sid, "decision", "llm", step.turn, i),
        OperatorDecision(action=c.name, reason=str(c.arguments.get("reason") or reply.content or "(none given)"),
                         evidence={"turn": step.turn, "call_id": c.id, "arguments": c.arguments}))
        for i, c in enumerate(reply.calls)]
    await in_thread(record_llm_turn, engine, sid, events, account_id=step.account_id,
                    charge_usd=reply.cost_usd * settings.billing_markup)
    stored = await in_thread(read_event, engine, key=key)  # a racing attempt's reply wins, as recorded
    return LlmTurnResult(reply=_reply(stored.data) if stored is not None else reply)


async def run_tool(settings: Settings, engine: Engine, client: Client, step: ToolStep) -> ToolResult:
    """Run one tool call as the session's account and record what it answered (a refusal is an answer too)."""
    call = step.call
    if call.unparsed is not None:
        result = ToolResult(ok=False, content="the arguments are not a JSON object; send one")
    else:
        try:
            result = await _Tools(settings, engine, client, step).run()
        except BenchwrightError as exc:
            result = ToolResult(ok=False, content=f"refused: {exc.message} ({exc.code})")
        except ValidationError as exc:
            result = ToolResult(ok=False, content=f"invalid arguments: {exc}")
    result = result.model_copy(update={"content": clip(result.content)})
    await in_thread(append_session_events, engine, step.session_id, [NewEvent.of(
        session_key(step.session_id, "tool", step.turn, step.index),
        OperatorToolResult(turn=step.turn, call_id=call.id, name=call.name, ok=result.ok, content=result.content))])
    return result


class _Tools:
    """One tool call's dispatch (``benchwright.operator.llm.TOOLS``)."""

    def __init__(self, settings: Settings, engine: Engine, client: Client, step: ToolStep) -> None:
        self.settings, self.engine, self.client, self.step = settings, engine, client, step
        self.sid, self.args = step.session_id, step.call.arguments

    async def ref(self, name: str) -> str:
        return await in_thread(run_label, self.engine, session_id=self.sid, ref=str(self.args.get(name) or ""))

    async def run(self) -> ToolResult:
        engine, name = self.engine, self.step.call.name
        account = await in_thread(get_account, engine, account_id=self.step.account_id)
        if name == "get_run":
            run_id = await self.ref("run_id")
            await in_thread(readable_run, engine, run_id=run_id, account_id=account.id, finished=False)
            read = await in_thread(read_evidence, engine, run_id=run_id, label=str(self.args.get("run_id")))
            return ToolResult(ok=True, content=read.model_dump_json())
        if name == "compare":
            a, b = await self.ref("a"), await self.ref("b")
            pair = await in_thread(pair_evidence, engine, account.id, a, b)
            return ToolResult(ok=True, content=pair.model_dump_json())
        if name == "frontier":
            ids = [await in_thread(run_label, engine, session_id=self.sid, ref=str(r))
                   for r in list(self.args.get("run_ids") or [])[:MAX_SESSION_RUNS]]
            front = await in_thread(frontier, engine, run_ids=ids, account_id=account.id)
            return ToolResult(ok=True, content=front.model_dump_json())
        if name == "halt":
            return await self.halt(await self.ref("run_id"))
        if name in LAUNCHING:
            return await self.launch(account)
        return ToolResult(ok=False, content=f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")

    async def halt(self, run_id: str) -> ToolResult:
        step = self.step
        row = await in_thread(get_session, self.engine, session_id=self.sid, account_id=step.account_id)
        if run_id not in row.runs:
            return ToolResult(ok=False, content=f"halt stops only runs this session launched ({', '.join(row.runs)})")
        reason = f"operator session {self.sid}: {self.args.get('reason') or 'halted'}"
        if not await stop_run(self.client, self.engine, account_id=step.account_id, run_id=run_id, reason=reason,
                              request_id=f"op-{self.sid}-{step.turn}-{step.index}"):
            return ToolResult(ok=False, content=f"run {run_id} is not running (it has finished)")
        return ToolResult(ok=True, content=f"run {run_id} stopped")

    async def launch(self, account: Account) -> ToolResult:
        """Launches through the one start path, within the session's runs, cost and deadline."""
        settings, engine, step, sid, args = self.settings, self.engine, self.step, self.sid, self.args
        call = step.call
        row = await in_thread(get_session, engine, session_id=sid, account_id=step.account_id)
        ids = step.run_ids
        fresh = [i for i in ids if i not in row.runs]
        if fresh:
            budget = step.limits.session
            if len(row.runs) + len(fresh) > budget.runs:
                return ToolResult(ok=False, content=f"refused: the session may launch {budget.runs} run(s) "
                                                    f"(limits.session.runs) and has launched {len(row.runs)}")
            over = await in_thread(over_budget, engine, sid, step.account_id, step.limits)
            if over is not None:
                return ToolResult(ok=False, content=f"refused: {over}")
        label = str(args.get("label") or f"{call.name} {step.turn}.{step.index}")
        memo = {"operator_session": sid}
        runs = []
        if call.name == "launch":
            body = LaunchRequest.model_validate(args.get("launch") or {})
            runs = [await start_run(settings, engine, self.client, account=account, launch=body, run_id=ids[0],
                                    memo=memo)]
        elif call.name == "extend":
            parent = await in_thread(readable_run, engine, run_id=await self.ref("run_id"), account_id=account.id,
                                     finished=False)
            body = LaunchRequest.model_validate(parent.launch)
            body = body.model_copy(update={"constraints": {**(body.constraints or {}),
                                                           "max_tasks": int(args.get("max_tasks") or 0)}})
            body = LaunchRequest.model_validate(body.model_dump(exclude_unset=True))  # the bounds, checked again
            runs = [await start_run(settings, engine, self.client, account=account, launch=body, run_id=ids[0],
                                    memo=memo)]
        else:
            parent_id = await self.ref("run_id")
            if call.name == "fork":
                runs = [await self.fork(account, parent_id, ForkRequest.model_validate(args.get("fork") or {}),
                                        "fork", ids[0], memo)]
            else:
                models = [args.get("model")] if call.name == "replay" else list(args.get("models") or [])
                for model, run_id in zip(models, ids, strict=False):
                    req = ForkRequest(rewind_to="materialize",
                                      overrides=ForkOverrides(model=ModelSpec.model_validate(model)))
                    runs.append(await self.fork(account, parent_id, req, "replay", run_id, memo))
        labels = {label if len(runs) == 1 else f"{label} {j + 1}": run.id for j, run in enumerate(runs)}
        for j, (name, run) in enumerate(zip(labels, runs, strict=True)):
            await in_thread(append_session_events, engine, sid, [NewEvent.of(
                session_key(sid, "launch", "llm", step.turn, step.index, j),
                OperatorRunLaunched(label=name, run_id=run.id, model=str(run.model.get("identifier", ""))))],
                add_run=run.id)
        return ToolResult(ok=True, launched=[r.id for r in runs], labels=labels, content=json.dumps(
            {"launched": [{"run_id": r.id, "label": name, "model": r.model.get("identifier"), "driver": r.driver}
                          for name, r in zip(labels, runs, strict=True)]}))

    async def fork(self, account: Account, parent_id: str, req: ForkRequest, kind: str, run_id: str,
                   memo: dict[str, str]) -> Run:
        """A fork or replay on the one start path (``plan_fork``, then ``start_run``), idempotent on ``run_id``."""
        fork = await in_thread(plan_fork, self.engine, account_id=account.id, parent_id=parent_id, req=req,
                               kind=kind)
        return await start_run(self.settings, self.engine, self.client, account=account, launch=fork.launch,
                               run_id=run_id, memo=memo, fork=fork)


async def llm_answer(engine: Engine, step: LlmAnswerStep) -> Answer:
    """The session's answer: the model's sentence, with the evidence and comparisons read from the store (never
    the model's numbers); the session row finished with it."""
    sid = step.session_id
    row = await in_thread(get_session, engine, session_id=sid, account_id=step.account_id)
    args = step.arguments or {}
    refs = [str(r) for r in list(args.get("runs") or row.runs)[:MAX_SESSION_RUNS]]
    unestablished = [str(u)[:2000] for u in list(args.get("unestablished") or [])[:20]]
    evidence, comparisons = [], []
    for r in refs:
        run_id = await in_thread(run_label, engine, session_id=sid, ref=r)
        try:
            await in_thread(readable_run, engine, run_id=run_id, account_id=step.account_id, finished=False)
        except BenchwrightError as exc:
            unestablished.append(f"{r}: {exc.message}")
            continue
        evidence.append(await in_thread(read_evidence, engine, run_id=run_id, label=r))
    for pair in list(args.get("comparisons") or [])[:MAX_SESSION_RUNS]:
        if not isinstance(pair, list) or len(pair) != 2:
            continue
        a = await in_thread(run_label, engine, session_id=sid, ref=str(pair[0]))
        b = await in_thread(run_label, engine, session_id=sid, ref=str(pair[1]))
        try:
            comparisons.append(await in_thread(pair_evidence, engine, step.account_id, a, b))
        except BenchwrightError as exc:
            unestablished.append(f"{pair[0]} vs {pair[1]}: {exc.message}")
    if step.cut_short:
        unestablished.append(step.cut_short)
    if step.arguments is not None:
        result = Answer(outcome=str(args.get("outcome") or "answered")[:64],
                        sentence=str(args.get("sentence") or "")[:4000], evidence=evidence,
                        comparisons=comparisons, unestablished=unestablished)
    else:
        outcome = "stopped" if step.stopped else \
            "budget_exhausted" if step.cut_short and "budget" in step.cut_short else "failed"
        result = Answer(outcome=outcome, sentence=f"The session ended before the operator answered: "
                                                  f"{step.cut_short or 'no answer'}.",
                        evidence=evidence, unestablished=unestablished)
    await in_thread(append_session_events, engine, sid, [NewEvent.of(
        session_key(sid, "decision", "answer"), OperatorDecision(action="answer", reason=result.sentence, evidence={
            "outcome": result.outcome, "runs": [e.run_id for e in evidence]}))])
    status = "stopped" if step.stopped else "answered" if step.arguments is not None else "failed"
    await in_thread(finish_session, engine, session_id=sid, status=status, answer=result)
    return result


async def stop_run(client: Client, engine: Engine, *, account_id: str, run_id: str, reason: str,
                   request_id: str) -> bool:
    """Stop one of the account's runs (``benchwright.runs.control``, the path of ``POST /v1/runs/{id}/stop``);
    False when it has finished (or finishes first)."""
    try:
        await control_run(client, engine, run_id=run_id, account_id=account_id, update="stop",
                          arg=StopRequest(reason=reason[:500]), request_id=request_id)
    except Conflict:
        return False
    return True


def over_budget(engine: Engine, session_id: str, account_id: str, limits: SessionLimits) -> str | None:
    """Why the session may spend no more: its cost limit (runs and its own tokens), its deadline, the balance."""
    budget = limits.session
    row = get_session(engine, session_id=session_id, account_id=account_id)
    spent, _ = session_spent(engine, row)
    if budget.cost is not None and spent >= budget.cost:
        return f"budget: the session has spent ${spent:.4f} of its ${budget.cost:.4f} (limits.session.cost)"
    if budget.deadline is not None and datetime.now(UTC) >= budget.deadline:
        return f"budget: the session's deadline ({budget.deadline.isoformat()}) has passed"
    if get_account(engine, account_id=account_id).balance_usd <= 0:
        return "budget: the account's balance is exhausted"
    return None


def _reply(data: dict[str, Any]) -> LlmReply:
    return LlmReply(content=data.get("content"), calls=[ToolCall.model_validate(c) for c in data.get("tool_calls", [])],
                    prompt_tokens=int(data.get("prompt_tokens", 0)),
                    completion_tokens=int(data.get("completion_tokens", 0)), cost_usd=float(data.get("cost_usd", 0)))
