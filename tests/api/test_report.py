"""The run report and narration (issue 26) through the API, on a real run of the dev model: ReportFile events after
the terminal event, the files downloadable with their digest and size, results.json's numbers equal to the run view
and the breakdown, the builtin narration recorded, shown and deterministic, visibility (cross-account 404), and the
LLM narrator against the scripted-LLM double with its spend in cost.narration and cost.billed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import SecretStr
from temporalio.client import WorkflowExecutionStatus

import api.routes.runs as runs_route
from api.main import create_app
from benchwright.report.facts import narration_facts
from benchwright.report.narration import builtin_narration
from benchwright.stack.devstack import free_port
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from benchwright.store.runs import get_run
from benchwright.testkit.scripted_llm import ScriptedLlm, parse_script, start_scripted_llm
from tests.api.helpers import launch, poll_all, wait_terminal
from tests.api.test_results import IMPL, write_dataset
from tests.conftest import SAMPLE, Stack, serve_app
from worker import build_worker

pytestmark = pytest.mark.asyncio(loop_scope="session")

OUTPUT_TYPES = ("RunNarrated", "NarrationUsage", "ReportFile")


async def run_to_the_end(stack: Stack, http: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Launch, follow the log to its terminal event, then wait for the workflow itself (the report is written after
    the terminal event, before the workflow returns)."""
    run = await launch(http, body)
    await wait_terminal(http, run["id"])
    await stack.client.get_workflow_handle(run["id"]).result()
    return run


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def reported(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dataset = tmp_path_factory.mktemp("report") / "arith_subjects.jsonl"
    rows = write_dataset(dataset)
    async with stack.http() as http:
        run = await run_to_the_end(stack, http, {
            "dataset": str(dataset), "task_impl": IMPL, "group_by": "subject",
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        view = (await http.get(f"/v1/runs/{run['id']}")).json()
        events = await poll_all(http, run["id"], page=500)
        listed = (await http.get(f"/v1/runs/{run['id']}/files")).json()
        files = {name: await http.get(f"/v1/runs/{run['id']}/files/{name}") for name in ("report.html", "results.json")}
        breakdown = (await http.get(f"/v1/runs/{run['id']}/breakdown")).json()
    return {"view": view, "events": events, "listed": listed, "files": files, "breakdown": breakdown, "rows": rows,
            "dataset": dataset}


async def test_report_files_follow_the_terminal_event_and_download_with_their_digest(reported: dict[str, Any]) -> None:
    types = [e["type"] for e in reported["events"]]
    finished = types.index("PipelineFinished")
    files = [e["data"] for e in reported["events"] if e["type"] == "ReportFile"]
    assert [f["name"] for f in files] == ["report.html", "results.json"]
    assert all(types.index(t) > finished for t in ("RunNarrated", "ReportFile"))
    assert reported["listed"]["files"] == files
    for f in files:
        resp = reported["files"][f["name"]]
        assert resp.status_code == 200, resp.text
        assert hashlib.sha256(resp.content).hexdigest() == f["digest"]
        assert len(resp.content) == f["size"]
        assert resp.headers["content-type"].startswith(f["media_type"].split(";")[0])
        assert resp.headers["content-disposition"] == f'attachment; filename="{f["name"]}"'
    html = reported["files"]["report.html"]
    assert "sandbox" in html.headers["content-security-policy"]  # opened from the API, its script has no origin
    assert b"<script src" not in html.content and b"<link rel=\"stylesheet\"" not in html.content


async def test_results_json_equals_the_run_view_and_the_breakdown(reported: dict[str, Any]) -> None:
    doc = json.loads(reported["files"]["results.json"].content)
    view, summary = reported["view"], reported["view"]["tasks"]["summary"]
    assert doc["schema"] == "benchwright.scoring.results/1"
    task = "arith_subjects"
    top = doc["results"][task]
    assert top["acc,none"] == summary["pass_rate"]
    assert top["acc_stderr,none"] == summary["pass_rate_se"]
    assert [top["acc_ci95_low,none"], top["acc_ci95_high,none"]] == summary["pass_rate_ci"]
    assert {k: top[k] for k in ("passed", "failed", "errored", "no_answer", "total")} == {
        k: summary[k] for k in ("passed", "failed", "errored", "no_answer", "total")}
    assert doc["benchwright"]["summary"] == summary
    assert doc["benchwright"]["run_id"] == view["id"] and doc["benchwright"]["fingerprint"] == view["fingerprint"]
    assert doc["benchwright"]["narration"] == view["narration"]
    assert doc["n-samples"][task] == {"original": summary["total"], "effective": summary["passed"] + summary["failed"]}
    assert doc["config"]["model_name"] == "openai/dev"
    # One subtask per group of the breakdown (the launch's group_by), with the API's numbers.
    groups = reported["breakdown"]["groups"]
    assert doc["group_subtasks"][task] == [f"{task}:subject={g['group']}" for g in groups]
    for g in groups:
        sub = doc["results"][f"{task}:subject={g['group']}"]
        assert sub["acc,none"] == g["pass_rate"]
        assert [sub["acc_ci95_low,none"], sub["acc_ci95_high,none"]] == (g["pass_rate_ci"] or [None, None])
        assert (sub["passed"], sub["failed"], sub["errored"], sub["total"]) == (
            g["passed"], g["failed"], g["errored"], g["total"])


async def test_builtin_narration_is_recorded_shown_and_deterministic(stack: Stack, reported: dict[str, Any]) -> None:
    view = reported["view"]
    narrated = [e["data"] for e in reported["events"] if e["type"] == "RunNarrated"]
    assert len(narrated) == 1 and narrated[0]["narrator"] == "builtin" and narrated[0]["fallback"] is None
    text = view["narration"]
    assert text == narrated[0]["text"]
    s = view["tasks"]["summary"]
    assert f"passed {s['passed']} of {s['passed'] + s['failed']} scored tasks" in text
    assert f"pass rate {s['pass_rate'] * 100:.1f} %" in text
    assert f"{s['errored']} tasks errored" in text and "scorer bug on purpose" in text
    assert f"{s['no_answer']} of the {s['failed']} failures found no answer" in text
    # The same facts give the same text: recomputed now from the store, byte for byte.
    engine = make_engine(stack.settings.resolved_database_url())
    run = get_run(engine, run_id=view["id"])
    assert builtin_narration(narration_facts(engine, run)) == text
    # Free: nothing on cost.narration, no narrator calls.
    assert view["cost"]["narration"] == 0 and view["cost"]["narration_usage"]["calls"] == 0
    # The narration and report never feed the fingerprint (§6).
    async with stack.http() as http:
        fp = (await http.get(f"/v1/runs/{view['id']}/fingerprint")).json()
    assert fp["recomputed"] == view["fingerprint"]
    assert not {i["type"] for i in fp["inputs"]} & set(OUTPUT_TYPES)


async def test_report_records_each_tasks_latency(reported: dict[str, Any]) -> None:
    results = [e["data"] for e in reported["events"] if e["type"] == "MaterializeTaskResult"]
    assert results and all(isinstance(r["duration_ms"], int) and r["duration_ms"] >= 0 for r in results)
    html = reported["files"]["report.html"].content.decode()
    assert f'id="latency" width="600" height="136" role="img" data-n="{len(results)}"' in html


async def test_a_rerun_of_the_same_shape_is_compared_with_the_previous(stack: Stack, reported: dict[str, Any]) -> None:
    async with stack.http() as http:
        again = await run_to_the_end(stack, http, {
            "dataset": str(reported["dataset"]), "task_impl": IMPL, "group_by": "subject",
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        view = (await http.get(f"/v1/runs/{again['id']}")).json()
        events = await poll_all(http, again["id"], page=1000)
    narrated = next(e["data"] for e in events if e["type"] == "RunNarrated")
    assert narrated["compared_with"] == reported["view"]["id"]
    assert f"the previous run of the same benchmark, subset and impl {reported['view']['id']}" in view["narration"]
    assert "moved +0.0 points" in view["narration"]
    # The run compared with is read by its counts alone: the same numbers as its own view's summary.
    engine = make_engine(stack.settings.resolved_database_url())
    comparison = narration_facts(engine, get_run(engine, run_id=again["id"])).comparison
    first = reported["view"]["tasks"]["summary"]
    assert comparison is not None and comparison.run_id == reported["view"]["id"]
    assert (comparison.passed, comparison.failed, comparison.pass_rate) == (
        first["passed"], first["failed"], first["pass_rate"])
    assert list(comparison.pass_rate_ci or []) == list(first["pass_rate_ci"] or [])


async def test_a_fork_is_compared_with_its_parent(stack: Stack, reported: dict[str, Any]) -> None:
    parent = reported["view"]
    async with stack.http() as http:
        resp = await http.post(f"/v1/runs/{parent['id']}/fork", json={"rewind_to": "materialize"})
        assert resp.status_code == 201, resp.text
        fork = resp.json()
        await wait_terminal(http, fork["id"])
        await stack.client.get_workflow_handle(fork["id"]).result()
        view = (await http.get(f"/v1/runs/{fork['id']}")).json()
        events = await poll_all(http, fork["id"], page=1000)
    narrated = next(e["data"] for e in events if e["type"] == "RunNarrated")
    assert narrated["compared_with"] == parent["id"]
    rate = parent["tasks"]["summary"]["pass_rate"] * 100
    assert f"Against its parent run {parent['id']} (openai/dev, {rate:.1f} %)" in view["narration"]
    assert [e["data"]["name"] for e in events if e["type"] == "ReportFile"] == ["report.html", "results.json"]


async def test_report_files_follow_the_runs_visibility(stack: Stack, reported: dict[str, Any]) -> None:
    run_id = reported["view"]["id"]
    async with stack.http(stack.other_key) as other:
        for path in ("files", "files/report.html", "files/results.json"):
            resp = await other.get(f"/v1/runs/{run_id}/{path}")
            assert resp.status_code == 404, (path, resp.text)
            assert "narration" not in resp.text and "arith" not in resp.text
    async with stack.http() as http:
        missing = await http.get(f"/v1/runs/{run_id}/files/other.html")
        traversal = await http.get(f"/v1/runs/{run_id}/files/..%2F..%2Fetc%2Fpasswd")
        assert (await http.patch(f"/v1/runs/{run_id}", json={"visibility": "unlisted"})).status_code == 200
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert traversal.status_code in (404, 422)
    try:
        async with stack.http(stack.other_key) as other:
            resp = await other.get(f"/v1/runs/{run_id}/files/results.json")
        assert resp.status_code == 200  # unlisted: anyone with the id reads it, as the run itself
        assert resp.content == reported["files"]["results.json"].content
    finally:
        async with stack.http() as http:
            await http.patch(f"/v1/runs/{run_id}", json={"visibility": "private"})


async def test_a_run_that_failed_still_gets_its_narration_and_report(stack: Stack, tmp_path: Any) -> None:
    async with stack.http() as http:
        run = await run_to_the_end(stack, http, {"dataset": str(tmp_path / "missing.jsonl"),
                                                 "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        view = (await http.get(f"/v1/runs/{run['id']}")).json()
        listed = (await http.get(f"/v1/runs/{run['id']}/files")).json()["files"]
        doc = (await http.get(f"/v1/runs/{run['id']}/files/results.json")).json()
    assert view["status"] == "error"
    assert "has no scored task" in view["narration"] and "The run failed in fetch" in view["narration"]
    assert [f["name"] for f in listed] == ["report.html", "results.json"]
    assert doc["benchwright"]["status"] == "error" and doc["benchwright"]["breakdown"] is None
    assert doc["results"]["missing"]["acc,none"] is None


# -- the LLM narrator ---------------------------------------------------------------------------------------------

NARRATOR_KEY = "sk-narrator-" + uuid.uuid4().hex
INPUT_PRICE, OUTPUT_PRICE, MARKUP = 2e-6, 8e-6, 1.5
NARRATED = "The dev model answered every arithmetic question it was asked; nothing went wrong."
HELD = "Written while the caller already had the score."


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def narrator_stack(stack: Stack) -> AsyncIterator[dict[str, Any]]:
    """A deployment whose narrator is an LLM (the scripted double), with a billing markup: its own worker and API
    on the session's Temporal and store."""
    llm = ScriptedLlm()
    model = f"narrator-{uuid.uuid4().hex[:6]}"
    llm.add(model, parse_script({model: [
        [{"content": NARRATED, "usage": {"prompt_tokens": 1200, "completion_tokens": 150}}],
        [{"content": "   ", "usage": {"prompt_tokens": 900, "completion_tokens": 3}}],  # an empty reply: falls back
        [{"content": HELD}],  # the long poll's test, held by the test's gate
        [{"content": HELD}],  # `benchwright report` waiting for it, held the same way
    ]})[model])
    server = await start_scripted_llm(llm, port=free_port())
    settings = stack.settings.model_copy(update={
        "task_queue": f"bw-narrator-{uuid.uuid4()}", "narrator": f"openai/{model}", "narrator_api_base": server.url,
        "narrator_api_key": SecretStr(NARRATOR_KEY), "narrator_input_cost_per_token": INPUT_PRICE,
        "narrator_output_cost_per_token": OUTPUT_PRICE, "billing_markup": MARKUP})
    engine = make_engine(settings.resolved_database_url())
    _, key = create_account(engine, name=f"narrated-{uuid.uuid4().hex[:6]}", balance_usd=100.0, local_paths=True)
    port = free_port()
    async with build_worker(stack.client, settings=settings, engine=engine):
        api, task = await serve_app(create_app(settings), port)
        try:
            yield {"url": f"http://127.0.0.1:{port}", "key": key, "llm": llm, "model": model}
        finally:
            api.should_exit = True
            await task
            await server.close()


async def test_llm_narrator_writes_the_narration_and_its_spend_is_billed(stack: Stack,
                                                                         narrator_stack: dict[str, Any]) -> None:
    body = {"dataset": str(SAMPLE / "arithmetic.jsonl"), "constraints": {"max_tasks": 5},
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}
    async with stack.http(narrator_stack["key"]) as http:
        http.base_url = narrator_stack["url"]
        first = await run_to_the_end(stack, http, body)
        view = (await http.get(f"/v1/runs/{first['id']}")).json()
        events = await poll_all(http, first["id"], page=1000)
        second = await run_to_the_end(stack, http, body)
        view2 = (await http.get(f"/v1/runs/{second['id']}")).json()
        events2 = await poll_all(http, second["id"], page=1000)
        report = (await http.get(f"/v1/runs/{first['id']}/files/results.json")).json()

    cost = INPUT_PRICE * 1200 + OUTPUT_PRICE * 150
    narrated = next(e["data"] for e in events if e["type"] == "RunNarrated")
    usage = [e["data"] for e in events if e["type"] == "NarrationUsage"]
    assert narrated == {"text": NARRATED, "narrator": f"openai/{narrator_stack['model']}", "fallback": None,
                        "compared_with": None}
    assert usage == [{"model": f"openai/{narrator_stack['model']}", "calls": 1, "prompt_tokens": 1200,
                      "completion_tokens": 150, "cost_usd": pytest.approx(cost)}]
    assert view["narration"] == NARRATED and report["benchwright"]["narration"] == NARRATED
    # The cost trigger moved cost.narration by the recorded spend, and cost.billed by it with the markup (the
    # builtin driver and the local sandboxes cost nothing here, so the narration is all of the platform share).
    assert view["cost"]["narration"] == pytest.approx(cost)
    assert view["cost"]["billed"] == pytest.approx(cost * MARKUP)
    assert view["cost"]["incurred"] == pytest.approx(view["cost"]["model"] + cost)
    assert view["cost"]["narration_usage"] == {"calls": 1, "prompt_tokens": 1200, "completion_tokens": 150}
    assert report["benchwright"]["cost"]["narration"] == pytest.approx(cost)

    # What the narrator was sent: the run's facts and the builtin draft, and its key only as the credential.
    sent = narrator_stack["llm"].requests_for(narrator_stack["model"])
    assert len(sent) == 2
    messages = json.dumps(sent[0].messages)
    assert first["id"] in messages and NARRATOR_KEY not in messages
    assert sent[0].headers.get("authorization") == f"Bearer {NARRATOR_KEY}"

    # An empty reply: the builtin text stands in, the fallback says why, and the tokens it spent are still billed.
    narrated2 = next(e["data"] for e in events2 if e["type"] == "RunNarrated")
    assert narrated2["narrator"] == "builtin" and "no text" in narrated2["fallback"]
    assert NARRATOR_KEY not in narrated2["fallback"]
    assert view2["narration"] == narrated2["text"] and narrated2["text"].startswith("openai/dev passed 5 of 5")
    assert "the previous run" in narrated2["text"] and narrated2["compared_with"] == first["id"]
    cost2 = INPUT_PRICE * 900 + OUTPUT_PRICE * 3
    assert view2["cost"]["narration"] == pytest.approx(cost2)
    assert view2["cost"]["billed"] == pytest.approx(cost2 * MARKUP)
    assert [e["type"] for e in events2].count("ReportFile") == 2


async def test_the_long_poll_answers_when_the_run_ends_not_when_its_report_is_written(
        stack: Stack, narrator_stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``GET /v1/runs/{id}?wait_s=`` answers once the row is terminal (finish_run's end in the workflow's history, a
    local activity's marker, wakes it), while the report is still being written: here the LLM narrator is held by the
    test until the answer is in. The long poll's periodic re-read of the row is put out of reach, so only the history
    wakes it."""
    monkeypatch.setattr(runs_route, "WAIT_HALT_CHECK_S", 3600.0)
    body = {"dataset": str(SAMPLE / "arithmetic.jsonl"), "constraints": {"max_tasks": 3},
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}
    gate, wait_s = asyncio.Event(), 30.0
    narrator_stack["llm"].gate = gate
    loop = asyncio.get_running_loop()
    try:
        async with stack.http(narrator_stack["key"]) as http:
            http.base_url = narrator_stack["url"]
            run = await launch(http, body)
            t0 = loop.time()
            done = (await http.get(f"/v1/runs/{run['id']}", params={"wait_s": wait_s}, timeout=wait_s + 30)).json()
            waited = loop.time() - t0
            handle = stack.client.get_workflow_handle(run["id"])
            open_then = (await handle.describe()).status
            files_then = (await http.get(f"/v1/runs/{run['id']}/files")).json()["files"]
            gate.set()
            await handle.result()
            files_after = (await http.get(f"/v1/runs/{run['id']}/files")).json()["files"]
            view_after = (await http.get(f"/v1/runs/{run['id']}")).json()
    finally:
        gate.set()
        narrator_stack["llm"].gate = None
    assert done["status"] == "ok" and done["terminal"] and done["tasks"]["summary"]["total"] == 3
    assert waited < wait_s, "answered at its deadline, not when the run ended"
    assert open_then == WorkflowExecutionStatus.RUNNING and files_then == []  # the report was still being written
    # Meanwhile the view showed the builtin narration; the narrator's own is recorded once released.
    assert done["narration"].startswith("openai/dev passed 3 of 3")
    assert view_after["narration"] == HELD
    assert [f["name"] for f in files_after] == ["report.html", "results.json"]


async def test_benchwright_report_waits_for_the_report_of_a_run_that_has_just_ended(
        stack: Stack, narrator_stack: dict[str, Any], tmp_path: Path) -> None:
    """``benchwright run --wait`` returns with the score, before the report: ``benchwright report`` run then waits for
    it instead of failing. The narrator is held until the command says it is waiting, then released."""
    body = {"dataset": str(SAMPLE / "arithmetic.jsonl"), "constraints": {"max_tasks": 2},
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}
    gate = asyncio.Event()
    narrator_stack["llm"].gate = gate
    target = tmp_path / "out.html"
    proc: asyncio.subprocess.Process | None = None
    try:
        async with stack.http(narrator_stack["key"]) as http:
            http.base_url = narrator_stack["url"]
            run = await launch(http, body)
            done = (await http.get(f"/v1/runs/{run['id']}", params={"wait_s": 60}, timeout=90)).json()
            assert done["terminal"] and (await http.get(f"/v1/runs/{run['id']}/files")).json()["files"] == []
            env = {**os.environ, "COLUMNS": "200", "BENCHWRIGHT_API_URL": narrator_stack["url"],
                   "BENCHWRIGHT_API_KEY": narrator_stack["key"]}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchwright.cli", "report", run["id"], "-o", str(target), env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            assert proc.stderr is not None
            said: list[str] = []
            while not any("waiting for its report" in line for line in said):
                line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
                assert line, f"the command ended without waiting: {''.join(said)}"
                said.append(line)
            gate.set()  # the report is written now, while the command waits for it
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            said.append(err.decode())
            listed = (await http.get(f"/v1/runs/{run['id']}/files")).json()["files"]
    finally:
        gate.set()
        narrator_stack["llm"].gate = None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, "".join(said)
    meta = next(f for f in listed if f["name"] == "report.html")
    data = target.read_bytes()
    assert hashlib.sha256(data).hexdigest() == meta["digest"] and len(data) == meta["size"]
    assert f"wrote {target}" in "".join(said)
