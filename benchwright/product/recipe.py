"""Product-sandbox recipes (§2, §4, §7): a Benchwright-built environment benchmark, declared in one YAML file.

A recipe names its base (files put into the sandbox's working directory: a directory beside the recipe and/or inline
files), setup commands (run once in the work sandbox, then snapshotted), the tasks (an instruction for the agent
and a checker command whose exit status decides the task) and the agent's limits. docs/agents.md has the format.

A launch names a recipe with ``recipe``: a bundled name (``terminal-basics``) or a path on the worker's host, under
the same local-path rules as a dataset path (``benchwright.data.dataset_access``). The API checks the name or path at
launch; Setup loads it on the worker (checking again) and *freezes* it: the base directory is read into the
recipe's ``base.files``, so what the run used is one JSON document (``recipe.json`` in the run's work files).

``task_impl.py`` is generated, never written by a Driver: the product runner's source plus the frozen recipe as its
header, so ``impl_sha256`` (and the impl id, ``<recipe name>:<first 12 hex>``, keyed on the recipe's name as the
subset id) changes when, and only when, the recipe or the runner changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from benchwright.data.dataset_access import LocalPathRules, check_local_path
from benchwright.errors import InvalidInput
from benchwright.schemas import LaunchRequest

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_RECIPE_BYTES = 512 * 1024
MAX_BASE_FILES = 200
MAX_BASE_BYTES = 1024 * 1024
MAX_TASKS = 500
BUNDLED = "benchwright.product.recipes"


class RecipeError(InvalidInput):
    code = "invalid_recipe"


class AgentLimits(BaseModel):
    """Bounds of one task's agent (every one enforced by the runner; a task that crosses one ends ``err``)."""

    model_config = ConfigDict(extra="forbid")

    turns: int = Field(default=20, ge=1, le=200)
    """Model calls per task."""
    wall_seconds: float = Field(default=120.0, gt=0, le=3600)
    """The whole task: agent, tools and checker."""
    tokens: int = Field(default=100_000, ge=1, le=10_000_000)
    """Prompt + completion tokens of the task's model calls together."""
    command_seconds: float = Field(default=20.0, gt=0, le=600)
    """One shell command (its whole process tree is killed beyond it)."""
    output_bytes: int = Field(default=8192, ge=256, le=1024 * 1024)
    """What the agent sees of one tool's output (the rest is cut, and it is told so)."""
    file_mb: int = Field(default=16, ge=1, le=1024)
    """Largest file a command may write (RLIMIT_FSIZE)."""
    disk_mb: int = Field(default=256, ge=1, le=65536)
    """The task's files together (checked after every shell command and file write)."""
    memory_mb: int = Field(default=512, ge=64, le=8192)
    processes: int = Field(default=64, ge=4, le=1024)


class RecipeTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    instruction: str = Field(min_length=1, max_length=8192)
    check: str = Field(min_length=1, max_length=8192)
    """A ``/bin/sh -c`` command run in the task sandbox after the agent finishes: exit 0 passes."""

    @field_validator("id")
    @classmethod
    def _plain_id(cls, v: str) -> str:
        if not TASK_ID.match(v):
            raise ValueError("a task id is letters, digits, '.', '_', '-' (at most 100)")
        return v


class Base(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dir: str | None = Field(default=None, max_length=1024)
    """A directory beside the recipe file whose tree is copied into the sandbox (read at freeze time)."""
    files: dict[str, str] = Field(default_factory=dict)
    """Relative path -> text, put into the sandbox's working directory."""

    @field_validator("files")
    @classmethod
    def _relative(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > MAX_BASE_FILES:
            raise ValueError(f"at most {MAX_BASE_FILES} base files")
        if sum(len(k) + len(v.encode()) for k, v in files.items()) > MAX_BASE_BYTES:
            raise ValueError(f"base files are at most {MAX_BASE_BYTES} bytes together")
        for path in files:
            check_relative(path)
        return files


def check_relative(path: str) -> str:
    """A relative POSIX path inside the sandbox's working directory (no ``..``, not absolute, no empty parts)."""
    p = PurePosixPath(path)
    if not path or len(path) > 512 or p.is_absolute() or any(part in ("", "..", ".") for part in path.split("/")):
        raise ValueError(f"{path!r} must be a relative path inside the sandbox (no '..', not absolute)")
    return path


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """The subset id its impls are keyed on."""
    description: str = Field(default="", max_length=2000)
    base: Base = Field(default_factory=Base)
    setup: list[str] = Field(default_factory=list, max_length=50)
    """``/bin/sh -c`` commands run in order in the work sandbox; the snapshot after them is every task's start."""
    setup_seconds: float = Field(default=120.0, gt=0, le=1800)
    """Bound on each setup command."""
    system_prompt: str | None = Field(default=None, max_length=8192)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    tasks: list[RecipeTask] = Field(min_length=1, max_length=MAX_TASKS)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v):
            raise ValueError("a recipe name is lowercase letters, digits and '-' (at most 64)")
        return v

    @field_validator("setup")
    @classmethod
    def _commands(cls, v: list[str]) -> list[str]:
        if any(not c.strip() or len(c) > 8192 for c in v):
            raise ValueError("a setup command is non-empty and at most 8192 characters")
        return v

    @model_validator(mode="after")
    def _unique_ids(self) -> Recipe:
        ids = [t.id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("task ids must be unique")
        return self


def parse(text: str, *, where: str) -> Recipe:
    """A recipe from YAML text.

    Raises:
        RecipeError: not YAML, too large, or not a valid recipe (every problem named with its location).
    """
    if len(text.encode()) > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe {where} is over {MAX_RECIPE_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # the problem and where, never the file's text (it may not be a recipe at all)
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise RecipeError(f"recipe {where} is not valid YAML: {getattr(exc, 'problem', None) or 'unreadable'}{at}") \
            from None
    return validate(doc, where=where)


def validate(doc: Any, *, where: str) -> Recipe:
    if not isinstance(doc, dict):
        raise RecipeError(f"recipe {where} must be a YAML mapping (name, tasks, ...)")
    try:
        return Recipe.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'recipe'}: {e['msg']}" for e in exc.errors())
        raise RecipeError(f"recipe {where}: {problems}") from None


def is_bundled_name(ref: str) -> bool:
    return bool(NAME.match(ref))


def bundled_names() -> list[str]:
    root = resources.files(BUNDLED)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "recipe.yaml").is_file())


