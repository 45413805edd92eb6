"""A run's sandboxes from birth to ledger (§4, §9): the domain side of every phase that runs untrusted code.

One work sandbox per phase invocation, restored from the previous phase's snapshot, so the work sandbox's
filesystem is shared across phases through snapshots and no live sandbox depends on the worker process that made
it. Task sandboxes (fanout) restore the post-Atomize snapshot.

Each sandbox is made on the run's recorded backend (:func:`benchwright.sandbox.factory.open_backend`: the one
seam), gets its own egress proxy enforcing the run's account's host policy and recording refusals in the run's
blocked-host log, and leaves a SandboxCreated (naming the backend that made it) / SandboxKilled pair in the log;
the kill carries its cost, lifetime × the backend's rate for the sandbox's instance size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Engine

from benchwright.aio import uncancellable
from benchwright.data.blobs import BlobNotFound
from benchwright.events import Event, SandboxCreated, SandboxKilled, SnapshotCreated
from benchwright.proxy.egress import EgressProxy
from benchwright.proxy.policy import HostPolicy
from benchwright.sandbox.base import (
    ExecLimits,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    proxy_env,
)
from benchwright.sandbox.factory import OpenBackend, blob_store, open_backend
from benchwright.sandbox.local import LocalBackend
from benchwright.sandbox.snapshot_sync import export_snapshot, import_snapshot
from benchwright.scoring.host import RUNNER, Spawn, runner_env
from benchwright.settings import Settings
from benchwright.store.db import reader
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.models import EventRow, Run, table_of
from benchwright.store.policy import get_policy, record_blocked
from benchwright.store.runs import get_run

DEPS_DIR = ".deps"
"""Where Setup installs the scorer's Python requirements inside the work sandbox (on the runner's PYTHONPATH)."""
SNAPSHOTS = "snapshots.json"
"""Where runs from before the log held snapshot ids kept them; the phase cache still leaves such a file out."""
POLICY_TTL_S = 1.0
SNAPSHOT_PHASES = ("fetch", "setup", "atomize")


@dataclass
class Sandbox:
    """A live sandbox of a run, on the backend that made it.

    Attributes:
        backend: That backend.
        info: What it reported at creation.
        home: The sandbox's working directory as its commands see it.
        python: The interpreter that runs the scorer runtime in it.
    """

    backend: SandboxBackend
    info: SandboxInfo
    home: str
    python: str

    def scorer_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return runner_env(self.home, {"PYTHONPATH": f"{self.home}/{DEPS_DIR}", **proxy_env(self.info),
                                      **(extra or {})})

    def spawn(self, env: dict[str, str], limits: ExecLimits) -> Spawn:
        async def spawn(args: list[str]) -> object:
            return await self.backend.spawn(self.info.sandbox_id, [self.python, "runner.py", *args], env=env,
                                            limits=limits)

        return spawn


class _RunBlockedLog:
    def __init__(self, engine: Engine, run_id: str, account_id: str) -> None:
        self.engine, self.run_id, self.account_id = engine, run_id, account_id

    async def record(self, host: str) -> None:
        await asyncio.to_thread(record_blocked, self.engine, run_id=self.run_id, account_id=self.account_id,
                                host=host)


class _PolicyCache:
    """The account's policy, re-read at most once a second (the proxy asks once per request)."""

    def __init__(self, engine: Engine, account_id: str) -> None:
        self.engine, self.account_id = engine, account_id
        self.policy: HostPolicy | None = None
        self.read_at = 0.0

    async def __call__(self) -> HostPolicy:
        if self.policy is None or time.monotonic() - self.read_at > POLICY_TTL_S:
            self.policy = await asyncio.to_thread(get_policy, self.engine, account_id=self.account_id)
            self.read_at = time.monotonic()
        return self.policy


def run_backend(engine: Engine, run_id: str) -> str:
    """The backend a run's launch resolved (its recorded ``compute``); runs from before it was recorded: local."""
    return get_run(engine, run_id=run_id).backend or "local"


def _home(info: SandboxInfo) -> str:
    workdir = info.metadata.get("workdir")
    if workdir:
        return str(workdir)
    return "/sandbox" if info.metadata.get("isolation", "namespaces") == "namespaces" else str(info.root)


