"""Nothing outlives the stack: what a worker releases when it stops, what it reaps when it starts, and the sweep
``benchwright up`` makes of its whole data directory when it stops and before it starts.

Three owners, three scopes (all within one data directory, never beyond it; other stacks run beside this one):

* a worker shutting down kills the sandboxes *it* created and stops the model proxies *it* started
  (``release_worker``); runs it leaves unfinished go on with another worker, which starts what it needs again;
* a worker starting reaps what dead workers left: sandboxes whose creator is gone, proxies whose worker is gone
  or whose run ended more than a linger ago (``reap_worker_leftovers``);
* a worker running revokes, every ``proxy_route_sweep_s``, its proxy's routes of runs that ended (``sweep_routes``):
  a run's own revocation reaches only the worker that runs it, and a phase on another host registered the run at
  that host's proxy too; and every ``workdir_sweep_s`` it removes the work directories of runs that ended more than
  ``workdir_linger_s`` ago (``sweep_workdirs``, ``benchwright.runs.workdirs``);
* the supervisor, when the stack stops and again before it starts (after a SIGKILL nothing of that ran), stops
  every process in the stack's registry, every proxy and every sandbox under the data directory
  (``reap_stack``): workers first (SIGTERM: they clean up their own), then the API and Temporal, then the rest.

A worker starting and the supervisor's sweep also remove the socket directories
(``benchwright.stack.procreg.owned_tempdir``) of processes that died without removing them: a SIGKILLed worker's
egress relays and its model proxy's control socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.engine import Engine

from benchwright.proxy.model_proxy import reap_model_proxies, stop_owned_proxies, sweep_ended_routes
from benchwright.runs.workdirs import sweep_ended_workdirs
from benchwright.sandbox import LocalBackend, SandboxInfo
from benchwright.sandbox.local import settle_kills
from benchwright.settings import Settings
from benchwright.stack.devstack import pid_alive
from benchwright.stack.procreg import ProcEntry, ProcessRegistry, sweep_owned_tempdirs

_log = logging.getLogger(__name__)


@dataclass
class Reaped:
    """What a sweep found still running."""

    processes: list[ProcEntry] = field(default_factory=list)
    proxies: int = 0
    sandboxes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.processes or self.proxies or self.sandboxes)

    def describe(self) -> str:
        kinds = ", ".join(f"{e.kind} {e.pid}" for e in self.processes) or "no stack processes"
        return f"{kinds}; {self.proxies} model proxies; {len(self.sandboxes)} sandboxes"


async def _reap_sandboxes(sandboxes_root: Path, which: Callable[[SandboxInfo], bool]) -> list[str]:
    # allow_unisolated: the reaper must see (and kill) unisolated sandboxes too; it creates none.
    backend = LocalBackend(sandboxes_root, allow_unisolated=True)
    try:
        return await backend.reap(which)
    finally:
        await backend.close()


def _owner(info: SandboxInfo) -> int | None:
    owner = info.metadata.get("owner_pid")
    return owner if isinstance(owner, int) else None


def run_finished_at(engine: Engine, run_id: str) -> float | None:
    """When the run ended (epoch seconds), None while it runs, 0.0 if the store does not know it."""
    from benchwright.errors import NotFound
    from benchwright.store.runs import get_run

    try:
        run = get_run(engine, run_id=run_id)
    except NotFound:
        return 0.0
    return run.finished_at.timestamp() if run.finished_at else None


_IN_CHUNK = 500
"""Run ids per ``IN (...)`` (SQLite's bound-parameter limit is 999 in older builds); a worker holds far fewer."""


def runs_ended_at(engine: Engine, run_ids: Sequence[str]) -> dict[str, float]:
    """Which of these runs ended, in one query: run id → epoch seconds it ended, 0.0 for a run the store does not
    know; runs still going are absent.

    Read through ``reader`` (on Postgres each statement alone in autocommit): every worker asks this every
    ``proxy_route_sweep_s``, and a transaction of its own ended in ROLLBACK, at which psycopg drops every statement
    it had prepared on that pooled connection (``DEALLOCATE ALL``), so the writers that took the connection next
    planned their statements afresh."""
    from sqlalchemy import select
    from sqlmodel import col

    from benchwright.store.db import reader
    from benchwright.store.models import Run

    found: dict[str, datetime | None] = {}
    with reader(engine).connect() as conn:
        for i in range(0, len(run_ids), _IN_CHUNK):
            chunk = list(run_ids[i:i + _IN_CHUNK])
            rows = conn.execute(select(col(Run.id), col(Run.finished_at)).where(col(Run.id).in_(chunk)))
            found.update({run_id: at for run_id, at in rows})
    ended: dict[str, float] = {}
    for run_id in run_ids:
        if run_id not in found:
            ended[run_id] = 0.0
        elif (at := found[run_id]) is not None:
            ended[run_id] = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()  # SQLite hands back naive UTC
    return ended


async def sweep_routes(*, settings: Settings, engine: Engine, stop: asyncio.Event) -> None:
    """Until ``stop`` is set: every ``settings.proxy_route_sweep_s``, revoke the routes this worker's handles hold
    for runs that ended (``sweep_ended_routes``). A sweep under way when ``stop`` is set finishes first (it is
    short: one query and one control-socket round trip per revoked route)."""
    registry, runs_dir = ProcessRegistry(settings.data_dir), settings.runs_dir()

    def sweep() -> int:
        return sweep_ended_routes(registry=registry, runs_dir=runs_dir, linger_s=settings.proxy_linger_s,
                                  ended_at=lambda run_ids: runs_ended_at(engine, run_ids))

    await _every(settings.proxy_route_sweep_s, stop, sweep, f"the route sweep of {runs_dir}",
                 "revoked %d route(s) of ended runs at this worker's credential proxy")


async def sweep_workdirs(*, settings: Settings, engine: Engine, stop: asyncio.Event) -> None:
    """Until ``stop`` is set: every ``settings.workdir_sweep_s``, remove the work directories of runs that ended more
    than ``settings.workdir_linger_s`` ago (``benchwright.runs.workdirs``)."""
    runs_dir = settings.runs_dir()

    def sweep() -> int:
        return sweep_ended_workdirs(runs_dir=runs_dir, linger_s=settings.workdir_linger_s,
                                    ended_at=lambda run_ids: runs_ended_at(engine, run_ids))

    await _every(settings.workdir_sweep_s, stop, sweep,
                 f"the work-directory sweep of {runs_dir}", "removed the work directories of %d ended run(s)")


async def _every(interval: float, stop: asyncio.Event, sweep: Callable[[], int], what: str, done: str) -> None:
    """Run ``sweep`` in a thread every ``interval`` seconds until ``stop`` is set (never with ``interval`` 0). A
    failed sweep is logged and the next one comes on time: a sweep never takes the worker down."""
    if interval <= 0:
        return
    while True:
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
            return
        except TimeoutError:
            pass
        try:
            count = await asyncio.to_thread(sweep)
        except Exception:  # noqa: BLE001 - the store or a proxy failing must not end the worker; the next sweep retries
            _log.exception("%s failed", what)
            continue
        if count:
            _log.info(done, count)


async def release_worker(*, settings: Settings) -> list[str]:
    """A worker's shutdown: kill the sandboxes this process created, stop the proxies it started.

    Returns the sandboxes killed (their activities were cancelled first, so normally none is left).
    """
    await asyncio.to_thread(stop_owned_proxies, ProcessRegistry(settings.data_dir))
    await settle_kills()  # the ended sandboxes' remains, before the sweep below would remove them a second time
    me = os.getpid()
    return await _reap_sandboxes(settings.sandboxes_dir(), lambda info: _owner(info) == me)


async def reap_worker_leftovers(*, settings: Settings, engine: Engine) -> list[str]:
    """A worker's start: sandboxes whose creator died (a SIGKILL runs no cleanup) and proxies nobody will stop.

    Returns the sandboxes killed.
    """
    await asyncio.to_thread(reap_model_proxies, registry=ProcessRegistry(settings.data_dir),
                            runs_dir=settings.runs_dir(), finished_at=lambda run_id: run_finished_at(engine, run_id),
                            linger_s=settings.proxy_linger_s)

    def orphan(info: SandboxInfo) -> bool:
        owner = _owner(info)
        return owner is not None and not pid_alive(owner)

    killed = await _reap_sandboxes(settings.sandboxes_dir(), orphan) + await _reap_remote(settings=settings,
                                                                                          engine=engine)
    await asyncio.to_thread(sweep_owned_tempdirs)  # the sockets' directories of processes SIGKILLed
    return killed


async def _reap_remote(*, settings: Settings, engine: Engine) -> list[str]:
    """Pods and micro-VMs (from their labels / metadata) of runs that have ended: whatever worker made them died
    before it could kill them. A live run's sandboxes are left alone (no host can tell whether another worker's
    process still uses them); they go when the run ends and the next worker starts."""
    from benchwright.sandbox.factory import open_backend

    def ended(info: SandboxInfo) -> bool:
        run_id = info.metadata.get("benchwright_run_id")
        return isinstance(run_id, str) and run_finished_at(engine, run_id) is not None

    reaped: list[str] = []
    for name in settings.configured_backends():
        if name == "local":
            continue
        opened = open_backend(settings, backend=name)
        try:
            reaped += await opened.backend.reap(ended)
        finally:
            await opened.backend.close()
    return reaped


def reap_stack(*, data_dir: Path, workers_timeout_s: float, others_timeout_s: float) -> Reaped:
    """Stop everything the data directory's stack started, except supervisors (the caller, or a live one it must
    not touch: ``benchwright up`` holds the data directory's lock, so none other is alive when this runs).

    Workers get ``workers_timeout_s`` after SIGTERM to cancel their activities and kill their own sandboxes and
    proxies; the API and Temporal ``others_timeout_s``; then SIGKILL. Whatever remains (sandboxes and proxies of
    workers that were SIGKILLed, or of a stack that crashed) is killed last.
    """
    settings = Settings(data_dir=data_dir)
    registry = ProcessRegistry(data_dir)
    reaped = Reaped()
    reaped.processes += registry.stop(registry.live(kinds=("worker",)), timeout_s=workers_timeout_s)
    reaped.processes += registry.stop(registry.live(kinds=("api", "temporal")), timeout_s=others_timeout_s)
    reaped.proxies = reap_model_proxies(registry=registry, runs_dir=settings.runs_dir(), finished_at=lambda _: None,
                                        linger_s=0.0, everything=True)
    reaped.sandboxes = asyncio.run(_reap_sandboxes(settings.sandboxes_dir(), lambda _: True))
    # A directory without meta.json (its creator died between mkdir and the first write) has no process and no
    # cgroup yet; with the whole stack down nothing else can be using it.
    for stray in (settings.sandboxes_dir() / "sandboxes").glob("sb-*"):
        shutil.rmtree(stray, ignore_errors=True)
    sweep_owned_tempdirs()  # the directories of the sockets of processes that were SIGKILLed (a worker's relays)
    return reaped
