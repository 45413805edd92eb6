"""Launch ceilings (§9): the ``limits`` block, the older ``constraints`` spelling, and the enforceable matrix.

Limits are nested ``<level>.<quantity>``; money in dollars, time in seconds, the unit belongs to the quantity.
Only what the platform enforces is accepted; anything else is refused with a message naming the path and listing
what is allowed, never stored and ignored.

| path                    | enforced how                                                                |
|-------------------------|-----------------------------------------------------------------------------|
| run.cost                | halts ``limit_exceeded:run.cost`` as soon as cost.incurred crosses it         |
| run.duration            | halts ``limit_exceeded:run.duration`` when the run's wall time (launch on) crosses it |
| phase.duration          | halts ``limit_exceeded:phase.duration`` when any one phase invocation runs longer |
| phase:<name>.duration   | the same for one phase, ``limit_exceeded:phase:<name>.duration``              |
| task.attempts           | attempts a trial gets when one errs (default 1: no retry); then the row is err |
| task.duration           | a trial's wall time across its attempts; past it the row is err, not retried  |
| task.cost               | a trial's model spend; past it the row is err (the spend still counts)        |
| attempt.duration        | bounds one attempt of a trial; past it that attempt errs                      |
| phase.driver_steps      | the LLM driver's model calls per phase invocation; spent without finishing, the |
|                         | phase asks for human review (the reviewer's instructions re-run it, fresh steps) |
| phase:<name>.driver_steps | the same for one phase                                                      |
| run.driver_tokens       | the LLM driver's tokens (prompt + completion) over the whole run; spent, the    |
|                         | phase fails (``driver_budget_exhausted``): a review could not buy more tokens  |

Scorer time is never unbounded (``ScorerCeilings``, deployment settings published by ``GET /v1/limits``): a launch
without ``attempt.duration`` gets the deployment's default, a scorer runtime must finish importing task_impl.py
within ``scorer.load``, and a Materialize batch's trials not settled within ``batch.duration`` err
``limit_exceeded:batch.duration``. An attempt past its ceiling is stopped by killing the scorer runtime (a
thread spinning in Python cannot be interrupted); a fresh runtime carries on with the batch's other trials.

The LLM driver is never unbounded either (``DriverBudgets``): a launch without ``phase.driver_steps`` or
``run.driver_tokens`` gets the deployment's defaults, published by ``GET /v1/limits`` beside ``attempt.duration``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from benchwright.errors import InvalidInput
from benchwright.schemas import PHASES
from benchwright.security.bounds import MAX_DURATION_S, NUMBER_RANGES, number_problem

if TYPE_CHECKING:
    from benchwright.settings import Settings

ENFORCEABLE: dict[str, tuple[str, ...]] = {
    "run": ("cost", "duration", "driver_tokens"),
    "phase": ("duration", "driver_steps"),
    "task": ("attempts", "duration", "cost"),
    "attempt": ("duration",),
}
"""The matrix ``GET /v1/limits`` publishes. ``phase:<name>`` takes what ``phase`` takes."""

INTEGER_QUANTITIES = {"attempts", "driver_steps", "driver_tokens"}


class TaskLimits(BaseModel):
    """What the scorer host enforces per trial (carried into every Materialize batch)."""

    attempts: int = 1
    duration_s: float | None = None
    cost_usd: float | None = None
    attempt_duration_s: float | None = None


class RunLimits(BaseModel):
    """The resolved, validated ceilings of one run, frozen on the run at launch."""

    run_cost_usd: float | None = None
    run_duration_s: float | None = None
    phase_duration_s: float | None = None
    phase_durations_s: dict[str, float] = Field(default_factory=dict)
    task: TaskLimits = Field(default_factory=TaskLimits)
    max_tasks: int | None = None
    """Caps the sample count (does not halt): the narrowest of constraints.max_tasks, metadata.limit and a
    harness's own limit."""
    run_driver_tokens: int | None = None
    phase_driver_steps: int | None = None
    phase_driver_steps_by: dict[str, int] = Field(default_factory=dict)
    """``phase:<name>.driver_steps``, which wins over ``phase.driver_steps`` for that phase."""

    def driver_steps(self, phase: str) -> int | None:
        """The LLM driver's step budget for one invocation of ``phase``, if the launch set one."""
        return self.phase_driver_steps_by.get(phase, self.phase_driver_steps)

    def phase_limit(self, phase: str) -> tuple[float, str] | None:
        """The duration ceiling for ``phase`` and the limit path named in the halt reason, if any."""
        if phase in self.phase_durations_s:
            return self.phase_durations_s[phase], f"phase:{phase}.duration"
        if self.phase_duration_s is not None:
            return self.phase_duration_s, "phase.duration"
        return None


