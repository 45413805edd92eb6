"""Wiring only: build the Temporal worker that runs RunWorkflow and the phase activities."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import hashlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import temporalio
from sqlalchemy.engine import Engine
from temporalio.client import Client
from temporalio.worker import Worker

from activities.analyze import AnalyzeActivities
from activities.atomize import AtomizeActivities
from activities.attach import AttachActivities
from activities.chain import PhaseChainActivities
from activities.common import Deps
from activities.fair_share import FairShareInterceptor
from activities.fetch import FetchActivities
from activities.find import FindActivities
from activities.fork import ForkActivities
from activities.materialize import MaterializeActivities
from activities.operator import OperatorActivities, OperatorLlmActivities
from activities.regression import RegressionActivities
from activities.report import ReportActivities
from activities.run_log import ControlActivities, RunLogActivities
from activities.setup import SetupActivities
from benchwright.drivers.llm import install_llm_driver
from benchwright.llm.httpclient import ConnectionShelf
from benchwright.proxy.model_proxy import keep_proxies_ready
from benchwright.runs.placement import start_warm_sandboxes
from benchwright.sandbox.local.warm import stop_warm_pool
from benchwright.security.crypto import load_keyring
from benchwright.security.fair_share import FairShare, running_accounts
from benchwright.settings import Settings
from benchwright.stack.cpu import pin_threads
from benchwright.stack.procreg import ProcessRegistry
from benchwright.stack.teardown import reap_worker_leftovers, release_worker, sweep_routes, sweep_workdirs
from benchwright.stack.workflow_runner import workflow_runner
from benchwright.store.db import outage_tolerant
from benchwright.store.policy import prepare_secrets
from workflows.operator import OperatorWorkflow
from workflows.regression import RegressionWorkflow
from workflows.run import RunWorkflow

log = logging.getLogger("benchwright.worker")

# Modules the workflow sandbox shares with the worker instead of re-importing per run (10x cheaper, and SQLModel
# tables cannot be defined twice). None of them is used for I/O from workflow code.
PASSTHROUGH = ("benchwright", "pydantic", "pydantic_core", "sqlmodel", "sqlalchemy", "yaml", "httpx")


def workflow_build_id() -> str:
    """This worker's build id: a digest of the workflow code it runs (``workflows/*.py``) and of the SDK's version.
    Given none, Temporal makes one by hashing the code of every module loaded (~1,300 here), compiling each whose
    bytecode is not cached: 3.4 s of CPU at each start of a worker whose bytecode cache (``cache_bytecode``, under its
    data directory) is new, as in every test stack and bench. The id is informational: this worker does not opt into
    Temporal's worker versioning."""
    digest = hashlib.sha256(temporalio.__version__.encode())
    for path in sorted((Path(__file__).resolve().parent / "workflows").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"benchwright-{digest.hexdigest()[:16]}"


class StackWorker(Worker):
    """A Temporal worker that, while it runs, revokes its credential proxy's routes of runs that ended (the run's own
    revocation reaches only the worker that runs it) and removes ended runs' work directories, and once shut down
    (its activities cancelled and finished) kills the sandboxes and stops the model proxies its process started: a
    worker leaves nothing running behind it, in-process (tests) or not."""

    def __init__(self, client: Client, *, settings: Settings, engine: Engine, share: FairShare | None = None,
                 connections: ConnectionShelf | None = None, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._settings = settings
        self._engine = engine
        self._share = share
        self._connections = connections

    async def run(self) -> None:
        stop_sweep = asyncio.Event()
        sweeps = [asyncio.create_task(sweep(settings=self._settings, engine=self._engine, stop=stop_sweep))
                  for sweep in (sweep_routes, sweep_workdirs)]
        lag = asyncio.create_task(self._share.watch(self._running)) if self._share else None  # the fair share's probe
        try:
            await super().run()
        finally:
            if lag:
                lag.cancel()
            if self._connections is not None:
                self._connections.close()
            stop_sweep.set()
            await asyncio.shield(_release(sweeps, settings=self._settings))


    async def _running(self) -> set[str]:
        return await outage_tolerant(running_accounts, self._engine)


async def _release(sweeps: list[asyncio.Task[None]], *, settings: Settings) -> None:
    await asyncio.wait(sweeps)  # a sweep under way finishes before the proxies it talks to are stopped
    await release_worker(settings=settings)


def build_worker(client: Client, *, settings: Settings, engine: Engine, task_queue: str | None = None) -> Worker:
    prepare_secrets(engine, load_keyring(settings))  # refuses to start with encrypted secrets and no key
    deps = Deps(engine=engine, settings=settings)
    install_llm_driver(engine=engine, settings=settings)  # driver_for('<provider>://<model>') in this worker
    # Alone, an account's phases and batch starts (CPU-bound: sandboxes, scorer runtimes) go as many at once as cores.
    share = FairShare(phase_slots=settings.fair_phase_slots, lag_target_s=settings.fair_lag_target_ms / 1000,
                      alone_phase_slots=(os.cpu_count() or 1))
    # The batches' connections to the worker's credential proxy outlive each batch: the next one starts with them.
    connections = ConnectionShelf()
    materialize = MaterializeActivities(deps, share, connections)
    attach = AttachActivities(deps)
    run_log = RunLogActivities(deps)
    control = ControlActivities(deps)
    regression = RegressionActivities(deps)
    quick = {"fetch": FetchActivities(deps).fetch, "analyze": AnalyzeActivities(deps).analyze,
             "setup": SetupActivities(deps).setup, "attach": attach.attach, "atomize": AtomizeActivities(deps).atomize}
    activities = [
        ForkActivities(deps).fork,
        FindActivities(deps).find,
        *quick.values(),
        PhaseChainActivities(quick).quick_phases,  # the same instances: Atomize's remembered load checks are shared
        attach.stop_proxy,
        materialize.begin,
        materialize.batch,
        materialize.complete,
        run_log.record_events,
        run_log.finish,
        control.halt,
        control.clear,
        control.finish_halted,
        regression.start_replay,
        regression.check_replay,
        regression.post_alert,
        ReportActivities(deps).report,
    ]
    operator = OperatorActivities(deps, client)
    activities += [operator.plan, operator.launch, operator.wait, operator.record, operator.answer,
                   operator.halt_runs, operator.extend]
    llm_operator = OperatorLlmActivities(deps, client)
    activities += [llm_operator.turn, llm_operator.tool, llm_operator.answer]
    return StackWorker(
        client,
        build_id=workflow_build_id(),
        settings=settings,
        engine=engine,
        share=share,
        connections=connections,
        interceptors=[FairShareInterceptor(share)],  # each account's share of this worker (security.fair_share)
        task_queue=task_queue or settings.task_queue,
        workflows=[RunWorkflow, RegressionWorkflow, OperatorWorkflow],
        activities=activities,
        max_concurrent_activities=settings.worker_max_activities,
        # Eager dispatch hands a workflow's next activity to the slot its last one freed, past the task queue: one
        # account's runs would keep the worker's slots and the queue's fairness (benchwright.security.quotas) never
        # apply.
        disable_eager_activity_execution=not settings.worker_eager_activities,
        # The sandbox, without a per-payload context lookup our converter takes nothing from
        # (benchwright.stack.workflow_runner).
        workflow_runner=workflow_runner(client.data_converter, PASSTHROUGH),
    )


def cache_bytecode(data_dir: Path) -> None:
    """Cache compiled modules under the data directory when the environment says not to write them beside the
    sources (``PYTHONDONTWRITEBYTECODE``). Temporal's workflow sandbox imports the workflow module afresh for every
    run, and without a cache it compiled ``workflows/run.py`` each time: ~6.5 ms of every run's first workflow task
    (py-spy, issue 25). The source tree stays as the environment wanted it."""
    if sys.dont_write_bytecode and sys.pycache_prefix is None:
        sys.pycache_prefix = str(data_dir / "pycache")
        sys.dont_write_bytecode = False


async def run_worker(settings: Settings) -> None:
    """Connect, migrate the store, and poll the task queue until SIGTERM/SIGINT; then shut down cleanly (activities
    cancelled, this worker's sandboxes killed and model proxies stopped) and return."""
    from benchwright.stack.temporal_client import connect
    from benchwright.store.db import make_engine, migrate

    cpu = pin_threads(settings.worker_cpu)  # first: the threads started from here on inherit it
    if cpu is not None:
        log.info("the worker's threads run on CPU %d (BENCHWRIGHT_WORKER_CPU=%s)", cpu, settings.worker_cpu)
    ProcessRegistry(settings.data_dir).record(kind="worker", pid=os.getpid(), group=os.getpgid(0) == os.getpid())
    cache_bytecode(settings.data_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    prepare_secrets(engine, load_keyring(settings))  # before anything runs: no key for encrypted secrets, no start
    # What dead workers left (a SIGKILL runs no cleanup) is killed before this one polls.
    await reap_worker_leftovers(settings=settings, engine=engine)
    client = await connect(settings)
    worker = build_worker(client, settings=settings, engine=engine)
    # Everything loaded so far (SDK, SQLAlchemy, pydantic schemas: ~100 MB of objects) lives as long as the process;
    # frozen, the cyclic collector stops re-scanning it in every full collection during a sweep.
    gc.freeze()
    # Sandboxes made ahead, each with a scorer runtime waiting (issue 25); stopped before the worker's shutdown
    # reaps its own sandboxes, so no new one is made after that sweep.
    warm = await start_warm_sandboxes(settings)
    # A credential proxy started ahead, and again whenever one lingered out; stopped before the worker's shutdown
    # stops the proxies it started, so none is started after that.
    stop_spares = asyncio.Event()
    spares = asyncio.create_task(keep_proxies_ready(
        registry=ProcessRegistry(settings.data_dir), linger_s=settings.proxy_linger_s, every_s=PROXY_READY_EVERY_S,
        stop=stop_spares)) if settings.proxy_keep_ready else None

    async def stop_keeping_spares() -> None:
        stop_spares.set()
        if spares is not None and not spares.done():
            await spares

    slow: asyncio.Task[None] | None = None
    try:
        async with worker:
            await stop.wait()
            slow = asyncio.create_task(_say_where_a_slow_shutdown_is())
            await stop_keeping_spares()
            if warm is not None:
                await stop_warm_pool(warm)
                warm = None
    finally:
        await stop_keeping_spares()
        if warm is not None:
            await stop_warm_pool(warm)
        if slow is not None:  # the threads' dump stays armed: asyncio.run then waits for the executor's threads
            slow.cancel()


PROXY_READY_EVERY_S = 2.0
"""How often a worker looks whether its credential proxy is up (and starts a spare when it is not)."""
SLOW_SHUTDOWN_S = 10.0
"""A shutdown still under way this long after SIGTERM writes where it is to the log (stderr): ``benchwright up``
kills a worker that has not stopped within two thirds of its shutdown timeout (20 s by default)."""


async def _say_where_a_slow_shutdown_is() -> None:
    """After ``SLOW_SHUTDOWN_S``: every thread's stack (``faulthandler``, written even if the event loop is stuck)
    and every task's."""
    faulthandler.dump_traceback_later(SLOW_SHUTDOWN_S)
    await asyncio.sleep(SLOW_SHUTDOWN_S)
    me = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not me]
    print(f"the worker's shutdown is still under way after {SLOW_SHUTDOWN_S:.0f} s; its {len(tasks)} tasks:",
          file=sys.stderr)
    for task in tasks:
        task.print_stack(file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(run_worker(Settings()))
