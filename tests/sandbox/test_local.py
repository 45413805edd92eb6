"""The local sandbox backend against the real kernel: namespaces, cgroups/rlimits, egress, snapshots, reaping.

No mocks: every test runs real processes in real namespaces. Each hostile check is phrased so that it would fail
without the isolation it tests (the unisolated-mode test shows what the same scripts see without it).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from benchwright.sandbox import (
    ExecLimits,
    IsolationUnavailable,
    LocalBackend,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SandboxPathError,
    SandboxProcess,
    proxy_env,
)
from benchwright.sandbox.local.cgroups import _Cgroups, _cpu_quota_us

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "benchwright" / "scoring" / "runner.py"
PY = sys.executable
SECRET = f"bw-secret-{uuid.uuid4().hex}"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
FAST = ExecLimits(cpu_seconds=10, memory_mb=512, wall_seconds=20, max_processes=32)


def _namespaces_skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    if os.geteuid() != 0:
        return "the local sandbox backend needs root (CAP_SYS_ADMIN) to create namespaces"
    return None


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    b = LocalBackend(tmp_path / "data")
    yield b
    await _kill_all(b)


async def _kill_all(b: LocalBackend) -> None:
    for info in await b.list_alive():
        await b.kill(info.sandbox_id)
    await b.close()


async def _create(b: LocalBackend, run_id: str = "run-1", **kw: object) -> SandboxInfo:
    try:
        return await b.create(role="task", run_id=run_id, **kw)  # type: ignore[arg-type]
    except IsolationUnavailable as exc:
        print(f"SKIP: kernel refused sandbox namespaces: {exc}")
        pytest.skip(f"kernel refused sandbox namespaces: {exc}")


async def _py(b: LocalBackend, sid: str, code: str, limits: ExecLimits = FAST, *, timeout_s: float = 30.0,
              env: dict[str, str] | None = None):
    return await b.exec(sid, [PY, "-c", textwrap.dedent(code)], env=env or ENV, timeout_s=timeout_s, limits=limits)


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) host processes running as ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 ").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(name))
    return found


async def _wait_no_pids(uid: int, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (pids := _pids_of_uid(uid)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return pids


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The fake secret in this process's environment and in a host process's (``/proc/<pid>/environ`` shows a
    process's initial environment, so a child started with it is what a /proc scan could find); yields its PID."""
    monkeypatch.setenv("BENCHWRIGHT_TEST_SECRET", SECRET)
    decoy = subprocess.Popen(["sleep", "120"], env={**os.environ, "BENCHWRIGHT_TEST_SECRET": SECRET})
    deadline = time.monotonic() + 5
    while SECRET.encode() not in Path(f"/proc/{decoy.pid}/environ").read_bytes():  # until it has exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield decoy.pid
    decoy.kill()
    decoy.wait()


