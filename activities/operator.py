"""Operator sessions (issue 26): thin adapters over ``benchwright.operator`` and ``benchwright.runs.launch.start_run``.
Every event key is derived from the session and the workflow's step, so a retried activity appends nothing twice."""

from __future__ import annotations

import asyncio

from pydantic import TypeAdapter
from temporalio import activity
from temporalio.client import Client

from activities.common import Deps, in_thread
from benchwright.errors import BenchwrightError
from benchwright.operator.builtin import answer, extension, plan, read_evidence
from benchwright.operator.events import OperatorDecision, OperatorRunLaunched, OperatorRunRead, OperatorRunRefused
from benchwright.operator.goals import Answer, BetterGoal, Evidence, Goal
from benchwright.operator.steps import (
    AnswerStep,
    ExtendStep,
    HaltRunsStep,
    LaunchResult,
    LaunchStep,
    LlmAnswerStep,
    LlmTurnResult,
    LlmTurnStep,
    PlanResult,
    PlanStep,
    RecordStep,
    ToolResult,
    ToolStep,
    WaitStep,
)
from benchwright.operator.store import append_session_events, finish_session, get_session, session_key
from benchwright.operator.tools import llm_answer, llm_turn, run_tool, stop_run
from benchwright.runs.launch import start_run
from benchwright.store.accounts import get_account
from benchwright.store.events import NewEvent
from benchwright.store.models import Run

GOAL: TypeAdapter[Goal] = TypeAdapter(Goal)
POLL_S = 0.5
"""How often a waiting activity re-reads the run row (and heartbeats)."""


def _settled(run: Run | None) -> bool:
    return run is None or run.status != "running" or run.halted


