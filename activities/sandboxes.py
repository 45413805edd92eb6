"""Sandboxes for the phases that run untrusted code (§4): one work sandbox per phase invocation, restored from the
previous phase's snapshot, so the work sandbox's filesystem is shared across phases through snapshots and no live
sandbox depends on the worker process that made it. Task sandboxes (fanout) restore the post-Atomize snapshot.

Each sandbox gets its own egress proxy, enforcing the run's account's host policy and recording refusals in the
run's blocked-host log, and leaves a SandboxCreated / SandboxKilled pair in the log (the kill carries its cost).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from activities.common import Deps, in_thread
from benchwright.events import SandboxCreated, SandboxKilled, SnapshotCreated
from benchwright.proxy.egress import EgressProxy
from benchwright.proxy.policy import HostPolicy
from benchwright.sandbox import ExecLimits, LocalBackend, SandboxError, SandboxInfo, proxy_env
from benchwright.scoring.host import RUNNER, Spawn, runner_env
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.policy import get_policy, record_blocked
from benchwright.store.runs import get_run, record_isolation

DEPS_DIR = ".deps"
"""Where Setup installs the scorer's Python requirements inside the work sandbox (on the runner's PYTHONPATH)."""
SNAPSHOTS = "snapshots.json"
POLICY_TTL_S = 1.0


@dataclass
class Sandbox:
    backend: LocalBackend
    info: SandboxInfo
    home: str
    """The sandbox's working directory as its commands see it."""

    def scorer_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return runner_env(self.home, {"PYTHONPATH": f"{self.home}/{DEPS_DIR}", **proxy_env(self.info),
                                      **(extra or {})})

    def spawn(self, env: dict[str, str], limits: ExecLimits) -> Spawn:
        async def spawn(args: list[str]) -> object:
            return await self.backend.spawn(self.info.sandbox_id, [sys.executable, "runner.py", *args], env=env,
                                            limits=limits)

        return spawn


class _RunBlockedLog:
    def __init__(self, deps: Deps, run_id: str, account_id: str) -> None:
        self.deps, self.run_id, self.account_id = deps, run_id, account_id

    async def record(self, host: str) -> None:
        await in_thread(record_blocked, self.deps.engine, run_id=self.run_id, account_id=self.account_id, host=host)


class _PolicyCache:
    """The account's policy, re-read at most once a second (the proxy asks once per request)."""

    def __init__(self, deps: Deps, account_id: str) -> None:
        self.deps, self.account_id = deps, account_id
        self.policy: HostPolicy | None = None
        self.read_at = 0.0

    async def __call__(self) -> HostPolicy:
        if self.policy is None or time.monotonic() - self.read_at > POLICY_TTL_S:
            self.policy = await in_thread(get_policy, self.deps.engine, account_id=self.account_id)
            self.read_at = time.monotonic()
        return self.policy


def snapshot_of(deps: Deps, run_id: str, phase: str) -> str | None:
    path = deps.workdir(run_id) / SNAPSHOTS
    return json.loads(path.read_text()).get(phase) if path.exists() else None


def latest_snapshot(deps: Deps, run_id: str, *, before: str) -> str | None:
    """The newest work-sandbox snapshot of the phases that run before ``before``."""
    order = ("fetch", "setup", "atomize")
    earlier = order[: order.index(before)] if before in order else order
    for phase in reversed(earlier):
        snap = snapshot_of(deps, run_id, phase)
        if snap:
            return snap
    return None


