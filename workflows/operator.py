"""OperatorWorkflow: one Operator session (issue 26). Orchestration only: the builtin operator's plan, each launch
(through ``benchwright.runs.launch.start_run``, with a run id drawn from the workflow so a retry or a replay never
launches a run twice), each wait, the budget checks and the answer. The session's log is written by the activities.

Signals: ``pause``, ``resume``, ``stop``, ``steer(message)``. A pause holds the next launch (a run already going
keeps going); a stop stops the session's runs that are still going (``patched("operator-stop-halts-runs")``) and
ends the session with an answer from what it read; a steer is recorded (the builtin operator follows its plan; an
LLM operator reads it before its next model call).

An LLM operator (``inp.llm``, ``deprecate_patch("operator-llm")``) runs ``_run_llm`` instead of the builtin plan:
model turns and tool calls, each an activity, the conversation held here.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.operator import OperatorActivities, OperatorLlmActivities
    from benchwright.operator.builtin import PlannedLaunch
    from benchwright.operator.goals import Answer, Evidence
    from benchwright.operator.llm import LAUNCHING, MAX_TURNS, NUDGE, ToolCall
    from benchwright.operator.steps import (
        AnswerStep,
        ExtendStep,
        HaltRunsStep,
        LaunchResult,
        LaunchStep,
        LlmAnswerStep,
        LlmTurnResult,
        LlmTurnStep,
        OperatorInput,
        PlanResult,
        PlanStep,
        RecordStep,
        ToolResult,
        ToolStep,
        WaitStep,
    )

STEP_TIMEOUT = timedelta(minutes=5)
STEP_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10),
                         maximum_attempts=5)
WAIT_TIMEOUT = timedelta(days=7)
WAIT_HEARTBEAT = timedelta(seconds=10)
"""The waiting activity heartbeats every ``POLL_S``; a dead worker's wait is taken over after this."""
WAIT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))


