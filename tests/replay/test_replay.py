"""Saved workflow histories replay against today's RunWorkflow (TEMPORAL-NOTES: versioning long runs).

A run started by an older worker must finish on a newer one: every change to the commands the workflow issues goes
behind ``workflow.patched``, and a history recorded before the change is kept here so a missing patch fails CI.

- ``run_600_tasks_before_balanced_batches.json``: recorded with the code before ``plan_batches`` (three batches of
  250, 250 and 100 tasks); it replays only because the new plan is behind ``patched("balanced-batches")``.
- ``run_600_tasks_balanced_batches.json``: recorded with ``plan_batches`` (three batches of 200).
- ``fork_at_atomize.json``: a fork (issue 10) rewinding to Atomize with a replacement scorer: the Fork phase
  (``patched("fork-phase")``) before PipelineStarted, then Atomize and Materialize.
- ``run_resweep_materialize_v2.json``: a run whose first sweep asks Atomize for a new impl
  (``patched("materialize-restart")``): Atomize v2, then Materialize v2.
- ``run_unusable_limits.json``: a run started directly with ``phase.duration`` = 1e14 s (past ``timedelta``), which
  ``patched("unusable-input-ends-run")`` ends ``error`` with the reason (issue 23) instead of failing its task.
- ``regression_firing_ok.json`` and ``regression_firing_refused.json``: RegressionWorkflow firings recorded before
  ``patched("regression-outcomes")`` (a refused launch and an undeliverable alert became recorded outcomes): one
  that replayed and compared, one whose start_replay was refused (the balance was exhausted) and so failed.
- ``regression_firing_ok_with_outcomes.json`` and ``regression_firing_launch_refused.json``: the same two firings
  recorded with the patch (the second refused for local paths and completed as ``launch_refused``).
- ``product_run.json``: a product-sandbox run of the bundled recipe (issue 27): Find/Fetch/Analyze/Atomize
  skipped by the plan, Setup (probe, setup commands, generated impl), Attach, one fanout Materialize batch of 22
  task sandboxes. No workflow change was needed for it; it guards the shape from here on.
- ``run_with_report.json``: a run that writes its narration and report after its terminal event (issue 26,
  ``patched("run-report")``: the ``report_run`` activity); every older history above replays without it.
- ``run_phase_heartbeat_retry.json``: phase activities scheduled with a heartbeat timeout (issue 23,
  ``patched("phase-heartbeat")``), recorded by tests/faults/test_phase_worker_kill.py: the worker holding Fetch was
  SIGKILLed and Fetch's second attempt followed a heartbeat timeout. Temporal's replay does not compare an
  activity's timeouts, so the test below checks which branch each history takes instead.
- ``operator_llm_session.json``: an LLM operator session (issue 26, ``patched("operator-llm")``): model turns,
  tool calls (two launches, a replay, three waits) and the answer, recorded by ``tests/api/test_operator_llm.py``.
- ``operator_builtin_stopped.json``: a builtin session stopped while it waited on its first run: the run is stopped
  by the session (``patched("operator-stop-halts-runs")``: the ``operator_halt_runs`` activity) before the answer.
- ``operator_builtin_extended.json``: a builtin ``better`` session whose first comparison (40 tasks) was
  inconclusive, extended to two larger runs (``patched("operator-extend")``: the ``operator_extend`` activity).
- ``run_stopped_during_materialize.json``: a run stopped mid-Materialize (tests/api/test_control.py): its teardown
  waits for the halt row's write (``patched("halt-written-before-teardown")``) before ``finish_halted``.
- ``run_opened_by_first_phase.json``: a run whose PipelineStarted and skips land with Fetch's PhaseStarted
  (``patched("pipeline-started-by-first-phase")``: no ``record_events`` activity before Fetch) and whose Materialize
  PhaseStarted is written by its batches (``patched("materialize-opened-by-batches")``: no ``materialize_begin``),
  recorded by tests/api/test_runs_e2e.py (issue 25: two activities and two workflow tasks fewer before the first
  model call). Every run history above from before them replays with both activities.
- ``run_closed_by_finish.json``: a run whose last sweep's close and model-route revocation are written by
  ``finish_run`` with its terminal event (``patched("run-closed-by-finish")``: no ``materialize_complete`` or
  ``stop_model_proxy`` activity), recorded by tests/api/test_runs_e2e.py (issue 25: two activities and two workflow
  tasks fewer after the last result). ``run_opened_by_first_phase.json`` and every history before it replay with
  both activities.
- ``run_stopped_at_birth_pipeline_start_pending.json``: a run stopped in its first workflow task
  (tests/api/test_early_control_and_signals.py): no phase opened, so its teardown writes the pending PipelineStarted
  (``record_events``) before ``finish_halted``.
- ``run_quick_phases_local.json``: a run whose Fetch, Analyze, Setup, Attach and Atomize ran as local activities in
  its workflow tasks (``patched("quick-phases-local")``: a ``core_local_activity`` marker each, no activity
  scheduled), and ``run_quick_phase_past_local_budget.json``: the same with its local Atomize stalled past its local
  budget (2 s when recorded), which then ran as the ordinary activity; both recorded by
  tests/api/test_local_phases.py (issue 25: four hops through Temporal's queues fewer before the first model call).
  ``run_before_quick_phases_local.json``: the same run with the patch answered False in the recording worker, as a
  worker from before it would have run it (every phase an activity). The call is asked only for a ``RunInput`` with
  ``backend`` (carried since the patch), so every run history above replays without reaching it.
- ``run_quick_phases_chained.json``: the run of ``run_quick_phases_local.json`` with its five quick phases in one
  local activity (``patched("quick-phases-chained")``: one ``core_local_activity`` marker, ``quick_phases``), and
  ``run_quick_phases_chain_past_local_budget.json``: the same with Atomize stalled inside the chain, which ran past
  its 5 s budget, after which each phase ran as its own local activity and Atomize, stalled again, as its ordinary
  activity; both recorded by tests/api/test_local_phases.py (issue 25: four local activities fewer before the first
  model call). ``run_quick_phases_local.json`` is since recorded with that patch answered False (a local activity
  per phase, as before it); every run history above from before the patch reaches the call and replays without it.
- ``run_cached_phases_local.json``: a re-run of a published benchmark (a downloaded dataset, one requirement) whose
  Fetch, Analyze and Setup hit the cross-run cache and whose five quick phases all ran as local activities
  (``patched("cached-phases-local")``), and ``run_before_cached_phases_local.json``: the same re-run with the patch
  answered False in the recording worker (every phase an activity); both recorded by tests/api/test_local_phases.py.
  Every history above reaches the call only where a launch has requirements or a dataset URL, and none of them took
  the new branch.
- ``run_finished_locally.json``: a run whose end (``finish_run``) ran as a local activity in the workflow task that
  learned its last batch ended (``patched("run-finished-locally")``: a ``core_local_activity`` marker, no
  ``finish_run`` scheduled), and ``run_finished_locally_past_budget.json``: the same with the local end stalled past
  its 5 s budget after its commit, which ``finish_run`` then ran again as the ordinary activity (the log holds it
  once); ``run_before_finished_locally.json``: the same run with the patch answered False in the recording worker. All
  three recorded by tests/api/test_local_phases.py (issue 25: a hop through Temporal's queue fewer between the last
  result and the terminal event). Every run history above was recorded before the patch and replays with the
  ordinary ``finish_run``.
- Pre-patch histories recorded later with the code from before their patch (a ``git worktree`` of the patch's
  parent commit running its own test): ``run_stopped_before_halt_written_before_teardown.json`` (0487831, parent of
  24514fe: the same stop mid-Materialize, torn down without waiting), ``run_before_revoke_model_route.json``
  (f2b10b8, parent of c7ad09d: a run with a model proxy that slept the proxy linger after its terminal event, then
  stopped the proxy), ``operator_builtin_stopped_before_stop_halts_runs.json`` (908920d, parent of f7cf371: a
  stopped builtin session that answered without stopping its run).
- ``operator_llm_session_deprecated.json`` and ``operator_builtin_extended_deprecated.json``: the same sessions
  recorded after ``operator-llm`` and ``operator-extend`` were deprecated (their markers say ``deprecated``; such a
  history replays once the call is removed, test_patch_histories.py).

test_patch_histories.py checks that every patch in workflows/*.py has a history here with it on and one from
before it (or an allow-listed reason why not).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from benchwright.stack.workflow_runner import workflow_runner
from worker import PASSTHROUGH
from workflows.operator import OperatorWorkflow
from workflows.regression import RegressionWorkflow
from workflows.run import RunWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
HISTORIES = Path(__file__).with_name("histories")


def _replayer() -> Replayer:
    return Replayer(workflows=[RunWorkflow, RegressionWorkflow, OperatorWorkflow],
                    data_converter=pydantic_data_converter,
                    workflow_runner=workflow_runner(pydantic_data_converter, PASSTHROUGH))  # the worker's


@pytest.mark.parametrize("name", sorted(p.name for p in HISTORIES.glob("*.json")))
async def test_saved_history_replays_deterministically(name: str) -> None:
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{name}: {result.replay_failure}"


@pytest.mark.parametrize("name", ["run_600_tasks_before_balanced_batches.json", "regression_firing_refused.json"])
async def test_a_change_without_a_patch_would_be_caught(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The replay above is not vacuous: with the patch check forced on, the pre-change history no longer replays."""
    from temporalio import workflow

    monkeypatch.setattr(workflow, "patched", lambda _id: True)
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


