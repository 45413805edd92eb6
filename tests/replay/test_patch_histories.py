"""Every workflow patch has recorded histories on both sides of it (docs/architecture.md, "Workflow versioning").

The patch names come from the workflow sources (``workflow.patched(...)`` / ``workflow.deprecate_patch(...)`` in
workflows/*.py, read by AST, module-level string constants resolved), so a new patch cannot be added without a
history: CI fails until one is recorded under tests/replay/histories/ (``BW_RECORD_HISTORIES=1`` with the test that
calls ``tests.api.helpers.record_history``).

- **On**: a history whose ``MarkerRecorded`` events (marker ``core_patch``, its ``patch-data`` payload
  ``{"id": ..., "deprecated": ...}``) name the patch: a run started by a worker that had the patch.
- **Off**: a history in whose replay ``workflow.patched(name)`` was asked and answered ``False``: a run started by a
  worker from before the patch, reaching the branch. Only histories can tell this (a run that never reaches the
  call site says nothing about the patch), so it is read by replaying every history with a spy on
  ``workflow.patched``.

A patch without such a history is listed below with the reason; the lists only shrink (an entry whose history has
since been recorded fails the last test until it is removed).
"""

from __future__ import annotations

import ast
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory

from tests.replay.test_replay import HISTORIES, _replayer

ASYNC = pytest.mark.asyncio(loop_scope="session")
WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"

# Patches with no recorded history taken with them on. Shrink-only.
NO_ON_HISTORY: dict[str, str] = {
}

# Patches whose pre-patch behaviour was never recorded (no history from an older worker reaches the call site).
# Shrink-only; a pre-patch history can only be recorded with the code from before the patch.
NO_OFF_HISTORY: dict[str, str] = {
    # Introduced with the Fork phase itself (issue 10): no fork run was recorded by an older worker.
    "fork-phase": "no pre-patch fork recorded",
    # Introduced with harness bridges (issue 16): the old path is the plain batch plan, never recorded for a bridge.
    "harness-bridge": "no pre-patch harness-bridge run recorded",
    # Halted runs torn down without waiting for in-flight halt writes (before @workflow.init control): none recorded.
    "halt-written-before-teardown": "no pre-patch halted run recorded",
    # Runs from before it slept the proxy linger in the workflow before stopping the proxy: never recorded.
    "revoke-model-route-at-end": "no pre-patch run with a model proxy recorded",
    # The operator session histories were all recorded after their patches (issue 26).
    "operator-llm": "no pre-patch LLM operator session recorded",
    "operator-stop-halts-runs": "no pre-patch stopped operator session recorded",
    "operator-extend": "no pre-patch extended operator session recorded",
}


def workflow_patches() -> dict[str, str]:
    """Every patch name in workflows/*.py and how it is called (``patched`` or ``deprecate_patch``)."""
    found: dict[str, str] = {}
    for path in sorted(WORKFLOWS.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        constants = {t.id: node.value.value for node in tree.body
                     if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
                     and isinstance(node.value.value, str)
                     for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                     if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("patched", "deprecate_patch")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "workflow"):
                continue
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                name = arg.value
            elif isinstance(arg, ast.Name) and arg.id in constants:
                name = constants[arg.id]
            else:
                raise AssertionError(f"{path.name}:{node.lineno}: a patch id must be a string literal or a "
                                     f"module-level string constant")
            if found.get(name) != "deprecate_patch":  # a deprecated patch is called only that way
                found[name] = node.func.attr
    return found


def marker_patches(history: dict[str, Any]) -> set[str]:
    """The patch ids a saved history's ``MarkerRecorded`` events name."""
    ids: set[str] = set()
    for event in history["events"]:
        attrs = event.get("markerRecordedEventAttributes")
        if not attrs or attrs.get("markerName") != "core_patch":
            continue
        for payload in attrs["details"]["patch-data"]["payloads"]:
            ids.add(str(json.loads(base64.b64decode(payload["data"]))["id"]))
    return ids


def _histories() -> list[Path]:
    return sorted(HISTORIES.glob("*.json"))


def _on() -> dict[str, set[str]]:
    on: dict[str, set[str]] = {}
    for path in _histories():
        for patch in marker_patches(json.loads(path.read_text())):
            on.setdefault(patch, set()).add(path.name)
    return on


_off_cache: dict[str, set[str]] = {}


async def _off(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Patch id -> histories whose replay asked ``workflow.patched(id)`` and got ``False`` (replayed once)."""
    if _off_cache:
        return _off_cache
    real = workflow.patched
    current = [""]

    def spy(patch_id: str) -> bool:
        answer = real(patch_id)
        if not answer:
            _off_cache.setdefault(patch_id, set()).add(current[0])
        return answer

    monkeypatch.setattr(workflow, "patched", spy)
    for path in _histories():
        current[0] = path.name
        result = await _replayer().replay_workflow(WorkflowHistory.from_json(path.name, path.read_text()),
                                                   raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
    _off_cache.setdefault("", set())  # replayed, even if no patch was ever off
    return _off_cache


def test_the_workflow_sources_carry_the_patches_we_know() -> None:
    """The AST scan is not vacuous: it finds patches in all three workflows, including a constant-named one."""
    patches = workflow_patches()
    assert {"balanced-batches", "regression-outcomes", "operator-llm"} <= set(patches)
    assert len(patches) >= 14


def test_marker_reading_names_the_patch_a_history_was_recorded_with() -> None:
    before = json.loads((HISTORIES / "run_600_tasks_before_balanced_batches.json").read_text())
    after = json.loads((HISTORIES / "run_600_tasks_balanced_batches.json").read_text())
    assert "balanced-batches" not in marker_patches(before)
    assert "balanced-batches" in marker_patches(after)


@pytest.mark.parametrize("patch", sorted(workflow_patches()))
def test_every_patch_has_a_history_recorded_with_it(patch: str) -> None:
    if patch in NO_ON_HISTORY:
        pytest.skip(f"allow-listed: {NO_ON_HISTORY[patch]}")
    assert _on().get(patch), (f"no history in tests/replay/histories names patch {patch!r} in a marker: record "
                              f"one (tests.api.helpers.record_history with BW_RECORD_HISTORIES=1)")


@ASYNC
async def test_every_patch_has_a_history_from_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    off = await _off(monkeypatch)
    missing = [p for p, how in workflow_patches().items()
               if how == "patched" and p not in NO_OFF_HISTORY and not off.get(p)]
    assert missing == [], (f"no recorded history replays with these patches off: {missing}; record one from the "
                           f"code before the patch or allow-list it in NO_OFF_HISTORY with the reason")


@ASYNC
async def test_the_allowlists_only_shrink(monkeypatch: pytest.MonkeyPatch) -> None:
    """An allow-listed patch that has since got its history (or no longer exists) must leave the list."""
    patches = workflow_patches()
    on, off = _on(), await _off(monkeypatch)
    assert [p for p in NO_ON_HISTORY if p not in patches or on.get(p)] == []
    assert [p for p in NO_OFF_HISTORY if patches.get(p) != "patched" or off.get(p)] == []
