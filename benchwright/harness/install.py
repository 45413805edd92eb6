"""Harness runtimes, prepared once per deployment (like images): one venv per harness version, never per run.

``benchwright harness install inspect lmeval`` builds ``<harness_dir>/<name>-<version>/`` with the harness's pinned
packages, from the interpreter the worker runs on (so the venv's ``python`` is a symlink to a base interpreter the
sandboxes already mount). Sandboxes then mount the venv read-only at the same path and run the harness from it; a
run never pip-installs a harness. A ``.complete`` stamp written last marks a finished install, so an install killed
half-way is redone, and a finished one is reused (tests cache these under ``~/.cache/benchwright-harness``).

lm-eval pulls in torch: ``torch==2.13.0`` is pinned and installed first, so pip takes the CPU wheel (a plain
``torch`` requirement resolves to a multi-GB CUDA build).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

from benchwright.errors import InvalidInput, Unavailable


@dataclass(frozen=True)
class HarnessRuntime:
    """What one harness needs installed, in install order (each step is one pip command)."""

    name: str
    version: str
    steps: tuple[tuple[str, ...], ...]
    entry: str
    """The console script that runs the harness (``bin/<entry>`` in the venv)."""


RUNTIMES: dict[str, HarnessRuntime] = {
    "inspect": HarnessRuntime(name="inspect", version="0.3.285",
                              steps=(("inspect-ai==0.3.285", "openai>=1.99"),), entry="inspect"),
    "lmeval": HarnessRuntime(name="lmeval", version="0.4.13",
                             steps=(("torch==2.13.0",), ("lm-eval[api]==0.4.13",)), entry="lm_eval"),
}
"""The harnesses a deployment can install (``benchwright.harness.bridges.HARNESSES`` are the ones a launch may
name; a test keeps the two equal)."""

STAMP = ".complete"
PIP_TIMEOUT_S = 1800


def runtime_for(name: str) -> HarnessRuntime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise InvalidInput(f"unknown harness {name!r}; installable: {', '.join(RUNTIMES)}",
                           code="unknown_harness") from None


def venv_dir(harness_dir: Path, name: str) -> Path:
    """Where ``name``'s runtime lives (keyed by its version, so an upgrade installs beside the old one)."""
    runtime = runtime_for(name)
    return harness_dir / f"{runtime.name}-{runtime.version}"


def installed(harness_dir: Path, name: str) -> Path | None:
    """The runtime's venv if its install finished, else None."""
    path = venv_dir(harness_dir, name)
    return path if (path / STAMP).exists() else None


def install(harness_dir: Path, name: str, *, log: Path | None = None) -> tuple[Path, float]:
    """Build ``name``'s venv (a finished one is kept); returns its path and the seconds the install took (0.0 when
    it was already there).

    Raises:
        InvalidInput: an unknown harness.
        Unavailable: pip failed (the tail of its output is in the message).
    """
    runtime = runtime_for(name)
    path = venv_dir(harness_dir, name)
    if (path / STAMP).exists():
        return path, 0.0
    started = time.monotonic()
    if path.exists():  # a half-finished install: start over
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The base interpreter, not the worker's venv: the harness venv must not see Benchwright's own packages.
    venv.EnvBuilder(with_pip=True, symlinks=True).create(path)
    python = path / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    for step in runtime.steps:
        proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *step], check=False, env=env,
                              capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if log is not None:
            with log.open("a") as out:
                out.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise Unavailable(f"installing {' '.join(step)} for the {name} harness failed "
                              f"(exit {proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}")
    (path / STAMP).write_text(f"{name} {runtime.version} python {sys.version.split()[0]}\n")
    return path, time.monotonic() - started


def harness_root(*, data_dir: Path, harness_dir: Path | None) -> Path:
    """The deployment's harness directory (``Settings.harness_dir``, default ``<data_dir>/harness``)."""
    return harness_dir if harness_dir is not None else data_dir / "harness"
