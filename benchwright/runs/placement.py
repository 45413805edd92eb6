"""Where a Materialize batch's trials run (§2 "Materialize", §4): the domain's placement of one batch.

``run_placed_batch`` is the batch: a harness-bridge run's harness process (``benchwright.harness.batch``), a
product-sandbox run's agents in task sandboxes (``benchwright.product.batch``), or the scorer runtime in one work
sandbox (``sequential``) or in one task sandbox per task (``fanout``), each restored from the post-Atomize snapshot,
run by ``benchwright.runs.materialize.run_batch``. The batch activity
(``activities.materialize``) keeps what every batch has around it: heartbeats, the halt watch, the SUT client and
its breaker, error mapping.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from benchwright.drivers.templates import prime_source
from benchwright.harness.batch import bridge_batch
from benchwright.llm.sut import SutClient
from benchwright.product.batch import is_product_run, product_batch
from benchwright.proxy.model_proxy import ProxyHandle
from benchwright.runs.limits import ScorerCeilings
from benchwright.runs.materialize import Execute, run_batch, scorer_threads
from benchwright.runs.pipeline import MaterializeBatchInput, MaterializeBatchResult
from benchwright.sandbox import ExecLimits, LocalBackend
from benchwright.sandbox.lifecycle import Sandbox, open_sandbox, snapshot_of
from benchwright.sandbox.local import WORK_INSIDE
from benchwright.sandbox.local.warm import RuntimeSpec, WarmPool, start_warm_pool
from benchwright.scoring.host import RUNNER, TrialItem, TrialLimits, TrialRecord, run_trials, runner_env
from benchwright.settings import Settings
from benchwright.store.db import outage_tolerant
from benchwright.store.models import Run

SANDBOX_MARGIN_S = 60.0
"""The scorer sandbox outlives the batch's ceiling by this much: the host settles the trials and kills the runtime
at the ceiling itself; the sandbox's own limits are the backstop."""


def scorer_limits(threads: int, ceilings: ScorerCeilings) -> ExecLimits:
    """The scorer runtime's sandbox limits for a batch run on ``threads`` scorer threads."""
    # The runner's threads count against the process limit; leave room for what the scorer itself starts. One
    # core: the runner is one Python process (one GIL), so only a scorer's own runaway children would want more;
    # at one core its CPU time cannot exceed its wall time, so both share the batch's ceiling.
    bound = ceilings.batch_duration_s + SANDBOX_MARGIN_S
    return ExecLimits(cpu_seconds=int(bound), memory_mb=2048, wall_seconds=bound, max_processes=threads + 64,
                      cpu_cores=1.0)


def warm_runtime(settings: Settings) -> RuntimeSpec:
    """The scorer runtime a warm sandbox keeps waiting (``benchwright.sandbox.local.warm``): what ``sequential``
    starts for a batch on one scorer thread, so it stands for any batch's runtime on this deployment (the thread
    count, and with it the process limit, is set when it is handed over)."""
    return RuntimeSpec(argv=(sys.executable, "runner.py"), source=RUNNER.read_bytes(), env=runner_env(WORK_INSIDE),
                       limits=scorer_limits(1, ScorerCeilings.of(settings)), prime=prime_source().encode())


async def start_warm_sandboxes(settings: Settings) -> WarmPool | None:
    """A worker's warm sandboxes on its local backend (``settings.sandbox_warm_pool`` of them; None for 0). Stop
    them with ``benchwright.sandbox.local.warm.stop_warm_pool`` before the worker's own sandboxes are reaped."""
    if settings.sandbox_warm_pool <= 0:
        return None
    return await start_warm_pool(LocalBackend(settings.sandboxes_dir()), size=settings.sandbox_warm_pool,
                                 runtime=warm_runtime(settings))


def scorer_env(proxy: ProxyHandle | None, box: Sandbox) -> dict[str, str]:
    """The scorer's environment: a fake key and the proxy's URL when the run has a model proxy, never more."""
    extra = {"OPENAI_BASE_URL": proxy.base_url, "OPENAI_API_KEY": proxy.fake_key} if proxy else {}
    return box.scorer_env(extra)


def allowed_internal(proxy: ProxyHandle | None) -> frozenset[tuple[str, int]]:
    """The one internal address a scorer sandbox may reach: the run's model proxy, when it has one."""
    return frozenset({("127.0.0.1", proxy.port)}) if proxy else frozenset()