@pytest.fixture
def tcp_server() -> Iterator[tuple[int, list[int]]]:
    """A TCP server on the host's 127.0.0.1 that counts the connections it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted: list[int] = []

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=loop, daemon=True).start()
    yield srv.getsockname()[1], accepted
    srv.close()


# ------------------------------------------------------------------------------------------------ env and basics ---


async def test_exec_sees_exactly_the_env_passed(backend: LocalBackend, secret_env: int) -> None:
    info = await _create(backend)
    assert info.metadata["isolation"] == "namespaces"
    assert info.metadata["benchwright_role"] == "task"
    assert info.instance_size.startswith("local-")

    echo = await backend.exec(info.sandbox_id, ["echo", "hello", "sandbox"], env=ENV, timeout_s=10, limits=FAST)
    assert (echo.returncode, echo.stdout, echo.timed_out, echo.killed_reason) == (0, b"hello sandbox\n", False, None)

    env = {"PATH": "/usr/bin:/bin", "ONLY_THIS": "1"}
    res = await backend.exec(info.sandbox_id, ["env", "-0"], env=env, timeout_s=10, limits=FAST)
    seen = dict(item.split("=", 1) for item in res.stdout.decode().split("\0") if item)
    assert seen == env
    assert SECRET.encode() not in res.stdout

    assert isinstance(backend, SandboxBackend)
    who = await _py(backend, info.sandbox_id, "import os; print(os.getuid(), os.getgid(), os.getgroups(), os.getcwd())")
    uid, gid, groups, cwd = who.stdout.decode().split(" ", 3)
    assert int(uid) == info.metadata["sandbox_uid"] and int(uid) != 0 and int(gid) != 0
    assert groups == "[]" and cwd.strip() == "/sandbox"


async def test_read_and_write_files_refuse_escapes(backend: LocalBackend) -> None:
    info = await _create(backend)
    await backend.write_file(info.sandbox_id, "sub/dir/a.txt", b"data")
    assert await backend.read_file(info.sandbox_id, "sub/dir/a.txt") == b"data"
    assert await backend.read_file(info.sandbox_id, "/sandbox/sub/dir/a.txt") == b"data"
    seen = await backend.exec(info.sandbox_id, ["cat", "sub/dir/a.txt"], env=ENV, timeout_s=10, limits=FAST)
    assert seen.stdout == b"data"
    for bad in ("../escape.txt", "sub/../../x", "/etc/passwd", ""):
        with pytest.raises(SandboxPathError):
            await backend.write_file(info.sandbox_id, bad, b"x")
        with pytest.raises(SandboxPathError):
            await backend.read_file(info.sandbox_id, bad)
    assert not (Path(info.root).parent / "escape.txt").exists()  # type: ignore[arg-type]
    # A symlink the sandbox plants must not make the host read or write through it.
    await backend.exec(info.sandbox_id, ["ln", "-s", "/etc", "etc-link"], env=ENV, timeout_s=10, limits=FAST)
    await backend.exec(info.sandbox_id, ["ln", "-s", "/etc/hostname", "file-link"], env=ENV, timeout_s=10,
                       limits=FAST)
    with pytest.raises(SandboxPathError):
        await backend.read_file(info.sandbox_id, "etc-link/hostname")
    with pytest.raises(SandboxPathError):
        await backend.read_file(info.sandbox_id, "file-link")
    with pytest.raises(SandboxPathError):
        await backend.write_file(info.sandbox_id, "file-link", b"overwrite the host?")
    assert Path("/etc/hostname").read_bytes() != b"overwrite the host?"


async def test_filesystem_is_read_only_but_for_work_and_tmp(tmp_path: Path, secret_env: int) -> None:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    shared = tmp_path / "dataset"
    shared.mkdir()
    (shared / "rows.jsonl").write_text('{"q": 1}\n')
    host_only = Path(tempfile.mkdtemp(prefix="bw-host-only-"))  # a host /tmp entry the sandbox must not see
    b = LocalBackend(tmp_path / "data", extra_ro_paths=[shared])
    try:
        info = await _create(b)
        code = f"""
            import os
            def attempt(path):
                try:
                    with open(path, "w") as fh:
                        fh.write("x")
                    return "wrote"
                except OSError as exc:
                    return type(exc).__name__
            print(attempt("/sandbox/ok.txt"), attempt("/tmp/ok.txt"), attempt("/usr/evil"), attempt("/evil"),
                  attempt("{shared}/rows.jsonl"), attempt("/etc/passwd"))
            print(open("{shared}/rows.jsonl").read().strip())
            print(sorted(os.listdir("/tmp")))
        """
        res = await _py(b, info.sandbox_id, code)
        lines = res.stdout.decode().splitlines()
        assert lines[0] == "wrote wrote OSError OSError OSError OSError", res.stderr  # EROFS but in work and /tmp
        assert lines[1] == '{"q": 1}'
        # A private /tmp: none of the host's files, only the paths down to read-only binds (the dataset here; the
        # interpreter or venv too when they live under /tmp, as in a CI checkout there).
        listing = set(eval(lines[2]))  # our own print of a list of names
        binds = {Path(p).parts[2] for p in (shared, sys.prefix, sys.base_prefix, Path(__file__).resolve())
                 if str(p).startswith("/tmp/") and len(Path(p).parts) > 2}
        assert "ok.txt" in listing and host_only.name not in listing
        assert listing <= {"ok.txt", *binds}, listing
        assert (shared / "rows.jsonl").read_text() == '{"q": 1}\n'
    finally:
        await _kill_all(b)
        host_only.rmdir()


# ------------------------------------------------------------------------------------------------ hostile script ---

HOSTILE = r"""
import glob, json, os, socket, sys
secret = sys.stdin.read()  # not in argv: its own /proc/self/cmdline must not contain it
paths, port = json.loads(sys.argv[1]), int(sys.argv[2])
out = {"environ_hits": [], "cmdlines": [], "files": {}, "connect": None}
for path in ["/proc/1/environ", f"/proc/{sys.argv[3]}/environ"] + glob.glob("/proc/*/environ"):
    try:
        if secret.encode() in open(path, "rb").read():
            out["environ_hits"].append(path)
    except OSError:
        pass
