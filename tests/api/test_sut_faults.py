"""A dead or misconfigured model endpoint must not read as success (issue 15 item 9a), on the real stack.

Attach's probe fails the run at Attach in plain words; a model that breaks mid-run (401 from the second completion on)
halts the run ``sut_unavailable`` instead of erroring every task; 5xx for good still makes per-task ``err`` rows
(transient faults do not trip the breaker); 429 with ``Retry-After`` is waited out and the tasks pass.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from benchwright.testkit.devmodel import DevModelConfig, Fault, load_answers
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
TASKS = 60  # rows in the sample


def _closed_port_url() -> str:
    with socket.socket() as s:  # bound, never listening: connecting to it is refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def _run(stack: Stack, model: dict[str, Any],
               **launch_fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": model, **launch_fields})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    return final, events


def _answers() -> dict[str, str]:
    return load_answers(SAMPLE / "arithmetic.jsonl")


async def test_unreachable_endpoint_fails_attach_in_plain_words(stack: Stack) -> None:
    url = _closed_port_url()
    final, events = await _run(stack, {"identifier": "openai/dev", "api_base": url})
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert final["status"] == "error" and not final["halted"]
    assert failed and failed[0]["phase"] == "attach" and failed[0]["error_type"] == "Unavailable"
    assert f"model endpoint {url} is unreachable (connection refused)" in failed[0]["detail"]
    assert "is unreachable (connection refused)" in final["error"]
    assert not any(e["type"] == "MaterializeTaskResult" for e in events)  # nothing ran against a dead model


async def test_unknown_model_fails_attach_naming_the_model(stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(DevModelConfig(answers=_answers(), known_models_only=True))
    final, events = await _run(stack, {"identifier": "openai/gpt-nope", "api_base": url})
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert final["status"] == "error"
    assert failed and failed[0]["phase"] == "attach"
    assert "the provider does not know model 'openai/gpt-nope' (HTTP 404)" in failed[0]["detail"]


async def test_key_refused_mid_run_halts_sut_unavailable(stack: Stack, dev_models: DevModels) -> None:
    server_url = await dev_models.start(DevModelConfig(answers=_answers(), faults=(Fault(401, first=1),)))
    server = dev_models.servers[-1]
    # One call in flight (the batch's two scorer threads alternate tasks; a thread reports its task's record before
    # it asks for its next call), so what the halt keeps is known. With many calls in flight, a reply still being
    # scored when the halt lands is abandoned with the batch, as any halt abandons work in flight.
    final, events = await _run(stack, {"identifier": "openai/dev", "api_base": server_url}, concurrency=1)
    threshold = stack.settings.sut_breaker_threshold
    assert final["halted"] and final["display_status"] == "halted"
    assert final["halt_reason"].startswith("sut_unavailable: the provider refused the key (HTTP 401)")
    assert f"{threshold} model calls in a row failed" in final["halt_reason"]
    # Attach's check was the provider's model listing (no completion); call 0 was a task's and passed. Calls 1..9
    # failed (a 401 is not retried) and are err rows, the 10th tripped the breaker and never became a result. The
    # other thread's next call was already waiting for the slot when the 10th failed, so it went out too (an 11th
    # 401); nothing asked for after the trip was sent. The 9th's err row is written unless the halt's cancellation
    # beat its report, which the 11th call (asked for after that report) rules out.
    summary = final["tasks"]["summary"]
    refused = server.chat_statuses[401]
    assert server.chat_statuses[200] == 1 and refused in (threshold, threshold + 1)
    assert summary["passed"] == 1
    low = threshold - 1 if refused == threshold + 1 else threshold - 2
    assert low <= summary["errored"] <= threshold - 1
    halts = [e["data"]["halt_reason"] for e in events if e["type"] == "RunHalted"]
    assert halts == [final["halt_reason"]]


async def test_5xx_for_good_after_attach_errs_each_task_with_the_status(
        stack: Stack, dev_models: DevModels) -> None:
    # The provider lists the model (Attach passes without a completion), then answers every completion 503.
    url = await dev_models.start(DevModelConfig(answers=_answers(), faults=(Fault(503, first=0),)))
    server = dev_models.servers[-1]
    final, _ = await _run(stack, {"identifier": "openai/dev", "api_base": url})
    summary = final["tasks"]["summary"]
    assert final["status"] == "ok" and not final["halted"]  # transient faults never trip the breaker
    assert summary["errored"] == TASKS and summary["pass_rate"] is None
    # every task's call: one try and sut_retries retries, all 503
    assert server.chat_statuses == {503: TASKS * (stack.settings.sut_retries + 1)}
    async with stack.http() as http:
        detail = (await http.get(f"/v1/runs/{final['id']}/tasks/0")).json()
    assert "answered HTTP 503" in detail["trials"][0]["error"]


async def test_429_with_retry_after_is_waited_out_and_tasks_pass(stack: Stack, dev_models: DevModels) -> None:
    # Attach spends no completion (the provider lists the model); every task's first call (0..59) is told to come
    # back in 1 s.
    url = await dev_models.start(DevModelConfig(answers=_answers(),
                                                faults=(Fault(429, first=0, count=TASKS, retry_after="1"),)))
    server = dev_models.servers[-1]
    final, events = await _run(stack, {"identifier": "openai/dev", "api_base": url})
    summary = final["tasks"]["summary"]
    assert final["status"] == "ok" and summary["passed"] == TASKS and summary["errored"] == 0
    assert server.chat_statuses == {200: TASKS, 429: TASKS}
    done = {e["data"]["phase"]: e["data"]["duration_ms"] for e in events if e["type"] == "PhaseCompleted"}
    assert done["materialize"] >= 1000  # Retry-After was honoured (the backoff alone waits ~0.2 s)


def _cli_run(stack: Stack, *args: str) -> Any:
    from typer.testing import CliRunner

    from benchwright.cli.app import app

    return CliRunner().invoke(app, ["run", "--dataset", DATASET, "--model", "openai/dev", "--watch",
                                    "--api-url", stack.api_url, "--api-key", stack.api_key, *args])


async def test_cli_run_watch_says_plainly_when_every_task_errored(stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(DevModelConfig(answers=_answers(), faults=(Fault(503, first=0),)))
    # The CLI is synchronous; the stack serves it from this event loop while it runs in a thread.
    result = await asyncio.to_thread(_cli_run, stack, "--api-base", url)
    assert result.exit_code == 1, result.output
    # e.g. "finished with 60 of 60 tasks errored: solve: SutCallError: model endpoint ... answered HTTP 503: ..."
    assert f"finished with {TASKS} of {TASKS} tasks errored: " in result.output
    assert f"model endpoint {url} answered HTTP 503" in result.output.split("tasks errored: ", 1)[1]


async def test_cli_run_watch_reports_a_dead_endpoint_and_fails(stack: Stack) -> None:
    url = _closed_port_url()
    result = await asyncio.to_thread(_cli_run, stack, "--api-base", url)
    assert result.exit_code == 1, result.output
    assert "error: attach failed: " in result.output
    assert f"model endpoint {url} is unreachable (connection refused)" in result.output


async def test_cli_run_watch_exits_0_for_a_clean_run(stack: Stack) -> None:
    result = await asyncio.to_thread(_cli_run, stack, "--api-base", stack.dev_url)
    assert result.exit_code == 0, result.output
    assert "tasks errored" not in result.output


async def test_a_wrong_secret_fails_attach_through_the_proxy_naming_the_secret(
        stack: Stack, dev_models: DevModels) -> None:
    from benchwright.proxy.model_proxy import load_handle

    url = await dev_models.start(DevModelConfig(answers=_answers(), api_key="sk-the-real-one"))
    async with stack.http() as http:
        made = await http.post("/v1/secrets", json={"name": "STALEKEY", "value": "sk-revoked"})
        assert made.status_code == 201, made.text
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": url,
                                                                "secret": "STALEKEY"}})
        pids: set[int] = set()
        events: list[dict[str, Any]] = []
        deadline = asyncio.get_running_loop().time() + 120
        while not any(e["type"] == "PipelineFinished" for e in events):  # note the proxy's pid while it runs
            assert asyncio.get_running_loop().time() < deadline, "the run did not finish"
            handle = load_handle(stack.data_dir / "runs" / run["id"])
            if handle is not None:
                pids.add(handle.pid)
            events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
            await asyncio.sleep(0.05)
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert final["status"] == "error" and failed and failed[0]["phase"] == "attach"
    assert "the provider refused the key (HTTP 401): check the secret 'STALEKEY'" in failed[0]["detail"]
    # The route lives ~0.1 s (registered, probed, refused, revoked): the poll above may not see its handle. The
    # provider saw the stale key (401s) from the credential proxy, the only holder of the secret's value.
    assert set(dev_models.servers[-1].chat_statuses) == {401}
    assert load_handle(stack.data_dir / "runs" / run["id"]) is None, "Attach revoked the route it registered"