@dataclass(frozen=True)
class ScorerCeilings:
    """The deployment's ceilings on scorer time (from its settings), so a looping scorer ends as err rows."""

    attempt_duration_s: float = 300.0
    """``attempt.duration`` for launches that set none (their own ``limits.attempt.duration`` overrides it)."""
    load_s: float = 60.0
    """How long one scorer runtime may take to import task_impl.py and build its Scorer."""
    batch_duration_s: float = 36_000.0
    """Wall time of one Materialize batch's scoring; also bounds its sandbox's CPU and wall time."""

    @classmethod
    def of(cls, settings: Settings) -> ScorerCeilings:
        """The ceilings a deployment's settings name."""
        return cls(attempt_duration_s=settings.default_attempt_duration_s, load_s=settings.scorer_load_s,
                   batch_duration_s=settings.materialize_batch_duration_s)

    def task_limits(self, task: TaskLimits) -> TaskLimits:
        """``task`` with the default attempt ceiling where the launch set none."""
        if task.attempt_duration_s is not None:
            return task
        return task.model_copy(update={"attempt_duration_s": self.attempt_duration_s})


@dataclass(frozen=True)
class DriverBudgets:
    """The deployment's default LLM-driver budgets, for launches whose limits set none."""

    steps: int = 30
    """``phase.driver_steps``: model calls per phase invocation."""
    tokens: int = 1_000_000
    """``run.driver_tokens``: prompt + completion tokens over the run."""

    @classmethod
    def of(cls, settings: Settings) -> DriverBudgets:
        return cls(steps=settings.driver_max_steps, tokens=settings.driver_max_tokens)


def matrix(ceilings: ScorerCeilings | None = None, budgets: DriverBudgets | None = None) -> dict[str, Any]:
    """The enforceable matrix as the API publishes it, with the deployment's defaults and fixed ceilings."""
    ceilings = ceilings or ScorerCeilings()
    budgets = budgets or DriverBudgets()
    return {
        "defaults": {"attempt.duration": ceilings.attempt_duration_s, "phase.driver_steps": budgets.steps,
                     "run.driver_tokens": budgets.tokens},
        "ceilings": {"scorer.load": ceilings.load_s, "batch.duration": ceilings.batch_duration_s},
        "levels": {level: list(q) for level, q in ENFORCEABLE.items()},
        "phase_names": [p for p in PHASES],
        "units": {"cost": "USD (decimals allowed)", "duration": "seconds", "attempts": "count (integer >= 1)",
                  "driver_steps": "LLM-driver model calls per phase invocation (integer >= 1)",
                  "driver_tokens": "LLM-driver tokens, prompt + completion, per run (integer >= 1)"},
        "constraints": {"max_cost_cents": "run.cost (in cents)", "max_duration_ms": "run.duration (in ms)",
                        "max_tasks": "caps the sample count; does not halt"},
    }


def _allowed() -> str:
    return (", ".join(f"{lvl}.{q}" for lvl, qs in ENFORCEABLE.items() for q in qs)
            + ", phase:<name>.duration, phase:<name>.driver_steps")


def _number(path: str, value: Any, *, integer: bool) -> float:
    where = path if path.startswith(("constraints.", "metadata.")) else f"limits.{path}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{where} must be a number, got {value!r}", code="invalid_limit")
    if not math.isfinite(value):
        raise InvalidInput(f"{where} must be a finite number, got {value!r}", code="invalid_limit")
    if value <= 0 and not integer:
        raise InvalidInput(f"{where} must be greater than 0, got {value!r}", code="invalid_limit")
    # The API refuses out-of-range values with 422 first (``benchwright.security.bounds.check_numbers``); a launch made
    # another way (a schedule's firing, a fork's resolution) meets the same table here.
    quantity = "max_tasks" if path == "metadata.limit" else path.rsplit(".", 1)[-1]
    low, high, low_exclusive, unit = NUMBER_RANGES.get(quantity, (0.0, float(2**53), True, ""))
    problem = number_problem(value, path=where, low=low, high=high, low_exclusive=low_exclusive, unit=unit)
    if problem and not (integer and value < 1):
        raise InvalidInput(problem, code="invalid_limit")
    if integer and (float(value) != int(value) or value < 1):
        raise InvalidInput(f"{where} must be a whole number >= 1, got {value!r}", code="invalid_limit")
    return float(value)