for path in glob.glob("/proc/*/cmdline"):
    try:
        out["cmdlines"].append(open(path, "rb").read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
for path in paths:
    try:
        out["files"][path] = open(path).read()
    except OSError as exc:
        out["files"][path] = "ERR " + type(exc).__name__
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", port))
    out["connect"] = "connected"
except OSError as exc:
    out["connect"] = "ERR " + type(exc).__name__
print(json.dumps(out))
"""


async def test_hostile_script_reads_no_host_secret_and_reaches_no_host_port(
        backend: LocalBackend, tmp_path: Path, secret_env: int, tcp_server: tuple[int, list[int]]) -> None:
    port, accepted = tcp_server
    info = await _create(backend)
    other = await _create(backend, run_id="run-2")
    data_secret = backend.root_dir / "secret.txt"
    data_secret.write_text(SECRET)
    other_secret = Path(other.root) / "other.txt"  # type: ignore[arg-type]
    other_secret.write_text(SECRET)
    root_secret = Path(f"/root/bw-test-{uuid.uuid4().hex}.txt")
    root_secret.write_text(SECRET)
    host_tmp = tmp_path / "host-tmp-secret.txt"  # under the host's /tmp
    host_tmp.write_text(SECRET)
    try:
        paths = [str(data_secret), str(other_secret), str(root_secret), str(REPO / "pyproject.toml"),
                 str(host_tmp), "/etc/shadow", "/home/x"]
        await backend.write_file(info.sandbox_id, "hostile.py", HOSTILE.encode())
        res = await backend.exec(info.sandbox_id, [PY, "hostile.py", json.dumps(paths), str(port), str(secret_env)],
                                 env=ENV, timeout_s=30, limits=FAST, stdin=SECRET.encode())
    finally:
        root_secret.unlink()
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert SECRET.encode() not in res.stdout
    assert out["environ_hits"] == []
    # The sandbox's /proc shows the exec's own processes only: no host process, not even the sandbox's helpers.
    assert any("hostile.py" in c for c in out["cmdlines"]), out["cmdlines"]
    assert not any(c.startswith("sleep 120") or "_nsexec.py" in c or "-m pytest" in c for c in out["cmdlines"])
    assert len(out["cmdlines"]) <= 3, out["cmdlines"]  # its own process (and self/thread-self aliases)
    assert all(v.startswith("ERR ") for v in out["files"].values()), out["files"]
    assert out["connect"].startswith("ERR "), out["connect"]
    assert accepted == []


# ------------------------------------------------------------------------------------------------------ limits ---

BOUNDED_FORKS = r"""
import os, time
n = 0
try:
    while n < 2000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    print("forked", n)
except OSError as exc:
    print("fork failed after", n, type(exc).__name__)
"""

FORK_BOMB = r"""
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


async def test_fork_bomb_is_contained(backend: LocalBackend) -> None:
    info = await _create(backend)
    uid = info.metadata["sandbox_uid"]
    limits = ExecLimits(cpu_seconds=10, memory_mb=512, wall_seconds=10, max_processes=16)
    bounded = await _py(backend, info.sandbox_id, BOUNDED_FORKS, limits)
    words = bounded.stdout.decode().split()
    assert words[:3] == ["fork", "failed", "after"], bounded.stdout
    assert int(words[3]) < 16  # without a process limit (root, no cgroup) it would reach 2000
    assert await _wait_no_pids(uid) == []  # the sleeping children died with the exec

    started = time.monotonic()
    bomb = await _py(backend, info.sandbox_id, FORK_BOMB,
                     ExecLimits(cpu_seconds=30, memory_mb=512, wall_seconds=2, max_processes=32))
    assert bomb.timed_out and bomb.killed_reason == "wall_clock"
    assert time.monotonic() - started < 8
    assert await _wait_no_pids(uid) == []
    # The host is unharmed: this process can still start processes, and the sandbox still works and dies cleanly.
    assert subprocess.run(["true"], check=False).returncode == 0
    again = await backend.exec(info.sandbox_id, ["echo", "ok"], env=ENV, timeout_s=10, limits=FAST)
    assert again.stdout == b"ok\n"
    assert await backend.kill(info.sandbox_id) > 0


async def test_memory_limit(backend: LocalBackend) -> None:
    info = await _create(backend)
    res = await _py(backend, info.sandbox_id, "b = bytearray(1536 * 1024 * 1024); print('allocated', len(b))",
                    ExecLimits(cpu_seconds=20, memory_mb=256, wall_seconds=20))
    assert b"allocated" not in res.stdout
    assert res.returncode != 0
    assert b"MemoryError" in res.stderr or res.killed_reason == "memory", (res.returncode, res.stderr[-300:])


async def test_output_is_capped_without_buffering_it_all(backend: LocalBackend) -> None:
    info = await _create(backend)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cap = 1024 * 1024
    res = await _py(backend, info.sandbox_id,
                    "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(200): sys.stdout.buffer.write(chunk)",
                    ExecLimits(cpu_seconds=20, wall_seconds=30, max_output_bytes=cap))
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert res.returncode == 0, res.stderr
    assert len(res.stdout) == cap and res.stdout_truncated and not res.stderr_truncated
    assert grown_kb < 100 * 1024  # 200 MiB went through; far less of it ever sat in this process


async def test_cpu_limit_kills(backend: LocalBackend) -> None:
    info = await _create(backend)
    started = time.monotonic()
    res = await _py(backend, info.sandbox_id, "while True: pass", ExecLimits(cpu_seconds=1, wall_seconds=30))
    assert res.returncode < 0 and res.killed_reason == "cpu" and not res.timed_out
    assert time.monotonic() - started < 10


async def test_cpu_limit_counts_all_processes_of_the_command(backend: LocalBackend) -> None:
    if "cpuacct" not in backend.cgroups.controllers:
        print("SKIP: no writable CPU-accounting cgroup; only the per-process RLIMIT_CPU applies")
        pytest.skip("no writable CPU-accounting cgroup (only the per-process RLIMIT_CPU applies)")
    info = await _create(backend)
    code = "import os\nfor _ in range(3):\n    if os.fork() == 0: break\nwhile True: pass"
    started = time.monotonic()
    res = await _py(backend, info.sandbox_id, code, ExecLimits(cpu_seconds=2, wall_seconds=30, cpu_cores=2))
    assert res.killed_reason == "cpu" and not res.timed_out
    assert time.monotonic() - started < 6  # four burners on two cores: ~1 s of wall clock, not 2 s each


BURNERS = """
    import os, sys, time
    end = time.monotonic() + float(sys.argv[1])
    kids = []
    for _ in range(3):  # four busy loops in all
        pid = os.fork()
        if pid == 0:
            kids = []
            break
        kids.append(pid)
    while time.monotonic() < end:
        pass
    for pid in kids:
        os.waitpid(pid, 0)
"""


def test_cpu_quota_for_a_rate() -> None:
    assert _cpu_quota_us(0.5) == 50_000 and _cpu_quota_us(2) == 200_000
    assert _cpu_quota_us(0.0001) == 1_000  # the kernel's minimum quota
    assert _cpu_quota_us(0) is None and _cpu_quota_us(-1) is None and _cpu_quota_us(float("inf")) is None
    assert ExecLimits().cpu_cores == 1.0


def test_co_mounted_cpu_and_cpuacct_share_one_cgroup(tmp_path: Path) -> None:
    # Plain directories stand in for the hierarchies: only which files get written where is checked here.
    cpu_cpuacct, pids = tmp_path / "cpu,cpuacct", tmp_path / "pids"
    cpu_cpuacct.mkdir()
    pids.mkdir()
    cg = _Cgroups({"pids": pids, "cpuacct": cpu_cpuacct, "cpu": cpu_cpuacct}, None, set())
    assert cg.cpu_rate and cg.sandbox_dirs("s") == [pids / "benchwright-s", cpu_cpuacct / "benchwright-s"]
    ex = cg.create_exec("s", ExecLimits(cpu_cores=1.5, max_processes=7))
    assert [d.parent.parent for d in ex.dirs] == [pids, cpu_cpuacct] and len(ex.procs) == 2
    leaf = ex.dirs[1]
    assert ex.cpu_usage == str(leaf / "cpuacct.usage")
    assert (leaf / "cpu.cfs_period_us").read_text() == "100000" and (leaf / "cpu.cfs_quota_us").read_text() == "150000"
    assert (ex.dirs[0] / "pids.max").read_text() == "7"
    uncapped = cg.create_exec("s", ExecLimits(cpu_cores=0))
    assert not (uncapped.dirs[1] / "cpu.cfs_quota_us").exists()  # a fresh cgroup's own default: -1, no cap
    assert not _Cgroups({"cpuacct": cpu_cpuacct}, None, set()).cpu_rate


async def test_cpu_rate_is_capped(backend: LocalBackend) -> None:
    if not backend.cgroups.cpu_rate:
        print(f"SKIP: no usable cpu controller here ({backend.limit_mechanism})")
        pytest.skip(f"no usable cpu controller here: {backend.limit_mechanism}")
    assert "CPU rate capped" in backend.limit_mechanism
    info = await _create(backend)
    sid = info.sandbox_id

    async def burn(cores: float) -> tuple[float, float]:
        res = await backend.exec(sid, [PY, "-c", textwrap.dedent(BURNERS), "2"], env=ENV, timeout_s=20,
                                 limits=ExecLimits(cpu_seconds=30, wall_seconds=20, max_processes=16,
                                                   cpu_cores=cores))
        assert res.returncode == 0 and res.killed_reason is None, (res.returncode, res.stderr[-500:])
        assert res.cpu_seconds is not None
        print(f"cpu_cores={cores}: {res.cpu_seconds:.2f} CPU s in {res.duration_s:.2f} s of wall clock")
        return res.cpu_seconds, res.duration_s

    cpu, wall = await burn(0.5)
    # Without the cap four busy loops on this host would use up to min(4, cores) x wall (~4 CPU s on two cores).
    assert wall >= 2.0
    assert cpu <= 0.5 * wall * 1.1 + 0.1, (cpu, wall)
    assert cpu >= 0.5 * 2.0 * 0.6, (cpu, wall)  # it did run (at about its rate), it was not starved
    fast_cpu, fast_wall = await burn(2)
    assert fast_cpu >= 0.75 * fast_wall and fast_cpu >= 1.4 * cpu, (fast_cpu, fast_wall, cpu)
    # Each exec's cgroup is gone once it ended; the sandbox's own (per hierarchy) goes with the sandbox.
    dirs = backend.cgroups.sandbox_dirs(sid)
    assert [c for d in dirs if d.is_dir() for c in d.iterdir() if c.is_dir()] == []
    await backend.kill(sid)
    assert [d for d in dirs if d.exists()] == []


async def test_wall_clock_kills_the_whole_command(backend: LocalBackend) -> None:
    info = await _create(backend)
    code = """
        import os, subprocess, time
        # a detached grandchild in its own session: it must die with the command all the same
        subprocess.Popen(["sleep", "300"], start_new_session=True)
        time.sleep(300)
    """
    started = time.monotonic()
    res = await _py(backend, info.sandbox_id, code, ExecLimits(wall_seconds=1))
    assert res.timed_out and res.killed_reason == "wall_clock"
    assert time.monotonic() - started < 5
    assert await _wait_no_pids(info.metadata["sandbox_uid"]) == []
    short = await _py(backend, info.sandbox_id, "import time; time.sleep(300)", FAST, timeout_s=0.5)
    assert short.timed_out


# ------------------------------------------------------------------------------------------------------ egress ---

EGRESS_CLIENT = r"""
import os, socket, sys, urllib.request
port = int(sys.argv[1])
via = urllib.request.urlopen("http://example.invalid/hello", timeout=10).read().decode()
print("via-proxy:", via)
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    direct.open(f"http://127.0.0.1:{port}/direct", timeout=5).read()
    print("direct: reached")
except OSError as exc:
    print("direct: failed", type(exc).__name__)
"""


async def test_egress_only_through_the_proxy(tmp_path: Path) -> None:
    reason = _namespaces_skip_reason()
    if reason:
        pytest.skip(reason)
    seen: list[str] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's naming
            seen.append(self.path)
            body = f"proxied {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    b = LocalBackend(tmp_path / "data", egress_proxy_url=f"http://127.0.0.1:{port}")
    try:
        info = await _create(b)
        assert info.metadata["egress_proxy"] == "http://127.0.0.1:3128"
        env = {**ENV, **proxy_env(info)}
        res = await b.exec(info.sandbox_id, [PY, "-c", EGRESS_CLIENT, str(port)], env=env, timeout_s=30, limits=FAST)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.decode().splitlines()
        assert lines[0] == "via-proxy: proxied http://example.invalid/hello"
        assert lines[1].startswith("direct: failed")
        assert seen == ["http://example.invalid/hello"]  # the direct attempt never got here
        # Without the proxy variables the same request has no way out.
        res = await b.exec(info.sandbox_id, [PY, "-c", EGRESS_CLIENT, str(port)], env=ENV, timeout_s=30,
                           limits=FAST)
        assert res.returncode != 0 and seen == ["http://example.invalid/hello"]
    finally:
        await _kill_all(b)
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------------------- spawn ---

TASK_IMPL = '''
class Scorer:
    def extract(self, row):
        return row

    def solve(self, row, call):
        return call(row["q"])

    def score(self, row, response):
        return 1.0 if response == row["a"] else 0.0
'''


async def test_spawn_runs_the_scorer_runner_over_stdio(backend: LocalBackend) -> None:
    info = await _create(backend)
    await backend.write_file(info.sandbox_id, "runner.py", RUNNER.read_bytes())
    await backend.write_file(info.sandbox_id, "task_impl.py", TASK_IMPL.encode())

    check = await backend.spawn(info.sandbox_id, [PY, "runner.py", "--impl", "task_impl.py", "--check"], env=ENV,
                                limits=FAST)
    assert check.stdout is not None
    assert json.loads(await asyncio.wait_for(check.stdout.readline(), 20)) == {"op": "ready"}
    assert await check.wait() == 0 and check.killed_reason is None

    proc = await backend.spawn(info.sandbox_id, [PY, "runner.py", "--impl", "task_impl.py", "--threads", "2"],
                               env=ENV, limits=FAST)
    assert isinstance(proc, SandboxProcess)
    assert proc.stdin is not None and proc.stdout is not None

    async def recv() -> dict[str, object]:
        return json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))  # type: ignore[union-attr]

    async def send(msg: dict[str, object]) -> None:
        proc.stdin.write((json.dumps(msg) + "\n").encode())  # type: ignore[union-attr]
        await proc.stdin.drain()  # type: ignore[union-attr]

    assert await recv() == {"op": "ready"}
    await send({"op": "task", "id": 7, "row": {"q": "2+2?", "a": "4"}})
    call = await recv()
    assert call["op"] == "call" and call["task"] == 7
    assert call["messages"] == [{"role": "user", "content": "2+2?"}]
    await send({"op": "reply", "call": call["call"], "ok": True, "text": "4"})
    result = await recv()
    assert result == {"op": "result", "id": 7, "ok": True, "score": 1.0, "output": "4"}
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_spawn_limits_apply_and_kill_ends_it(backend: LocalBackend) -> None:
    info = await _create(backend)
    proc = await backend.spawn(info.sandbox_id, [PY, "-c", "import time; time.sleep(300)"], env=ENV,
                               limits=ExecLimits(wall_seconds=1))
    assert await asyncio.wait_for(proc.wait(), 10) < 0
    assert proc.timed_out and proc.killed_reason == "wall_clock"
    proc = await backend.spawn(info.sandbox_id, [PY, "-c", "import time; time.sleep(300)"], env=ENV, limits=FAST)
    proc.kill()
    assert await asyncio.wait_for(proc.wait(), 10) < 0 and proc.killed_reason == "terminated"
    assert await _wait_no_pids(info.metadata["sandbox_uid"]) == []


