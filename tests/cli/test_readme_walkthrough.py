"""The README's 5-minute tour, run as printed (issue 22), so the README cannot drift from the product.

The commands are read from README.md's "A 5-minute tour" section (every ```bash block in it), not copied here.
Only the places are substituted: the data directory (``$BENCHWRIGHT_DATA_DIR``, which every command honours) and
the ports (``benchwright up`` gets ``--api-port/--temporal-port/--ui-port`` for free ports, and the README's port
numbers in ``127.0.0.1:PORT`` and ``--port PORT`` become those free ports). ``source .venv/bin/activate`` is done
the way activation works: the running interpreter's ``bin`` directory goes first on PATH. Each command runs in its
own ``bash`` (``set -o pipefail``); ``NAME=$(...)`` lines keep their value for the commands after them, as a shell
would. ``benchwright up`` and commands ending in ``&`` run in the background until the end, stopped by their PID.

Every command must exit 0 and print what it is for (a check per command below; a tour command without a check
fails the test, so a new README command needs one). A block right after ``<!-- walkthrough: skip (reason) -->``
is not run; the test prints which and why. The tour's links to the dashboard and the Temporal UI must answer 200.

Two static checks ride along: every documented curl to the API carries the key and, with a body, the JSON
content type; every ``§N`` in the code has its numbered section in docs/concepts.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from benchwright.stack.devstack import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOUR = "## A 5-minute tour"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
SKIP = re.compile(r"<!--\s*walkthrough:\s*skip\s*\((?P<why>[^)]*)\)\s*-->")
UP_PORTS = {"api": 8700, "temporal": 7233, "ui": 8233}  # `benchwright up`'s defaults, which the README prints


@dataclass
class Block:
    commands: list[str]
    skip: str | None = None


def tour_section(text: str) -> str:
    start = text.index(TOUR)
    end = text.find("\n## ", start + len(TOUR))
    return text[start:end if end != -1 else None]


def tour_blocks(section: str) -> list[Block]:
    """Each ```bash block, its commands (continuation lines joined, comments and blank lines dropped)."""
    blocks: list[Block] = []
    for m in re.finditer(r"```bash\n(.*?)```", section, re.S):
        before = section[:m.start()].rstrip().rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        joined = re.sub(r"\\\n\s*", " ", m.group(1))
        cmds = [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
        blocks.append(Block(cmds, skip.group("why") if skip else None))
    return blocks


@dataclass
class Tour:
    data_dir: Path
    ports: dict[int, int]  # the README's port -> the free port used here
    env: dict[str, str]
    background: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    vars: dict[str, str] = field(default_factory=dict)
    printed_run: str | None = None
    printed_fork: str | None = None

    def place(self, text: str) -> str:
        """The README's ports replaced by this test's free ones (only where they name a port)."""
        def swap(m: re.Match[str]) -> str:
            return m.group(1) + str(self.ports.get(int(m.group(2)), m.group(2)))
        return re.sub(r"(127\.0\.0\.1:|--port )(\d+)", swap, text)

    def shell_env(self) -> dict[str, str]:
        return {**self.env, **self.vars}


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    return proc.returncode


def _wait_until(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"{what} was not ready after {timeout} s")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# What each tour command must print, besides exiting 0: (pattern on the command as printed, check).
Check = Callable[[Tour, str], None]


def _check_watch(tour: Tour, out: str) -> None:
    m = re.search(rf"run ({UUID}): ok\b[^\n]*?\b(\d+(?:\.\d+)?)%", out)
    assert m, f"no final line with the run id, ok and a score:\n{out}"
    tour.printed_run = m.group(1)
    assert re.search(r"\bpassed\b", out) and "60" in out, out


def _check_runs(tour: Tour, out: str) -> None:
    assert tour.printed_run and tour.printed_run[:8] in out and re.search(r"\bok\b", out), out


def _check_run_var(tour: Tour, out: str) -> None:
    assert re.fullmatch(UUID, out), out
    assert out == tour.printed_run, f"RUN is {out}, but `run --watch` printed {tour.printed_run}"


def _check_show(tour: Tour, out: str) -> None:
    assert tour.vars["RUN"] in out and "pass rate" in out and "95 % CI" in out and "60" in out, out


def _check_tasks(tour: Tour, out: str) -> None:
    rows = re.findall(r"^\s*(\d+)\s+(pass|fail|err)\b", out, re.M)
    assert sorted(int(i) for i, _ in rows) == list(range(60)), out
    assert any(o == "pass" for _, o in rows), out


def _check_events(tour: Tour, out: str) -> None:
    assert re.search(r"^\s*0\s+\S+\s+RunLaunched\b", out, re.M) and "PipelineFinished" in out, out


def _check_fork_watch(tour: Tour, out: str) -> None:
    m = re.search(rf"run ({UUID}): ok\b[^\n]*?\b(\d+(?:\.\d+)?)%", out)
    assert m and m.group(1) != tour.vars["RUN"], f"no final line with the fork's id, ok and a score:\n{out}"
    tour.printed_fork = m.group(1)


def _check_fork_var(tour: Tour, out: str) -> None:
    assert re.fullmatch(UUID, out) and out != tour.vars["RUN"], out
    assert out == tour.printed_fork, f"FORK is {out}, but `fork --watch` printed {tour.printed_fork}"


def _check_compare(tour: Tour, out: str) -> None:
    # The fork scored the weaker dev model (--accuracy 0.7 against 0.9) on the same 60 tasks.
    assert "B is worse than A" in out and "on 60 tasks" in out, out
    assert tour.vars["RUN"] in out and tour.vars["FORK"] in out, out


def _check_lineage(tour: Tour, out: str) -> None:
    assert tour.vars["RUN"][:8] in out and tour.vars["FORK"][:8] in out and "fork at attach" in out, out


def _check_dev(tour: Tour, out: str) -> None:
    assert out == str(tour.data_dir / "dev.json"), out


def _check_api(tour: Tour, out: str) -> None:
    assert out == f"http://127.0.0.1:{tour.ports[UP_PORTS['api']]}", out


def _check_key(tour: Tour, out: str) -> None:
    assert out.startswith("bw_") and len(out) > 20, "KEY is not an API key"


def _check_get_run(tour: Tour, out: str) -> None:
    run = json.loads(out)
    assert run["id"] == tour.vars["RUN"] and run["terminal"] is True and run["status"] == "ok", out


def _check_replay(tour: Tour, out: str) -> None:
    run = json.loads(out)  # a 422 (no content-type) or any error would be {"error": ...}
    assert "error" not in run or run["error"] is None, out
    assert re.fullmatch(UUID, run["id"]) and run["model"]["identifier"] == "openai/weaker", out


CHECKS: list[tuple[str, Check]] = [
    (r"^benchwright run .*--watch", _check_watch),
    (r"^benchwright runs$", _check_runs),
    (r"^RUN=\$\(benchwright runs ", _check_run_var),
    (r"^benchwright show \$\{RUN:0:8\}$", _check_show),
    (r"^benchwright tasks \$RUN$", _check_tasks),
    (r"^benchwright events \$RUN$", _check_events),
    (r"^benchwright fork \$RUN .*--watch", _check_fork_watch),
    (r"^FORK=\$\(benchwright runs ", _check_fork_var),
    (r"^benchwright compare \$RUN \$FORK$", _check_compare),
    (r"^benchwright lineage \$RUN$", _check_lineage),
    (r"^DEV=", _check_dev),
    (r"^API=", _check_api),
    (r"^KEY=", _check_key),
    (r"^curl -s \$API/v1/runs/\$RUN ", _check_get_run),
    (r"^curl -s -X POST \$API/v1/runs/\$RUN/replay ", _check_replay),
]


def _start_background(tour: Tour, command: str) -> None:
    cmd = tour.place(command)
    name = cmd.split()[1] if cmd.startswith("benchwright ") else cmd
    if cmd == "benchwright up" or cmd.startswith("benchwright up "):
        cmd += "".join(f" --{k}-port {tour.ports[v]}" for k, v in UP_PORTS.items())
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=ROOT, env=tour.shell_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=(tour.data_dir.parent / "up.err").open("wb"))
        tour.background.append((cmd, proc))
        _wait_until(lambda: (tour.data_dir / "dev.json").exists(), proc, cmd)
        return
    assert cmd.endswith("&"), cmd
    cmd = cmd[:-1].strip()
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=ROOT, env=tour.shell_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tour.background.append((cmd, proc))
    port = re.search(r"--port (\d+)", cmd)
    assert port and name == "dev-model", f"a background command the test cannot wait for: {cmd}"
    _wait_until(lambda: _answers(f"http://127.0.0.1:{port.group(1)}/v1/models"), proc, cmd)


def _run(tour: Tour, command: str) -> None:
    cmd = tour.place(command)
    assign = re.match(r"^([A-Z_]+)=(.*)$", cmd)
    script = f"set -o pipefail; {cmd}" + (f'; printf %s "${assign.group(1)}"' if assign else "")
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=tour.shell_env(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    checks = [check for pattern, check in CHECKS if re.search(pattern, command)]
    assert len(checks) == 1, f"tour command without exactly one check in this test (add one): {command}"
    if assign:
        tour.vars[assign.group(1)] = done.stdout
        checks[0](tour, done.stdout)
    else:
        checks[0](tour, done.stdout + done.stderr)
    print(f"ok: {command}")


@pytest.fixture
def tour(tmp_path: Path) -> Iterator[Tour]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    readme_ports = [*UP_PORTS.values(), *map(int, re.findall(r"--port (\d+)", tour_section(README.read_text())))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHWRIGHT_")}
    env["BENCHWRIGHT_DATA_DIR"] = str(data_dir)
    t = Tour(data_dir=data_dir, ports={p: free_port() for p in readme_ports}, env=env)
    try:
        yield t
    finally:
        for cmd, proc in reversed(t.background):
            rc = _stop(proc)
            print(f"stopped `{cmd}` (pid {proc.pid}): exit {rc}")


def test_readme_tour_runs_as_printed(tour: Tour) -> None:
    section = tour_section(README.read_text())
    blocks = tour_blocks(section)
    assert sum(len(b.commands) for b in blocks if not b.skip) >= 10, "the tour lost its commands"
    for block in blocks:
        if block.skip:
            print(f"skipped block ({block.skip}): " + "; ".join(block.commands))
            continue
        for command in block.commands:
            if command == "source .venv/bin/activate":
                # Activation puts the venv's bin first on PATH: the venv here is the one running this test.
                tour.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{tour.env.get('PATH', '')}"
                tour.env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
                print(f"ok: {command} (as {Path(sys.executable).parent} first on PATH)")
            elif command.startswith("benchwright up") or command.endswith("&"):
                _start_background(tour, command)
                print(f"ok: {command} (in the background)")
            elif command.startswith("curl ") and shutil.which("curl") is None:
                assert os.environ.get("CI") != "true", f"curl is not installed, so the tour cannot run: {command}"
                print(f"skipped (curl is not installed here; on CI this fails): {command}")
            else:
                _run(tour, command)
    for url in re.findall(r"<(http://127\.0\.0\.1:\d+[^>]*)>", section):
        placed = tour.place(url)
        assert _answers(placed), f"the tour's link {url} ({placed} here) does not answer 200"
        print(f"ok: {url} answers 200")
    up = next(proc for cmd, proc in tour.background if cmd.startswith("benchwright up"))
    assert _stop(up) == 0, (tour.data_dir.parent / "up.err").read_text()


def test_tour_blocks_parse_as_commands() -> None:
    """The parser itself: continuation lines join, comments drop, a skip marker skips only its own block."""
    section = (f"{TOUR}\n\n```bash\na --x \\\n   --y  # why\n# only a comment\n\nb\n```\n\n"
               "<!-- walkthrough: skip (needs a real provider) -->\n```bash\nc\n```\n\n```bash\nd &\n```\n## Next\n")
    blocks = tour_blocks(tour_section(section))
    assert [(b.commands, b.skip) for b in blocks] == [
        (["a --x  --y  # why", "b"], None), (["c"], "needs a real provider"), (["d &"], None)]


