"""Materialize for a harness-bridge run: the harness process in the work sandbox, its samples into the log.

``benchwright.runs.placement.run_placed_batch`` runs ``bridge_batch`` for a ``mode="bridge"`` batch; the batch
activity (``activities.materialize``) keeps what every batch has: heartbeats, the halt watcher (a stop cancels this
coroutine; leaving the sandbox block kills the harness's whole PID namespace), the SUT breaker. The harness runs
from its installed runtime (mounted read-only), restored from the post-Setup snapshot, and reaches the model only
through the relay's one loopback endpoint via the sandbox's egress proxy (``benchwright.harness.relay``).

harbor is the same batch with a ``harbor_orchestrator`` sandbox running harbor on a copy of the task set, and a
task-environment broker (``benchwright.harness.harbor.TaskEnvBroker``) beside the relay that opens one
``harbor_task_env`` sandbox per trial on the run's backend (``SandboxCreated``/``SandboxKilled`` each) and kills
whatever is still open when the batch ends. On a remote run the orchestrator stays on the worker's local backend
(where harbor's venv is) and only the task sandboxes are remote (``benchwright.harness.harbor_remote``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from benchwright.errors import Unavailable
from benchwright.events import HarnessLogArtifact, HarnessTaskArtifact
from benchwright.fingerprint import sha256_hex
from benchwright.harness.artifacts import store_artifact
from benchwright.harness.bridge import CONFIG, SCRIPT, BridgeFailed, BridgeRecorder, plan_bridge
from benchwright.harness.config import HARBOR_MODEL_AGENTS, HarnessConfig, check_harness, sample_limit
from benchwright.harness.harbor import (
    HARBOR_AGENT_KWARGS,
    TASKS_DIR,
    EnvPlan,
    TaskEnvBroker,
    environment_plans,
    harbor_model_env,
    harbor_model_name,
    resolve_task_set,
    task_files,
)
from benchwright.harness.harbor_remote import env_options, place_plans
from benchwright.harness.install import RUNTIMES, base_prefix, harness_root, installed
from benchwright.harness.relay import Relay
from benchwright.llm.sut import SutClient
from benchwright.runs.limits import RunLimits
from benchwright.runs.pipeline import MaterializeBatchInput, MaterializeBatchResult
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.lifecycle import Sandbox, open_sandbox, put_file, snapshot_of
from benchwright.sandbox.local import ROOT_LINKS_KEY
from benchwright.schemas import LaunchRequest
from benchwright.settings import Settings
from benchwright.store.db import outage_tolerant
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import get_run

STDERR_TAIL_LINES = 40
MEMORY_MB = 4096
"""lm-eval imports torch (~1 GB resident with its CPU kernels); inspect needs far less."""


async def bridge_batch(*, engine: Engine, settings: Settings, inp: MaterializeBatchInput, sut: SutClient,
                       progress: Callable[[dict[str, Any]], None]) -> MaterializeBatchResult:
    """Run the launch's harness task to the end (skipping what earlier attempts recorded) and record it.

    Raises:
        Unavailable: the harness's runtime is not installed on this worker.
        BridgeFailed: the harness ended without finishing (its stderr's tail is in the message).
        RunHalted: a commit crossed run.cost.
    """
    run = await outage_tolerant(get_run, engine, run_id=inp.run_id)
    launch = LaunchRequest.model_validate(run.launch)
    config = check_harness(launch)
    assert config is not None and launch.harness is not None  # a bridge batch is planned for bridge launches only
    root = harness_root(data_dir=settings.data_dir, harness_dir=settings.harness_dir)
    runtime = installed(root, launch.harness)
    if runtime is None:
        raise Unavailable(f"the {launch.harness} harness is not installed on this worker (under {root}); run "
                          f"`benchwright harness install {launch.harness}`")
    runtime = runtime.resolve()  # mounted and run at its real path (the sandbox has no symlinks of the host's)
    await outage_tolerant(append_events, engine, inp.run_id, [NewEvent.of(
        event_key(inp.run_id, "materialize", inp.invocation, "harness-task"),
        HarnessTaskArtifact(harness=launch.harness, version=RUNTIMES[launch.harness].version,
                            task=config.task or config.task_name or config.path,
                            config_sha256=sha256_hex(config.model_dump(mode="json"))))])
    relay = Relay(sut)
    recorder = BridgeRecorder(engine=engine, inp=inp, harness=launch.harness, meter=relay.meter,
                              progress=progress)
    done = await recorder.load()
    limit = sample_limit(config, RunLimits.model_validate(run.limits or {}))
    if launch.harness == "harbor":
        return await _harbor_batch(engine=engine, settings=settings, inp=inp, config=config, runtime=runtime,
                                   root=root, recorder=recorder, limit=limit, done=done, relay=relay,
                                   model=launch.model.identifier, backend=run.backend or "local")
    setup_snapshot = await outage_tolerant(snapshot_of, engine, inp.run_id, "setup")
    async with relay as endpoint, open_sandbox(
            engine=engine, settings=settings, run_id=inp.run_id, role="work",
            key=("materialize", inp.invocation, "bridge"), restore=setup_snapshot,
            internal_allowed=frozenset({("127.0.0.1", endpoint.port)}),
            metadata={"harness": launch.harness}, ro_paths=(runtime,)) as box:
        plan = plan_bridge(harness=launch.harness, config=config, model=launch.model.identifier, endpoint=endpoint,
                           home=box.home, limit=limit, done=done, concurrency=inp.concurrency)
        for name, data in plan.files.items():
            await put_file(box, name, data)
        bound = settings.materialize_batch_duration_s
        await _run_harness(box, runtime=runtime, env=plan.env, bound=bound, recorder=recorder, harness=launch.harness)
        await _keep_log(engine, settings, box, inp=inp, harness=launch.harness, path=recorder.done_line.get("log")
                        if recorder.done_line else None, home=box.home)
    return recorder.result()


async def _run_harness(box: Sandbox, *, runtime: Path, env: dict[str, str], bound: float, recorder: BridgeRecorder,
                       harness: str) -> None:
    """The sandbox-side script under the harness's interpreter, its lines into the recorder until it ends.

    Raises:
        BridgeFailed: it ended without its ``done`` line.
    """
    proc = await box.backend.spawn(box.info.sandbox_id, [str(runtime / "bin" / "python"), SCRIPT],
                                   env=box.scorer_env(env),
                                   limits=ExecLimits(cpu_seconds=int(bound), memory_mb=MEMORY_MB,
                                                     wall_seconds=bound, max_processes=512, cpu_cores=1.0))
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)

    async def drain_stderr() -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            tail.append(line.decode(errors="replace").rstrip())

    stderr = asyncio.create_task(drain_stderr())
    try:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            await recorder.line(line)
        await proc.wait()
        await asyncio.gather(stderr, return_exceptions=True)
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.shield(proc.wait())
        stderr.cancel()
    await recorder.flush()
    if recorder.done_line is None:
        reason = f", {proc.killed_reason}" if proc.killed_reason else ""
        raise BridgeFailed(f"the {harness} harness exited with {proc.returncode}{reason} before finishing: "
                           + "\n".join(tail)[-3000:])


async def _harbor_batch(*, engine: Engine, settings: Settings, inp: MaterializeBatchInput, config: HarnessConfig,
                        runtime: Path, root: Path, recorder: BridgeRecorder, limit: int | None, done: list[int],
                        relay: Relay, model: str, backend: str) -> MaterializeBatchResult:
    """harbor in a ``harbor_orchestrator`` sandbox, each trial's environment a ``harbor_task_env`` sandbox on the
    run's ``backend`` (the orchestrator is on the worker's local backend, where harbor's venv is: see
    ``benchwright.harness.harbor_remote``); a model-driven agent (``terminus-2``) runs in harbor's process and
    reaches the model only through ``relay``.

    Raises:
        InvalidInput: the task set cannot be found or one of its environments cannot be mapped on ``backend``
            (before harbor runs).
    """
    assert config.path is not None  # checked at launch
    tasks = await outage_tolerant(resolve_task_set, config.path, harness_dir=root)
    plans = place_plans(await outage_tolerant(environment_plans, tasks), backend=backend,
                        templates=settings.harbor_templates)
    files = await outage_tolerant(task_files, tasks)
    base = base_prefix(runtime)
    ro_paths = (runtime, *((base.resolve(),) if base is not None else ()))

    def open_env(session: str, plan: EnvPlan) -> AbstractAsyncContextManager[Sandbox]:
        return open_sandbox(engine=engine, settings=settings, run_id=inp.run_id, role="harbor_task_env",
                            key=("materialize", inp.invocation, "harbor", session), restore=None,
                            metadata={"harbor_session": session, ROOT_LINKS_KEY: plan.root_links,
                                      **({"template": plan.template} if plan.template else {})},
                            backend_options=env_options(plan))

    agent = config.agent or "oracle"
    uses_model = agent in HARBOR_MODEL_AGENTS
    broker = TaskEnvBroker(plans, open_env, tasks_root=TASKS_DIR,
                           max_opened=2 * len(tasks.tasks) * inp.trials.plan.k, terminal=uses_model)
    async with contextlib.AsyncExitStack() as stack:
        url, key, port = await stack.enter_async_context(broker)
        allowed = {("127.0.0.1", port)}
        model_env: dict[str, str] = {}
        if uses_model:
            endpoint = await stack.enter_async_context(relay)
            allowed.add(("127.0.0.1", endpoint.port))
            model_env = harbor_model_env(endpoint)
        box = await stack.enter_async_context(open_sandbox(
            engine=engine, settings=settings, run_id=inp.run_id, role="harbor_orchestrator",
            key=("materialize", inp.invocation, "harbor"),
            # A remote run's Setup snapshot is in the remote backend's format; harbor runs from its own venv.
            restore=await outage_tolerant(snapshot_of, engine, inp.run_id, "setup") if backend == "local" else None,
            internal_allowed=frozenset(allowed), metadata={"harness": "harbor"}, ro_paths=ro_paths,
            on_worker=backend != "local"))
        broker.tasks_root = f"{box.home}/{TASKS_DIR}"
        for name, data in files.items():
            await put_file(box, f"{TASKS_DIR}/{name}", data)
        names = [t.relative_to(tasks.root).as_posix() if t != tasks.root else t.name for t in tasks.tasks]
        harbor_config = {"tasks": [f"{box.home}/{TASKS_DIR}/{n}" for n in names], "agent": agent,
                         "model": harbor_model_name(model) if uses_model else None,
                         "agent_kwargs": HARBOR_AGENT_KWARGS.get(agent, {}),
                         "attempts": inp.trials.plan.k, "limit": limit, "done": done,
                         "jobs_dir": f"{box.home}/bw_jobs", "job_name": "benchwright",
                         "concurrency": max(1, min(inp.concurrency, 4))}
        await put_file(box, SCRIPT, resources.files("benchwright.harness").joinpath(
            "sandbox_side/harbor_bridge.py").read_bytes())
        await put_file(box, "bw_harbor_env.py", resources.files("benchwright.harness").joinpath(
            "sandbox_side/bw_harbor_env.py").read_bytes())
        await put_file(box, CONFIG, json.dumps(harbor_config).encode())
        env = {"BW_HARBOR_ENV_URL": url, "BW_HARBOR_ENV_KEY": key, "HARBOR_TELEMETRY": "off", "DO_NOT_TRACK": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "HOME": box.home,
               "XDG_CACHE_HOME": f"{box.home}/.bw_cache", "XDG_CONFIG_HOME": f"{box.home}/.bw_config",
               "XDG_DATA_HOME": f"{box.home}/.bw_data", **model_env}
        await _run_harness(box, runtime=runtime, env=env, bound=settings.materialize_batch_duration_s,
                           recorder=recorder, harness="harbor")
        await _keep_log(engine, settings, box, inp=inp, harness="harbor", path=recorder.done_line.get("log")
                        if recorder.done_line else None, home=box.home)
    return recorder.result()


async def _keep_log(engine: Engine, settings: Settings, box: Any, *, inp: MaterializeBatchInput, harness: str,
                    path: object, home: str) -> None:
    """The harness's native log as a run artifact (none when a resumed batch had nothing left to run)."""
    if not isinstance(path, str) or not path:
        return
    relative = os.path.relpath(path, home) if os.path.isabs(path) else path
    data = await box.backend.read_file(box.info.sandbox_id, relative)
    digest = await outage_tolerant(store_artifact, settings.data_dir, run_id=inp.run_id, data=data)
    await outage_tolerant(append_events, engine, inp.run_id, [NewEvent.of(
        event_key(inp.run_id, "materialize", inp.invocation, "harness-log", digest),
        HarnessLogArtifact(harness=harness, filename=Path(relative).name, sha256=digest, bytes=len(data)))])
