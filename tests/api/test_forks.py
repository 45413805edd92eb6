"""Forks, replays, sweeps and re-sweeps (issue 10, §10) end to end through the real stack: real Temporal, real
sandboxes, the dev model, and a loopback dataset server that counts its downloads (so "nothing upstream is
recomputed" is measured, not assumed)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from benchwright.runs.forks import LoggedEvent, run_shape
from benchwright.runs.workdirs import sweep_ended_workdirs
from benchwright.stack.devstack import free_port
from benchwright.stack.teardown import runs_ended_at
from benchwright.store.db import make_engine
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "histories"

ZERO_IF_WRONG_FILE_IMPL = '''
import os

class Scorer:
    """A replacement scorer: inverts the exact match (so its scores are visibly not the template's) and reports
    the files it sees (the post-Setup filesystem: the fetched dataset among them)."""

    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut(self.extract(row))

    def score(self, row, response):
        files = sorted(os.listdir("."))
        right = response.strip() == str(row["answer"]).strip()
        return {"score": 0.0 if right else 1.0, "files": files}
'''

BROKEN_IMPL = "class Scorer:\n    def extract(self, row)\n"  # a syntax error: Atomize fails, the run ends error


@dataclass
class Origin:
    """A loopback dataset server the operator listed in ``egress_internal_allowed``; counts downloads."""

    url: str
    hits: list[str]
    server: Any
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def _origin(stack: Stack) -> Origin:
    hits: list[str] = []

    async def serve(request: Request) -> Response:
        hits.append(request.url.path)
        return FileResponse(SAMPLE / "arithmetic.jsonl")

    port = free_port()
    server, task = await serve_app(Starlette(routes=[Route("/{name}", serve)]), port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    return Origin(url=f"http://127.0.0.1:{port}/arithmetic.jsonl", hits=hits, server=server, task=task)


@pytest_asyncio.fixture(loop_scope="session")
async def origin(stack: Stack) -> AsyncIterator[Origin]:
    server = await _origin(stack)
    yield server
    await server.stop()


def _model(url: str, name: str = "openai/dev") -> dict[str, str]:
    return {"identifier": name, "api_base": url}


def _own(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The run's own events of a type (not copies inherited from its parent)."""
    return [e for e in events if e["type"] == kind and "inherited_from" not in e["data"]]


def _own_phases(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["phase"] for e in _own(events, "PhaseStarted")]


async def _finish(http: httpx.AsyncClient, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events = await wait_terminal(http, run_id)
    return (await http.get(f"/v1/runs/{run_id}")).json(), events


async def _scores(http: httpx.AsyncClient, run_id: str, invocation: int | None = None) -> dict[int, float | None]:
    params: dict[str, Any] = {"limit": 5000}
    if invocation is not None:
        params["invocation"] = invocation
    resp = await http.get(f"/v1/runs/{run_id}/tasks", params=params)
    assert resp.status_code == 200, resp.text
    return {t["index"]: t["score"] for t in resp.json()["tasks"]}


def _assert_seeded(events: list[dict[str, Any]], parent: list[dict[str, Any]], parent_id: str, rewind: str) -> None:
    """The fork's log: RunLaunched naming parent and rewind point, then the parent's events before its first
    PhaseStarted(rewind) copied in order with inherited_from, then its own; seq gapless from 0."""
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "RunLaunched"
    assert events[0]["data"]["fork"]["parent_run_id"] == parent_id
    cut = next(e["seq"] for e in parent if e["type"] == "PhaseStarted" and e["data"]["phase"] == rewind)
    copied = [e for e in events if "inherited_from" in e["data"]]
    assert [c["data"]["inherited_from"]["seq"] for c in copied] == list(range(1, cut))
    assert all(c["data"]["inherited_from"]["run_id"] == parent_id for c in copied)
    assert [c["seq"] for c in copied] == list(range(1, cut)), "the copies follow RunLaunched"
    assert [c["type"] for c in copied] == [p["type"] for p in parent[1:cut]]
    decided = _own(events, "ForkDecided")
    assert len(decided) == 1 and decided[0]["data"]["rewind_to"] == rewind


async def test_fork_at_atomize_with_a_replacement_scorer(stack: Stack, origin: Origin) -> None:
    async with stack.http() as http:
        parent = await launch(http, {"dataset": origin.url, "model": _model(stack.dev_url)})
        parent_final, parent_events = await _finish(http, parent["id"])
        assert parent_final["tasks"]["summary"]["pass_rate"] == 1.0 and len(origin.hits) == 1
        resp = await http.post(f"/v1/runs/{parent['id']}/fork",
                               # a scorer no earlier test loaded: Atomize checks it in a sandbox of its own
                               # (benchwright.scoring.load_checks remembers a passed check, whatever the test order)
                               json={"rewind_to": "atomize", "overrides": {
                                   "task_impl": f"{ZERO_IF_WRONG_FILE_IMPL}\n# {parent['id']}\n"}})
        assert resp.status_code == 201, resp.text
        fork = resp.json()
        final, events = await _finish(http, fork["id"])
        tasks = (await http.get(f"/v1/runs/{fork['id']}/tasks", params={"limit": 100})).json()["tasks"]
    assert final["status"] == "ok", final
    _assert_seeded(events, parent_events, parent["id"], "atomize")
    assert _own_phases(events) == ["fork", "atomize", "materialize"], "no Fetch/Analyze/Setup/Attach work"
    assert len(origin.hits) == 1, "the fork downloaded nothing"
    assert {e["data"]["role"] for e in _own(events, "SandboxCreated")} == {"work"}
    created = [e["data"] for e in _own(events, "SandboxCreated")]
    assert not any(e["data"]["phase"] in ("fetch", "setup") for e in _own(events, "SnapshotCreated"))
    assert len(created) == 2, "one work sandbox for Atomize, one for Materialize; none for Setup"
    skipped = {e["data"]["phase"]: e["data"]["reason"] for e in _own(events, "PhaseSkipped")}
    assert skipped["setup"] == f"inherited from {parent['id']} (fork at atomize)"
    # The scorer ran on the parent's post-Setup filesystem (the dataset file is there) and its scores are its own:
    # the dev model answers every question right, which this scorer counts as 0.
    assert len(tasks) == 60 and all(t["score"] == 0.0 for t in tasks)
    assert final["tasks"]["summary"]["pass_rate"] == 0.0
    results = _own(events, "MaterializeTaskResult")
    fetched = _own(parent_events, "FetchArtifact")[0]["data"]["file"]  # Fetch names its file in the log, ...
    assert not (stack.settings.runs_dir() / parent["id"] / "work" / "fetch.json").exists()  # ... nowhere else
    assert results and all(fetched in r["data"]["meta"]["files"] for r in results), results[0]["data"]["meta"]
    # The Temporal UI shows the parent.
    desc = await stack.client.get_workflow_handle(fork["id"]).describe()
    from benchwright.stack.temporal_ui import RUN_PARENT

    assert desc.typed_search_attributes.get(RUN_PARENT) == parent["id"]
    assert (await desc.memo_value("BenchwrightParentRun")) == parent["id"]
    await _record_history_once(stack, fork["id"], "fork_at_atomize.json")


async def test_fork_at_fetch_reads_a_mirror_named_in_prose_after_the_original_stopped(stack: Stack) -> None:
    first, mirror = await _origin(stack), await _origin(stack)
    try:
        async with stack.http() as http:
            parent = await launch(http, {"dataset": first.url, "model": _model(stack.dev_url)})
            _, parent_events = await _finish(http, parent["id"])
            await first.stop()
            resp = await http.post(f"/v1/runs/{parent['id']}/fork",
                                   json={"instructions": f"Use the mirror at {mirror.url}."})
            assert resp.status_code == 201, resp.text
            final, events = await _finish(http, resp.json()["id"])
    finally:
        await mirror.stop()
    assert final["status"] == "ok" and final["tasks"]["summary"]["pass_rate"] == 1.0, final
    assert len(first.hits) == 1 and len(mirror.hits) == 1
    _assert_seeded(events, parent_events, parent["id"], "fetch")
    decided = _own(events, "ForkDecided")[0]["data"]
    assert decided["overrides"] == {"dataset": mirror.url} and decided["inherited"] == ["find"]
    assert "fetch the dataset from" in decided["interpreted"][0]
    assert [e["data"]["source"] for e in _own(events, "FetchArtifact")] == [mirror.url]


async def test_fork_at_analyze_reanalyzes_the_inherited_dataset_named_by_the_log(stack: Stack, origin: Origin) -> None:
    """Analyze finds the dataset from the FetchArtifact the fork inherited (no file on disk says which it is)."""
    async with stack.http() as http:
        parent = await launch(http, {"dataset": origin.url, "model": _model(stack.dev_url)})
        _, parent_events = await _finish(http, parent["id"])
        hits = len(origin.hits)
        resp = await http.post(f"/v1/runs/{parent['id']}/fork", json={"rewind_to": "analyze"})
        assert resp.status_code == 201, resp.text
        fork = resp.json()
        final, events = await _finish(http, fork["id"])
    assert final["status"] == "ok" and final["tasks"]["summary"]["total"] == 60, final
    _assert_seeded(events, parent_events, parent["id"], "analyze")
    assert _own_phases(events)[:2] == ["fork", "analyze"] and len(origin.hits) == hits, "Analyze ran, Fetch did not"
    # (Setup may cache-hit: another test of the session may have published these sample bytes)
    assert not [e for e in _own(events, "PhaseCacheHit") if e["data"]["phase"] == "analyze"], \
        "the fork's Analyze did the work"
    inherited = [e["data"] for e in events if e["type"] == "FetchArtifact"]
    assert len(inherited) == 1 and inherited[0]["inherited_from"]["run_id"] == parent["id"]
    assert inherited[0]["file"] == "dataset.jsonl"
    own, theirs = _own(events, "AnalyzeArtifact"), _own(parent_events, "AnalyzeArtifact")
    assert [a["data"] for a in own] == [a["data"] for a in theirs]
    for run_id in (parent["id"], fork["id"]):
        assert not (stack.settings.runs_dir() / run_id / "work" / "fetch.json").exists()


async def test_prose_the_builtin_driver_cannot_read_fails_the_fork_phase(stack: Stack) -> None:
    async with stack.http() as http:
        parent = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": _model(stack.dev_url)})
        await _finish(http, parent["id"])
        resp = await http.post(f"/v1/runs/{parent['id']}/fork", json={"instructions": "make the scorer smarter"})
        assert resp.status_code == 201, resp.text
        final, events = await _finish(http, resp.json()["id"])
    assert final["status"] == "error"
    failed = _own(events, "PhaseFailed")[0]["data"]
    assert failed["phase"] == "fork" and "cannot interpret the fork instruction 'make the scorer smarter'" in \
        failed["detail"]


async def test_fork_of_an_error_run_completes(stack: Stack) -> None:
    dataset = str(SAMPLE / "arithmetic.jsonl")
    async with stack.http() as http:
        parent = await launch(http, {"dataset": dataset, "model": _model(stack.dev_url), "task_impl": BROKEN_IMPL})
        parent_final, parent_events = await _finish(http, parent["id"])
        assert parent_final["status"] == "error" and "atomize" in parent_final["error"]
        fork = (await http.post(f"/v1/runs/{parent['id']}/fork", json={
            "rewind_to": "atomize", "overrides": {"task_impl": ZERO_IF_WRONG_FILE_IMPL}})).json()
        final, events = await _finish(http, fork["id"])
        # A rewind past the phase that failed has nothing to inherit: refused before anything is written.
        refused = await http.post(f"/v1/runs/{parent['id']}/replay", json={"model": _model(stack.dev_url)})
    assert final["status"] == "ok" and final["tasks"]["summary"]["total"] == 60, final
    _assert_seeded(events, parent_events, parent["id"], "atomize")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "rewind_unavailable"
    assert "did not complete atomize" in refused.json()["error"]["message"]


async def test_bad_forks_are_refused_naming_the_problem(stack: Stack) -> None:
    async with stack.http() as http:
        parent = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": _model(stack.dev_url)})
        await _finish(http, parent["id"])
        late = await http.post(f"/v1/runs/{parent['id']}/fork",
                               json={"rewind_to": "atomize", "overrides": {"dataset": "http://x.example/a.jsonl"}})
        model_late = await http.post(f"/v1/runs/{parent['id']}/fork", json={
            "rewind_to": "materialize", "overrides": {"model": "openai/other"}})
        empty = await http.post(f"/v1/runs/{parent['id']}/fork", json={})
        replay_extra = await http.post("/v1/runs", json={"replay_of": parent["id"], "model": "openai/dev",
                                                         "task_impl": "x"})
        async with stack.http(stack.other_key) as other:
            foreign = await other.post(f"/v1/runs/{parent['id']}/fork", json={"rewind_to": "materialize"})
            foreign_lineage = await other.get(f"/v1/runs/{parent['id']}/lineage")
    assert late.status_code == 400 and late.json()["error"]["code"] == "override_needs_rewind"
    assert "override 'dataset' needs rewind_to 'fetch'" in late.json()["error"]["message"]
    assert model_late.status_code == 400 and "'model' needs rewind_to 'attach'" in model_late.json()["error"]["message"]
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_fork"
    assert replay_extra.status_code == 400 and "task_impl" in replay_extra.json()["error"]["message"]
    assert foreign.status_code == 404 and foreign_lineage.status_code == 404


async def test_replays_reproduce_the_reference_and_another_model_changes_only_the_fingerprint(
        stack: Stack, dev_models: DevModels) -> None:
    answers = load_answers(SAMPLE / "arithmetic.jsonl")
    half = await dev_models.start(DevModelConfig(answers=answers, accuracy=0.5, seed="half"))
    other = await dev_models.start(DevModelConfig(answers=answers, accuracy=0.5, seed="other"))
    async with stack.http() as http:
        ref = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": _model(half)})
        ref_final, ref_events = await _finish(http, ref["id"])
        ref_scores = await _scores(http, ref["id"])
        assert 0 < ref_final["tasks"]["summary"]["pass_rate"] < 1, "a model that is wrong on some tasks"
        # Ten noise-check replays at once (a sweep of the same model), plus the launch form of a replay.
        sweep = await http.post(f"/v1/runs/{ref['id']}/sweep", json={"models": [_model(half)] * 9})
        assert sweep.status_code == 201, sweep.text
        form = await http.post("/v1/runs", json={"replay_of": ref["id"], "model": _model(half)})
        assert form.status_code == 201, form.text
        ids = [r["id"] for r in sweep.json()["runs"]] + [form.json()["id"]]
        finals = await asyncio.gather(*(_finish(http, i) for i in ids))
        scores = [await _scores(http, i) for i in ids]
        diff = (await http.post(f"/v1/runs/{ref['id']}/replay", json={"model": _model(other, "openai/other")})).json()
        diff_final, diff_events = await _finish(http, diff["id"])
    assert len(ids) == 10
    for (final, events), got in zip(finals, scores, strict=True):
        assert final["status"] == "ok" and got == ref_scores
        assert final["fingerprint"] == ref_final["fingerprint"] is not None
        assert _own_phases(events) == ["fork", "materialize"]
        assert final["trials_config"] == ref_final["trials_config"]
    assert diff_final["status"] == "ok" and diff_final["fingerprint"] != ref_final["fingerprint"]
    assert await_shape(diff_final, diff_events) == await_shape(ref_final, ref_events)
    rebound = [e for e in diff_events if e["type"] == "ModelProxyArtifact"]
    assert rebound[0]["data"]["model_id"] == "openai/other"
    assert rebound[0]["data"]["inherited_from"]["overridden"] == ["litellm_config_yaml", "model_id"]


async def test_a_replay_of_a_run_whose_work_directory_was_swept_restores_it_and_scores_the_same(stack: Stack) -> None:
    """A worker removes ended runs' work directories (``benchwright.runs.workdirs``); a fork reads its parent's
    files from the blob store then."""
    engine = make_engine(stack.settings.resolved_database_url())
    async with stack.http() as http:
        ref = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": _model(stack.dev_url)})
        ref_final, _ = await _finish(http, ref["id"])
        ref_scores = await _scores(http, ref["id"])
        work = stack.settings.runs_dir() / ref["id"] / "work"
        assert (work / "tasks.jsonl").is_file() and (work / "task_impl.py").is_file()

        def ref_only(run_ids: Sequence[str]) -> dict[str, float]:  # the store's word, for this test's run alone
            return {r: at for r, at in runs_ended_at(engine, run_ids).items() if r == ref["id"]}

        removed = await asyncio.to_thread(sweep_ended_workdirs, runs_dir=stack.settings.runs_dir(),
                                          ended_at=ref_only, linger_s=0)
        assert removed == 1 and not work.exists()
        replay = await http.post(f"/v1/runs/{ref['id']}/replay", json={"model": _model(stack.dev_url)})
        assert replay.status_code == 201, replay.text
        final, events = await _finish(http, replay.json()["id"])
        scores = await _scores(http, replay.json()["id"])
    engine.dispose()
    assert final["status"] == "ok" and scores == ref_scores and len(scores) == 60
    assert final["fingerprint"] == ref_final["fingerprint"] is not None
    assert _own_phases(events) == ["fork", "materialize"]


def await_shape(final: dict[str, Any], events: list[dict[str, Any]]) -> tuple[str | None, ...]:
    return run_shape(run_ids=final, events=[LoggedEvent(e["seq"], e["type"], e["data"]) for e in events])


async def test_a_sweep_of_three_models_fetches_sets_up_and_atomizes_once(stack: Stack, origin: Origin,
                                                                          dev_models: DevModels) -> None:
    answers = load_answers(SAMPLE / "arithmetic.jsonl")
    urls = [await dev_models.start(DevModelConfig(answers=answers, accuracy=acc, seed=str(acc)))
            for acc in (0.2, 0.5, 0.8)]
    async with stack.http() as http:
        ref = await launch(http, {"dataset": origin.url, "model": _model(stack.dev_url)})
        await _finish(http, ref["id"])
        resp = await http.post(f"/v1/runs/{ref['id']}/sweep",
                               json={"models": [_model(u, f"openai/m{i}") for i, u in enumerate(urls)]})
        assert resp.status_code == 201, resp.text
        replays = resp.json()["runs"]
        done = await asyncio.gather(*(_finish(http, r["id"]) for r in replays))
        lineage = (await http.get(f"/v1/runs/{replays[0]['id']}/lineage")).json()
    all_events = [events for _, events in done]
    assert len(origin.hits) == 1, "one download for the reference and its three replays"
    for events in all_events:
        assert not {"fetch", "analyze", "setup", "atomize"} & set(_own_phases(events))
    rates = [final["tasks"]["summary"]["pass_rate"] for final, _ in done]
    assert rates == sorted(rates) and rates[0] < rates[-1], rates
    assert lineage["root"] == ref["id"] and lineage["runs"][0]["id"] == ref["id"], lineage
    nodes = {n["id"]: n for n in lineage["runs"][1:]}
    assert set(nodes) == {r["id"] for r in replays}, lineage
    assert [nodes[r["id"]]["model"] for r in replays] == ["openai/m0", "openai/m1", "openai/m2"]
    assert all(n["kind"] == "replay" and n["rewind_to"] == "materialize" and n["parent_run_id"] == ref["id"]
               for n in nodes.values())
    assert [nodes[r["id"]]["pass_rate"] for r in replays] == rates


async def test_atomize_restart_after_materialize_makes_two_sweeps_selectable_by_invocation(stack: Stack) -> None:
    hooks = {"resweep": {"times": 1, "reason": "the scorer misreads negative answers"}}
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": _model(stack.dev_url),
                                  "metadata": {"test_hooks": hooks}})
        final, events = await _finish(http, run["id"])
        first, second = await _scores(http, run["id"], 1), await _scores(http, run["id"], 2)
        latest = await _scores(http, run["id"])
        state = await stack.client.get_workflow_handle(run["id"]).query("state")
    assert final["status"] == "ok", final
    assert [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"][-4:] == \
        ["atomize", "materialize", "atomize", "materialize"]
    assert [e["data"]["phase"] for e in events if e["type"] == "PhaseRestartRequested"] == ["atomize"]
    assert [e["data"]["invocation"] for e in events if e["type"] == "AtomizeArtifact"] == [1, 2]
    results = {e["data"]["invocation"] for e in events if e["type"] == "MaterializeTaskAggregated"}
    assert results == {1, 2} and len(first) == len(second) == 60 and latest == second
    assert final["tasks"]["summary"]["passed"] == 60, "the summary reports the latest sweep"
    assert state["invocations"]["materialize"] == 2 and state["restarts"] == 1
    await _record_history_once(stack, run["id"], "run_resweep_materialize_v2.json")


async def _record_history_once(stack: Stack, run_id: str, name: str) -> None:
    """``BW_RECORD_HISTORIES=1`` saves this run's workflow history for tests/replay (recorded once, committed)."""
    if os.environ.get("BW_RECORD_HISTORIES") != "1":
        return
    handle = stack.client.get_workflow_handle(run_id)
    await handle.result()
    (HISTORIES / name).write_text((await handle.fetch_history()).to_json())


async def test_sdk_fork_and_the_lineage_tree_the_cli_prints(stack: Stack) -> None:
    from benchwright.cli.forks import lineage_lines
    from benchwright.client import Client

    async with stack.http() as http:
        root = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": _model(stack.dev_url)})
        await _finish(http, root["id"])

        sdk = Client(stack.api_url, stack.api_key)
        try:
            child = await asyncio.to_thread(lambda: sdk.fork(root["id"], rewind_to="atomize",
                                                             task_impl=ZERO_IF_WRONG_FILE_IMPL))
            await _finish(http, child["id"])
            grandchild = await asyncio.to_thread(lambda: sdk.replay(child["id"], model=_model(stack.dev_url)))
        finally:
            sdk.close()
        final, _ = await _finish(http, grandchild["id"])
        tree = (await http.get(f"/v1/runs/{grandchild['id']}/lineage")).json()
    assert final["status"] == "ok" and final["tasks"]["summary"]["pass_rate"] == 0.0, "the child's scorer, pinned"
    lines = lineage_lines(tree)
    assert len(lines) == 3 and lines[0].startswith(root["id"][:8])
    assert lines[1].startswith(f"└─ {child['id'][:8]}  fork at atomize")
    assert lines[2].startswith(f"   └─ {grandchild['id'][:8]}  replay at materialize") and lines[2].endswith(" *")
