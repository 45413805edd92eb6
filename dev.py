#!/usr/bin/env python3
"""Set-up and entry point on a fresh machine with only Python >= 3.11 and pip.

    python3 dev.py demo          create .venv if needed, install Benchwright, run the end-to-end demo
    python3 dev.py test [ARGS]   create .venv if needed, install Benchwright with test extras, run pytest
    python3 dev.py check         the same environment; ruff check and mypy (configured in pyproject.toml)
    python3 dev.py bench [ARGS]  run bench/materialize.py
    python3 dev.py bench sse [ARGS]  run bench/sse.py (SSE streams on a live run)
    python3 dev.py bench harness     run bench/harness.py (a harness-bridge run vs the harness run directly)

The environment is (re)installed only when pyproject.toml changed since the last install.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def ensure_env(extras: str) -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"Benchwright needs Python >= 3.11; this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = VENV / f".installed-{extras or 'base'}-{digest}"
    if stamp.exists():
        return
    print("installing Benchwright and its dependencies into .venv (first time takes a few minutes)", flush=True)
    subprocess.check_call([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    target = f".[{extras}]" if extras else "."
    subprocess.check_call([str(PY), "-m", "pip", "install", "--quiet", "-e", target], cwd=ROOT)
    stamp.touch()


def main() -> None:
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}"}
    if command == "demo":
        ensure_env("")
        os.execve(str(VENV / "bin" / "benchwright"), ["benchwright", "demo", *args], env)
    elif command == "test":
        ensure_env("test")
        os.chdir(ROOT)
        os.execve(str(PY), [str(PY), "-m", "pytest", *args], env)
    elif command == "check":
        ensure_env("test")
        os.chdir(ROOT)
        # Both always run, so one CI log shows every finding; either failing fails the command.
        failed = [name for name, cmd in (("ruff", [str(VENV / "bin" / "ruff"), "check", "."]),
                                         ("mypy", [str(VENV / "bin" / "mypy")]))
                  if subprocess.call(cmd, env=env) != 0]
        if failed:
            sys.exit(f"check failed: {', '.join(failed)}")
    elif command == "bench":
        ensure_env("test")
        os.chdir(ROOT)
        scripts = {"sse": "bench/sse.py", "harness": "bench/harness.py"}
        script, args = ((scripts[args[0]], args[1:]) if args[:1] and args[0] in scripts
                        else ("bench/materialize.py", args))
        os.execve(str(PY), [str(PY), script, *args], env)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
