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

A **deprecated** patch (``workflow.deprecate_patch``, step 2 of the lifecycle in docs/architecture.md) has lost its
old branch: it is listed in ``DEPRECATED`` with the proof that no workflow which could take that branch is open, its
histories recorded with ``patched`` still replay and reach the call, and no kept history is from before it (such a
history would take the new code; it leaves tests/replay/histories with its reason). Why a patch recorded by
``patched`` cannot simply be deleted (step 3) and one recorded by ``deprecate_patch`` can is checked here too.
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
_PATCHED, _DEPRECATE = workflow.patched, workflow.deprecate_patch
"""The SDK's own functions, whatever the spies below replace them with."""

# Patches with no recorded history taken with them on. Shrink-only.
NO_ON_HISTORY: dict[str, str] = {
}

# Patches whose pre-patch behaviour was never recorded (no history from an older worker reaches the call site).
# Shrink-only; a pre-patch history can only be recorded with the code from before the patch (a ``git worktree`` of
# the patch's parent commit, its own test recording the history).
NO_OFF_HISTORY: dict[str, str] = {
}

# Deprecated patches (``workflow.deprecate_patch``): why no workflow that could take the deleted old branch can be
# open. Every ``deprecate_patch`` call site is listed (the reason is the proof the compatibility window has closed);
# the commits are the ones that introduced the ``patched`` call (``git log -S 'patched("<id>")' -- workflows/``).
DEPRECATED: dict[str, str] = {
    "fork-phase": "introduced with forks themselves (a37a5f1, da13e16, issue 10): RunInput at a37a5f1^ has no "
                  "`fork` field and no route starts a fork, so `inp.fork is not None` is False for every run from "
                  "before the patch and the call site is never reached",
    "harness-bridge": "introduced with harness bridges (1975deb, issue 16): LaunchRequest at 1975deb^ has no "
                      "`harness` field and forbids extra keys (a launch naming one was refused 422), so `is_bridge` "
                      "is False for every run from before the patch",
    "operator-llm": "introduced with the LLM operator (908920d): at 908920d^ OperatorInput has no `llm` and "
                    "POST /v1/operator/sessions answered 400 unknown_operator for any operator but `builtin` "
                    "(\"the LLM operator is not available yet\", api/routes/operator.py), so `inp.llm` is None for "
                    "every session from before the patch",
    "operator-extend": "introduced with BetterGoal.tasks (12afed7): at 12afed7^ the goal models forbid extra keys and "
                       "have no `tasks`, so no stored goal carries it and the call site is never reached",
}

