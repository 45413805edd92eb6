"""Forks, replays and sweeps (§10) as plain functions: which overrides fit which rewind point, how the builtin
driver reads prose fork instructions, where the parent's log is cut, and how its events are copied into the fork.

A fork is a new run seeded from its parent: every phase before the rewind point is *inherited* (its events are
copied into the fork's log with ``inherited_from: {run_id, seq}``, its work-directory files and work-sandbox
snapshots are reused), nothing of it runs again. A replay is the fork that rewinds to Materialize and rebinds the
model: the parent's ModelProxyArtifact is copied with the new model's two fields in place, so the log keeps the
pipeline's order and a replay against the same model carries the reference's fingerprint exactly.

Cost-bearing events are copied with ``cost_usd`` 0 (the original amount stays in ``inherited_from.cost_usd``): the
parent paid for that work, and the cost trigger must not bill the fork for it again.

The seam to the registry (issue 9): ``run_shape`` answers the replay 4-tuple's (benchmark, subset, impl) from the
run row's ids when the registry has set them, and from the run's own artifacts otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchwright.drivers.base import DriverFailed
from benchwright.errors import InvalidInput
from benchwright.events import (
    AtomizeArtifact,
    DatasetTasksArtifact,
    FetchArtifact,
    MaterializeTaskAggregated,
    MaterializeTaskResult,
    ModelProxyArtifact,
    PhaseCompleted,
    PhaseSkipped,
    PhaseStarted,
    PipelineFinished,
    ProductRecipeArtifact,
)
from benchwright.runs.handoff import dataset_file
from benchwright.schemas import (
    PHASES,
    REWIND_POINTS,
    ForkOverrides,
    LaunchRequest,
    ModelSpec,
)

OVERRIDE_NEEDS: dict[str, str] = {
    "dataset": "fetch",
    "requirements": "setup",
    "model": "attach",
    "task_impl": "atomize",
    "scorer_instructions": "atomize",
    "trials": "materialize",
    "limits": "materialize",
    "concurrency": "materialize",
}
"""Override -> the latest rewind point that still lets it take effect (the phase that consumes it)."""
RESULT_TYPES = frozenset({MaterializeTaskResult.type_name(), MaterializeTaskAggregated.type_name()})
"""Results are never inherited: a fork's sweep is its own."""


def _order(phase: str) -> int:
    return PHASES.index(phase)


def inherited_phases(rewind_to: str) -> list[str]:
    """The phases before ``rewind_to``, in pipeline order: what a fork inherits instead of running."""
    return [p for p in PHASES if _order(p) < _order(rewind_to)]


def check_overrides(*, rewind_to: str, overrides: Iterable[str], kind: str = "fork") -> None:
    """Refuse an override the rewind point comes too late for.

    A replay (``kind="replay"``) rewinds to Materialize and may change the model only.

    Raises:
        InvalidInput: ``override_needs_rewind`` naming the override and the rewind point it needs, or
            ``replay_override`` for a replay asked to change anything but the model.
    """
    if rewind_to not in REWIND_POINTS:
        raise InvalidInput(f"rewind_to must be one of {', '.join(REWIND_POINTS)}, got {rewind_to!r}",
                           code="invalid_rewind")
    for name in overrides:
        if kind == "replay":
            if name != "model":
                raise InvalidInput(f"a replay changes only the model; '{name}' needs a fork", code="replay_override")
            continue
        need = OVERRIDE_NEEDS[name]
        if _order(rewind_to) > _order(need):
            raise InvalidInput(f"override '{name}' needs rewind_to '{need}' or earlier (Fork cannot change it once "
                               f"{need} has run); got rewind_to '{rewind_to}'", code="override_needs_rewind")


def default_rewind(overrides: Iterable[str]) -> str:
    """The latest rewind point every override still fits (Materialize when there is none)."""
    return min((OVERRIDE_NEEDS[n] for n in overrides), key=_order, default="materialize")


def apply_overrides(launch: LaunchRequest, overrides: ForkOverrides) -> LaunchRequest:
    """The parent's launch body with the overrides that live in it (model, dataset, requirements, task_impl,
    trials, limits, concurrency) replaced; validated again as a launch."""
    body = launch.model_dump(mode="json", exclude_none=True)
    for name in ("model", "dataset", "requirements", "task_impl", "trials", "limits", "concurrency"):
        value = getattr(overrides, name)
        if value is not None:
            body[name] = value.model_dump(mode="json", exclude_none=True) if hasattr(value, "model_dump") else value
    body.pop("replay_of", None)
    return LaunchRequest.model_validate(body)


# -- the builtin driver's fork vocabulary ---------------------------------------------------------------------------