@asynccontextmanager
async def sandbox(deps: Deps, *, run_id: str, role: str, key: tuple[object, ...], restore: str | None,
                  internal_allowed: frozenset[tuple[str, int]] = frozenset(),
                  metadata: dict[str, object] | None = None, ro_paths: tuple[Path, ...] = ()) -> AsyncIterator[Sandbox]:
    """A sandbox for the length of the block, with its egress proxy; killed (and its cost recorded) on the way out,
    whatever happens inside. ``ro_paths``: host directories shown read-only at the same path (a harness runtime)."""
    run = await in_thread(get_run, deps.engine, run_id=run_id)
    operator_allowed = {(h, int(p)) for h, _, p in (e.rpartition(":") for e in deps.settings.egress_internal_allowed)}
    egress = EgressProxy(policy_provider=_PolicyCache(deps, run.account_id),
                         recorder=_RunBlockedLog(deps, run_id, run.account_id),
                         internal_allowed=frozenset(internal_allowed | operator_allowed))
    await egress.start()
    backend = LocalBackend(deps.settings.sandboxes_dir(), allow_unisolated=deps.settings.allow_unisolated,
                           egress_proxy_url=egress.url, extra_ro_paths=ro_paths)
    info: SandboxInfo | None = None
    try:
        info = await backend.create(role=role, run_id=run_id, snapshot_id=restore)
        isolation = str(info.metadata.get("isolation", "namespaces"))
        await in_thread(append_events, deps.engine, run_id, [NewEvent.of(
            event_key(run_id, *key, "sandbox", info.sandbox_id, "created"),
            SandboxCreated(sandbox_id=info.sandbox_id, role=role, backend=backend.name,
                           instance_size=info.instance_size, isolation=isolation,
                           metadata={**(metadata or {}), "benchwright_role": role, "isolation": isolation}))])
        if run.isolation != isolation:
            await in_thread(record_isolation, deps.engine, run_id=run_id, isolation=isolation)
        home = "/sandbox" if isolation == "namespaces" else str(info.root)
        yield Sandbox(backend=backend, info=info, home=home)
    finally:
        # Shielded: a second cancellation (a task group tearing down siblings) must not leave a sandbox alive or
        # its ledger entry open.
        await asyncio.shield(_dispose(deps, backend, egress, info, run_id=run_id, role=role, key=key))


async def _dispose(deps: Deps, backend: LocalBackend, egress: EgressProxy, info: SandboxInfo | None, *, run_id: str,
                   role: str, key: tuple[object, ...]) -> None:
    try:
        if info is not None:
            try:
                lifetime = await backend.kill(info.sandbox_id)
            except SandboxError:  # already gone (its init died): still close its ledger entry
                lifetime = max(0.0, time.time() - info.created_at)
            cost = lifetime / 3600 * deps.settings.local_sandbox_usd_per_hour
            await in_thread(append_events, deps.engine, run_id, [NewEvent.of(
                event_key(run_id, *key, "sandbox", info.sandbox_id, "killed"),
                SandboxKilled(sandbox_id=info.sandbox_id, role=role, duration_ms=int(lifetime * 1000),
                              cost_usd=cost))])
    finally:
        await backend.close()
        await egress.stop()


async def take_snapshot(deps: Deps, box: Sandbox, *, run_id: str, phase: str, invocation: int) -> str:
    """Snapshot the work sandbox at a phase's exit (SnapshotCreated) and remember it for the phases after."""
    snapshot_id = await box.backend.snapshot(box.info.sandbox_id, label=f"{run_id}:{phase}:v{invocation}")
    await record_snapshot(deps, run_id=run_id, phase=phase, invocation=invocation, snapshot_id=snapshot_id)
    return snapshot_id


async def snapshot_files(deps: Deps, files: dict[str, bytes], *, run_id: str, phase: str, invocation: int) -> str:
    """A work-sandbox snapshot holding ``files``, made without a sandbox (for a phase that only puts files in
    place and runs nothing), recorded like ``take_snapshot``'s."""
    backend = LocalBackend(deps.settings.sandboxes_dir(), allow_unisolated=deps.settings.allow_unisolated)
    try:
        snapshot_id = await backend.snapshot_files(files, label=f"{run_id}:{phase}:v{invocation}")
    finally:
        await backend.close()
    await record_snapshot(deps, run_id=run_id, phase=phase, invocation=invocation, snapshot_id=snapshot_id)
    return snapshot_id


async def record_snapshot(deps: Deps, *, run_id: str, phase: str, invocation: int, snapshot_id: str) -> None:
    """SnapshotCreated for the phase, and the id remembered for the phases after. Snapshots are content-addressed,
    so a phase that left the filesystem as it found it records its predecessor's id without taking one."""
    await in_thread(append_events, deps.engine, run_id, [NewEvent.of(
        event_key(run_id, phase, invocation, "snapshot"), SnapshotCreated(snapshot_id=snapshot_id, phase=phase))])
    path = deps.workdir(run_id) / SNAPSHOTS
    known = json.loads(path.read_text()) if path.exists() else {}
    known[phase] = snapshot_id
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(known))
    os.replace(tmp, path)


async def put_file(box: Sandbox, name: str, data: bytes) -> None:
    await box.backend.write_file(box.info.sandbox_id, name, data)


async def put_runtime(box: Sandbox, impl_source: str) -> None:
    """The scorer runtime and task_impl.py into the sandbox's working directory."""
    await put_file(box, "runner.py", Path(RUNNER).read_bytes())
    await put_file(box, "task_impl.py", impl_source.encode())
