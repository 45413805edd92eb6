"""A plain run's quick phases in one local activity (patch ``quick-phases-chained``; ``PhaseChainInput``).

Each phase runs exactly as its own activity would (the same method, the same input, its own bracket and events), one
after the other; the chain stops after a phase that asks the workflow for something (a restart, a review, a halt) and
at a phase that fails, whose failure it returns for the workflow to raise as that phase's. Past ``SOFT_BUDGET_S`` it
starts no further phase: the workflow runs the rest as their own local activities, each with its own budget.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from temporalio import activity
from temporalio.exceptions import ApplicationError

from benchwright.runs.pipeline import PhaseChainFailure, PhaseChainInput, PhaseChainResult, PhaseInput, PhaseResult

SOFT_BUDGET_S = 2.0
"""No phase of a chain starts this long after the chain did (the workflow's budget for the whole chain is its local
budget, 5 s; a plain run's five quick phases take ~50-100 ms)."""

Phase = Callable[[PhaseInput], Awaitable[PhaseResult]]


class PhaseChainActivities:
    def __init__(self, phases: Mapping[str, Phase]) -> None:
        self.phases = phases

    @activity.defn(name="quick_phases")
    async def quick_phases(self, inp: PhaseChainInput) -> PhaseChainResult:
        results: list[PhaseResult] = []
        began = time.monotonic()
        for phase_inp in inp.phases:
            if results and time.monotonic() - began > SOFT_BUDGET_S:
                break
            try:
                result = await self.phases[phase_inp.phase](phase_inp)
            except ApplicationError as err:  # a domain error (non-retryable) or a halt, as the phase raised it
                return PhaseChainResult(results=results, failure=PhaseChainFailure(
                    phase=phase_inp.phase, invocation=phase_inp.invocation, type=err.type or "ApplicationError",
                    message=err.message, non_retryable=err.non_retryable, details=list(err.details)))
            except Exception as err:  # noqa: BLE001 - anything else is transient: its activity runs it again
                return PhaseChainResult(results=results, failure=PhaseChainFailure(
                    phase=phase_inp.phase, invocation=phase_inp.invocation, type=type(err).__name__,
                    message=str(err), non_retryable=False))
            results.append(result)
            if result.control is not None:
                break
        return PhaseChainResult(results=results)