VOCABULARY = (
    "use the mirror at <URL>",
    "swap the model to <model> [at <api_base URL>]",
    "rewind to <phase>",
)
"""The prose the builtin driver understands in the Fork phase, one clause per sentence, line or ``;``. Anything
else fails the phase naming the clause (an LLM driver may understand more)."""
_MIRROR = re.compile(r"^(?:please\s+)?(?:use|fetch from|switch to)\s+(?:the\s+)?mirror\s+(?:at\s+)?(?P<url>\S+)$",
                     re.IGNORECASE)
_MODEL = re.compile(r"^(?:please\s+)?(?:swap|switch|change)\s+the\s+model\s+to\s+(?P<model>\S+?)"
                    r"(?:\s+at\s+(?P<base>https?://\S+))?$", re.IGNORECASE)
_REWIND = re.compile(r"^(?:please\s+)?rewind\s+to\s+(?P<phase>[a-z]+)$", re.IGNORECASE)
_CLAUSES = re.compile(r"[;\n]+|\.(?=\s|$)")


@dataclass
class Interpretation:
    """What prose fork instructions ask for."""

    dataset: str | None = None
    model: ModelSpec | None = None
    rewind_to: str | None = None
    notes: list[str] = field(default_factory=list)

    def overrides(self) -> list[str]:
        return [name for name in ("dataset", "model") if getattr(self, name) is not None]


def interpret_instructions(text: str, *, current_model: ModelSpec) -> Interpretation:
    """Read fork instructions with the builtin driver's vocabulary (``VOCABULARY``).

    Args:
        text: the operator's prose.
        current_model: the model in force; "swap the model to X" keeps its api_base and secret unless it names a
            new api_base.

    Raises:
        DriverFailed: a clause the vocabulary does not cover, named, with the vocabulary listed.
    """
    out = Interpretation()
    for clause in (c.strip().strip(",") for c in _CLAUSES.split(text)):
        if not clause:
            continue
        if m := _MIRROR.match(clause):
            out.dataset = m["url"]
            out.notes.append(f"'{clause}': fetch the dataset from {m['url']}")
        elif m := _MODEL.match(clause):
            base = m["base"] or current_model.api_base
            out.model = current_model.model_copy(update={"identifier": m["model"], "api_base": base})
            out.notes.append(f"'{clause}': the model becomes {m['model']}" + (f" at {base}" if base else ""))
        elif (m := _REWIND.match(clause)) and m["phase"].lower() in REWIND_POINTS:
            out.rewind_to = m["phase"].lower()
            out.notes.append(f"'{clause}': start over at {out.rewind_to}")
        else:
            raise DriverFailed(f"the builtin driver cannot interpret the fork instruction '{clause}'; it understands: "
                               + "; ".join(VOCABULARY) + " (or send structured overrides)")
    return out


# -- the parent's log ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoggedEvent:
    seq: int
    type: str
    data: Mapping[str, Any]


def cut_point(events: list[LoggedEvent], rewind_to: str) -> int:
    """The seq the parent's log is cut at: its first PhaseStarted of ``rewind_to`` (everything before it is
    inherited), or just after the last event when the parent never reached that phase.

    Raises:
        InvalidInput: ``rewind_unavailable`` when a phase before the rewind point did not complete in the parent
            (it failed or was halted there, or is still running): nothing to inherit it from.
    """
    cut = next((e.seq for e in events if e.type == PhaseStarted.type_name() and e.data.get("phase") == rewind_to), None)
    before = [e for e in events if cut is None or e.seq < cut]
    done = {e.data.get("phase") for e in before if e.type in (PhaseCompleted.type_name(), PhaseSkipped.type_name())}
    missing = [p for p in inherited_phases(rewind_to) if p not in done]
    if missing:
        raise InvalidInput(f"the parent run did not complete {missing[0]}, so a fork cannot rewind to {rewind_to}; "
                           f"rewind to {missing[0]} or earlier", code="rewind_unavailable")
    if cut is None:
        cut = max((e.seq for e in before if e.type != PipelineFinished.type_name()), default=0) + 1
    return cut


def model_binding(spec: ModelSpec) -> dict[str, str]:
    """The two fields of a ModelProxyArtifact for ``spec``, as Attach writes them."""
    from benchwright.proxy.litellm_config import litellm_config_yaml, secret_env_name

    return {"model_id": spec.identifier,
            "litellm_config_yaml": litellm_config_yaml(spec, secret_env=secret_env_name(spec.secret)
                                                       if spec.secret else None)}