# --------------------------------------------------------------------------------------------------- snapshots ---


def _objects(b: LocalBackend) -> set[str]:
    root = b.snapshots.objects
    return {f"{d.name}{f.name}" for d in root.iterdir() if d.name != "tmp" for f in d.iterdir()}


async def test_snapshot_restore_identical_dedup_and_survives_restart(backend: LocalBackend, tmp_path: Path) -> None:
    info = await _create(backend)
    sid = info.sandbox_id
    files = {"run.sh": (b"#!/bin/sh\necho hi\n", 0o755), "data/blob.bin": (os.urandom(200_000), 0o600),
             "data/deep/empty.txt": (b"", 0o644), "data/deep/same1.txt": (b"same content", 0o640),
             "same2.txt": (b"same content", 0o444)}
    for path, (data, mode) in files.items():
        await backend.write_file(sid, path, data, mode=mode)
    await backend.exec(sid, ["sh", "-c", "mkdir -p empty-dir && ln -s data/blob.bin link && "
                                         "ln -s /etc/hostname host-link"], env=ENV, timeout_s=10, limits=FAST)
    snap = await backend.snapshot(sid, label="after-setup")
    assert len(snap) == 64
    manifest = json.loads((backend.snapshots.manifests / f"{snap}.json").read_bytes())
    assert manifest["symlinks"] == {"host-link": "/etc/hostname", "link": "data/blob.bin"}  # recorded, not followed
    objects = _objects(backend)
    assert len(objects) == 4  # five files, two of them with the same content
    host_hostname = Path("/etc/hostname").read_bytes()
    assert all((backend.snapshots.object_path(o).read_bytes() != host_hostname) for o in objects)

    restored = await _create(backend, snapshot_id=snap)
    for path, (data, mode) in files.items():
        assert await backend.read_file(restored.sandbox_id, path) == data
        assert stat.S_IMODE(os.stat(Path(restored.root) / path).st_mode) == mode  # type: ignore[arg-type]
    assert os.readlink(Path(restored.root) / "link") == "data/blob.bin"  # type: ignore[arg-type]
    assert (Path(restored.root) / "empty-dir").is_dir()  # type: ignore[arg-type]
    run = await backend.exec(restored.sandbox_id, ["./run.sh"], env=ENV, timeout_s=10, limits=FAST)
    assert run.stdout == b"hi\n"

    # Same content again (from the restored sandbox) -> the same snapshot and no new objects.
    assert await backend.snapshot(restored.sandbox_id, label="again") == snap
    await backend.write_file(restored.sandbox_id, "new.txt", b"one more file")
    snap2 = await backend.snapshot(restored.sandbox_id, label="plus-one")
    assert snap2 != snap and _objects(backend) == objects | {_sha(b"one more file")}

    # A new backend object on the same root (a restarted worker) restores the old snapshot from disk alone.
    fresh = LocalBackend(backend.root_dir)
    try:
        again = await _create(fresh, snapshot_id=snap)
        assert await fresh.read_file(again.sandbox_id, "data/blob.bin") == files["data/blob.bin"][0]
        await fresh.kill(again.sandbox_id)
    finally:
        await fresh.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_snapshot_of_files_equals_the_sandbox_made_one_and_builds_on_a_base(backend: LocalBackend) -> None:
    info = await _create(backend)
    await backend.write_file(info.sandbox_id, "data/rows.jsonl", b'{"q": 1}\n')
    via_sandbox = await backend.snapshot(info.sandbox_id, label="through a sandbox")
    direct = await backend.snapshot_files({"data/rows.jsonl": b'{"q": 1}\n'}, label="without one")
    assert direct == via_sandbox  # same files, modes and layout: the same content-addressed id

    layered = await backend.snapshot_files({"task_impl.py": b"class Scorer: ..."}, label="on top", base=direct)
    box = await _create(backend, snapshot_id=layered)
    assert await backend.read_file(box.sandbox_id, "data/rows.jsonl") == b'{"q": 1}\n'
    assert await backend.read_file(box.sandbox_id, "task_impl.py") == b"class Scorer: ..."
    with pytest.raises(SandboxPathError):
        await backend.snapshot_files({"../outside": b"x"}, label="escape")
    with pytest.raises(SandboxError, match="snapshot"):
        await backend.snapshot_files({"a": b"x"}, label="bad base", base="0" * 64)
    assert not list(backend.snapshots.root.glob("staging-*")), "no staging directory is left behind"