def sequential(*, engine: Engine, settings: Settings, inp: MaterializeBatchInput, sut: SutClient,
               proxy: ProxyHandle | None, ceilings: ScorerCeilings, run: Run | None = None) -> Execute:
    """Every trial of the batch in one work sandbox restored from the post-Atomize snapshot."""

    async def execute(items: list[TrialItem], on_record: Callable[[TrialRecord], Awaitable[None]],
                      limits: TrialLimits) -> None:
        if not items:
            return
        threads = scorer_threads(inp.concurrency, len(items))
        snapshot = await outage_tolerant(snapshot_of, engine, inp.run_id, "atomize")
        async with open_sandbox(engine=engine, settings=settings, run_id=inp.run_id, role="work",
                                key=("materialize", inp.invocation, inp.start), restore=snapshot,
                                internal_allowed=allowed_internal(proxy), run=run) as box:
            await run_trials(spawn=box.spawn(scorer_env(proxy, box), scorer_limits(threads, ceilings)),
                             items=items, sut=sut, threads=threads, on_record=on_record, limits=limits, reap=False)

    return execute


def fanout(*, engine: Engine, settings: Settings, inp: MaterializeBatchInput, sut: SutClient,
           proxy: ProxyHandle | None, ceilings: ScorerCeilings, run: Run | None = None) -> Execute:
    """Each task in its own task sandbox, restored from the post-Atomize snapshot and killed when it ends."""

    async def execute(items: list[TrialItem], on_record: Callable[[TrialRecord], Awaitable[None]],
                      limits: TrialLimits) -> None:
        by_task: dict[int, list[TrialItem]] = {}
        for item in items:
            by_task.setdefault(item.index, []).append(item)
        # Task sandboxes in existence at once: each costs a namespace set-up and a process tree, so the
        # machine's cores bound them rather than the run's model-call concurrency.
        gate = asyncio.Semaphore(max(1, min(inp.concurrency, settings.fanout_sandboxes)))
        snapshot = await outage_tolerant(snapshot_of, engine, inp.run_id, "atomize")

        async def one(index: int, trials: list[TrialItem]) -> None:
            async with gate, open_sandbox(engine=engine, settings=settings, run_id=inp.run_id, role="task",
                                          key=("materialize", inp.invocation, index),
                                          restore=snapshot, internal_allowed=allowed_internal(proxy),
                                          metadata={"task_index": index}, run=run) as box:
                spawn = box.spawn(scorer_env(proxy, box), scorer_limits(len(trials), ceilings))
                await run_trials(spawn=spawn, items=trials, sut=sut, threads=len(trials), on_record=on_record,
                                 limits=limits, reap=False)

        async with asyncio.TaskGroup() as group:  # one failure cancels the siblings
            for index, trials in by_task.items():
                group.create_task(one(index, trials))

    return execute


async def run_placed_batch(*, engine: Engine, settings: Settings, inp: MaterializeBatchInput, sut: SutClient,
                           proxy: ProxyHandle | None, workdir: Path, progress: Callable[[dict[str, Any]], None],
                           ceilings: ScorerCeilings, attempt: int = 1, run: Run | None = None
                           ) -> MaterializeBatchResult:
    """One batch where its mode places it: the harness process (``bridge``), a task sandbox per task (``fanout``;
    a product run's agents or the scorer) or one work sandbox (otherwise). ``attempt``: the batch activity's.
    ``run``: the run's row as the batch read it (its scorer's sandboxes open with it rather than read it again).

    Raises:
        RunHalted: a commit crossed a ceiling or the balance.
    """
    if inp.mode == "bridge":  # a harness-bridge run: the harness process is the whole batch
        return await bridge_batch(engine=engine, settings=settings, inp=inp, sut=sut, progress=progress)
    if inp.mode == "fanout" and await is_product_run(engine, inp.run_id):  # agents in task sandboxes
        return await product_batch(engine=engine, settings=settings, workdir=workdir, inp=inp, sut=sut,
                                   progress=progress, attempt=attempt)
    place = fanout if inp.mode == "fanout" else sequential
    execute = place(engine=engine, settings=settings, inp=inp, sut=sut, proxy=proxy, ceilings=ceilings, run=run)
    return await run_batch(engine=engine, inp=inp, tasks_path=workdir / "tasks.jsonl", execute=execute,
                           progress=progress, ceilings=ceilings)
