"""The worker's workflow runner (benchwright.stack.workflow_runner): for Benchwright's converter, which no
serialization context changes, workflow tasks resolve no payload's context inside the sandbox; a converter that a
context does change keeps temporalio's own runner, and every recorded history replays either way."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import PayloadCodec, SerializationContext, WithSerializationContext
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, _runner

from benchwright.security.crypto import Keyring
from benchwright.security.payload_codec import data_converter
from benchwright.stack.workflow_runner import ContextFreeSandboxRunner, context_free, workflow_runner
from worker import PASSTHROUGH
from workflows.run import RunWorkflow

HISTORY = Path(__file__).resolve().parents[1] / "replay" / "histories" / "run_finished_locally.json"


class _ContextCodec(PayloadCodec, WithSerializationContext):
    """A codec that a context changes (as a per-workflow key would): another codec for each context."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> _ContextCodec:
        return _ContextCodec(context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


def _encrypting() -> Any:
    return data_converter(Keyring([os.urandom(32)], source="test"))


def test_benchwrights_converters_take_no_context_and_get_the_context_free_runner() -> None:
    for converter in (pydantic_data_converter, _encrypting()):
        assert context_free(converter)
        assert isinstance(workflow_runner(converter, PASSTHROUGH), ContextFreeSandboxRunner)


def test_a_converter_a_context_changes_keeps_temporalios_runner() -> None:
    aware = dataclasses.replace(pydantic_data_converter, payload_codec=_ContextCodec())
    assert not context_free(aware)
    runner = workflow_runner(aware, PASSTHROUGH)
    assert type(runner) is SandboxedWorkflowRunner


@pytest.mark.asyncio
@pytest.mark.parametrize("context_aware", [False, True])
async def test_a_run_replays_and_only_temporalios_runner_asks_the_sandbox_for_contexts(
        monkeypatch: pytest.MonkeyPatch, context_aware: bool) -> None:
    asked: list[object] = []
    ask = _runner._Instance.get_serialization_context

    def counting(self: Any, command_info: Any) -> Any:
        asked.append(command_info)
        return ask(self, command_info)

    monkeypatch.setattr(_runner._Instance, "get_serialization_context", counting)
    converter = (dataclasses.replace(pydantic_data_converter, payload_codec=_ContextCodec()) if context_aware
                 else _encrypting())
    replayer = Replayer(workflows=[RunWorkflow], data_converter=converter,
                        workflow_runner=workflow_runner(converter, PASSTHROUGH))
    history = WorkflowHistory.from_json(HISTORY.name, HISTORY.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None
    # A history of a whole run: its payloads (input, the local activities' results and inputs, the batch's...)
    if context_aware:
        assert len(asked) > 10
    else:
        assert asked == []