def _documented_commands() -> Iterator[tuple[Path, str]]:
    """Every command in a ```bash block of the README and docs/, continuation lines joined."""
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                if line.strip():
                    yield page, line.strip()


def test_documented_curl_requests_send_a_key_and_json() -> None:
    """A curl example with a body that lacks ``content-type: application/json`` answers 422, and one without the key
    401: every curl the README and docs/ print that talks to the API carries both."""
    curls = [(page, line) for page, line in _documented_commands() if line.startswith("curl ") and "$API" in line]
    assert len(curls) >= 4, curls
    for page, line in curls:
        assert 'Authorization: Bearer $KEY"' in line, f"{page.name}: {line}"
        if " -d " in line:
            assert '-H "content-type: application/json"' in line, f"{page.name}: {line}"


def test_section_references_have_a_home_in_concepts() -> None:
    """``§N`` in the code and in user-facing messages means section N of docs/concepts.md: every N used exists there,
    under its numbered heading and anchor."""
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    numbered = {int(n) for n in re.findall(r'^<a id="s(\d+)"></a>\n## \1\. ', concepts, re.M)}
    assert numbered == set(range(1, 14)), numbered
    used: set[int] = set()
    for package in ("benchwright", "api", "activities", "workflows"):
        for source in (ROOT / package).rglob("*.py"):
            # RFC sections (RFC 9112 §6.3) are not ours: they always have a dotted part.
            used |= {int(n) for n in re.findall(r"§(\d+)(?![.\d])", source.read_text())}
    assert used and used <= numbered, sorted(used - numbered)
    assert "§N" in (ROOT / "benchwright" / "__init__.py").read_text()