async def test_a_layer_on_a_base_is_the_snapshot_a_sandbox_would_give(backend: LocalBackend) -> None:
    """``snapshot_files`` on a base composes manifests (no staging copy of the base's files): the id must be the one
    a sandbox restored from the base gives after the same writes, and a base with a damaged object is refused."""
    box = await _create(backend)
    await backend.write_file(box.sandbox_id, "data/big.jsonl", b"row\n" * 300_000)
    await backend.write_file(box.sandbox_id, "bin/tool", b"#!/bin/sh\n", mode=0o755)
    await backend.write_file(box.sandbox_id, "task_impl.py", b"old = 1\n", mode=0o600)
    base = await backend.snapshot(box.sandbox_id, label="base")
    staged = backend.snapshots.root.glob("staging-*")
    files = {"task_impl.py": b"class Scorer: ...\n", "data/extra.txt": b"x", "/sandbox/runner.py": b"print()\n"}
    layered = await backend.snapshot_files(files, label="layered", base=base)
    assert not list(staged)
    via_sandbox = await _create(backend, snapshot_id=base)
    for path, data in files.items():
        await backend.write_file(via_sandbox.sandbox_id, path, data)
    assert layered == await backend.snapshot(via_sandbox.sandbox_id, label="through a sandbox")
    assert backend.snapshots.layer(base, {"new/dir/f": b"x"}, label="-", source="files") is None  # staged instead
    assert backend.snapshots.layer(base, {"data/big.jsonl/f": b"x"}, label="-", source="files") is None
    with_new_dir = await backend.snapshot_files({"new/dir/f": b"x"}, label="staged", base=base)
    assert await backend.read_file((await _create(backend, snapshot_id=with_new_dir)).sandbox_id, "new/dir/f") == b"x"

    fresh = await _create(backend)  # no base: the file alone, as a fresh sandbox would hold it
    await backend.write_file(fresh.sandbox_id, "rows.jsonl", b"row\n")
    alone = await backend.snapshot_files({"rows.jsonl": b"row\n"}, label="no base")
    assert alone == await backend.snapshot(fresh.sandbox_id, label="a fresh sandbox's")
    assert backend.snapshots.layer(None, {"rows.jsonl": b"row\n"}, label="-", source="files") == alone

    obj = backend.snapshots.object_path(_sha(b"old = 1\n"))
    os.chmod(obj, 0o600)
    obj.write_bytes(b"old = 2\n")  # same size, other bytes
    with pytest.raises(SandboxError, match="damaged"):
        await backend.snapshot_files({"task_impl.py": b"y"}, label="on a damaged base", base=base)


