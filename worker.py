"""Wiring only: build the Temporal worker that runs RunWorkflow and the phase activities."""

from __future__ import annotations

import asyncio
import gc

from sqlalchemy.engine import Engine
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.analyze import AnalyzeActivities
from activities.atomize import AtomizeActivities
from activities.attach import AttachActivities
from activities.common import Deps
from activities.fetch import FetchActivities
from activities.materialize import MaterializeActivities
from activities.run_log import ControlActivities, RunLogActivities
from activities.sandboxes import reap_orphans
from activities.setup import SetupActivities
from benchwright.settings import Settings
from workflows.run import RunWorkflow

# Modules the workflow sandbox shares with the worker instead of re-importing per run (10x cheaper, and SQLModel
# tables cannot be defined twice). None of them is used for I/O from workflow code.
PASSTHROUGH = ("benchwright", "pydantic", "pydantic_core", "sqlmodel", "sqlalchemy", "yaml", "httpx")


def build_worker(client: Client, *, settings: Settings, engine: Engine, task_queue: str | None = None) -> Worker:
    deps = Deps(engine=engine, settings=settings)
    materialize = MaterializeActivities(deps)
    attach = AttachActivities(deps)
    run_log = RunLogActivities(deps)
    control = ControlActivities(deps)
    activities = [
        FetchActivities(deps).fetch,
        AnalyzeActivities(deps).analyze,
        SetupActivities(deps).setup,
        attach.attach,
        attach.stop_proxy,
        AtomizeActivities(deps).atomize,
        materialize.begin,
        materialize.batch,
        materialize.complete,
        run_log.record_events,
        run_log.finish,
        control.halt,
        control.clear,
        control.finish_halted,
    ]
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        workflows=[RunWorkflow],
        activities=activities,
        max_concurrent_activities=64,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)),
    )


async def run_worker(settings: Settings) -> None:
    """Connect, migrate the store, and poll the task queue until cancelled."""
    from benchwright.store.db import make_engine, migrate
    from benchwright.temporal_client import connect

    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    # Sandboxes left behind by a worker that died (a SIGKILL runs no cleanup) are killed before this one polls.
    await reap_orphans(Deps(engine=engine, settings=settings))
    client = await connect(settings)
    worker = build_worker(client, settings=settings, engine=engine)
    # Everything loaded so far (SDK, SQLAlchemy, pydantic schemas: ~100 MB of objects) lives as long as the process;
    # frozen, the cyclic collector stops re-scanning it in every full collection during a sweep.
    gc.freeze()
    await worker.run()


if __name__ == "__main__":
    asyncio.run(run_worker(Settings()))
