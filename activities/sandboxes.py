"""Adapters from the phase activities to the run's sandboxes (``benchwright.sandbox.lifecycle`` holds the logic:
the backend seam, egress wiring, the SandboxCreated/SandboxKilled ledger and snapshot bookkeeping).

Activities keep calling these with their ``Deps``; each call passes the store and the settings down. Snapshot ids
come from the run's SnapshotCreated events, never from a file on the worker's disk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from activities.common import Deps
from benchwright.sandbox import lifecycle
from benchwright.sandbox.lifecycle import DEPS_DIR, SNAPSHOTS, Sandbox
from benchwright.scoring.host import RUNNER

__all__ = ["DEPS_DIR", "SNAPSHOTS", "Sandbox", "latest_snapshot", "put_file", "put_runtime", "record_snapshot",
           "sandbox", "snapshot_files", "snapshot_of", "take_snapshot"]


def snapshot_of(deps: Deps, run_id: str, phase: str) -> str | None:
    """The snapshot ``phase`` left, from the run's SnapshotCreated events (one indexed query)."""
    return lifecycle.snapshot_of(deps.engine, run_id, phase)


def latest_snapshot(deps: Deps, run_id: str, *, before: str) -> str | None:
    """The newest work-sandbox snapshot of the phases that run before ``before``."""
    return lifecycle.latest_snapshot(deps.engine, run_id, before=before)


@asynccontextmanager
async def sandbox(deps: Deps, *, run_id: str, role: str, key: tuple[object, ...], restore: str | None,
                  internal_allowed: frozenset[tuple[str, int]] = frozenset(),
                  metadata: dict[str, object] | None = None, ro_paths: tuple[Path, ...] = (),
                  backend_options: dict[str, object] | None = None) -> AsyncIterator[Sandbox]:
    """A sandbox on the run's backend for the length of the block (``lifecycle.open_sandbox``); ``ro_paths``: host
    directories shown read-only at the same path (a harness runtime); ``backend_options`` go to the backend."""
    async with lifecycle.open_sandbox(engine=deps.engine, settings=deps.settings, run_id=run_id, role=role, key=key,
                                      restore=restore, internal_allowed=internal_allowed,
                                      metadata=metadata, ro_paths=ro_paths, backend_options=backend_options) as box:
        yield box


async def take_snapshot(deps: Deps, box: Sandbox, *, run_id: str, phase: str, invocation: int) -> str:
    """Snapshot the work sandbox at a phase's exit (SnapshotCreated) and remember it for the phases after."""
    return await lifecycle.take_snapshot(engine=deps.engine, settings=deps.settings, box=box, run_id=run_id,
                                         phase=phase, invocation=invocation)


async def snapshot_files(deps: Deps, files: dict[str, bytes], *, run_id: str, phase: str, invocation: int) -> str:
    """A work-sandbox snapshot holding ``files``, made without a sandbox, on the run's backend."""
    return await lifecycle.snapshot_files(engine=deps.engine, settings=deps.settings, files=files, run_id=run_id,
                                          phase=phase, invocation=invocation)


async def record_snapshot(deps: Deps, *, run_id: str, phase: str, invocation: int, snapshot_id: str) -> None:
    """SnapshotCreated for the phase: how the phases after it find it."""
    await lifecycle.record_snapshot(engine=deps.engine, run_id=run_id, phase=phase, invocation=invocation,
                                    snapshot_id=snapshot_id)


async def put_file(box: Sandbox, name: str, data: bytes) -> None:
    await box.backend.write_file(box.info.sandbox_id, name, data)


async def put_runtime(box: Sandbox, impl_source: str) -> None:
    """The scorer runtime and task_impl.py into the sandbox's working directory."""
    await put_file(box, "runner.py", Path(RUNNER).read_bytes())
    await put_file(box, "task_impl.py", impl_source.encode())