@asynccontextmanager
async def open_sandbox(*, engine: Engine, settings: Settings, run_id: str, role: str, key: tuple[object, ...],
                       restore: str | None, internal_allowed: frozenset[tuple[str, int]] = frozenset(),
                       metadata: Mapping[str, object] | None = None,
                       ro_paths: tuple[Path, ...] = (),
                       backend_options: Mapping[str, object] | None = None,
                       on_worker: bool = False, run: Run | None = None) -> AsyncIterator[Sandbox]:
    """A sandbox for the length of the block, on the run's backend, with its egress proxy; killed (and its cost
    recorded) on the way out, whatever happens inside. ``ro_paths``: host directories shown read-only at the same
    path (a harness runtime; the local backend only, remote backends bake them into their image or template).
    ``backend_options``: passed to the backend's ``create`` with its metadata (the local backend's ``root_links``,
    a remote backend's ``template``). ``on_worker``: on the worker's own local backend whatever the run's (a harness
    runner that drives task sandboxes on the run's backend through the worker, as harbor's orchestrator does; its
    SandboxCreated names ``local``, and it leaves the run's recorded isolation alone). ``run``: the run's row when
    the caller has read it already (a Materialize batch, with its call limit); read here otherwise.

    Raises:
        InvalidInput: the run's backend is not configured on this worker (naming what to configure), or
            ``ro_paths`` were asked of a remote backend.
    """
    if run is None or run.id != run_id:
        run = await asyncio.to_thread(get_run, engine, run_id=run_id)
    backend_name = "local" if on_worker else run.backend or "local"
    operator_allowed = {(h, int(p)) for h, _, p in (e.rpartition(":") for e in settings.egress_internal_allowed)}
    egress = EgressProxy(policy_provider=_PolicyCache(engine, run.account_id),
                         recorder=_RunBlockedLog(engine, run_id, run.account_id),
                         internal_allowed=frozenset(internal_allowed | operator_allowed),
                         host=settings.egress_proxy_host)
    await egress.start()
    opened: OpenBackend | None = None
    info: SandboxInfo | None = None
    try:
        opened = open_backend(settings, backend=backend_name, egress_proxy_url=egress.url, ro_paths=ro_paths)
        if restore is not None:
            await _import_local(settings, opened.backend, restore)
        info = await opened.backend.create(role=role, run_id=run_id, snapshot_id=restore,
                                           metadata={"account": run.account_id, **(backend_options or {})})
        isolation = str(info.metadata.get("isolation", "namespaces"))
        # A warm sandbox (benchwright.sandbox.local.warm) was made before the run claimed it: the log says so.
        made = {"warm": True} if info.metadata.get("warm") else {}
        # The run's first sandbox records how its sandboxes are isolated, in the same transaction as its event.
        recorded = {"isolation": isolation} if run.isolation != isolation and not on_worker else {}
        await asyncio.to_thread(append_events, engine, run_id, [NewEvent.of(
            event_key(run_id, *key, "sandbox", info.sandbox_id, "created"),
            SandboxCreated(sandbox_id=info.sandbox_id, role=role, backend=opened.backend.name,
                           instance_size=info.instance_size, isolation=isolation,
                           metadata={**(metadata or {}), "benchwright_role": role, "isolation": isolation,
                                     **made}))], **recorded)
        yield Sandbox(backend=opened.backend, info=info, home=_home(info), python=opened.python)
    finally:
        # Shielded and waited for: a cancellation (a task group tearing down siblings, a halted batch) must neither
        # leave a sandbox alive or its ledger entry open, nor end the block before its SandboxKilled is written (the
        # run's terminal event comes after every sandbox's end).
        await uncancellable(_dispose(engine, opened, egress, info, run_id=run_id, role=role, key=key))


async def _dispose(engine: Engine, opened: OpenBackend | None, egress: EgressProxy, info: SandboxInfo | None, *,
                   run_id: str, role: str, key: tuple[object, ...]) -> None:
    try:
        if opened is not None and info is not None:
            try:
                if isinstance(opened.backend, LocalBackend):  # its remains are removed after the sandbox's end
                    lifetime = await opened.backend.kill(info.sandbox_id, remains="later")
                else:
                    lifetime = await opened.backend.kill(info.sandbox_id)
            except SandboxError:  # already gone (its init died): still close its ledger entry
                lifetime = max(0.0, time.time() - info.created_at)
            await asyncio.to_thread(append_events, engine, run_id, [NewEvent.of(
                event_key(run_id, *key, "sandbox", info.sandbox_id, "killed"),
                SandboxKilled(sandbox_id=info.sandbox_id, role=role, duration_ms=int(lifetime * 1000),
                              cost_usd=lifetime / 3600 * opened.usd_per_hour))])
    finally:
        if opened is not None:
            await opened.backend.close()
        await egress.stop()


# ------------------------------------------------------------------------------------------------- snapshots ---

async def _export_local(settings: Settings, backend: SandboxBackend, snapshot_id: str) -> None:
    """A local-backend snapshot into the shared blob store, where the deployment has one: any worker restores it.
    (Remote backends keep their snapshots there already.)"""
    if settings.blob_store_url and isinstance(backend, LocalBackend):
        await export_snapshot(backend, blob_store(settings), snapshot_id)


async def _import_local(settings: Settings, backend: SandboxBackend, snapshot_id: str) -> None:
    """A snapshot another worker exported, into this worker's local store before it is restored."""
    if settings.blob_store_url and isinstance(backend, LocalBackend):
        try:
            await import_snapshot(backend, blob_store(settings), snapshot_id)
        except BlobNotFound:
            pass  # not exported (taken before a shared store was configured): the local store answers alone


# Read by every phase that leaves or restores a snapshot, and by every batch: a Core statement built once.
_EVENTS = table_of(EventRow)
_SNAPSHOTS = (select(_EVENTS.c.data)
              .where(_EVENTS.c.run_id == bindparam("run_id_"), _EVENTS.c.type == SnapshotCreated.type_name())
              .order_by(_EVENTS.c.seq.desc()))


