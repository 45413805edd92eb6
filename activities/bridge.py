"""Materialize for a harness-bridge run: the harness process in the work sandbox, its samples into the log.

The batch activity (``activities.materialize``) calls ``bridge_batch`` for a ``mode="bridge"`` batch and keeps
what every batch has: heartbeats, the halt watcher (a stop cancels this coroutine; leaving the sandbox block kills
the harness's whole PID namespace), the SUT breaker. The harness runs from its installed runtime (mounted
read-only), restored from the post-Setup snapshot, and reaches the model only through the relay's one loopback
endpoint via the sandbox's egress proxy (``benchwright.harness.relay``).
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from activities.common import Deps, in_thread
from activities.sandboxes import put_file, sandbox, snapshot_of
from benchwright.errors import Unavailable
from benchwright.events import HarnessLogArtifact, HarnessTaskArtifact
from benchwright.fingerprint import sha256_hex
from benchwright.harness.artifacts import store_artifact
from benchwright.harness.bridge import SCRIPT, BridgeFailed, BridgeRecorder, plan_bridge
from benchwright.harness.config import check_harness, sample_limit
from benchwright.harness.install import RUNTIMES, harness_root, installed
from benchwright.harness.relay import Relay
from benchwright.limits import RunLimits
from benchwright.pipeline import MaterializeBatchInput, MaterializeBatchResult
from benchwright.sandbox import ExecLimits
from benchwright.schemas import LaunchRequest
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.runs import get_run
from benchwright.sut import SutClient

STDERR_TAIL_LINES = 40
MEMORY_MB = 4096
"""lm-eval imports torch (~1 GB resident with its CPU kernels); inspect needs far less."""


async def bridge_batch(deps: Deps, *, inp: MaterializeBatchInput, sut: SutClient,
                       progress: Callable[[dict[str, Any]], None]) -> MaterializeBatchResult:
    """Run the launch's harness task to the end (skipping what earlier attempts recorded) and record it.

    Raises:
        Unavailable: the harness's runtime is not installed on this worker.
        BridgeFailed: the harness ended without finishing (its stderr's tail is in the message).
        RunHalted: a commit crossed run.cost.
    """
    run = await in_thread(get_run, deps.engine, run_id=inp.run_id)
    launch = LaunchRequest.model_validate(run.launch)
    config = check_harness(launch)
    assert config is not None and launch.harness is not None  # a bridge batch is planned for bridge launches only
    root = harness_root(data_dir=deps.settings.data_dir, harness_dir=deps.settings.harness_dir)
    runtime = installed(root, launch.harness)
    if runtime is None:
        raise Unavailable(f"the {launch.harness} harness is not installed on this worker (under {root}); run "
                          f"`benchwright harness install {launch.harness}`")
    runtime = runtime.resolve()  # mounted and run at its real path (the sandbox has no symlinks of the host's)
    await in_thread(append_events, deps.engine, inp.run_id, [NewEvent.of(
        event_key(inp.run_id, "materialize", inp.invocation, "harness-task"),
        HarnessTaskArtifact(harness=launch.harness, version=RUNTIMES[launch.harness].version,
                            task=config.task or config.task_name,
                            config_sha256=sha256_hex(config.model_dump(mode="json"))))])
    relay = Relay(sut)
    recorder = BridgeRecorder(engine=deps.engine, inp=inp, harness=launch.harness, meter=relay.meter,
                              progress=progress)
    done = await recorder.load()
    limit = sample_limit(config, RunLimits.model_validate(run.limits or {}))
    async with relay as endpoint, sandbox(
            deps, run_id=inp.run_id, role="work", key=("materialize", inp.invocation, "bridge"),
            restore=snapshot_of(deps, inp.run_id, "setup"), internal_allowed=frozenset({("127.0.0.1", endpoint.port)}),
            metadata={"harness": launch.harness}, ro_paths=(runtime,)) as box:
        plan = plan_bridge(harness=launch.harness, config=config, model=launch.model.identifier, endpoint=endpoint,
                           home=box.home, limit=limit, done=done, concurrency=inp.concurrency)
        for name, data in plan.files.items():
            await put_file(box, name, data)
        bound = deps.settings.materialize_batch_duration_s
        proc = await box.backend.spawn(box.info.sandbox_id, [str(runtime / "bin" / "python"), SCRIPT],
                                       env=box.scorer_env(plan.env),
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
            raise BridgeFailed(f"the {launch.harness} harness exited with {proc.returncode}{reason} before finishing: "
                               + "\n".join(tail)[-3000:])
        await _keep_log(deps, box, inp=inp, harness=launch.harness, path=recorder.done_line.get("log"),
                        home=box.home)
    return recorder.result()


async def _keep_log(deps: Deps, box: Any, *, inp: MaterializeBatchInput, harness: str, path: object,
                    home: str) -> None:
    """The harness's native log as a run artifact (none when a resumed batch had nothing left to run)."""
    if not isinstance(path, str) or not path:
        return
    relative = os.path.relpath(path, home) if os.path.isabs(path) else path
    data = await box.backend.read_file(box.info.sandbox_id, relative)
    digest = await in_thread(store_artifact, deps.settings.data_dir, run_id=inp.run_id, data=data)
    await in_thread(append_events, deps.engine, inp.run_id, [NewEvent.of(
        event_key(inp.run_id, "materialize", inp.invocation, "harness-log", digest),
        HarnessLogArtifact(harness=harness, filename=Path(relative).name, sha256=digest, bytes=len(data)))])
