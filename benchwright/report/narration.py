"""Run narration (issue 26): a short prose summary of what a terminal run did and what it means.

Every terminal run gets one, written after its terminal event (``benchwright.report.write_run_report``) and recorded
as ``RunNarrated``; ``GET /v1/runs/{id}`` shows it as ``narration``, ``benchwright show`` prints it, the run page and
the report show it. Two narrators, chosen per deployment (``Settings.narrator``):

* **builtin** (the default): :func:`builtin_narration`, a pure function of :class:`NarrationFacts`. Deterministic
  (the same facts give the same text, byte for byte) and free. It says, in this order: the score with its 95 %
  interval; errors (excluded from the pass rate) with their most common reason and its likely cause; the failures
  that found no answer in the reply; halts and a failed phase; the cost by source; and how the run compares with
  its parent (a fork or replay) or, failing that, the previous run of the same shape (benchmark, subset and impl;
  for an unregistered dataset run, the same task rows and scorer: ``subset_fingerprint``, ``impl_fingerprint``).
* **an LLM** (a LiteLLM model string, ``openai/gpt-4o-mini``): given the same facts and the builtin text as a
  draft, it writes the summary. Its tokens are recorded as ``NarrationUsage`` (model, calls, tokens, cost), which
  the cost trigger folds into cost.narration and, with the markup, cost.billed. It is bounded in time
  (``narrator_timeout_s``) and any failure (timeout, refusal, an empty reply) is recorded in ``RunNarrated.fallback``
  and swallowed: the builtin text stands in. Narration never blocks or fails the run, and never feeds the
  fingerprint (``RunNarrated`` is an output event, §6).

litellm is imported on first use, off the event loop (it stays out of the API's and CLI's import path).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from benchwright.events import NarrationUsage
from benchwright.runs.halts import HaltKind, HaltReason
from benchwright.schemas import CostView, TasksSummary

if TYPE_CHECKING:
    from benchwright.settings import Settings

__all__ = [
    "BUILTIN",
    "MAX_NARRATION_CHARS",
    "Comparison",
    "Narration",
    "NarrationFacts",
    "NarratorConfig",
    "builtin_narration",
    "check_narrator",
    "error_cause",
    "halt_cause",
    "narrate",
]

BUILTIN = "builtin"
MAX_NARRATION_CHARS = 4_000
"""The longest narration recorded (an LLM's reply is cut here)."""
MAX_REASON_CHARS = 160
_NARRATOR = re.compile(r"^[a-z][a-z0-9_-]{0,39}/[A-Za-z0-9][\w.:@/+-]{0,199}$")


def check_narrator(value: str) -> str:
    """``builtin`` or a LiteLLM model string ``<provider>/<model>``.

    Raises:
        ValueError: anything else (a settings error at the deployment's start).
    """
    if value == BUILTIN or _NARRATOR.match(value):
        return value
    raise ValueError(f"narrator must be 'builtin' or a LiteLLM model string like 'openai/gpt-4o-mini', not {value!r}")


class Comparison(BaseModel):
    """The run a narration compares against."""

    run_id: str
    relation: Literal["fork", "replay", "previous"]
    """The parent of a fork or replay, else the previous terminal run of the same shape (same account)."""
    model: str
    passed: int
    failed: int
    pass_rate: float | None
    pass_rate_ci: tuple[float, float] | None


class NarrationFacts(BaseModel):
    """What a narration is about (``benchwright.report.facts.narration_facts`` reads it from the store)."""

    run_id: str
    model: str
    status: str
    display_status: str
    halted: bool
    halt_reason: str | None
    error: str | None
    failed_phase: str | None = None
    summary: TasksSummary
    cost: CostView
    halts: list[str] = Field(default_factory=list)
    """Every halt reason the log raised, in order (a resumed pause included)."""
    top_errors: list[tuple[str, int]] = Field(default_factory=list)
    """The most common err reasons of the latest sweep (first line of the error), most frequent first."""
    comparison: Comparison | None = None
    duration_s: float | None = None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" (95 % CI {ci[0] * 100:.1f}–{ci[1] * 100:.1f} %)"


def _usd(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:.2f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_HALT_CAUSES: dict[HaltKind, str] = {
    HaltKind.OPERATOR_KILL: "stopped by its operator",
    HaltKind.ADMIN: "halted by a platform administrator",
    HaltKind.OPERATOR_PAUSE: "paused by its operator",
    HaltKind.AGENT_REVIEW: "the Driver asked for a human review",
    HaltKind.RESTART_CAP_EXCEEDED: "the Driver restarted a phase as often as it may",
    HaltKind.LIMIT_EXCEEDED: "it crossed a limit of its launch",
    HaltKind.BALANCE_EXHAUSTED: "the account's balance ran out",
    HaltKind.SUT_UNAVAILABLE: "the model endpoint kept failing",
}


def halt_cause(reason: str) -> str:
    """A halt reason in words (``benchwright.runs.halts`` reads its kind)."""
    parsed = HaltReason.parse(reason)
    return _HALT_CAUSES[parsed.kind] if parsed is not None else "it was halted"


_ERROR_CAUSES: tuple[tuple[tuple[str, ...], str], ...] = (
    ((HaltKind.LIMIT_EXCEEDED.value,), "a limit of the launch cut the tasks short"),
    (("timeout", "timed out", "readtimeout"), "model calls timing out"),
    (("429", "rate limit", "ratelimit"), "the model endpoint rate-limiting the run"),
    (("connect", "unreachable", " 5", "503", "502", "500", "unavailable"), "the model endpoint failing"),
    (("401", "403", "unauthorized", "forbidden", "api key"), "the model endpoint refusing the credential"),
    (("score:", "error", "exception", "traceback"), "the scorer raising on these tasks (a scorer or pipeline "
                                                    "fault, not a wrong answer)"),
)


def error_cause(reason: str) -> str:
    """The likely cause of an err reason, in words."""
    lowered = reason.lower()
    for needles, words in _ERROR_CAUSES:
        if any(n in lowered for n in needles):
            return words
    return "a pipeline fault rather than a wrong answer"


def builtin_narration(facts: NarrationFacts) -> str:
    """The builtin narrator's text: deterministic, a few sentences (module docstring)."""
    s = facts.summary
    scored = s.passed + s.failed
    parts: list[str] = []
    if scored:
        parts.append(f"{facts.model} passed {s.passed} of {scored} scored tasks: pass rate {_pct(s.pass_rate)}"
                     f"{_ci(s.pass_rate_ci)}.")
    else:
        parts.append(f"{facts.model} has no scored task, so the run has no pass rate.")
    unsettled = max(s.total - scored - s.errored, 0)
    if unsettled and facts.status != "running":
        parts.append(f"{unsettled} of {s.total} tasks never settled.")
    if s.errored:
        line = (f"{_plural(s.errored, 'task')} errored and {'is' if s.errored == 1 else 'are'} left out of the pass "
                "rate")
        if facts.top_errors:
            reason, count = facts.top_errors[0]
            line += f"; the most common reason ({count}) is “{reason}”, most likely {error_cause(reason)}"
        parts.append(line + ".")
    if s.no_answer:
        parts.append(f"{s.no_answer} of the {_plural(s.failed, 'failure')} found no answer in the reply: the "
                     "model's output format may not match what the scorer extracts, which a prompt or extraction "
                     "change may fix.")
    if facts.status == "error":
        where = f" in {facts.failed_phase}" if facts.failed_phase else ""
        parts.append(f"The run failed{where}: {_cut(facts.error or 'no error recorded', MAX_REASON_CHARS)}.")
    if facts.halted and facts.halt_reason:
        parts.append(f"It was halted ({_cut(facts.halt_reason, MAX_REASON_CHARS)}): {halt_cause(facts.halt_reason)}.")
    elif facts.halts:
        parts.append(f"It was halted {_plural(len(facts.halts), 'time')} on the way "
                     f"({', '.join(_cut(h, 60) for h in facts.halts[:3])}) and resumed.")
    c = facts.cost
    sources = [(name, getattr(c, name)) for name in ("model", "driver", "sandbox", "narration") if getattr(c, name)]
    if c.incurred:
        parts.append(f"It cost {_usd(c.incurred)}" + (" (" + ", ".join(f"{n} {_usd(v)}" for n, v in sources) + ")"
                                                    if sources else "") + f"; billed {_usd(c.billed)}.")
    else:
        parts.append("It cost nothing.")
    if facts.comparison is not None:
        parts.append(_compare(facts, facts.comparison))
    return " ".join(parts)


def _compare(facts: NarrationFacts, other: Comparison) -> str:
    what = {"fork": "its parent run", "replay": "the run it replays",
            "previous": "the previous run of the same benchmark, subset and impl"}[other.relation]
    mine = facts.summary
    if other.pass_rate is None or mine.pass_rate is None:
        return f"Against {what} {other.run_id} ({other.model}) there is no pass rate to compare."
    diff = (mine.pass_rate - other.pass_rate) * 100
    head = (f"Against {what} {other.run_id} ({other.model}, {_pct(other.pass_rate)}), the pass rate moved "
            f"{diff:+.1f} points")
    a, b = mine.pass_rate_ci, other.pass_rate_ci
    if a is not None and b is not None and (a[1] < b[0] or b[1] < a[0]):
        return head + "; the 95 % intervals do not overlap, so the change is unlikely to be noise."
    return head + "; the 95 % intervals overlap, so the difference may be noise (compare the runs task by task " \
                  "with `benchwright compare`)."


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the LLM narrator ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NarratorConfig:
    """What a deployment decides for narration (from its settings; passed to the report activity)."""

    narrator: str = BUILTIN
    api_base: str | None = None
    api_key: str | None = None
    input_cost_per_token: float | None = None
    output_cost_per_token: float | None = None
    timeout_s: float = 30.0

    @classmethod
    def of(cls, settings: Settings) -> NarratorConfig:
        key = settings.narrator_api_key.get_secret_value() if settings.narrator_api_key else None
        return cls(narrator=settings.narrator, api_base=settings.narrator_api_base, api_key=key,
                   input_cost_per_token=settings.narrator_input_cost_per_token,
                   output_cost_per_token=settings.narrator_output_cost_per_token, timeout_s=settings.narrator_timeout_s)

    def __repr__(self) -> str:  # the key never reaches a log line
        return f"NarratorConfig(narrator={self.narrator!r}, api_base={self.api_base!r})"


@dataclass(frozen=True)
class Narration:
    text: str
    narrator: str
    fallback: str | None = None
    usage: NarrationUsage | None = None
    """The LLM narrator's spend (also when its reply could not be used)."""


SYSTEM_PROMPT = (
    "You summarise one finished evaluation run of Benchwright for the person who launched it. Write 3 to 6 plain "
    "sentences of prose (no lists, no headings, no markdown): the score with its 95 % interval, errors and "
    "no-answer failures with their likely cause, halts, cost, and the comparison with the other run when one is "
    "given, and what it means. Use only the facts given; never invent numbers. Errors are pipeline faults and are "
    "excluded from the pass rate; failures are wrong (or missing) answers.")


def _prompt(facts: NarrationFacts, draft: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Facts (JSON):\n" + json.dumps(facts.model_dump(mode="json"), sort_keys=True)
             + "\n\nA draft you may improve on:\n" + draft}]


async def narrate(facts: NarrationFacts, config: NarratorConfig) -> Narration:
    """The run's narration by the configured narrator; an LLM's failure falls back to the builtin text."""
    builtin = builtin_narration(facts)
    if config.narrator == BUILTIN:
        return Narration(text=builtin, narrator=BUILTIN)
    usage: list[NarrationUsage] = []
    try:
        # litellm's first import takes seconds (more on a busy worker): it is not the narrator's time to spend
        litellm = await asyncio.to_thread(_import_litellm)
        text = await asyncio.wait_for(_llm_text(litellm, facts, builtin, config, usage), timeout=config.timeout_s)
    except Exception as exc:  # noqa: BLE001 - whatever the narrator did, the run keeps the builtin text
        reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        return Narration(text=builtin, narrator=BUILTIN, fallback=_redact(f"{config.narrator}: {reason}", config),
                         usage=usage[0] if usage else None)
    return Narration(text=text, narrator=config.narrator, usage=usage[0] if usage else None)


async def _llm_text(litellm: Any, facts: NarrationFacts, draft: str, config: NarratorConfig,
                    usage: list[NarrationUsage]) -> str:
    response = await litellm.acompletion(model=config.narrator, messages=_prompt(facts, draft), api_key=config.api_key,
                                         api_base=config.api_base, timeout=config.timeout_s, num_retries=1,
                                         max_tokens=600)
    counts = getattr(response, "usage", None)
    prompt_tokens = int(getattr(counts, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(counts, "completion_tokens", 0) or 0)
    usage.append(NarrationUsage(model=config.narrator, calls=1, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens,
                                cost_usd=_prices(config).cost({"prompt_tokens": prompt_tokens,
                                                               "completion_tokens": completion_tokens})))
    content = response.choices[0].message.content
    text = " ".join(str(content or "").split())
    if not text:
        raise ValueError("the narrator answered with no text")
    return _cut(text, MAX_NARRATION_CHARS)


def _prices(config: NarratorConfig) -> Any:
    from benchwright.llm.prices import prices_for
    from benchwright.schemas import ModelSpec

    return prices_for(ModelSpec(identifier=config.narrator, input_cost_per_token=config.input_cost_per_token,
                                output_cost_per_token=config.output_cost_per_token))


def _redact(text: str, config: NarratorConfig) -> str:
    text = text.replace(config.api_key, "[redacted]") if config.api_key else text
    return _cut(text, 1000)


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return importlib.import_module("litellm")
