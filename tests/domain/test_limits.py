"""The limits block, the constraints spelling, and the enforceable matrix (§9)."""

from __future__ import annotations

import pytest

from benchwright.errors import InvalidInput
from benchwright.runs.limits import matrix, resolve_limits


def test_limits_resolve_to_the_run_shape() -> None:
    limits = resolve_limits(limits={"run": {"cost": 5.0, "duration": 600}, "task": {"attempts": 2, "cost": 0.01},
                                    "attempt": {"duration": 30}, "phase": {"duration": 120},
                                    "phase:atomize": {"duration": 60}}, constraints=None, metadata={})
    assert limits.run_cost_usd == 5.0 and limits.run_duration_s == 600
    assert limits.task.attempts == 2 and limits.task.cost_usd == 0.01 and limits.task.attempt_duration_s == 30
    assert limits.phase_limit("atomize") == (60, "phase:atomize.duration")
    assert limits.phase_limit("fetch") == (120, "phase.duration")


def test_constraints_map_exactly_and_the_narrowest_wins() -> None:
    limits = resolve_limits(limits={"run": {"cost": 5.0}},
                            constraints={"max_cost_cents": 250, "max_duration_ms": 90_000, "max_tasks": 10},
                            metadata={"limit": 20})
    assert limits.run_cost_usd == 2.5 and limits.run_duration_s == 90 and limits.max_tasks == 10
    assert resolve_limits(limits=None, constraints={"max_tasks": 30}, metadata={"limit": 20}).max_tasks == 20


@pytest.mark.parametrize("limits, fragment", [
    ({"run": {"attempts": 3}}, "limits.run.attempts is not enforceable; allowed: run.cost, run.duration"),
    ({"runs": {"cost": 1}}, "limits.runs is not a limit level"),
    ({"phase:atomise": {"duration": 1}}, "limits.phase:atomise is not a limit level"),
    ({"task": {"attempts": 1.5}}, "limits.task.attempts must be a whole number"),
    ({"run": {"cost": -1}}, "limits.run.cost must be greater than 0"),
    ({"run": {"cost": "5"}}, "limits.run.cost must be a number"),
    ({"run": 5}, "limits.run must be an object"),
])
def test_unenforceable_or_bad_limits_are_refused_naming_the_path(limits: dict, fragment: str) -> None:
    with pytest.raises(InvalidInput) as err:
        resolve_limits(limits=limits, constraints=None, metadata={})
    assert fragment in err.value.message


def test_unknown_constraint_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"constraints\.max_cost is not a constraint"):
        resolve_limits(limits=None, constraints={"max_cost": 1}, metadata={})


def test_matrix_lists_every_enforceable_path() -> None:
    published = matrix()["levels"]
    assert published == {"run": ["cost", "duration", "driver_tokens"], "phase": ["duration", "driver_steps"],
                         "task": ["attempts", "duration", "cost"], "attempt": ["duration"]}


def test_driver_budgets_are_whole_numbers_per_phase_and_per_run() -> None:
    limits = resolve_limits(limits={"phase": {"driver_steps": 5, "duration": 60}, "phase:atomize": {"driver_steps": 3},
                                    "run": {"driver_tokens": 20_000}}, constraints=None, metadata={})
    assert limits.driver_steps("atomize") == 3 and limits.driver_steps("analyze") == 5
    assert limits.run_driver_tokens == 20_000
    assert limits.phase_durations_s == {}, "a per-phase step budget is not a duration"
    with pytest.raises(InvalidInput, match=r"limits\.phase\.driver_steps must be a whole number"):
        resolve_limits(limits={"phase": {"driver_steps": 2.5}}, constraints=None, metadata={})
    assert matrix()["defaults"]["phase.driver_steps"] >= 1 and matrix()["defaults"]["run.driver_tokens"] >= 1