def _newest_snapshots(engine: Engine, run_id: str) -> dict[str, str]:
    """Each phase's newest snapshot in the run's log (a fork's log holds copies of its parent's for the phases it
    inherits)."""
    newest: dict[str, str] = {}
    with reader(engine).connect() as conn:
        for (data,) in conn.execute(_SNAPSHOTS, {"run_id_": run_id}):
            newest.setdefault(str(data.get("phase")), str(data["snapshot_id"]))
    return newest


def snapshot_of(engine: Engine, run_id: str, phase: str) -> str | None:
    """The snapshot ``phase`` left for the phases after it: its newest SnapshotCreated in the run's log. None if it
    left none."""
    return _newest_snapshots(engine, run_id).get(phase)


def latest_snapshot(engine: Engine, run_id: str, *, before: str) -> str | None:
    """The newest work-sandbox snapshot of the phases that run before ``before``."""
    earlier = SNAPSHOT_PHASES[: SNAPSHOT_PHASES.index(before)] if before in SNAPSHOT_PHASES else SNAPSHOT_PHASES
    newest = _newest_snapshots(engine, run_id)
    return next((newest[phase] for phase in reversed(earlier) if phase in newest), None)


Emit = Callable[[str, Event], None]
"""A phase's ``PhaseScope.emit``: queue an event to land with the phase's close (``activities.common``)."""


async def record_snapshot(*, engine: Engine, run_id: str, phase: str, invocation: int, snapshot_id: str,
                          emit: Emit | None = None) -> None:
    """SnapshotCreated for the phase: how the phases after it (on any worker) find it. Snapshots are
    content-addressed, so a phase that left the filesystem as it found it records its predecessor's id without
    taking one. With ``emit`` (the phase's scope), the event lands with the phase's close, in its transaction and
    under the same key, instead of in a transaction of its own now."""
    event = SnapshotCreated(snapshot_id=snapshot_id, phase=phase)
    if emit is not None:
        emit("snapshot", event)
        return
    await asyncio.to_thread(append_events, engine, run_id, [NewEvent.of(
        event_key(run_id, phase, invocation, "snapshot"), event)])


async def take_snapshot(*, engine: Engine, settings: Settings, box: Sandbox, run_id: str, phase: str,
                        invocation: int) -> str:
    """Snapshot the work sandbox at a phase's exit (SnapshotCreated) and remember it for the phases after. Recorded
    at once, while the sandbox lives: its SandboxKilled follows."""
    snapshot_id = await box.backend.snapshot(box.info.sandbox_id, label=f"{run_id}:{phase}:v{invocation}")
    await _export_local(settings, box.backend, snapshot_id)
    await record_snapshot(engine=engine, run_id=run_id, phase=phase, invocation=invocation, snapshot_id=snapshot_id)
    return snapshot_id


async def snapshot_files(*, engine: Engine, settings: Settings, files: dict[str, bytes], run_id: str, phase: str,
                         invocation: int, base: str | None = None, emit: Emit | None = None,
                         backend: str | None = None) -> str:
    """A work-sandbox snapshot holding ``base``'s files (none if not given) and ``files`` on the run's backend, made
    without a sandbox (for a phase that only puts files in place and runs nothing), recorded like
    ``take_snapshot``'s: the snapshot a sandbox restored from ``base`` would give after ``put_file`` of each. With
    ``emit``, recorded with the phase's close (``record_snapshot``). ``backend``: the run's (``run_backend``), when
    the caller read its run already."""
    if backend is None:
        backend = await asyncio.to_thread(run_backend, engine, run_id)
    opened = open_backend(settings, backend=backend)
    try:
        if base is not None:
            await _import_local(settings, opened.backend, base)
        snapshot_id = await opened.backend.snapshot_files(files, label=f"{run_id}:{phase}:v{invocation}", base=base)
        await _export_local(settings, opened.backend, snapshot_id)
    finally:
        await opened.backend.close()
    await record_snapshot(engine=engine, run_id=run_id, phase=phase, invocation=invocation, snapshot_id=snapshot_id,
                          emit=emit)
    return snapshot_id


async def put_file(box: Sandbox, name: str, data: bytes) -> None:
    """``data`` as ``name`` in the sandbox's working directory."""
    await box.backend.write_file(box.info.sandbox_id, name, data)


def runtime_files(impl_source: str) -> dict[str, bytes]:
    """What ``put_runtime`` puts in a sandbox's working directory: the scorer runtime and task_impl.py."""
    return {"runner.py": Path(RUNNER).read_bytes(), "task_impl.py": impl_source.encode()}


async def put_runtime(box: Sandbox, impl_source: str) -> None:
    """The scorer runtime and task_impl.py into the sandbox's working directory."""
    for name, data in runtime_files(impl_source).items():
        await put_file(box, name, data)


__all__ = ["DEPS_DIR", "SNAPSHOTS", "Emit", "Sandbox", "latest_snapshot", "open_sandbox", "put_file", "put_runtime",
           "record_snapshot", "run_backend", "runtime_files", "snapshot_files", "snapshot_of",
           "take_snapshot"]
