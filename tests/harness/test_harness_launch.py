"""The ``harness`` launch field (§4): bridges accepted with a valid harness_config, everything else a clear 400;
the plan's hard skips (§2); the limit fold (§9); epochs as trials. Plain functions, no stack."""

from __future__ import annotations

import pytest

from benchwright.errors import InvalidInput
from benchwright.harness.config import (
    HARNESSES,
    bridge_trials,
    check_bridge_limits,
    check_harness,
    sample_limit,
)
from benchwright.harness.install import RUNTIMES
from benchwright.runs.limits import RunLimits, TaskLimits
from benchwright.runs.pipeline import plan_phases
from benchwright.schemas import HARNESS_VALUES, LaunchRequest
from benchwright.scoring.aggregators import TrialPlan, TrialsConfig
from tests.harness.qa import harness_config

MODEL = {"identifier": "openai/dev"}


def _launch(**body: object) -> LaunchRequest:
    return LaunchRequest.model_validate({"model": MODEL, **body})


def _refused(**body: object) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        check_harness(_launch(**body))
    return caught.value


def test_the_declared_values_are_the_checked_ones() -> None:
    assert tuple(HARNESS_VALUES) == HARNESSES
    assert set(RUNTIMES) == set(HARNESSES) - {"benchwright"}


def test_benchwright_is_the_default_and_takes_no_harness_config() -> None:
    assert check_harness(_launch(dataset="x.jsonl")) is None
    assert check_harness(_launch(dataset="x.jsonl", harness="benchwright")) is None
    assert _refused(dataset="x.jsonl", harness_config={"task": "t"}).code == "invalid_harness_config"


def test_lighteval_needs_one_task_spec_and_harbor_a_relative_task_path() -> None:
    assert check_harness(_launch(harness="lighteval", harness_config={"task_file": "x", "task_name": "qa|0"}))
    assert "task_name must name" in str(_refused(harness="lighteval", harness_config={"task_file": "x"}))
    assert "one 'name'" in str(_refused(harness="lighteval", harness_config={"task": "a|b|c|d"}))
    assert "not lighteval options" in str(_refused(harness="lighteval", harness_config={"task": "qa", "epochs": 2}))
    assert check_harness(_launch(harness="harbor", harness_config={"path": "bundled/demo", "agent": "nop",
                                                                   "epochs": 2}))
    for path in ("/etc", "../x", "a/../../b", "bundled/./demo", ""):
        err = _refused(harness="harbor", harness_config={"path": path})
        assert err.code == "invalid_harness_config" and "path" in str(err), path
    assert check_harness(_launch(harness="harbor", harness_config={"path": "bundled/demo", "agent": "terminus-2"}))
    err = _refused(harness="harbor", harness_config={"path": "bundled/demo", "agent": "claude-code"})
    assert err.code == "harness_not_supported" and "oracle, nop, terminus-2" in str(err) and "relay" in str(err)
    assert "not harbor options" in str(_refused(harness="harbor", harness_config={"path": "p", "task": "t"}))


def test_a_typo_is_refused_with_a_suggestion_never_a_fallback() -> None:
    err = _refused(harness="inspekt", harness_config={"task": "t"})
    assert err.code == "unknown_harness" and "did you mean 'inspect'" in str(err)


@pytest.mark.parametrize(("config", "says"), [
    (None, "needs harness_config"),
    ({}, "exactly one of task"),
    ({"task": "a", "task_file": "b"}, "exactly one of task"),
    ({"task": "a", "files": {"../x": "1"}}, "plain name"),
    ({"task": "a", "files": {"bw_bridge.py": "1"}}, "plain name"),
    ({"task": "a", "limit": 0}, "limit"),
    ({"task": "a", "typo": 1}, "typo"),
    ({"task": "a", "num_fewshot": 2}, "not inspect options"),
])
def test_bad_inspect_configs_say_what_is_wrong(config: dict[str, object] | None, says: str) -> None:
    err = _refused(harness="inspect", harness_config=config)
    assert err.code == "invalid_harness_config" and says in str(err)


def test_lmeval_task_yaml_must_name_its_task_and_a_bridge_names_no_dataset() -> None:
    assert "'task:' name" in str(_refused(harness="lmeval", harness_config={"task_file": "dataset_path: json\n"}))
    assert "not valid YAML" in str(_refused(harness="lmeval", harness_config={"task_file": "a: [\n"}))
    assert "drop dataset" in str(_refused(harness="lmeval", dataset="x.jsonl", harness_config={"task": "t"}))
    assert check_harness(_launch(harness="lmeval", harness_config=harness_config("lmeval"))) is not None


def test_a_bridge_hard_skips_fetch_analyze_atomize_and_find() -> None:
    plan = plan_phases(_launch(harness="inspect", harness_config={"task": "t"}))
    skipped = {p.phase: p.skip_reason for p in plan if p.skip_reason}
    assert set(skipped) == {"find", "fetch", "analyze", "atomize"}
    assert all(r is not None and r.startswith("harness-bridge run (inspect)") for r in skipped.values())
    assert [p.phase for p in plan if not p.skip_reason] == ["setup", "attach", "materialize"]
    assert not any(p.skip_reason and "harness" in p.skip_reason for p in plan_phases(_launch(dataset="x.jsonl")))


def test_limits_fold_narrowest_wins_and_task_limits_are_refused() -> None:
    config = check_harness(_launch(harness="inspect", harness_config={"task": "t", "limit": 50}))
    assert config is not None
    assert sample_limit(config, RunLimits()) == 50
    assert sample_limit(config, RunLimits(max_tasks=20)) == 20
    assert sample_limit(config.model_copy(update={"limit": None}), RunLimits(max_tasks=70)) == 70
    with pytest.raises(InvalidInput, match="cannot be enforced"):
        check_bridge_limits(RunLimits(task=TaskLimits(attempts=2)))
    check_bridge_limits(RunLimits(run_cost_usd=1.0, max_tasks=3))


def test_epochs_are_the_trials() -> None:
    config = check_harness(_launch(harness="inspect", harness_config={"task": "t", "epochs": 3}))
    assert config is not None
    trials = bridge_trials(config, TrialsConfig(), given=False)
    assert trials.plan.k == 3 and trials.aggregator.name == "mean"
    with pytest.raises(InvalidInput, match="disagree"):
        bridge_trials(config, TrialsConfig(plan=TrialPlan(k=2)), given=True)
    assert bridge_trials(config.model_copy(update={"epochs": None}), TrialsConfig(), given=False).plan.k == 1