async def test_damaged_snapshot_is_refused(backend: LocalBackend) -> None:
    info = await _create(backend)
    await backend.write_file(info.sandbox_id, "a.txt", b"original")
    snap = await backend.snapshot(info.sandbox_id, label="x")
    obj = backend.snapshots.object_path(_sha(b"original"))
    os.chmod(obj, 0o600)
    obj.write_bytes(b"tampered")
    with pytest.raises(Exception, match="damaged"):
        await backend.create(role="task", run_id="r", snapshot_id=snap)
    with pytest.raises(Exception, match="unknown snapshot"):
        await backend.create(role="task", run_id="r", snapshot_id="0" * 64)


# ------------------------------------------------------------------------------------------------ kill and reap ---


async def spawn_with_a_child(backend: LocalBackend, info: SandboxInfo) -> SandboxProcess:
    """A command in the sandbox that started a child in a session of its own, both running when this returns."""
    proc = await backend.spawn(info.sandbox_id, [PY, "-c", "import subprocess, time\n"
                                                 "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                                                 "print('up', flush=True); time.sleep(300)"], env=ENV, limits=FAST)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    assert len(_pids_of_uid(info.metadata["sandbox_uid"])) >= 2
    return proc


async def test_kill_removes_processes_and_directory(backend: LocalBackend) -> None:
    info = await _create(backend)
    uid = info.metadata["sandbox_uid"]
    proc = await spawn_with_a_child(backend, info)
    meta = json.loads((Path(info.root).parent / "meta.json").read_text())  # type: ignore[arg-type]
    lifetime = await backend.kill(info.sandbox_id)
    assert lifetime > 0
    assert await _wait_no_pids(uid) == []
    assert not Path(info.root).parent.exists()  # type: ignore[arg-type]
    assert not Path(f"/proc/{meta['init_pid']}/stat").exists() or \
        Path(f"/proc/{meta['init_pid']}/stat").read_text().split(") ")[1][0] in "ZX"
    assert await asyncio.wait_for(proc.wait(), 10) < 0 and proc.killed_reason == "sandbox_killed"
    assert await backend.kill(info.sandbox_id) == lifetime  # idempotent
    with pytest.raises(SandboxNotFound):
        await backend.exec(info.sandbox_id, ["true"], env=ENV, timeout_s=5, limits=FAST)
    assert info.sandbox_id not in {i.sandbox_id for i in await backend.list_alive()}


CRASHING_WORKER = r"""
import asyncio, os, signal, sys
from pathlib import Path
from benchwright.sandbox import ExecLimits, LocalBackend

async def main():
    b = LocalBackend(Path(sys.argv[1]))
    info = await b.create(role="work", run_id="orphan-run")
    sleeper = "import time; print('up', flush=True); time.sleep(300)"
    proc = await b.spawn(info.sandbox_id, [sys.executable, "-c", sleeper], env={"PATH": "/usr/bin:/bin"},
                         limits=ExecLimits())
    await proc.stdout.readline()
    if sys.argv[2:] == ["--kill-later"]:  # killed, its remains left for later (tests/sandbox/test_kill_later.py)
        await b.kill(info.sandbox_id, remains="later")
    print(info.sandbox_id, info.metadata["sandbox_uid"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the worker crashes with its sandbox still running (or its remains)

asyncio.run(main())
"""


async def test_reap_kills_orphans_left_by_a_crashed_worker(backend: LocalBackend) -> None:
    keep = await _create(backend, run_id="live-run")
    crashed = subprocess.run([PY, "-c", CRASHING_WORKER, str(backend.root_dir)], capture_output=True, timeout=60,
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
    orphan_id, orphan_uid = crashed.stdout.decode().split()
    assert _pids_of_uid(int(orphan_uid)), "the orphan's command should still be running"

    alive = {i.sandbox_id: i for i in await backend.list_alive()}
    assert {orphan_id, keep.sandbox_id} <= set(alive)
    assert alive[orphan_id].metadata["benchwright_run_id"] == "orphan-run"

    reaped = await backend.reap(lambda i: i.metadata["benchwright_run_id"] == "orphan-run")
    assert reaped == [orphan_id]
    assert await _wait_no_pids(int(orphan_uid)) == []
    assert not (backend.root_dir / "sandboxes" / orphan_id).exists()
    assert {i.sandbox_id for i in await backend.list_alive()} == {keep.sandbox_id}
    ok = await backend.exec(keep.sandbox_id, ["true"], env=ENV, timeout_s=10, limits=FAST)
    assert ok.returncode == 0


# ------------------------------------------------------------------------------------------------- unisolated ---


async def test_unisolated_mode_records_none(tmp_path: Path, secret_env: int) -> None:
    b = LocalBackend(tmp_path / "data", allow_unisolated=True, isolation="none")
    try:
        info = await b.create(role="driver", run_id="r")
        assert info.metadata["isolation"] == "none"
        res = await b.exec(info.sandbox_id, ["env", "-0"], env={"PATH": "/usr/bin:/bin"}, timeout_s=10, limits=FAST)
        assert res.stdout == b"PATH=/usr/bin:/bin\0"  # the environment is still exactly the one passed...
        # ...but nothing else is isolated: the same hostile read that fails in a sandbox succeeds here, which is
        # what makes the hostile test meaningful.
        res = await b.exec(info.sandbox_id, [PY, "-c", f"print(open('/proc/{secret_env}/environ','rb').read())"],
                           env=ENV, timeout_s=10, limits=FAST)
        assert SECRET.encode() in res.stdout
        res = await b.exec(info.sandbox_id, [PY, "-c", "import time; time.sleep(30)"], env=ENV, timeout_s=10,
                           limits=ExecLimits(wall_seconds=0.5))
        assert res.timed_out
        snap = await b.snapshot(info.sandbox_id, label="x")
        assert (await b.create(role="driver", run_id="r", snapshot_id=snap)).metadata["isolation"] == "none"
    finally:
        await _kill_all(b)


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory the unprivileged user ``nobody`` owns (pytest's tmp_path is not reachable for it)."""
    data = Path(tempfile.mkdtemp(prefix="bw-sandbox-unpriv-"))
    os.chown(data, 65534, 65534)
    yield data
    shutil.rmtree(data, ignore_errors=True)


UNAVAILABLE_PROBE = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from benchwright.sandbox import ExecLimits, IsolationUnavailable, LocalBackend
    async def main():
        try:
            await LocalBackend(Path(sys.argv[1])).create(role="task", run_id="r")
        except IsolationUnavailable as exc:
            print("UNAVAILABLE", exc)
        b = LocalBackend(Path(sys.argv[1]), allow_unisolated=True)
        info = await b.create(role="task", run_id="r")
        res = await b.exec(info.sandbox_id, ["echo", "ran"], env={"PATH": "/usr/bin:/bin"}, timeout_s=10,
                           limits=ExecLimits())
        print("FALLBACK", info.metadata["isolation"], res.stdout.decode().strip())
        await b.kill(info.sandbox_id)
    asyncio.run(main())
""")


def test_without_root_create_raises_isolation_unavailable(nobody_dir: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root, setpriv and a system /usr/bin/python3 to run a check as an unprivileged user")
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                            UNAVAILABLE_PROBE, str(nobody_dir)], capture_output=True, text=True, timeout=60,
                           cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    if "No module named" in probe.stderr or "Permission denied" in probe.stderr:
        pytest.skip(f"an unprivileged user cannot import the project here: {probe.stderr[-300:]}")
    assert "UNAVAILABLE" in probe.stdout and "needs root" in probe.stdout, probe.stderr
    assert "allow_unisolated=True" in probe.stdout
    assert "FALLBACK none ran" in probe.stdout, probe.stderr


def test_in_a_rootless_user_namespace_create_raises_isolation_unavailable(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and util-linux unshare")
    # "root" mapped alone into a user namespace, as in a rootless container: the sandbox uids do not exist there.
    probe = subprocess.run(["unshare", "--user", "--map-root-user", PY, "-c", UNAVAILABLE_PROBE, str(tmp_path)],
                           capture_output=True, text=True, timeout=60, cwd=REPO,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    if "unshare failed" in probe.stderr:
        print(f"SKIP: the kernel refuses user namespaces: {probe.stderr.strip()}")
        pytest.skip(f"the kernel refuses user namespaces: {probe.stderr.strip()}")
    assert "UNAVAILABLE" in probe.stdout and "uid map" in probe.stdout, probe.stderr
    assert "FALLBACK none ran" in probe.stdout, probe.stderr
