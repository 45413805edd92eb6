"""Two installs of one harness runtime at once (two ``benchwright harness install``s, two test processes sharing the
harness cache) take turns: one builds the venv, the other waits and reuses it, and neither removes the other's
half-built venv."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from benchwright.harness import install as harness_install
from benchwright.harness.install import STAMP, HarnessRuntime, install, installed


def test_two_installs_at_once_build_the_venv_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A runtime with no pip steps: the venv alone (a few seconds), so the two overlap for all of it.
    monkeypatch.setitem(harness_install.RUNTIMES, "bare",
                        HarnessRuntime(name="bare", version="1", steps=(), entry="python"))
    start = threading.Barrier(2)
    took: list[float] = []
    errors: list[Exception] = []

    def one() -> None:
        start.wait()
        try:
            took.append(install(tmp_path, "bare")[1])
        except Exception as exc:  # noqa: BLE001 - reported below, beside the other thread's outcome
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    built, reused = sorted(took, reverse=True)
    assert built > 0 and reused == 0.0, took
    path = installed(tmp_path, "bare")
    assert path is not None and (path / STAMP).read_text().startswith("bare 1 python ")
    assert (path / "bin" / "python").exists()
