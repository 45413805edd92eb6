"""What the bench scripts share: the real stack as separate processes, datasets, and /proc readings."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchwright.comparison.stats import median_interval
from benchwright.stack.devstack import free_port, free_ports  # noqa: F401 - free_port for bench/temporal_dispatch.py

BW = [sys.executable, "-m", "benchwright.cli"]


@dataclass
class BenchStack:
    """A running ``benchwright up`` plus a ``benchwright dev-model``, as a user would start them."""

    dev: dict
    """dev.json: api_url, api_key, temporal_address."""
    model_url: str
    pids: dict[str, int]
    """worker, api, temporal and dev_model process ids."""
    keyed_model_url: str | None = None
    """A second dev model, the same but demanding ``model_api_key`` (``running_stack``), for keyed runs."""


def wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        time.sleep(0.05)
    raise SystemExit(f"{path} did not appear")


def scratch_dir(prefix: str) -> Path:
    """A new directory under the temporary directory, removed when the bench exits: a stack's data and datasets are
    30-70 MB an invocation, and benches run back to back."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def spread(values: Sequence[float]) -> str:
    """``median [low, high]``: the median with its distribution-free 95 % interval (``median_interval``: the whole
    range below 6 values)."""
    ci = median_interval(values)
    return f"{statistics.median(values):.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def ratio_verdict(ratios: Sequence[float], goal: float) -> str:
    """Paired ratios (each one pair's sides, run seconds apart) against ``goal`` (at most): their ``spread`` and
    whether the median meets it, said to be undecided when the interval spans the goal (a pair's ratio swings by
    tens of percent on a 2-core machine, so a median a few points either side of it may be the machine's)."""
    ci = median_interval(ratios)
    said = f"{spread(ratios)}  {'MEETS' if statistics.median(ratios) <= goal else 'MISSES'} the goal (<= {goal:g})"
    return said if ci.high <= goal or ci.low > goal else f"{said}, not decided (the interval spans it)"


def write_dataset(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"question": f"What is {i} plus {i + 7}? (item {i})", "answer": str(2 * i + 7)}) + "\n")


def _status_kb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmHWM")


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_s() -> float:
    """CPU seconds of this machine's Postgres server so far: every ``postgres`` process alive (the postmaster, its
    backends and workers) plus what the postmaster's exited children used (its ``cutime`` and ``cstime``)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        if name != "postgres":
            continue
        fields = rest.split()
        total += int(fields[11]) + int(fields[12])
        if not _is_postgres(int(fields[1])):
            total += int(fields[13]) + int(fields[14])  # the postmaster: its reaped backends
    return total / os.sysconf("SC_CLK_TCK")


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return False


@contextmanager
def running_stack(work: Path, *, answers: Path, latency_ms: float,
                  model_api_key: str | None = None) -> Iterator[BenchStack]:
    """Start ``benchwright up`` and the dev model (answering from ``answers``) under ``work``; stop both after.
    With ``model_api_key``, a second dev model demanding that key serves keyed runs."""
    ports = dict(zip(("api", "temporal", "ui"), free_ports(3), strict=True))
    up = subprocess.Popen([*BW, "up", "--data-dir", str(work / "data"), "--api-port", str(ports["api"]),
                           "--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"])],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready = work / "model.json"
    model = subprocess.Popen([*BW, "dev-model", "--answers", str(answers), "--latency-ms", str(latency_ms),
                              "--port", "0", "--ready-file", str(ready)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    keyed = subprocess.Popen([*BW, "dev-model", "--answers", str(answers), "--latency-ms", str(latency_ms),
                              "--port", "0", "--ready-file", str(work / "keyed.json"), "--api-key", model_api_key],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) \
        if model_api_key else None
    try:
        dev = wait_file(work / "data" / "dev.json", up)
        model_url = wait_file(ready, model)["url"]
        keyed_url = wait_file(work / "keyed.json", keyed)["url"] if keyed is not None else None
        stack_pids = json.loads((work / "data" / "pids.json").read_text())
        pids = {"worker": stack_pids["worker"], "api": stack_pids["api"], "temporal": stack_pids["temporal"],
                "dev_model": model.pid}
        yield BenchStack(dev=dev, model_url=model_url, pids=pids, keyed_model_url=keyed_url)
    finally:
        for proc in (model, *([keyed] if keyed else []), up):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)


@contextmanager
def postgres_store(url: str | None) -> Iterator[None]:
    """With ``url``: a fresh schema on that Postgres database is the store of the stack started meanwhile (its
    processes read ``BENCHWRIGHT_DATABASE_URL``); dropped after."""
    if url is None:
        yield
        return
    import uuid

    from sqlalchemy import create_engine, text

    schema = f"bw_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    os.environ["BENCHWRIGHT_DATABASE_URL"] = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    print(f"store: Postgres at {url.rsplit('@', 1)[-1]}, schema {schema}")
    try:
        yield
    finally:
        os.environ.pop("BENCHWRIGHT_DATABASE_URL", None)
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()
