"""The workflow sandbox the worker runs its workflows in, without a per-payload cost that buys our converter nothing.

temporalio (1.35) asks the sandboxed workflow instance, for every payload sequence of every activation and every
completion, which serialization context and which external-store context it belongs to (three passes each way), so
that a context-aware converter or codec can tell an activity's payloads from the workflow's. Each answer runs a code
string in the sandbox (``exec``, with the sandbox's importer applied): ~0.1 ms apiece, ~40 a one-task run, a few
hundred microseconds in every workflow task on a run's path to its first model call and to its end (py-spy,
docs/performance.md, issue 25).

Benchwright's converter takes no context: the pydantic converter and the encryption codec are the same object under
every context (``DataConverter.with_context`` returns it unchanged), and there is no external storage. For such a
converter every context leads temporalio to the same converter, so the instance answers "no context" without
entering the sandbox. Anything else (a converter some context changes, external storage) gets temporalio's own
runner unchanged: :func:`workflow_runner` checks the converter it is given, not a promise about it.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    SerializationContext,
    StorageDriverStoreContext,
    WorkflowSerializationContext,
)
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import Info

_PROBES: Sequence[SerializationContext] = (
    WorkflowSerializationContext(namespace="default", workflow_id="probe"),
    ActivitySerializationContext(namespace="default", workflow_id="probe", workflow_type="Probe", activity_type="probe",
                                 activity_task_queue="probe", is_local=False, activity_id="probe"),
)


def context_free(converter: DataConverter) -> bool:
    """Whether ``converter`` is the same under every serialization context and stores nothing externally."""
    return converter.external_storage is None and all(converter.with_context(c) is converter for c in _PROBES)


def workflow_runner(converter: DataConverter, passthrough: Sequence[str]) -> WorkflowRunner:
    """The sandboxed runner with ``passthrough`` modules shared with the worker; one whose instances skip the
    per-payload context lookups when ``converter`` takes no context."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*passthrough)
    if context_free(converter):
        return ContextFreeSandboxRunner(restrictions=restrictions)
    return SandboxedWorkflowRunner(restrictions=restrictions)


class ContextFreeSandboxRunner(SandboxedWorkflowRunner):
    """:class:`SandboxedWorkflowRunner` whose instances tell temporalio that no payload has a context: for a converter
    that ignores contexts, what it would have chosen anyway."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _ContextFreeInstance(super().create_instance(det))


class _ContextFreeInstance(WorkflowInstance):
    """The sandboxed instance, its contexts answered outside the sandbox: none for serialization (temporalio then uses
    the worker's converter, the one every context gives back), none for external storage (there is none)."""

    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self._inner.activate(act)

    def get_info(self) -> Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()

    def get_serialization_context(self, command_info: object) -> SerializationContext | None:
        return None

    def get_external_store_context(self, command_info: object) -> StorageDriverStoreContext:
        return StorageDriverStoreContext(target=None)
