"""`benchwright demo` as a newcomer runs it (issue 22): real processes, a real stack, the bundled sample.

A kept-running demo lives on the default data directory, so plain `benchwright runs` finds it; it prints the
dashboard's address, which answers; the dev model's exact count of right answers matches the run's score; SIGTERM
to the demo stops every process it started (checked by PID). A demo that ends stops its stack, says so instead of
printing dead addresses, and leaves no temporary directory behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchwright.stack.devstack import pid_alive
from tests.cli.test_teardown import _cmdline, _descendants

BW = [sys.executable, "-m", "benchwright.cli"]


def _env(tmp_path: Path) -> dict[str, str]:
    """A newcomer's environment: a fresh home (so the default data directory is fresh) and a private TMPDIR."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHWRIGHT_")}
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    return {**env, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}


def _until_printed(path: Path, proc: subprocess.Popen[bytes], needle: str, timeout_s: float = 240) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text(errors="replace")
        if needle in text:
            return text
        assert proc.poll() is None, f"the demo exited ({proc.returncode}) before printing {needle!r}:\n{text}"
        assert time.monotonic() < deadline, f"the demo never printed {needle!r}:\n{text}"
        time.sleep(0.1)


def _right_answers_match_the_score(text: str) -> None:
    passed = int(re.search(r"passed (\d+), failed \d+, errored 0 of 60", text)[1])  # type: ignore[index]
    assert f"answers exactly {passed} of these 60 questions right at --accuracy 0.85" in text, text


def test_kept_running_demo_is_found_by_the_cli_and_sigterm_stops_everything(tmp_path: Path) -> None:
    env = _env(tmp_path)
    log = tmp_path / "demo.out"
    with log.open("wb") as sink:
        demo = subprocess.Popen([*BW, "demo", "--keep-running"], env=env, stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        text = _until_printed(log, demo, "stack left running")
        data_dir = tmp_path / "home" / ".benchwright"
        assert f"data in {data_dir})" in text  # the default data directory: the one every command reads
        _right_answers_match_the_score(text)
        run_id = re.search(r"launched run ([0-9a-f-]{36})", text)[1]  # type: ignore[index]

        dashboard = re.search(r"dashboard:\s+(http://127\.0\.0\.1:\d+/ui/)", text)[1]  # type: ignore[index]
        assert f"Benchwright is up. Dashboard {dashboard}" in text  # `up` prints it too
        page = httpx.get(dashboard, timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        signin = httpx.get(dashboard.replace("/ui/", "/v1/ui/signin"), timeout=10).json()
        assert signin["key_file"] == str(data_dir / "dev.json")  # the sign-in page names the real key file

        # plain `benchwright runs` / `show`, no --data-dir and no environment variable, find the demo's stack
        runs = subprocess.run([*BW, "runs"], env=env, capture_output=True, text=True, timeout=60)
        assert runs.returncode == 0, runs.stderr
        assert run_id[:8] in runs.stdout
        show = subprocess.run([*BW, "show", run_id], env=env, capture_output=True, text=True, timeout=60)
        assert show.returncode == 0 and run_id in show.stdout, show.stderr

        # everything the demo started, by PID: the dev model, `up`, and up's Temporal, worker and API
        started = _descendants(demo.pid)
        started.pop(demo.pid)
        assert len(started) >= 2, started  # the two children; theirs live in their own sessions, found below
        for child in list(started):
            started.update(_descendants(child))
        names = " ".join(_cmdline(pid) for pid in started)
        assert "dev-model" in names and " up " in names and "temporal" in names and "uvicorn" in names, names
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(120) == 128 + signal.SIGTERM
        survivors = [f"{pid}: {_cmdline(pid)}" for pid in started if pid_alive(pid)]
        assert not survivors, survivors
        assert not (data_dir / "dev.json").exists()
        assert data_dir.exists()  # the user's data directory is kept (their runs are in it)
    finally:
        if demo.poll() is None:  # a failed assertion: SIGTERM stops what the demo started (SIGKILL would leave it)
            demo.send_signal(signal.SIGTERM)
            try:
                demo.wait(120)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()


def test_demo_that_ends_says_its_stack_stopped_and_removes_its_temporary_data(tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = subprocess.run([*BW, "demo"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    _right_answers_match_the_score(text)
    assert "Temporal UI:" not in text and "/v1/runs/" not in text  # no address of a stack that is gone
    assert "the stack stops now" in text and "--keep-running" in text
    assert list((tmp_path / "tmp").iterdir()) == []  # no benchwright-demo-* left behind
    assert not (tmp_path / "home" / ".benchwright").exists()  # nor anything in the user's data directory
