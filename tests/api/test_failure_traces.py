"""``PhaseFailed.stack_trace`` keeps the trace (§5) but not the server's layout (issue 23 item 3): frames are named
relative to the repository, site-packages and the standard library; no absolute path of the server remains."""

from __future__ import annotations

import re
import sys
import sysconfig
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from benchwright.security.traces import format_trace, relative_trace
from benchwright.stack.devstack import free_port
from tests.api.helpers import launch, wait_terminal
from tests.conftest import Stack, serve_app

REPO = str(Path(__file__).resolve().parents[2])
FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@pytest_asyncio.fixture(loop_scope="session")
async def gone_url(stack: Stack) -> AsyncIterator[str]:
    app = Starlette(routes=[Route("/data.jsonl", lambda _: PlainTextResponse("gone", status_code=404))])
    port = free_port()
    server, task = await serve_app(app, port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}/data.jsonl"
    stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")
    server.should_exit = True
    await task


def _assert_no_server_paths(trace: str) -> None:
    for root in {REPO, sys.prefix, sys.base_prefix, str(Path.home())} - {"/"}:
        assert root not in trace, f"{root} in\n{trace}"
    frames = FRAME.findall(trace)
    assert frames, trace
    assert all(not name.startswith("/") for name, _ in frames), frames


async def test_a_failing_phase_trace_names_file_and_line_without_server_paths(stack: Stack, gone_url: str) -> None:
    async with stack.http() as http:
        model = {"identifier": "openai/dev", "api_base": stack.dev_url}
        run = await launch(http, {"dataset": gone_url, "model": model})
        events = await wait_terminal(http, run["id"])
    failed = [e for e in events if e["type"] == "PhaseFailed"]
    assert len(failed) == 1, [e["type"] for e in events]
    trace = failed[0]["data"]["stack_trace"]
    assert trace.startswith("Traceback") and "DatasetError" in trace
    _assert_no_server_paths(trace)
    files = {name for name, _ in FRAME.findall(trace)}
    assert any(name.startswith(("activities/", "benchwright/")) for name in files), files


def test_traces_keep_frames_and_code_but_not_locals() -> None:
    secret = "sk-live-abcdef0123456789"

    def boom(api_key: str) -> None:
        raise ValueError("no such model")

    try:
        boom(secret)
    except ValueError as exc:
        trace = format_trace(exc)
    assert secret not in trace, "a local's value never reaches the trace"
    assert 'tests/api/test_failure_traces.py", line' in trace and "ValueError: no such model" in trace
    _assert_no_server_paths(trace)
    # Temporal's own traces (a cause that was not ours) pass through relative_trace at record time
    site_packages = sysconfig.get_paths()["purelib"]
    raw = f'  File "{site_packages}/temporalio/worker/_activity.py", line 9, in run\n' \
          f'  File "{REPO}/activities/fetch.py", line 3, in fetch\n  File "/srv/other/deploy/x.py", line 1\n'
    shown = relative_trace(raw)
    assert 'File "temporalio/worker/_activity.py", line 9' in shown and 'File "activities/fetch.py", line 3' in shown
    assert 'File "…/deploy/x.py", line 1' in shown and "/srv" not in shown


async def test_a_scorer_errors_trace_is_relative_too(stack: Stack) -> None:
    impl = '''
class Scorer:
    def extract(self, row):
        return row["question"]
    def solve(self, row, call_sut):
        raise RuntimeError("scorer bug on purpose")
    def score(self, row, response):
        return 1.0
'''
    from tests.conftest import SAMPLE

    async with stack.http() as http:
        run = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "metadata": {"limit": 2},
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}, "task_impl": impl})
        await wait_terminal(http, run["id"])
        detail = (await http.get(f"/v1/runs/{run['id']}/tasks/0")).json()
    trace = detail["trials"][0]["meta"]["trace"]
    assert "scorer bug on purpose" in trace and "task_impl.py" in trace, trace
    _assert_no_server_paths(trace)
    assert str(stack.data_dir) not in trace, "nor the deployment's data directory"
