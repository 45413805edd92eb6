"""A bounded soak: mixed launches for ``--minutes`` while the worker, the API and the Temporal dev server are killed
at random (SIGKILL) and started again; then every run must end, with each (task, trial) scored exactly once, and
the worker's and the API's memory must stay flat.

The stack runs as separate processes on loopback only, each started by this script so each can be killed alone: a
Temporal dev server (same port and database file after each kill), a ``benchwright worker``, the API (uvicorn), and
the ``benchwright dev-model`` test double (the model, never killed). The store is SQLite in a temp data directory.

Launches are mixed: sizes, concurrency, k = 1 or 2 trials, some paused and resumed, some stopped part-way. At most
``--live`` runs are in flight; every HTTP call is bounded (timeouts, a few tries). At the end the launching stops,
every run is waited for (``--drain-minutes``), and the script prints:

* runs launched, and how they ended (ok, stopped, error), kills by process;
* results: per run, each (index, trial) recorded once (doubled = 0), and every task of a run that ended ``ok``
  recorded (lost = 0);
* memory: the worker's and the API's RSS at the start and the end of the soak (the first sample of the first
  process after its warm-up, the last sample of the last one), and, for each process that lived through at least
  ``--flat-window`` seconds, its growth from its first to its last sample;
* the load average of the machine (shared: note it beside the figures).

    python bench/soak.py                 # 20 minutes
    python bench/soak.py --minutes 3     # a short one
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from benchstack import rss_mb, write_dataset

from benchwright.stack.devstack import free_port, free_ports, port_open, temporal_binary
from benchwright.stack.temporal_ui import dev_server_args

BW = [sys.executable, "-m", "benchwright.cli"]
HTTP_TRIES = 5


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    ready: Any
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    samples: list[tuple[float, float]] = field(default_factory=list)
    lives: list[list[tuple[float, float]]] = field(default_factory=list)
    kills: int = 0

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         cwd=ROOT, start_new_session=True)
        self.started_at = time.monotonic()
        self.samples = []
        self.lives.append(self.samples)
        deadline = time.monotonic() + 120
        while not self.ready():
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited during start-up (log {self.log})")
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.name} not ready in 120 s (log {self.log})")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the process group (the worker's sandboxes and proxies too: a machine-level crash of it)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)

    def sample(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.samples.append((time.monotonic() - self.started_at, rss_mb(self.proc.pid)))
            except (OSError, ValueError):
                pass


@dataclass
class Launched:
    run_id: str
    tasks: int
    k: int
    plan: str
    """ok, pause (paused then resumed), stop (stopped part-way)."""
    acted: bool = False
    acted_at: float = 0.0
    done: bool = False


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        data = work / "data"
        data.mkdir()
        self.data = data
        self.ports = dict(zip(("temporal", "api"), free_ports(2), strict=True))
        self.datasets = {n: work / f"tasks-{n}.jsonl" for n in (20, 60, 150)}
        answers: dict[str, str] = {}
        for n, path in self.datasets.items():
            write_dataset(path, n)
            for line in path.read_text().splitlines():
                row = json.loads(line)
                answers[row["question"]] = row["answer"]
        (work / "answers.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                                    for q, a in answers.items()))
        self.model_port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCHWRIGHT_DATA_DIR": str(data),
               "BENCHWRIGHT_TEMPORAL_ADDRESS": f"127.0.0.1:{self.ports['temporal']}",
               "BENCHWRIGHT_ALLOW_LOCAL_PATHS": "true",
               "BENCHWRIGHT_MODEL_INTERNAL_ALLOWED": json.dumps([f"127.0.0.1:{self.model_port}"]),
               "BENCHWRIGHT_PROXY_LINGER_S": "5", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.env = env
        logs = work / "logs"
        logs.mkdir()
        self.model = Proc("dev-model", [*BW, "dev-model", "--answers", str(work / "answers.jsonl"), "--latency-ms",
                                        str(args.latency_ms), "--port", str(self.model_port)], env,
                          logs / "model.log", lambda: port_open("127.0.0.1", self.model_port))
        self.temporal = Proc("temporal", [
            temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.ports["temporal"]),
            "--headless", "--db-filename", str(work / "temporal.db"), "--log-level", "error", *dev_server_args()],
            env, logs / "temporal.log", lambda: port_open("127.0.0.1", self.ports["temporal"]))
        self.worker = Proc("worker", [*BW, "worker"], env, logs / "worker.log", lambda: True)
        self.api = Proc("api", [sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory", "--host",
                                "127.0.0.1", "--port", str(self.ports["api"]), "--log-level", "warning",
                                "--no-access-log"], env, logs / "api.log", self._api_ready)
        self.runs: list[Launched] = []
        self.refused: Counter[str] = Counter()
        self.http_failures = 0
        self.key = ""

    def _api_ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.ports['api']}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> None:
        self.model.start()
        self.temporal.start()
        from benchwright.settings import Settings
        from benchwright.store.accounts import create_account
        from benchwright.store.db import make_engine, migrate

        engine = make_engine(Settings(data_dir=self.data).resolved_database_url())
        migrate(engine)
        _, self.key = create_account(engine, name="soak", balance_usd=10_000.0, local_paths=True)
        engine.dispose()
        self.worker.start()
        self.api.start()

    async def request(self, http: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response | None:
        """One bounded API call: a few tries over connection errors and 5xx (the API or Temporal may be down)."""
        for attempt in range(HTTP_TRIES):
            try:
                resp = await http.request(method, path, **kw)
                if resp.status_code < 500:
                    return resp
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5 * 2 ** attempt)
        self.http_failures += 1
        return None

    async def launch(self, http: httpx.AsyncClient) -> None:
        n = self.rng.choice(list(self.datasets))
        k = self.rng.choice((1, 1, 2))
        plan = self.rng.choices(("ok", "pause", "stop"), weights=(6, 2, 1))[0]
        body: dict[str, Any] = {"dataset": str(self.datasets[n]), "concurrency": self.rng.choice((2, 4, 8, 16)),
                                "model": {"identifier": "openai/dev",
                                          "api_base": f"http://127.0.0.1:{self.model_port}/v1"}}
        if k > 1:
            body["trials"] = {"plan": {"k": k}}
        resp = await self.request(http, "POST", "/v1/runs", json=body)
        if resp is None:
            return
        if resp.status_code != 201:
            self.refused[f"{resp.status_code} {resp.json().get('error', {}).get('code')}"] += 1
            return
        self.runs.append(Launched(resp.json()["id"], n, k, plan))

    async def act(self, http: httpx.AsyncClient, run: Launched) -> None:
        """Pause-then-resume or stop a run once it has scored something."""
        if run.acted and run.plan == "pause" and time.monotonic() - run.acted_at > 10:
            # A resume lost to a killed API (its bounded tries gave up) is asked again until the run is not paused.
            resp = await self.request(http, "GET", f"/v1/runs/{run.run_id}")
            if resp is not None and resp.status_code == 200 and resp.json().get("halt_reason") == "operator_pause":
                await self.request(http, "POST", f"/v1/runs/{run.run_id}/resume")
            run.acted_at = time.monotonic()
            return
        if run.acted or run.plan == "ok":
            return
        resp = await self.request(http, "GET", f"/v1/runs/{run.run_id}")
        if resp is None or resp.status_code != 200:
            return
        summary = resp.json()["tasks"]["summary"]
        if summary["passed"] + summary["failed"] + summary["errored"] < 5:
            return
        run.acted = True
        run.acted_at = time.monotonic()
        if run.plan == "stop":
            await self.request(http, "POST", f"/v1/runs/{run.run_id}/stop", json={"reason": "soak"})
        else:
            await self.request(http, "POST", f"/v1/runs/{run.run_id}/pause")
            await asyncio.sleep(self.rng.uniform(0.5, 3))
            await self.request(http, "POST", f"/v1/runs/{run.run_id}/resume")

    def finished(self) -> dict[str, Any]:
        from sqlalchemy import select
        from sqlmodel import Session

        from benchwright.settings import Settings
        from benchwright.store.db import make_engine
        from benchwright.store.models import Run

        engine = make_engine(Settings(data_dir=self.data).resolved_database_url())
        with Session(engine) as session:
            rows = {r.id: r for r in session.execute(select(Run)).scalars()}
        engine.dispose()
        return rows

    async def chaos(self, stop_at: float) -> None:
        """SIGKILL one of worker / API / Temporal every ``--kill-every`` seconds (jittered), then start it again."""
        while True:
            wait = self.rng.uniform(0.5, 1.5) * self.args.kill_every
            if time.monotonic() + wait >= stop_at:
                return
            await asyncio.sleep(wait)
            target = self.rng.choice((self.worker, self.api, self.temporal))
            print(f"  [{time.strftime('%H:%M:%S')}] kill -9 {target.name}", flush=True)
            target.kill()
            await asyncio.sleep(self.rng.uniform(0.2, 2.0))
            await asyncio.to_thread(target.start)

    async def sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.worker.sample()
            self.api.sample()
            try:
                await asyncio.wait_for(stop.wait(), self.args.sample_every)
            except TimeoutError:
                pass

    async def main(self) -> int:
        args = self.args
        self.start()
        started = time.monotonic()
        stop_at = started + args.minutes * 60
        load_start = os.getloadavg()
        sampling = asyncio.Event()
        sampler = asyncio.create_task(self.sampler(sampling))
        chaos = asyncio.create_task(self.chaos(stop_at))
        url = f"http://127.0.0.1:{self.ports['api']}"
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {self.key}"},
                                     timeout=30) as http:
            last_report = started
            while time.monotonic() < stop_at:
                live = [r for r in self.runs if not r.done]
                if live:
                    rows = await asyncio.to_thread(self.finished)
                    for r in live:
                        if rows.get(r.run_id) is not None and rows[r.run_id].finished_at is not None:
                            r.done = True
                live = [r for r in self.runs if not r.done]
                if len(live) < args.live:
                    await self.launch(http)
                for r in live:
                    await self.act(http, r)
                if time.monotonic() - last_report > 60:
                    last_report = time.monotonic()
                    print(f"  [{time.strftime('%H:%M:%S')}] {len(self.runs)} launched, {len(live)} live, "
                          f"worker {self.worker.samples[-1][1] if self.worker.samples else 0:.0f} MB, "
                          f"api {self.api.samples[-1][1] if self.api.samples else 0:.0f} MB, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                await asyncio.sleep(0.5)
            await chaos
            drain_until = time.monotonic() + args.drain_minutes * 60
            while time.monotonic() < drain_until:
                rows = await asyncio.to_thread(self.finished)
                pending = [r for r in self.runs if rows[r.run_id].finished_at is None]
                for r in pending:
                    await self.act(http, r)
                if not pending:
                    break
                await asyncio.sleep(1)
        sampling.set()
        await sampler
        return self.report(started, load_start)

    def report(self, started: float, load_start: tuple[float, float, float]) -> int:
        from sqlalchemy import select
        from sqlmodel import Session

        from benchwright.settings import Settings
        from benchwright.store.db import make_engine
        from benchwright.store.models import EventRow

        rows = self.finished()
        engine = make_engine(Settings(data_dir=self.data).resolved_database_url())
        endings: Counter[str] = Counter()
        doubled = lost = scored = 0
        unfinished = []
        with Session(engine) as session:
            for r in self.runs:
                row = rows[r.run_id]
                if row.finished_at is None:
                    unfinished.append(r.run_id)
                    continue
                ending = "stopped" if row.halted else row.status
                endings[ending] += 1
                counts = Counter((int(d["index"]), int(d["trial"])) for d in session.execute(
                    select(EventRow.data).where(EventRow.run_id == r.run_id,
                                                EventRow.type == "MaterializeTaskResult")).scalars())
                scored += sum(counts.values())
                doubled += sum(n - 1 for n in counts.values() if n > 1)
                if ending == "ok":
                    lost += sum(1 for i in range(r.tasks) for t in range(r.k) if (i, t) not in counts)
        engine.dispose()
        minutes = (time.monotonic() - started) / 60
        print(f"\nsoak: {minutes:.1f} min ({self.args.minutes:g} min of launches), load average at start "
              f"{load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f} (2 cores, shared)")
        print(f"runs: {len(self.runs)} launched, ended {dict(endings)}, not terminal {len(unfinished)}")
        for run_id in unfinished[:5]:
            row = rows[run_id]
            print(f"  not terminal: {run_id} phase={row.phase} halted={row.halted} reason={row.halt_reason}")
        if self.refused:
            print(f"launches refused: {dict(self.refused)}")
        print(f"kills (SIGKILL): worker {self.worker.kills}, api {self.api.kills}, temporal {self.temporal.kills}; "
              f"bounded API calls that gave up: {self.http_failures}")
        print(f"results: {scored} recorded, doubled {doubled}, lost {lost} (runs that ended ok)")
        flat = True
        for proc in (self.worker, self.api):
            lives = [life for life in proc.lives if life]
            if not lives:
                continue
            warm = [s for s in lives[0] if s[0] >= self.args.warmup] or lives[0]
            first, last = warm[0][1], lives[-1][-1][1]
            growths = [(life[-1][1] - next(s for s in life if s[0] >= self.args.warmup)[1],
                        life[-1][0] - self.args.warmup)
                       for life in lives if life[-1][0] >= self.args.warmup + self.args.flat_window]
            peak = max(s[1] for lf in lives for s in lf)
            print(f"{proc.name} RSS: start {first:.0f} MB, end {last:.0f} MB, peak {peak:.0f} MB over {len(lives)} "
                  "process(es); growth within processes that lived "
                  f">= {self.args.flat_window:.0f} s after warm-up: "
                  + (", ".join(f"{g:+.0f} MB in {t / 60:.1f} min" for g, t in growths) or "none lived that long"))
            if last > first * 1.5 + 50:
                flat = False
        ok = not unfinished and doubled == 0 and lost == 0 and flat
        print("verdict:", "PASS" if ok else "FAIL", "(every run terminal, nothing doubled or lost, memory flat)")
        return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0, help="how long to launch and kill (default 20)")
    ap.add_argument("--live", type=int, default=4, help="most runs in flight at once")
    ap.add_argument("--kill-every", type=float, default=75.0, help="mean seconds between kills")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="the dev model's latency")
    ap.add_argument("--drain-minutes", type=float, default=10.0, help="bound on waiting for the last runs")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds of a process's life before its first counted "
                    "RSS sample (imports, first runs)")
    ap.add_argument("--flat-window", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (kept anyway on FAIL)")
    args = ap.parse_args()
    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too stops the stack this script started

    signal.signal(signal.SIGTERM, interrupted)
    tmp = Path(tempfile.mkdtemp(prefix="bw-soak-"))
    soak = Soak(args, tmp)
    try:
        code = asyncio.run(soak.main())
    finally:
        for proc in (soak.api, soak.worker, soak.temporal, soak.model):
            proc.stop()
    if args.keep or code:
        print(f"kept {tmp} (logs/, data/)")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