def bundled_path(name: str) -> Path:
    """The bundled recipe ``name``'s YAML file.

    Raises:
        RecipeError: no bundled recipe of that name (``unknown_recipe``).
    """
    names = bundled_names()
    if name not in names:
        raise RecipeError(f"no bundled recipe '{name}'; bundled: {', '.join(names)} (or give a path to a recipe "
                          "YAML on the worker's host)", code="unknown_recipe")
    return Path(str(resources.files(BUNDLED) / name / "recipe.yaml"))


def freeze(recipe: Recipe, *, directory: Path) -> Recipe:
    """The recipe with its base directory read into ``base.files`` (``dir`` cleared), so the run holds all of it.

    Raises:
        RecipeError: the base directory leaves the recipe's directory, holds a symlink or a special file, or is
            over the base bounds.
    """
    if recipe.base.dir is None:
        return recipe
    root = directory.resolve()
    base = (root / recipe.base.dir).resolve()
    if not base.is_relative_to(root) or not base.is_dir():
        raise RecipeError(f"base.dir {recipe.base.dir!r} must be a directory beside the recipe file")
    files: dict[str, str] = {}
    total = 0
    for path in sorted(base.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise RecipeError(f"base.dir holds {path.relative_to(base)}, which is not a plain file or directory")
        if path.is_dir():
            continue
        total += path.stat().st_size
        if len(files) >= MAX_BASE_FILES or total > MAX_BASE_BYTES:
            raise RecipeError(f"base.dir is over {MAX_BASE_FILES} files or {MAX_BASE_BYTES} bytes")
        try:
            files[path.relative_to(base).as_posix()] = path.read_text()
        except UnicodeDecodeError:
            raise RecipeError(f"base.dir file {path.relative_to(base)} is not UTF-8 text") from None
    merged = {**files, **recipe.base.files}
    return validate({**recipe.model_dump(mode="json"), "base": {"files": merged}}, where=recipe.name)


def load(path: Path) -> Recipe:
    """Read, validate and freeze the recipe at ``path``.

    Raises:
        RecipeError: as :func:`parse` and :func:`freeze`; the file cannot be read.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read recipe {path}: {exc}") from None
    return freeze(parse(text, where=str(path)), directory=path.parent)


def canonical(recipe: Recipe) -> str:
    return json.dumps(recipe.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def task_impl_source(recipe: Recipe) -> str:
    """The generated ``task_impl.py``: the recipe as its header, then the product runner (§7)."""
    runner_source = resources.files("benchwright.product").joinpath("runner.py").read_text()  # read, not imported
    return (f"# Generated by Benchwright for the product-sandbox recipe {recipe.name!r}; do not edit.\n"
            f"RECIPE = {canonical(recipe)!r}\n\n{runner_source}")


def impl_sha256(recipe: Recipe) -> str:
    return hashlib.sha256(task_impl_source(recipe).encode()).hexdigest()


def impl_id(recipe: Recipe) -> str:
    """``<recipe name>:<first 12 hex of sha256(task_impl.py)>`` (§7: keyed on the subset id)."""
    return f"{recipe.name}:{impl_sha256(recipe)[:12]}"


def check_launch(launch: LaunchRequest, local_paths: LocalPathRules) -> None:
    """A product-sandbox launch's ``recipe``, checked at launch (nothing for other launches).

    Raises:
        RecipeError: a recipe together with a dataset, a pin, a task_impl, a harness or trials k > 1; an unknown
            bundled name (``unknown_recipe``).
        InvalidInput, DatasetError: a path where local paths are not allowed, or outside the allowed roots.
    """
    if launch.recipe is None:
        return
    extra = [name for name in ("dataset", "prompt", "benchmark", "subset", "impl", "task_impl", "replay_of")
             if getattr(launch, name, None) is not None]
    if launch.requirements:
        extra.append("requirements")
    if launch.harness not in (None, "benchwright"):
        extra.append("harness")
    if extra:
        raise RecipeError(f"a product-sandbox run takes its tasks from the recipe; drop {', '.join(extra)}")
    if launch.trials is not None and launch.trials.plan.k != 1:
        raise RecipeError("a product-sandbox run runs each task once (trials.plan.k = 1); k > 1 is not supported yet")
    resolve_ref(launch.recipe, local_paths, must_exist=False)


def resolve_ref(ref: str, local_paths: LocalPathRules, *, must_exist: bool) -> Path:
    """Where the recipe ``ref`` names: a bundled recipe, or a local path under the dataset path rules.

    Raises:
        RecipeError: an unknown bundled name.
        InvalidInput, DatasetError: as ``benchwright.data.dataset_access.check_local_path``.
    """
    if is_bundled_name(ref):
        return bundled_path(ref)
    if "://" in ref or any(ord(c) < 32 for c in ref):
        raise RecipeError(f"recipe must be a bundled recipe's name or a path, got {ref!r}")
    return check_local_path(ref, local_paths, must_exist=must_exist)
