"""The LLM driver's tools for Atomize, as its model sees them (OpenAI function schemas) and as they execute.

Every tool is data in and data out for the model; whatever runs code runs in the run's work sandbox through the
phase's ``Workbench`` (``writeTaskImpl`` load-checks there, ``runScorer`` runs extract/solve/score there with the
model calls going through the run's SUT route). Reading the context and the sample rows is data the phase already
holds. No tool can reach a credential, another run, or the launch API: the model only ever sees what these return.

    readContext()                 the phase, the dataset's shape, Analyze's plan, the reviewer's instructions
    readSamples(offset, limit)    sample task rows (the first ``SAMPLE_ROWS`` of the run's tasks)
    writeTaskImpl(source)         the candidate task_impl.py; answers whether it loads in the sandbox
    runScorer(count)              the candidate on the first ``count`` sample rows; per-row outcome/score/output
    requestRestart(reason)        start this phase over (capped per run, §10)            ends the phase
    requestHumanReview(reason)    halt ``agent_review: <reason>`` until a person answers   ends the phase
    finishPhase(summary)          the candidate becomes the run's task_impl.py            ends the phase
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from benchwright.drivers.base import AtomizeDecision, DriverContext, DriverFailed

RESULT_CHARS = 8000
"""Longest tool result sent back to the model (and logged): a sample row or a reply can be large."""
OUTPUT_CHARS = 400
"""Of each sample's model output, in runScorer's answer."""

SCORER_CONTRACT = """task_impl.py must define `class Scorer` with three methods (standard library only):
    extract(self, row) -> str               the prompt for the model, from one task row (a dict)
    solve(self, row, call_sut) -> str       call_sut(messages) sends chat messages to the model under test and
                                            returns its reply text; usually `return call_sut([{"role": "user",
                                            "content": self.extract(row)}])`
    score(self, row, response) -> float     1.0 for a correct response, 0.0 for a wrong one (or a dict with
                                            "score" and extra keys kept as the task's meta)
It runs in a sandbox without network access; only call_sut reaches the model."""


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


_REASON = {"reason": {"type": "string", "description": "Why, in one or two sentences."}}

ATOMIZE_TOOLS: list[dict[str, Any]] = [
    _function("readContext", "The phase, the dataset's shape (columns, rows), Analyze's scorer plan, and the "
              "reviewer's instructions if a person resolved an earlier review.", {}, []),
    _function("readSamples", "Sample task rows as JSON objects.", {
        "offset": {"type": "integer", "minimum": 0, "description": "First row (0-based)."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "How many rows."}}, []),
    _function("writeTaskImpl", "Write the candidate task_impl.py (the whole file). It is load-checked in the "
              "sandbox; the answer says whether it loads, or why not.", {
                  "source": {"type": "string", "description": "Python source of task_impl.py."}}, ["source"]),
    _function("runScorer", "Run the candidate task_impl.py on the first `count` sample rows in the sandbox, calling "
              "the model under test; returns each row's outcome, score and the model's output.", {
                  "count": {"type": "integer", "minimum": 1, "description": "How many sample rows."}}, []),
    _function("requestRestart", "Start this phase over from scratch (at most twice per run). Use when the approach "
              "is wrong, not for a small fix (rewrite the file instead).", _REASON, ["reason"]),
    _function("requestHumanReview", "Stop and ask a person to decide (ambiguous columns, an unscorable dataset). "
              "Their answer comes back as instructions when the phase runs again.", _REASON, ["reason"]),
    _function("finishPhase", "Accept the candidate task_impl.py as the run's scorer and end the phase.", {
        "summary": {"type": "string", "description": "One sentence: what the scorer does."}}, ["summary"]),
]


@dataclass(frozen=True)
class ToolAnswer:
    ok: bool
    content: str


def _clip(text: str, limit: int = RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters cut]"


def _answer(ok: bool, payload: Any) -> ToolAnswer:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, default=str)
    return ToolAnswer(ok=ok, content=_clip(text))


def _int(args: dict[str, Any], name: str, default: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return value


class AtomizeToolbox:
    """The Atomize tools bound to one phase invocation's context. ``decision`` is set once a tool ends the phase
    (``finishPhase``); ``ended`` also covers the two requests, which set ``ctx.request``."""

    def __init__(self, ctx: DriverContext, *, origin: str, max_sample: int) -> None:
        if ctx.workbench is None:
            raise DriverFailed("the LLM driver needs the work sandbox in Atomize, and none was given")
        self.ctx, self.origin, self.max_sample = ctx, origin, max_sample
        self.workbench = ctx.workbench
        self.candidate: str | None = None
        self.loads = False
        self.decision: AtomizeDecision | None = None

    @property
    def ended(self) -> bool:
        return self.decision is not None or self.ctx.request is not None

    async def run(self, name: str, args: dict[str, Any]) -> ToolAnswer:
        """Execute one tool call; a bad call is answered (ok=False) so the model can correct itself."""
        handler = getattr(self, f"_tool_{name}", None)
        if handler is None:
            return _answer(False, f"unknown tool {name!r}; the tools are: "
                           + ", ".join(t["function"]["name"] for t in ATOMIZE_TOOLS))
        try:
            answer: ToolAnswer = await handler(args)
        except (ValueError, TypeError, KeyError) as exc:
            return _answer(False, f"bad arguments for {name}: {exc}")
        return answer

    async def _tool_readContext(self, args: dict[str, Any]) -> ToolAnswer:
        ctx = self.ctx
        schema = ctx.schema
        return _answer(True, {
            "phase": ctx.phase, "invocation": ctx.invocation,
            "dataset": None if schema is None else {"format": schema.format, "rows": schema.rows,
                                                    "columns": schema.columns, "splits": schema.splits},
            "plan": None if ctx.plan is None else {"template": ctx.plan.template, "fields": ctx.plan.fields,
                                                   "why": ctx.plan.why},
            "sample_rows": len(ctx.sample_rows),
            "reviewer_instructions": ctx.instructions,
            "candidate_written": self.candidate is not None,
            "scorer_contract": SCORER_CONTRACT,
        })

    async def _tool_readSamples(self, args: dict[str, Any]) -> ToolAnswer:
        offset, limit = _int(args, "offset", 0), _int(args, "limit", 5)
        if offset < 0 or limit < 1:
            raise ValueError("offset must be >= 0 and limit >= 1")
        rows = self.ctx.sample_rows[offset:offset + min(limit, 20)]
        return _answer(True, {"total_sample_rows": len(self.ctx.sample_rows), "offset": offset, "rows": rows})

    async def _tool_writeTaskImpl(self, args: dict[str, Any]) -> ToolAnswer:
        source = args["source"]
        if not isinstance(source, str) or not source.strip():
            raise ValueError("source must be the non-empty text of task_impl.py")
        self.candidate = source
        error = await self.workbench.check(source)
        self.loads = error is None
        if error is not None:
            return _answer(False, f"task_impl.py written ({len(source)} characters) but it does not load: {error}")
        return _answer(True, f"task_impl.py written ({len(source)} characters); it loads in the sandbox.")

    async def _tool_runScorer(self, args: dict[str, Any]) -> ToolAnswer:
        if self.candidate is None or not self.loads:
            return _answer(False, "write a task_impl.py that loads first (writeTaskImpl)")
        count = min(_int(args, "count", 5), self.max_sample, len(self.ctx.sample_rows))
        if count < 1:
            return _answer(False, "there are no sample rows to run")
        try:
            results = await self.workbench.run_samples(self.candidate, self.ctx.sample_rows[:count])
        except DriverFailed as exc:
            return _answer(False, str(exc))
        return _answer(True, [{"index": r.index, "outcome": r.outcome, "score": r.score,
                               "output": None if r.output is None else _clip(r.output, OUTPUT_CHARS),
                               "meta": r.meta, "error": r.error} for r in results])

    async def _tool_requestRestart(self, args: dict[str, Any]) -> ToolAnswer:
        self.ctx.request_restart(self._reason(args))
        return _answer(True, "restart requested; this phase ends now")

    async def _tool_requestHumanReview(self, args: dict[str, Any]) -> ToolAnswer:
        self.ctx.request_review(self._reason(args))
        return _answer(True, "human review requested; this phase ends now")

    async def _tool_finishPhase(self, args: dict[str, Any]) -> ToolAnswer:
        if self.candidate is None or not self.loads:
            return _answer(False, "there is no task_impl.py that loads yet: write one (writeTaskImpl) first")
        summary = str(args.get("summary") or "").strip() or "The LLM driver wrote task_impl.py."
        self.decision = AtomizeDecision(source=self.candidate, origin=self.origin, note=summary)
        return _answer(True, "phase finished; task_impl.py accepted")

    @staticmethod
    def _reason(args: dict[str, Any]) -> str:
        reason = args.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("reason must be a non-empty string")
        return reason.strip()[:500]