def inherited_copies(events: list[LoggedEvent], *, parent_run_id: str, cut: int,
                     rebind: Mapping[str, str] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """The parent's events with 0 < seq < ``cut`` as ``(key suffix, type, data)`` for the fork's log, each marked
    ``inherited_from: {run_id, seq}``. RunLaunched (the fork has its own) and Materialize results are left out.

    Args:
        rebind: a replay's model binding; the ModelProxyArtifact copies carry it (and say which fields changed).
    """
    out: list[tuple[str, str, dict[str, Any]]] = []
    for e in events:
        if not 0 < e.seq < cut or e.type in RESULT_TYPES:
            continue
        data = {k: v for k, v in e.data.items() if k != "inherited_from"}
        marker: dict[str, Any] = {"run_id": parent_run_id, "seq": e.seq}
        if data.get("cost_usd"):
            marker["cost_usd"], data["cost_usd"] = data["cost_usd"], 0.0
        if e.type == ModelProxyArtifact.type_name() and rebind is not None:
            changed = sorted(k for k, v in rebind.items() if data.get(k) != v)
            if changed:
                marker["overridden"] = changed
                data.update(rebind)
        data["inherited_from"] = marker
        out.append((f"inherit:{e.seq}", e.type, data))
    return out


def tasks_total(copies: list[tuple[str, str, dict[str, Any]]]) -> int | None:
    """The sample size the parent's Analyze settled on (its last DatasetTasksArtifact), if inherited."""
    counts = [int(d["count"]) for _, t, d in copies if t == DatasetTasksArtifact.type_name()]
    return counts[-1] if counts else None


# -- the work directory ----------------------------------------------------------------------------------------------


def inherited_files(*, inherited: list[str], events: list[LoggedEvent], cut: int,
                    parent_files: Mapping[str, str]) -> list[str]:
    """The parent's work files a fork carries over for the phases it inherits: the fetched dataset (Fetch), named by
    the parent's last FetchArtifact before ``cut``, tasks.jsonl (Analyze) and task_impl.py (Atomize); of a
    product-sandbox run, the frozen recipe and its generated task_impl.py (Setup). Everything
    else a later phase needs of them is in the inherited events (AnalyzeArtifact, SnapshotCreated...), read from
    the fork's own log, never from a file.

    Args:
        events: The parent's log, as ``cut_point`` read it.
        parent_files: The parent's recorded work files (path -> blob id, ``handoff.latest_files``), for an artifact
            recorded before Fetch named its file.

    Raises:
        InvalidInput: ``parent_state_missing`` when the parent's log before the cut holds no FetchArtifact.
    """
    if any(e.type == ProductRecipeArtifact.type_name() and e.seq < cut for e in events):
        # A product-sandbox run: Fetch/Analyze/Atomize were skipped; Setup froze the recipe and generated the impl.
        return ["recipe.json", "task_impl.py"] if "setup" in inherited else []
    names: list[str] = []
    if "fetch" in inherited:
        fetched = next((e.data for e in reversed(events) if e.seq < cut and e.type == FetchArtifact.type_name()), None)
        if fetched is None:
            raise InvalidInput("the parent run's log has no FetchArtifact, so a fork cannot inherit its Fetch",
                               code="parent_state_missing")
        names.append(dataset_file(fetched, parent_files))
    if "analyze" in inherited:
        names.append("tasks.jsonl")
    if "atomize" in inherited:
        names.append("task_impl.py")
    return names


def copy_workdir(*, parent: Path, fork: Path, names: list[str]) -> None:
    """Copy the work files ``names`` (``inherited_files``) from the parent's work directory into the fork's.

    Raises:
        InvalidInput: ``parent_state_missing`` when the parent's work directory lacks one of them.
    """
    fork.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = parent / name
        if not source.exists():
            raise InvalidInput(f"the parent run's work file {name} is in none of its recorded work files (a fork "
                               "copies them from the parent's WorkFilesRecorded)", code="parent_state_missing")
        tmp = fork / f".{name}.part"
        shutil.copyfile(source, tmp)
        os.replace(tmp, fork / name)


# -- shapes ---------------------------------------------------------------------------------------------------------


def run_shape(*, run_ids: Mapping[str, str | None], events: Iterable[LoggedEvent]) -> tuple[str | None, ...]:
    """The (benchmark, subset, impl) a run measured: the registry's ids when the run row has them (issue 9), else
    the run's own artifacts: the dataset bytes' sha256, the task count, the last impl's sha256."""
    if run_ids.get("benchmark_id") and run_ids.get("impl_id"):
        return run_ids.get("benchmark_id"), run_ids.get("subset_id"), run_ids.get("impl_id")
    bench = subset = impl = None
    for e in events:
        if e.type == FetchArtifact.type_name():
            bench = str(e.data.get("sha256"))
        elif e.type == DatasetTasksArtifact.type_name():
            subset = f"{bench}:{e.data.get('count')}"
        elif e.type == AtomizeArtifact.type_name():
            impl = str(e.data.get("impl_sha256"))
    return bench, subset, impl
