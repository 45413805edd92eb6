"""The worker names its build (``worker.workflow_build_id``): a digest of its workflow code, given to Temporal,
which otherwise computes one by hashing (and compiling, with a fresh bytecode cache) every loaded module at each
start."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType

from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack
from worker import workflow_build_id

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_runs_workflow_tasks_name_the_workers_build(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "constraints": {"max_tasks": 1},
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
    history = await stack.client.get_workflow_handle(run["id"]).fetch_history()
    completed = [e.workflow_task_completed_event_attributes for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    assert completed and {a.worker_version.build_id for a in completed} == {workflow_build_id()}
