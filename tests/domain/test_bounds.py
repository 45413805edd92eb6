"""The number bounds outside the API's body check (issue 23 item 1): launches made another way (a schedule's
firing, a fork's resolution) meet the same ranges in ``resolve_limits``; the workflow's own check (``unusable``)
names what it cannot act on; a schedule's interval is bounded."""

from __future__ import annotations

import math

import pytest

from benchwright.comparison.regression import parse_cadence
from benchwright.errors import InvalidInput
from benchwright.runs.limits import RunLimits, TaskLimits, resolve_limits, unusable


@pytest.mark.parametrize("limits, constraints, metadata, fragment", [
    ({"run": {"cost": math.nan}}, None, {}, "limits.run.cost must be a finite number"),
    ({"phase": {"duration": math.inf}}, None, {}, "limits.phase.duration must be a finite number"),
    ({"phase": {"duration": 1e14}}, None, {}, "at most 31,622,400 (seconds)"),
    ({"attempt": {"duration": 1e400}}, None, {}, "limits.attempt.duration must be a finite number"),
    ({"task": {"attempts": 10**30}}, None, {}, "limits.task.attempts must be a finite number at least 1"),
    (None, {"max_duration_ms": 1e17}, {}, "constraints.max_duration_ms must be a finite number"),
    (None, {"max_tasks": math.inf}, {}, "constraints.max_tasks must be a finite number"),
    (None, None, {"limit": 1e12}, "metadata.limit must be a finite number at least 1 and at most 100,000,000"),
])
def test_resolve_limits_refuses_what_the_api_refuses(limits, constraints, metadata, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInput) as err:
        resolve_limits(limits=limits, constraints=constraints, metadata=metadata)
    assert fragment in err.value.message and err.value.code == "invalid_limit", err.value.message


def test_the_workflows_check_names_each_unusable_ceiling() -> None:
    assert unusable(RunLimits(phase_duration_s=60, run_duration_s=3600, run_cost_usd=5.0)) is None
    assert "limits.phase.duration" in (unusable(RunLimits(phase_duration_s=1e14)) or "")
    assert "limits.run.duration" in (unusable(RunLimits(run_duration_s=math.inf)) or "")
    assert "limits.phase:atomize.duration" in (unusable(RunLimits(phase_durations_s={"atomize": 1e300})) or "")
    assert "limits.attempt.duration" in (unusable(RunLimits(task=TaskLimits(attempt_duration_s=-1.0))) or "")
    assert "limits.run.cost" in (unusable(RunLimits(run_cost_usd=math.nan)) or "")


def test_a_schedule_interval_is_bounded() -> None:
    assert parse_cadence("366d").interval is not None
    with pytest.raises(InvalidInput, match="longer than 366 days"):
        parse_cadence("999999d")


def test_only_request_bodies_are_held_to_the_bounds() -> None:
    """A launch read back from the store or a workflow's input validates as LaunchRequest: a bound tightened later
    must not fail a stored launch (a fork of an old run) or a running workflow's task decoding its input."""
    from pydantic import ValidationError

    from benchwright.schemas import LaunchBody, LaunchRequest

    stored = {"dataset": "http://x/d.jsonl", "model": {"identifier": "openai/x", "input_cost_per_token": 2.0},
              "metadata": {"seed": 1e300}, "limits": {"phase": {"duration": 1e14}}}
    assert LaunchRequest.model_validate(stored).metadata == {"seed": 1e300}
    with pytest.raises(ValidationError, match=r"must be a finite number"):
        LaunchBody.model_validate(stored)
