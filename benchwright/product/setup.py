"""Setup of a product-sandbox run (``launch.recipe``; docs/agents.md): load and freeze the recipe on this worker
(the path rules checked again), probe the base in a ``template_probe`` sandbox (TemplateProbeArtifact), put the base
into the work sandbox, run the setup commands, snapshot it (SnapshotCreated: every task sandbox starts from it), and
generate ``task_impl.py`` (runner + recipe header; ProductRecipeArtifact and AtomizeArtifact carry its digest and
impl id). The frozen recipe and the generated impl are the run's work files (``recipe.json``, ``task_impl.py``).

The ``setup`` activity brackets it (``activities.setup``); Materialize is ``benchwright.product.batch``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import Engine

from benchwright.data.dataset_access import LocalPathRules
from benchwright.events import (
    AtomizeArtifact,
    DatasetTasksArtifact,
    Event,
    ProductRecipeArtifact,
    TemplateProbeArtifact,
)
from benchwright.fingerprint import sha256_hex
from benchwright.product.batch import RECIPE_FILE
from benchwright.product.recipe import (
    RecipeError,
    canonical,
    impl_id,
    impl_sha256,
    load,
    resolve_ref,
    task_impl_source,
)
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.lifecycle import open_sandbox, put_file, take_snapshot
from benchwright.settings import Settings
from benchwright.store.accounts import get_account
from benchwright.store.db import outage_tolerant as in_thread
from benchwright.store.runs import get_run

PROBE_SECONDS = 30.0
PROBE = r"""
os=unknown
if [ -r /etc/os-release ]; then os=$(. /etc/os-release && printf '%s' "${PRETTY_NAME:-$NAME}"); fi
echo "os=$os"
echo "kernel=$(uname -sr 2>/dev/null)"
for s in sh bash dash zsh ash; do p=$(command -v "$s" 2>/dev/null) && echo "shell.$s=$p"; done
ver() { command -v "$1" >/dev/null 2>&1 && echo "interp.$1=$("$1" "$2" 2>&1 | head -n 1)"; }
ver python3 --version; ver python --version; ver perl -e'print "perl $^V"'; ver node --version; ver ruby --version
ver awk --version; ver sed --version; ver git --version; ver make --version
echo "base_files=$(find . -type f 2>/dev/null | wc -l)"
"""

Emit = Callable[[str, Event], None]
"""Queues an event (keyed by a short name) to land with the phase's PhaseCompleted."""


async def setup_product(*, engine: Engine, settings: Settings, workdir: Path, run_id: str, invocation: int,
                        recipe_ref: str, max_tasks: int | None, emit: Emit) -> int:
    """Set the run's product up (see the module docstring); returns how many tasks Materialize runs.

    Raises:
        RecipeError: the recipe cannot be loaded, or a setup command failed (code ``setup_failed``, its output's
            tail in the message).
    """
    run = await in_thread(get_run, engine, run_id=run_id)
    account = await in_thread(get_account, engine, account_id=run.account_id)
    rules = LocalPathRules.from_settings(settings, account_local_paths=account.local_paths)
    path = resolve_ref(recipe_ref, rules, must_exist=True)
    recipe = await asyncio.to_thread(load, path)
    files = {name: text.encode() for name, text in recipe.base.files.items()}
    probe = await _probe(engine, settings, run_id, invocation, files)
    async with open_sandbox(engine=engine, settings=settings, run_id=run_id, role="work", key=("setup", invocation),
                            restore=None) as box:
        for name, data in files.items():
            await put_file(box, name, data)
        for n, command in enumerate(recipe.setup, start=1):
            result = await box.backend.exec(box.info.sandbox_id, ["/bin/sh", "-c", command], env=box.scorer_env(),
                                            timeout_s=recipe.setup_seconds, limits=_limits(recipe.setup_seconds))
            if result.returncode != 0:
                said = (result.stderr or result.stdout).decode(errors="replace").strip()[-1500:]
                raise RecipeError(f"recipe {recipe.name}: setup command {n} exited {result.returncode}"
                                  f"{' (' + result.killed_reason + ')' if result.killed_reason else ''}: {said}",
                                  code="setup_failed")
        await take_snapshot(engine=engine, settings=settings, box=box, run_id=run_id, phase="setup",
                            invocation=invocation)
    source = task_impl_source(recipe)
    (workdir / RECIPE_FILE).write_text(canonical(recipe))
    (workdir / "task_impl.py").write_text(source)
    total = len(recipe.tasks) if max_tasks is None else min(len(recipe.tasks), max_tasks)
    emit("probe", probe)
    emit("recipe", ProductRecipeArtifact(name=recipe.name, recipe_sha256=sha256_hex(canonical(recipe)),
                                         tasks=len(recipe.tasks), impl_id=impl_id(recipe)))
    emit("impl", AtomizeArtifact(invocation=1, impl_sha256=impl_sha256(recipe), source=f"recipe {recipe.name}"))
    emit("tasks", DatasetTasksArtifact(count=total))
    return total


def parse_probe(text: str, *, base_files: int) -> TemplateProbeArtifact:
    """The probe script's ``key=value`` lines as the artifact (unknown lines ignored)."""
    values: dict[str, str] = {}
    shells: dict[str, str] = {}
    interpreters: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()[:200]
        if key.startswith("shell."):
            shells[key[6:]] = value
        elif key.startswith("interp."):
            interpreters[key[7:]] = value
        else:
            values[key] = value
    return TemplateProbeArtifact(os=values.get("os", "unknown"), kernel=values.get("kernel", ""), shells=shells,
                                 interpreters=interpreters, base_files=base_files)


def _limits(seconds: float) -> ExecLimits:
    return ExecLimits(cpu_seconds=max(1, int(seconds)), memory_mb=1024, wall_seconds=seconds, max_processes=128,
                      max_output_bytes=64 * 1024, max_file_mb=256, cpu_cores=1.0)


async def _probe(engine: Engine, settings: Settings, run_id: str, invocation: int,
                 files: dict[str, bytes]) -> TemplateProbeArtifact:
    """What the base holds, from a ``template_probe`` sandbox (killed at once)."""
    async with open_sandbox(engine=engine, settings=settings, run_id=run_id, role="template_probe",
                            key=("setup", invocation, "probe"), restore=None) as box:
        for name, data in files.items():
            await put_file(box, name, data)
        result = await box.backend.exec(box.info.sandbox_id, ["/bin/sh", "-c", PROBE], env=box.scorer_env(),
                                        timeout_s=PROBE_SECONDS, limits=_limits(PROBE_SECONDS))
    return parse_probe(result.stdout.decode(errors="replace"), base_files=len(files))
