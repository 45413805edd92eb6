"""``benchwright report RUN -o FILE`` and ``show``'s narration (issue 26): the real command in a subprocess against
the session stack's API, on a run of the dev model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.api.helpers import launch, poll_all, wait_terminal
from tests.api.test_results import IMPL, write_dataset
from tests.cli.test_cli_launch import api_env, bw
from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def finished(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dataset = tmp_path_factory.mktemp("cli-report") / "arith_subjects.jsonl"
    write_dataset(dataset)
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(dataset), "task_impl": IMPL, "group_by": "subject",
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        await stack.client.get_workflow_handle(run["id"]).result()
        view = (await http.get(f"/v1/runs/{run['id']}")).json()
        files = {e["data"]["name"]: e["data"] for e in await poll_all(http, run["id"], page=1000)
                 if e["type"] == "ReportFile"}
    return {"view": view, "files": files}


async def test_report_downloads_the_html_and_results_json(stack: Stack, finished: dict[str, Any],
                                                         tmp_path: Path) -> None:
    run_id = finished["view"]["id"]
    html, results = tmp_path / "out" / "report.html", tmp_path / "results.json"
    done = await bw("report", run_id, "-o", str(html), env=api_env(stack))
    assert done.rc == 0, done.err
    assert f"wrote {html}" in done.err
    data = html.read_bytes()
    meta = finished["files"]["report.html"]
    assert hashlib.sha256(data).hexdigest() == meta["digest"] and len(data) == meta["size"]
    assert data.startswith(b"<!doctype html>")

    done = await bw("report", run_id, "-o", str(results), env=api_env(stack))  # .json: results.json by default
    assert done.rc == 0, done.err
    doc = json.loads(results.read_text())
    assert doc["benchwright"]["summary"] == finished["view"]["tasks"]["summary"]
    assert hashlib.sha256(results.read_bytes()).hexdigest() == finished["files"]["results.json"]["digest"]


async def test_report_of_another_accounts_run_and_a_bad_file_name_fail_clearly(stack: Stack, finished: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    run_id = finished["view"]["id"]
    env = api_env(stack, stack.other_key)
    done = await bw("report", run_id, "-o", str(tmp_path / "r.html"), env=env)
    assert done.rc == 1 and "not found" in done.err and not (tmp_path / "r.html").exists()
    done = await bw("report", run_id, "--file", "secrets.txt", env=api_env(stack))
    assert done.rc == 2 and "--file" in done.err


async def test_show_prints_the_narration(stack: Stack, finished: dict[str, Any]) -> None:
    done = await bw("show", finished["view"]["id"], env=api_env(stack))
    assert done.rc == 0, done.err
    assert " ".join(finished["view"]["narration"].split()) in " ".join(done.out.split())