def resolve_limits(*, limits: dict[str, Any] | None, constraints: dict[str, Any] | None,
                   metadata: dict[str, Any]) -> RunLimits:
    """Validate ``limits`` (and map ``constraints`` onto it); where both set a ceiling, the narrower wins.

    Raises:
        InvalidInput: a level or quantity outside the enforceable matrix, or a value that is not a positive number.
    """
    flat: dict[str, float] = {}
    for level, quantities in (limits or {}).items():
        base = level.split(":", 1)[0]
        if base not in ENFORCEABLE or (":" in level and (base != "phase" or level.split(":", 1)[1] not in PHASES)):
            raise InvalidInput(f"limits.{level} is not a limit level; allowed: {_allowed()}",
                               code="unenforceable_limit")
        if not isinstance(quantities, dict):
            raise InvalidInput(f"limits.{level} must be an object of quantities", code="invalid_limit")
        for quantity, value in quantities.items():
            path = f"{level}.{quantity}"
            if quantity not in ENFORCEABLE[base]:
                raise InvalidInput(f"limits.{path} is not enforceable; allowed: {_allowed()}",
                                   code="unenforceable_limit")
            flat[path] = _number(path, value, integer=quantity in INTEGER_QUANTITIES)
    caps: list[int] = []
    known = {"max_cost_cents", "max_duration_ms", "max_tasks"}
    for key, value in (constraints or {}).items():
        if key not in known:
            raise InvalidInput(f"constraints.{key} is not a constraint; allowed: {', '.join(sorted(known))}",
                               code="unenforceable_limit")
        if key == "max_cost_cents":
            _narrow(flat, "run.cost", _number(f"constraints.{key}", value, integer=False) / 100)
        elif key == "max_duration_ms":
            _narrow(flat, "run.duration", _number(f"constraints.{key}", value, integer=False) / 1000)
        else:
            caps.append(int(_number(f"constraints.{key}", value, integer=True)))
    meta_limit = metadata.get("limit")
    if meta_limit is not None:
        caps.append(int(_number("metadata.limit", meta_limit, integer=True)))
    return RunLimits(
        run_cost_usd=flat.get("run.cost"), run_duration_s=flat.get("run.duration"),
        phase_duration_s=flat.get("phase.duration"),
        phase_durations_s={p.split(":", 1)[1].split(".")[0]: v for p, v in flat.items()
                           if p.startswith("phase:") and p.endswith(".duration")},
        task=TaskLimits(attempts=int(flat.get("task.attempts", 1)), duration_s=flat.get("task.duration"),
                        cost_usd=flat.get("task.cost"), attempt_duration_s=flat.get("attempt.duration")),
        max_tasks=min(caps) if caps else None,
        run_driver_tokens=int(flat["run.driver_tokens"]) if "run.driver_tokens" in flat else None,
        phase_driver_steps=int(flat["phase.driver_steps"]) if "phase.driver_steps" in flat else None,
        phase_driver_steps_by={p.split(":", 1)[1].split(".")[0]: int(v) for p, v in flat.items()
                               if p.startswith("phase:") and p.endswith(".driver_steps")},
    )


def unusable(limits: RunLimits) -> str | None:
    """Why the workflow could not act on ``limits`` (a value no launch check let through, or one that slipped past
    them: a workflow started some other way), or None. Pure and deterministic: the workflow calls it first and
    ends the run ``error`` with this reason rather than fail its task on a timer it cannot build."""
    seconds = {"run.duration": limits.run_duration_s, "phase.duration": limits.phase_duration_s,
               "task.duration": limits.task.duration_s, "attempt.duration": limits.task.attempt_duration_s,
               **{f"phase:{p}.duration": v for p, v in limits.phase_durations_s.items()}}
    for path, value in seconds.items():
        if value is not None and (problem := number_problem(value, path=f"limits.{path}", low=0.0,
                                                            high=MAX_DURATION_S, low_exclusive=True,
                                                            unit="seconds")):
            return problem
    for path, value in {"run.cost": limits.run_cost_usd, "task.cost": limits.task.cost_usd}.items():
        if value is not None and (problem := number_problem(value, path=f"limits.{path}", low=0.0,
                                                            high=NUMBER_RANGES["cost"][1], low_exclusive=True)):
            return problem
    return None


def _narrow(flat: dict[str, float], path: str, value: float) -> None:
    flat[path] = min(flat.get(path, value), value)