async def test_the_report_is_recorded_behind_its_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report history needs its patch: with ``run-report`` reported unpatched, the recorded report_run activity
    no longer matches the commands the workflow issues."""
    from temporalio import workflow

    real = workflow.patched
    monkeypatch.setattr(workflow, "patched", lambda patch_id: False if patch_id == "run-report" else real(patch_id))
    name = "run_with_report.json"
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


@pytest.mark.parametrize(("name", "heartbeat"), [("run_with_report.json", False),
                                                  ("run_phase_heartbeat_retry.json", True)])
async def test_phase_heartbeat_branch_follows_the_history(monkeypatch: pytest.MonkeyPatch, name: str,
                                                          heartbeat: bool) -> None:
    """Histories from before ``phase-heartbeat`` replay with its branch off (phases scheduled as they were), the one
    recorded with it replays with it on."""
    from temporalio import workflow

    real = workflow.patched
    seen: set[bool] = set()

    def spy(patch_id: str) -> bool:
        answer = real(patch_id)
        if patch_id == "phase-heartbeat":
            seen.add(answer)
        return answer

    monkeypatch.setattr(workflow, "patched", spy)
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    assert seen == {heartbeat}


@pytest.mark.parametrize(("name", "patch", "on"), [
    ("operator_builtin_stopped.json", "operator-stop-halts-runs", False),
    ("operator_builtin_stopped_before_stop_halts_runs.json", "operator-stop-halts-runs", True)])
async def test_the_operator_changes_are_recorded_behind_their_patches(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                      patch: str, on: bool) -> None:
    """Without ``operator-stop-halts-runs`` a stopped session would answer without stopping its runs, and with it a
    session stopped by an older worker would stop them: each history replays only on its own side of the patch.
    (``operator-llm`` and ``operator-extend`` are deprecated: their old branch is gone.)"""
    from temporalio import workflow

    real = workflow.patched
    monkeypatch.setattr(workflow, "patched", lambda patch_id: on if patch_id == patch else real(patch_id))
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


@pytest.mark.parametrize(("name", "patch", "on"), [
    ("run_quick_phases_local.json", "quick-phases-local", False),
    ("run_quick_phase_past_local_budget.json", "quick-phases-local", False),
    ("run_before_quick_phases_local.json", "quick-phases-local", True),
    ("run_cached_phases_local.json", "cached-phases-local", False),
    ("run_before_cached_phases_local.json", "cached-phases-local", True),
])
async def test_local_phases_are_recorded_behind_their_patch(monkeypatch: pytest.MonkeyPatch, name: str, patch: str,
                                                            on: bool) -> None:
    """A history whose quick phases ran as local activities replays only with ``quick-phases-local`` on, one whose
    re-run took its cache-hit phases locally only with ``cached-phases-local`` on, and one from before either only
    with it off (its phases were scheduled activities)."""
    from temporalio import workflow

    real = workflow.patched
    monkeypatch.setattr(workflow, "patched", lambda patch_id: on if patch_id == patch else real(patch_id))
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
