"""The fork rules as plain functions (benchwright.runs.forks): overrides vs rewind points, the builtin driver's fork
vocabulary, the parent log's cut, and the inherited copies."""

from __future__ import annotations

import pytest

from benchwright.drivers.base import DriverFailed
from benchwright.errors import InvalidInput
from benchwright.runs.forks import (
    LoggedEvent,
    check_overrides,
    cut_point,
    default_rewind,
    inherited_copies,
    inherited_phases,
    interpret_instructions,
    model_binding,
)
from benchwright.schemas import ModelSpec


def _log(*events: tuple[str, dict]) -> list[LoggedEvent]:
    return [LoggedEvent(seq=i, type=t, data=d) for i, (t, d) in enumerate(events)]


PARENT = _log(
    ("RunLaunched", {}), ("PipelineStarted", {}), ("PhaseSkipped", {"phase": "find"}),
    ("PhaseStarted", {"phase": "fetch"}), ("FetchArtifact", {"sha256": "a"}), ("PhaseCompleted", {"phase": "fetch"}),
    ("PhaseStarted", {"phase": "analyze"}), ("PhaseCompleted", {"phase": "analyze"}),
    ("PhaseStarted", {"phase": "setup"}), ("SandboxKilled", {"cost_usd": 0.25}), ("PhaseCompleted", {"phase": "setup"}),
    ("PhaseStarted", {"phase": "attach"}), ("ModelProxyArtifact", {"model_id": "openai/a", "litellm_config_yaml": "y"}),
    ("PhaseCompleted", {"phase": "attach"}),
    ("PhaseStarted", {"phase": "atomize"}), ("PhaseFailed", {"phase": "atomize"}), ("PipelineFinished", {}),
)


def test_overrides_must_come_no_later_than_the_phase_that_consumes_them() -> None:
    check_overrides(rewind_to="fetch", overrides=["dataset", "model", "task_impl", "trials"])
    check_overrides(rewind_to="materialize", overrides=["model"], kind="replay")
    with pytest.raises(InvalidInput, match="override 'task_impl' needs rewind_to 'atomize'"):
        check_overrides(rewind_to="materialize", overrides=["task_impl"])
    with pytest.raises(InvalidInput, match="a replay changes only the model"):
        check_overrides(rewind_to="materialize", overrides=["trials"], kind="replay")
    assert default_rewind(["trials", "model"]) == "attach" and default_rewind([]) == "materialize"
    assert inherited_phases("setup") == ["find", "fetch", "analyze"]


def test_the_builtin_vocabulary_and_its_refusal() -> None:
    base = ModelSpec(identifier="openai/dev", api_base="http://a:1/v1")
    said = interpret_instructions("Use the mirror at http://m.example/x.jsonl.\nswap the model to openai/b",
                                  current_model=base)
    assert said.dataset == "http://m.example/x.jsonl" and said.model is not None
    assert said.model.identifier == "openai/b" and said.model.api_base == "http://a:1/v1"
    assert interpret_instructions("rewind to setup", current_model=base).rewind_to == "setup"
    with pytest.raises(DriverFailed, match="cannot interpret the fork instruction 'try harder'"):
        interpret_instructions("use the mirror at http://m/x; try harder", current_model=base)


def test_the_cut_is_the_rewind_phase_start_and_needs_every_earlier_phase_done() -> None:
    assert cut_point(PARENT, "atomize") == 14
    assert cut_point(PARENT, "setup") == 8
    with pytest.raises(InvalidInput, match="did not complete atomize"):
        cut_point(PARENT, "materialize")


def test_copies_mark_their_origin_zero_costs_and_rebind_a_replay_model() -> None:
    spec = ModelSpec(identifier="openai/b", api_base="http://b:1/v1")
    copies = inherited_copies(PARENT, parent_run_id="p", cut=14, rebind=model_binding(spec))
    assert [seq for seq in (d["inherited_from"]["seq"] for _, _, d in copies)] == list(range(1, 14))
    kill = next(d for _, t, d in copies if t == "SandboxKilled")
    assert kill["cost_usd"] == 0.0 and kill["inherited_from"] == {"run_id": "p", "seq": 9, "cost_usd": 0.25}
    bound = next(d for _, t, d in copies if t == "ModelProxyArtifact")
    assert bound["model_id"] == "openai/b" and bound["inherited_from"]["overridden"] == ["litellm_config_yaml",
                                                                                         "model_id"]
    assert PARENT[12].data["model_id"] == "openai/a", "the parent's event is not touched"