# Patches whose recorded pre-patch histories replay even with the patch deprecated: their old branch issues the same
# commands for every recorded run, so replay cannot show their window (the count query in docs/architecture.md does).
REPLAY_BLIND: dict[str, str] = {
    "halt-written-before-teardown": "the new branch only waits (`wait_condition` issues no command)",
    "phase-heartbeat": "the branches differ in an activity's heartbeat timeout, which replay does not compare",
    "unusable-input-ends-run": "the branches differ only for limits no recorded pre-patch run had (a timer past "
                               "`timedelta`), whose old branch failed its workflow task",
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
_deprecated_cache: dict[str, set[str]] = {}


async def _replay(path: Path) -> str | None:
    """The replay failure of one saved history against today's workflows, or None."""
    result = await _replayer().replay_workflow(WorkflowHistory.from_json(path.name, path.read_text()),
                                               raise_on_replay_failure=False)
    return None if result.replay_failure is None else str(result.replay_failure)


async def _replay_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay every history once with spies on ``workflow.patched`` and ``workflow.deprecate_patch``."""
    if _off_cache:
        return
    real, real_deprecate = _PATCHED, _DEPRECATE
    current = [""]

    def spy(patch_id: str) -> bool:
        answer = real(patch_id)
        if not answer:
            _off_cache.setdefault(patch_id, set()).add(current[0])
        return answer

    def deprecate_spy(patch_id: str, **kwargs: Any) -> None:
        _deprecated_cache.setdefault(patch_id, set()).add(current[0])
        real_deprecate(patch_id, **kwargs)

    monkeypatch.setattr(workflow, "patched", spy)
    monkeypatch.setattr(workflow, "deprecate_patch", deprecate_spy)
    for path in _histories():
        current[0] = path.name
        failure = await _replay(path)
        assert failure is None, f"{path.name}: {failure}"
    _off_cache.setdefault("", set())  # replayed, even if no patch was ever off


async def _off(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Patch id -> histories whose replay asked ``workflow.patched(id)`` and got ``False`` (replayed once)."""
    await _replay_all(monkeypatch)
    return _off_cache


async def _deprecated_reached(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Patch id -> histories whose replay called ``workflow.deprecate_patch(id)``."""
    await _replay_all(monkeypatch)
    return _deprecated_cache


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


# -- deprecated patches (step 2) and removal (step 3) ------------------------------------------------------------


def test_every_deprecated_patch_says_why_its_window_has_closed() -> None:
    deprecated = {p for p, how in workflow_patches().items() if how == "deprecate_patch"}
    assert deprecated == set(DEPRECATED), ("every workflow.deprecate_patch call names its patch in DEPRECATED with "
                                           "the proof that no workflow from before it is open, and only those")


@ASYNC
async def test_histories_recorded_with_a_deprecated_patch_still_replay_through_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs started while the patch was ``patched`` (and since) carry its marker: they replay (``_replay_all``
    asserts that) and each one's replay reaches the ``deprecate_patch`` call, so the marker is matched, not skipped."""
    on, reached = _on(), await _deprecated_reached(monkeypatch)
    for patch in DEPRECATED:
        assert on.get(patch), f"{patch}: no history carries its marker"
        assert on[patch] <= reached.get(patch, set()), f"{patch}: {sorted(on[patch] - reached.get(patch, set()))}"


@ASYNC
async def test_no_kept_history_is_from_before_a_deprecated_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A history that reaches ``deprecate_patch(id)`` without the patch's marker was started before the patch: it
    now takes the new code. If it still replays that is an accident of equal commands, not a kept promise: it
    leaves tests/replay/histories (with the reason in docs/architecture.md) when its patch is deprecated."""
    on, reached = _on(), await _deprecated_reached(monkeypatch)
    before = {patch: sorted(names - on.get(patch, set())) for patch, names in reached.items()}
    assert {p: names for p, names in before.items() if names} == {}


@ASYNC
async def test_deprecating_a_patch_too_early_breaks_its_pre_patch_histories(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window is real: with a ``patched`` call replaced by ``deprecate_patch`` (its old branch gone), a history
    recorded before the patch no longer replays, for every patch whose pre-patch histories take a branch with other
    commands (``REPLAY_BLIND`` lists the others)."""
    off = dict(await _off(monkeypatch))
    simulated = [""]

    def early(patch_id: str) -> bool:
        if patch_id != simulated[0]:
            return _PATCHED(patch_id)
        _DEPRECATE(patch_id)
        return True

    monkeypatch.setattr(workflow, "patched", early)
    caught: dict[str, list[str]] = {}
    for patch, how in sorted(workflow_patches().items()):
        if how != "patched" or not off.get(patch):
            continue
        simulated[0] = patch
        caught[patch] = [name for name in sorted(off[patch]) if await _replay(HISTORIES / name) is not None]
    assert sorted(p for p, names in caught.items() if not names) == sorted(REPLAY_BLIND)
    assert caught["revoke-model-route-at-end"] == ["run_before_revoke_model_route.json"]
    assert caught["operator-stop-halts-runs"] == ["operator_builtin_stopped_before_stop_halts_runs.json"]


def _deprecated_marker(history: dict[str, Any], patch: str) -> bool | None:
    """The ``deprecated`` flag of the history's marker for ``patch`` (None: no marker)."""
    for event in history["events"]:
        attrs = event.get("markerRecordedEventAttributes")
        if attrs and attrs.get("markerName") == "core_patch":
            for payload in attrs["details"]["patch-data"]["payloads"]:
                data = json.loads(base64.b64decode(payload["data"]))
                if data["id"] == patch:
                    return bool(data.get("deprecated"))
    return None


@ASYNC
@pytest.mark.parametrize(("name", "patch", "removable"), [
    ("operator_builtin_extended.json", "operator-extend", False),
    ("operator_llm_session.json", "operator-llm", False),
    ("fork_at_atomize.json", "fork-phase", False),
    ("run_harness_bridge.json", "harness-bridge", False),
    ("operator_builtin_extended_deprecated.json", "operator-extend", True),
    ("operator_llm_session_deprecated.json", "operator-llm", True),
])
async def test_only_a_marker_written_by_deprecate_patch_lets_the_call_go(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                          patch: str, removable: bool) -> None:
    """Step 3 (removal) is safe only once no open workflow carries a marker written by ``patched``: Temporal skips a
    deprecated marker the code no longer asks for, but fails a non-deprecated one ("Non-deprecated patch marker
    encountered ... but there is no corresponding change command")."""
    assert _deprecated_marker(json.loads((HISTORIES / name).read_text()), patch) is removable
    monkeypatch.setattr(workflow, "deprecate_patch",
                        lambda patch_id, **kw: None if patch_id == patch else _DEPRECATE(patch_id, **kw))
    failure = await _replay(HISTORIES / name)
    if removable:
        assert failure is None, failure
    else:
        assert failure is not None and "Non-deprecated patch marker" in failure, failure