@workflow.defn(name="OperatorWorkflow")
class OperatorWorkflow:
    def __init__(self) -> None:
        self._paused = False
        self._stopped = False
        self._controls: list[tuple[str, str | None]] = []
        self._recorded = 0
        self._labels: dict[str, str] = {}
        """The labels an LLM operator gave the runs it launched → their ids."""
        self._steers: list[str] = []
        """Steer messages recorded and not yet shown to an LLM operator."""

    @workflow.signal
    def pause(self) -> None:
        self._paused = True
        self._controls.append(("pause", None))

    @workflow.signal
    def resume(self) -> None:
        self._paused = False
        self._controls.append(("resume", None))

    @workflow.signal
    def stop(self) -> None:
        self._stopped = True
        self._controls.append(("stop", None))

    @workflow.signal
    def steer(self, message: str) -> None:
        self._controls.append(("steer", message[:2000]))

    @workflow.run
    async def run(self, inp: OperatorInput) -> Answer:
        if inp.llm is not None:
            workflow.deprecate_patch("operator-llm")  # no session from before it had an LLM operator
            return await self._run_llm(inp)
        sid = inp.session_id
        planned: PlanResult = await workflow.execute_activity_method(
            OperatorActivities.plan, PlanStep(session_id=sid, account_id=inp.account_id, goal=inp.goal),
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY,
            summary="plan the runs")
        evidence: list[Evidence] = []
        cut_short = planned.refused if planned.refused is not None else \
            await self._launch_all(inp, planned.launches, evidence, planned=len(planned.launches))
        answered_with = evidence
        if cut_short is None and not self._stopped and inp.goal.get("question") == "better" \
                and inp.goal.get("tasks") is not None:
            workflow.deprecate_patch("operator-extend")  # no goal from before it could carry ``tasks``
            extension: PlanResult = await workflow.execute_activity_method(
                OperatorActivities.extend, ExtendStep(session_id=sid, account_id=inp.account_id, goal=inp.goal,
                                              evidence=evidence, runs_left=inp.limits.session.runs - len(evidence)),
                start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY,
                summary="extend an inconclusive comparison")
            if extension.launches:
                more: list[Evidence] = []
                cut_short = await self._launch_all(inp, extension.launches, more, start=len(evidence),
                                                   planned=len(evidence) + len(extension.launches),
                                                   spent=sum(e.cost for e in evidence))
                evidence += more
                answered_with = more if len(more) == len(extension.launches) and cut_short is None else evidence[:2]
        await self._flush(sid)
        if self._stopped and workflow.patched("operator-stop-halts-runs"):
            await self._halt_runs(inp)
        result: Answer = await workflow.execute_activity_method(
            OperatorActivities.answer, AnswerStep(session_id=sid, account_id=inp.account_id, goal=inp.goal,
                                          evidence=answered_with,
                                          reference=planned.reference, cut_short=cut_short, stopped=self._stopped),
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY, summary="answer")
        workflow.set_current_details(f"**{result.outcome}**  \n{result.sentence}")
        return result

    async def _launch_all(self, inp: OperatorInput, launches: list[PlannedLaunch], evidence: list[Evidence], *,
                          planned: int, start: int = 0, spent: float = 0.0) -> str | None:
        """Launch the planned runs one by one (the budget checked before each), each read when it settles into
        ``evidence``; returns why the plan was cut short (a stop, the budget, a refusal), or None."""
        sid, budget = inp.session_id, inp.limits.session
        cut_short: str | None = None
        for n, step in enumerate(launches):
            i = start + n
            await self._flush(sid)
            await workflow.wait_condition(lambda: not self._paused or self._stopped)
            await self._flush(sid)
            if self._stopped:
                cut_short = "the session was stopped"
                break
            over = self._over_budget(i, spent, planned, inp)
            if over is not None:
                cut_short = f"budget: {over}"
                await self._decide(sid, f"stop:{i}", "stop", over, {"runs_launched": i, "spent": spent})
                break
            await self._decide(sid, f"launch:{i}", "launch", step.reason, {
                "label": step.label, "model": step.launch.model.identifier, "runs_launched": i, "spent": spent,
                "budget": budget.model_dump(mode="json", exclude_none=True)})
            launched: LaunchResult = await workflow.execute_activity_method(
                OperatorActivities.launch, LaunchStep(session_id=sid, account_id=inp.account_id, index=i, planned=step,
                                              run_id=str(workflow.uuid4())),
                start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY,
                summary=f"launch the {step.label} run")
            if launched.run_id is None:
                cut_short = f"the {step.label} run was refused: {launched.refused}"
                break
            waiting = workflow.start_activity_method(
                OperatorActivities.wait, WaitStep(session_id=sid, run_id=launched.run_id, label=step.label),
                start_to_close_timeout=WAIT_TIMEOUT, heartbeat_timeout=WAIT_HEARTBEAT,
                retry_policy=WAIT_RETRY, summary=f"wait for the {step.label} run")
            if not await self._settled(sid, waiting):
                cut_short = "the session was stopped"
                break
            read = await waiting
            evidence.append(read)
            spent += read.cost
        return cut_short

    async def _settled(self, sid: str, waiting: workflow.ActivityHandle[Evidence]) -> bool:
        """Wait for the run while recording the signals that arrive; False when a stop came first (the wait is
        cancelled; the run itself goes on)."""
        def woken() -> bool:
            return waiting.done() or self._stopped or bool(self._controls)

        await workflow.wait_condition(woken)
        while not waiting.done() and not self._stopped:
            await self._flush(sid)
            await workflow.wait_condition(woken)
        if waiting.done():
            return True
        waiting.cancel()
        try:
            await waiting
        except (ActivityError, asyncio.CancelledError):
            pass
        return False

    @staticmethod
    def _over_budget(i: int, spent: float, planned: int, inp: OperatorInput) -> str | None:
        budget = inp.limits.session
        if i >= budget.runs:
            return f"the session's budget allows {budget.runs} run(s) and the plan needs {planned}"
        if budget.cost is not None and spent >= budget.cost:
            return f"the session has spent ${spent:.4f} of its ${budget.cost:.4f} budget"
        if budget.deadline is not None and workflow.now() >= budget.deadline:
            return f"the session's deadline ({budget.deadline.isoformat()}) has passed"
        return None

    @staticmethod
    async def _halt_runs(inp: OperatorInput) -> None:
        """A stopped session stops the runs it launched that are still going."""
        await workflow.execute_activity_method(
            OperatorActivities.halt_runs, HaltRunsStep(session_id=inp.session_id, account_id=inp.account_id),
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY, summary="stop the session's runs")

    async def _decide(self, sid: str, key: str, action: str, reason: str, evidence: dict[str, object]) -> None:
        await self._record(sid, f"op:{sid}:decision:{key}", "OperatorDecision",
                           {"action": action, "reason": reason, "evidence": evidence})

    async def _flush(self, sid: str) -> None:
        """Record the signals received since the last flush, in order (each once: keyed by its position)."""
        while self._controls:
            action, message = self._controls.pop(0)
            self._recorded += 1
            status = {"pause": "paused", "resume": "running"}.get(action)
            if action == "steer" and message is not None:
                self._steers.append(message)
            await self._record(sid, f"op:{sid}:control:{self._recorded}", "OperatorControl",
                               {"action": action, "message": message}, status=status)

    @staticmethod
    async def _record(sid: str, key: str, type_: str, data: dict[str, object], status: str | None = None) -> None:
        await workflow.execute_activity_method(
            OperatorActivities.record, RecordStep(session_id=sid, key=key, type=type_, data=data, status=status),
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY, summary=f"record {type_}")

    # -- the LLM operator (deprecated patch "operator-llm") ----------------------------------------------------

    async def _run_llm(self, inp: OperatorInput) -> Answer:
        """Model call, tool calls, model call, ... until the model answers, the budget or the turns run out, or a
        person stops the session. The conversation lives here (each turn's input); every step is an activity."""
        assert inp.llm is not None
        sid = inp.session_id
        transcript: list[dict[str, object]] = []
        launched: list[str] = []
        cut_short: str | None = None
        for turn in range(MAX_TURNS):
            await self._flush(sid)
            await workflow.wait_condition(lambda: not self._paused or self._stopped)
            await self._flush(sid)
            if self._stopped:
                cut_short = "the session was stopped"
                break
            transcript += [{"role": "user", "content": f"A person steers the session: {m}"} for m in self._steers]
            self._steers.clear()
            result: LlmTurnResult = await workflow.execute_activity_method(
                OperatorLlmActivities.turn, LlmTurnStep(session_id=sid, account_id=inp.account_id, llm=inp.llm,
                                                 goal=inp.goal, limits=inp.limits, turn=turn, transcript=transcript),
                start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY,
                summary=f"operator turn {turn}")
            if result.reply is None:
                cut_short = result.over or "the operator could not be called"
                break
            reply = result.reply
            transcript.append(reply.message())
            if not reply.calls:
                transcript.append({"role": "user", "content": NUDGE})
                continue
            for i, call in enumerate(reply.calls):
                if call.name == "answer" and call.unparsed is None:
                    await self._flush(sid)
                    return await self._llm_answer(inp, call.arguments, None)
                content = await self._llm_tool(inp, turn, i, call, launched)
                transcript.append({"role": "tool", "tool_call_id": call.id, "content": content})
                if self._stopped:
                    break
        else:
            cut_short = f"the operator did not answer within {MAX_TURNS} turns"
        await self._flush(sid)
        if self._stopped:
            await self._halt_runs(inp)
        return await self._llm_answer(inp, None, cut_short, stopped=self._stopped)

    async def _llm_tool(self, inp: OperatorInput, turn: int, i: int, call: ToolCall, launched: list[str]) -> str:
        if call.name == "wait" and call.unparsed is None:
            return await self._llm_wait(inp, call, launched)
        count = 0
        if call.name in LAUNCHING:
            models = call.arguments.get("models") if call.name == "sweep" else None
            count = min(len(models) if isinstance(models, list) else 1, inp.limits.session.runs)
        done: ToolResult = await workflow.execute_activity_method(
            OperatorLlmActivities.tool,
            ToolStep(session_id=inp.session_id, account_id=inp.account_id, limits=inp.limits, turn=turn, index=i,
                     call=call, run_ids=[str(workflow.uuid4()) for _ in range(count)]),
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY,
            summary=f"operator tool {call.name}")
        launched += [r for r in done.launched if r not in launched]
        self._labels.update(done.labels)
        return done.content

    async def _llm_wait(self, inp: OperatorInput, call: ToolCall, launched: list[str]) -> str:
        """Wait for runs this session launched (all of them when none is named); a stop ends the wait."""
        named = call.arguments.get("run_ids")
        wanted = [self._labels.get(str(r), str(r)) for r in named] if isinstance(named, list) and named \
            else list(launched)
        unknown = [r for r in wanted if r not in launched]
        wanted = [r for r in wanted if r in launched]
        reads: list[dict[str, object]] = []
        for run_id in wanted:
            waiting = workflow.start_activity_method(
                OperatorActivities.wait, WaitStep(session_id=inp.session_id, run_id=run_id, label=run_id),
                start_to_close_timeout=WAIT_TIMEOUT, heartbeat_timeout=WAIT_HEARTBEAT,
                retry_policy=WAIT_RETRY, summary=f"wait for run {run_id[:8]}")
            if not await self._settled(inp.session_id, waiting):
                return "the session was stopped while waiting"
            reads.append((await waiting).model_dump(mode="json"))
        out: dict[str, object] = {"runs": reads}
        if unknown:
            out["not_waited"] = f"wait takes run ids this session launched, not {', '.join(unknown)}"
        if not wanted and not unknown:
            out["not_waited"] = "this session has launched no run yet"
        return json.dumps(out)

    @staticmethod
    async def _llm_answer(inp: OperatorInput, arguments: dict[str, object] | None, cut_short: str | None,
                          stopped: bool = False) -> Answer:
        result: Answer = await workflow.execute_activity_method(
            OperatorLlmActivities.answer, LlmAnswerStep(session_id=inp.session_id, account_id=inp.account_id,
                                                 arguments=arguments, cut_short=cut_short, stopped=stopped),
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=STEP_RETRY, summary="answer")
        workflow.set_current_details(f"**{result.outcome}**  \n{result.sentence}")
        return result