class OperatorActivities:
    def __init__(self, deps: Deps, client: Client) -> None:
        self.deps, self.client = deps, client

    @activity.defn(name="operator_plan")
    async def plan(self, step: PlanStep) -> PlanResult:
        deps = self.deps
        goal = GOAL.validate_python(step.goal)
        try:
            launches = await in_thread(plan, deps.settings, deps.engine, account_id=step.account_id, goal=goal)
        except BenchwrightError as exc:
            await self._decide(step.session_id, "plan", "refused", f"the goal cannot be planned: {exc.message}",
                               {"code": exc.code})
            return PlanResult(refused=f"{exc.message} ({exc.code})")
        reference = None
        ref_id = getattr(goal, "reference_run", None)
        if ref_id is not None:
            reference = await in_thread(read_evidence, deps.engine, run_id=ref_id, label="reference")
        await self._decide(step.session_id, "plan", "plan", f"{len(launches)} run(s) answer the "
                           f"'{goal.question}' question", {
                               "launches": [{"label": p.label, "model": p.launch.model.identifier,
                                             "reason": p.reason} for p in launches],
                               "reference": reference.model_dump(mode="json") if reference else None})
        return PlanResult(launches=launches, reference=reference)

    @activity.defn(name="operator_launch")
    async def launch(self, step: LaunchStep) -> LaunchResult:
        """Launch one planned run through the one start path, as the session's account (idempotent on run_id)."""
        deps, planned = self.deps, step.planned
        try:
            account = await in_thread(get_account, deps.engine, account_id=step.account_id)
            run = await start_run(deps.settings, deps.engine, self.client, account=account, launch=planned.launch,
                                  run_id=step.run_id, memo={"operator_session": step.session_id})
        except BenchwrightError as exc:
            await in_thread(append_session_events, deps.engine, step.session_id, [NewEvent.of(
                session_key(step.session_id, "launch", step.index, "refused"),
                OperatorRunRefused(label=planned.label, code=exc.code, message=exc.message))])
            return LaunchResult(run_id=None, refused=f"{exc.message} ({exc.code})")
        await in_thread(append_session_events, deps.engine, step.session_id, [NewEvent.of(
            session_key(step.session_id, "launch", step.index, "launched"),
            OperatorRunLaunched(label=planned.label, run_id=run.id, model=planned.launch.model.identifier))],
            add_run=run.id)
        return LaunchResult(run_id=run.id)

    @activity.defn(name="operator_wait")
    async def wait(self, step: WaitStep) -> Evidence:
        """Poll the run row until the run settles (finished or halted), heartbeating; then read its metrics."""
        from sqlmodel import Session

        def row() -> Run | None:
            with Session(self.deps.engine) as session:
                return session.get(Run, step.run_id)

        while not _settled(await in_thread(row)):
            activity.heartbeat()
            await asyncio.sleep(POLL_S)
        evidence = await in_thread(read_evidence, self.deps.engine, run_id=step.run_id, label=step.label)
        await in_thread(append_session_events, self.deps.engine, step.session_id, [NewEvent.of(
            session_key(step.session_id, "read", step.run_id),
            OperatorRunRead(label=step.label, run_id=step.run_id, evidence=evidence.model_dump(mode="json")))])
        return evidence

    @activity.defn(name="operator_record")
    async def record(self, step: RecordStep) -> None:
        updates = {"status": step.status} if step.status else {}
        await in_thread(append_session_events, self.deps.engine, step.session_id,
                        [NewEvent(key=step.key, type=step.type, data=step.data)], **updates)

    @activity.defn(name="operator_extend")
    async def extend(self, step: ExtendStep) -> PlanResult:
        """The larger runs an inconclusive ``better`` comparison calls for (``benchwright.operator.builtin
        .extension``), recorded as a decision either way."""
        goal = GOAL.validate_python(step.goal)
        assert isinstance(goal, BetterGoal)
        launches, why = await in_thread(extension, self.deps.engine, account_id=step.account_id, goal=goal,
                                        evidence=step.evidence, runs_left=step.runs_left)
        await self._decide(step.session_id, "extend", "extend" if launches else "skip", why,
                           {"launches": [{"label": p.label, "max_tasks": (p.launch.constraints or {}).get("max_tasks")}
                                         for p in launches], "runs_left": step.runs_left})
        return PlanResult(launches=launches)

    @activity.defn(name="operator_halt_runs")
    async def halt_runs(self, step: HaltRunsStep) -> None:
        """Stop the session's runs that are still going (the run's own ``stop`` update, keyed so a retry is one
        stop), and record it as a decision."""
        deps, sid = self.deps, step.session_id
        row = await in_thread(get_session, deps.engine, session_id=sid, account_id=step.account_id)
        stopped = []
        for run_id in row.runs:
            if await stop_run(self.client, deps.engine, account_id=step.account_id, run_id=run_id,
                              reason=f"operator session {sid} was stopped",
                              request_id=f"op-stop-{sid}-{run_id}"):
                stopped.append(run_id)
        await self._decide(sid, "halt-runs", "halt", "the session was stopped: its runs that were still going are "
                           "stopped too", {"runs": stopped})

    @activity.defn(name="operator_answer")
    async def answer(self, step: AnswerStep) -> Answer:
        goal = GOAL.validate_python(step.goal)
        result = await in_thread(answer, self.deps.engine, account_id=step.account_id, goal=goal,
                                 evidence=step.evidence, reference=step.reference, cut_short=step.cut_short)
        if step.stopped:
            result = result.model_copy(update={"outcome": "stopped", "sentence": "Stopped before the answer was "
                                               "complete; what was read: " + result.sentence})
        await self._decide(step.session_id, "answer", "answer", result.sentence,
                           {"outcome": result.outcome, "needed_tasks": result.needed_tasks})
        status = "stopped" if step.stopped else "failed" if result.outcome == "failed" else "answered"
        await in_thread(finish_session, self.deps.engine, session_id=step.session_id, status=status, answer=result)
        return result

    async def _decide(self, session_id: str, key: str, action: str, reason: str, evidence: dict[str, object]) -> None:
        await in_thread(append_session_events, self.deps.engine, session_id, [NewEvent.of(
            session_key(session_id, "decision", key), OperatorDecision(action=action, reason=reason,
                                                                       evidence=evidence))])


class OperatorLlmActivities:
    """The LLM operator's steps (``benchwright.operator.tools``): one model call, one tool call, the answer."""

    def __init__(self, deps: Deps, client: Client) -> None:
        self.deps, self.client = deps, client

    @activity.defn(name="operator_llm_turn")
    async def turn(self, step: LlmTurnStep) -> LlmTurnResult:
        return await llm_turn(self.deps.settings, self.deps.engine, step)

    @activity.defn(name="operator_tool")
    async def tool(self, step: ToolStep) -> ToolResult:
        return await run_tool(self.deps.settings, self.deps.engine, self.client, step)

    @activity.defn(name="operator_llm_answer")
    async def answer(self, step: LlmAnswerStep) -> Answer:
        return await llm_answer(self.deps.engine, step)
