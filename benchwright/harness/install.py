"""Harness runtimes, prepared once per deployment (like images): one venv per harness version, never per run.

``benchwright harness install inspect lmeval`` builds ``<harness_dir>/<name>-<version>/`` with the harness's pinned
packages, from the interpreter the worker runs on (so the venv's ``python`` is a symlink to a base interpreter the
sandboxes already mount). Sandboxes then mount the venv read-only at the same path and run the harness from it; a
run never pip-installs a harness. A ``.complete`` stamp written last marks a finished install, so an install killed
half-way is redone, and a finished one is reused; two installs of one runtime at once take turns on a lock file beside
it (tests cache these under ``~/.cache/benchwright-harness``, and two test processes may need one at once).

lm-eval and lighteval pull in torch: ``torch==2.13.0`` is pinned and installed first, so pip takes the CPU wheel (a
plain ``torch`` requirement resolves to a multi-GB CUDA build). lighteval 0.13.0 builds LiteLLM's disk cache at
import (``LiteLLMCacheType.DISK``, gone from litellm 1.109), so litellm is pinned to 1.108.0 (with ``orjson`` and
``soundfile``, which its cache and cache hits import without declaring them); it hashes ``str`` with xxhash (refused
by xxhash 4), so xxhash is pinned to 3.8.2; every other package of its venv is pinned by
``locks/lighteval-0.13.0.txt`` (pip's resolver gave up on lighteval's loose dependencies once later releases were
out). lighteval also imports every built-in task module on every run, and ``tiny_benchmarks`` downloads
``tinyBenchmarks.pkl`` from raw.githubusercontent.com at import unless the file exists beside it: the install leaves
an empty one there (``offline_stubs``), so the harness starts offline (its tinyBenchmarks tasks read their weights
from another, relative, path anyway). harbor needs Python >= 3.12: its venv is made from such an interpreter found
on the machine (``find_python``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

from benchwright.errors import InvalidInput, Unavailable
from benchwright.stack.cpu import spawning


@dataclass(frozen=True)
class HarnessRuntime:
    """What one harness needs installed, in install order (each step is one pip command)."""

    name: str
    version: str
    steps: tuple[tuple[str, ...], ...]
    entry: str
    """The console script that runs the harness (``bin/<entry>`` in the venv)."""
    offline_stubs: tuple[str, ...] = ()
    """Files (relative to the venv's site-packages) created empty after the install when missing: data a harness
    downloads at import time, which an offline sandbox cannot (see the module docstring)."""
    min_python: tuple[int, int] | None = None
    """The oldest interpreter the harness supports; when the worker's own is older, the install looks for one on
    the machine (``find_python``)."""
    lock: str | None = None
    """A file in ``benchwright/harness/locks`` pinning every package of the venv, given to each pip step as its
    constraints (``-c``): the install is then the same on every machine and day, whatever was released since."""


RUNTIMES: dict[str, HarnessRuntime] = {
    "inspect": HarnessRuntime(name="inspect", version="0.3.285",
                              steps=(("inspect-ai==0.3.285", "openai>=1.99"),), entry="inspect"),
    "lmeval": HarnessRuntime(name="lmeval", version="0.4.13",
                             steps=(("torch==2.13.0",), ("lm-eval[api]==0.4.13",)), entry="lm_eval"),
    "lighteval": HarnessRuntime(name="lighteval", version="0.13.0",
                                steps=(("torch==2.13.0",),
                                       ("lighteval[litellm]==0.13.0", "litellm==1.108.0", "xxhash==3.8.2",
                                        "orjson==3.13.0", "soundfile==0.14.0")),
                                entry="lighteval", offline_stubs=("lighteval/tasks/tasks/tinyBenchmarks.pkl",),
                                lock="lighteval-0.13.0.txt"),
    "harbor": HarnessRuntime(name="harbor", version="0.26.0", steps=(("harbor==0.26.0",),), entry="harbor",
                             min_python=(3, 12)),
}
"""The harnesses a deployment can install (``benchwright.harness.bridges.HARNESSES`` are the ones a launch may
name; a test keeps the two equal)."""

STAMP = ".complete"
LOCKS = Path(__file__).resolve().parent / "locks"
"""Pinned package sets of the runtimes that name one (``HarnessRuntime.lock``)."""
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
    path.parent.mkdir(parents=True, exist_ok=True)
    # One install at a time per runtime on this machine (two `harness install`s, two test processes): the second
    # waits here, then finds the first's stamp instead of removing its half-built venv.
    with (path.parent / f"{path.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / STAMP).exists():
            return path, 0.0
        started = time.monotonic()
        with spawning():  # pip and the builds it starts on every CPU, not a pinned worker's one
            _build(runtime, path, name=name, log=log)
        return path, time.monotonic() - started


def _build(runtime: HarnessRuntime, path: Path, *, name: str, log: Path | None) -> None:
    """``install``'s work: the venv at ``path``, ``runtime``'s steps into it, its stamp last."""
    if path.exists():  # a half-finished install: start over
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = None if runtime.min_python is None or sys.version_info[:2] >= runtime.min_python else \
        find_python(runtime.min_python, name=name)
    if base is None:
        # The base interpreter, not the worker's venv: the harness venv must not see Benchwright's own packages.
        venv.EnvBuilder(with_pip=True, symlinks=True).create(path)
    else:
        proc = subprocess.run([str(base), "-m", "venv", "--symlinks", str(path)], check=False, capture_output=True,
                              text=True, timeout=PIP_TIMEOUT_S)
        if proc.returncode != 0:
            raise Unavailable(f"creating the {name} venv with {base} failed: {(proc.stderr or proc.stdout)[-1500:]}")
    python = path / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    constraints = ["-c", str(LOCKS / runtime.lock)] if runtime.lock else []
    for step in runtime.steps:
        proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *constraints, *step], check=False,
                              env=env, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if log is not None:
            with log.open("a") as out:
                out.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise Unavailable(f"installing {' '.join(step)} for the {name} harness failed "
                              f"(exit {proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()
    for stub in runtime.offline_stubs:
        target = Path(site) / stub
        if not target.exists():
            target.touch()
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version.split()[0])"], check=True,
                             capture_output=True, text=True, timeout=60).stdout.strip()
    (path / STAMP).write_text(f"{name} {runtime.version} python {version}\n")


def find_python(minimum: tuple[int, int], *, name: str) -> Path:
    """A base interpreter on this machine at least ``minimum`` (PATH's ``python3.X``, then pyenv's versions), the
    oldest such minor first (the one the harness's wheels most surely cover); never a virtualenv's (its packages
    would leak into the harness venv).

    Raises:
        InvalidInput: none found (``harness_needs_python``), saying which version the harness needs.
    """
    for found in python_candidates(minimum):
        return found
    raise InvalidInput(f"the {name} harness needs Python >= {minimum[0]}.{minimum[1]} and none was found on this "
                       f"machine (searched PATH for python3.N and {PYENV_VERSIONS}); install one and retry",
                       code="harness_needs_python")


PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def python_candidates(minimum: tuple[int, int]) -> list[Path]:
    """Base interpreters at least ``minimum``, best first (see ``find_python``)."""
    found: list[tuple[tuple[int, int], Path]] = []
    for minor in range(minimum[1], 20):
        on_path = shutil.which(f"python{minimum[0]}.{minor}")
        if on_path is not None:
            found.append(((minimum[0], minor), Path(on_path)))
    if PYENV_VERSIONS.is_dir():
        for version in PYENV_VERSIONS.iterdir():
            parts = version.name.split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() and (version / "bin" / "python").exists():
                found.append(((int(parts[0]), int(parts[1])), version / "bin" / "python"))
    usable = []
    for key, exe in sorted(found, key=lambda f: f[0]):
        if key < minimum:
            continue
        real = exe.resolve()
        if (real.parent.parent / "pyvenv.cfg").exists() or "shims" in exe.parts:
            continue  # a venv's or pyenv shim's python, not a base interpreter
        if real not in usable:
            usable.append(real)
    return usable


def base_prefix(venv_path: Path) -> Path | None:
    """The base interpreter's prefix a venv was made from (``home`` in its ``pyvenv.cfg``), for sandboxes to mount
    beside the venv when it is not the worker's own."""
    cfg = venv_path / "pyvenv.cfg"
    if not cfg.exists():
        return None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    return None


def harness_root(*, data_dir: Path, harness_dir: Path | None) -> Path:
    """The deployment's harness directory (``Settings.harness_dir``, default ``<data_dir>/harness``)."""
    return harness_dir if harness_dir is not None else data_dir / "harness"
