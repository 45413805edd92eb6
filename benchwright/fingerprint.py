"""Fingerprints (§6): one rule per Artifact event type, written down once, and the family of hashes built on them.

The **run fingerprint** asks "is this the same experiment, model included": the first 12 hex of SHA-256 over each
Artifact event's load-bearing fields as canonical JSON (sorted keys, no whitespace), in emission order, joined by
U+001E. Only the fields in ``LOAD_BEARING`` count, so per-run noise stays out: which URL or mirror served the
bytes (their sha256 counts), which invocation produced the scorer, the source label of the code, and the proxy's
host, port and paths (ModelProxyArtifact carries none: its YAML names secrets by environment variable only).

The rest of the family asks "is this the same evaluation setup" and keeps the model out (docs/registry.md):

========================  ===============================================================================
column                    what it hashes
========================  ===============================================================================
fingerprint               the run fingerprint above (model included)
subset_fingerprint        sha256 of the task rows as the run saw them (its normalized tasks.jsonl)
impl_fingerprint          sha256 of task_impl.py (the impl id is ``<benchmark_id>:`` + its first 12 hex)
fetch_fingerprint         Fetch's input hash: the dataset source
analyze_fingerprint       Analyze's input hash: the dataset bytes' sha256, the task cap, the Driver
setup_fingerprint         Setup's input hash: the post-Fetch snapshot, the requirements, the Python version
atomize_fingerprint       Atomize's cache key: the pre-Atomize snapshot, the analysis, the launch's scorer and
                          ``model_config_hash`` (a scorer may legitimately differ per model)
========================  ===============================================================================
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from benchwright.events import (
    EVENT_TYPES,
    AnalyzeArtifact,
    AtomizeArtifact,
    DatasetTasksArtifact,
    FetchArtifact,
    HarnessLogArtifact,
    HarnessTaskArtifact,
    ModelProxyArtifact,
    ProductRecipeArtifact,
    SetupArtifact,
    TemplateProbeArtifact,
)

RECORD_SEPARATOR = "\x1e"
LOAD_BEARING: dict[str, tuple[str, ...]] = {
    FetchArtifact.type_name(): ("sha256", "bytes", "format"),
    AnalyzeArtifact.type_name(): ("format", "rows", "columns", "input_field", "reference_field", "template", "fields",
                                  "splits"),
    DatasetTasksArtifact.type_name(): ("count",),
    SetupArtifact.type_name(): ("python", "requirements"),
    AtomizeArtifact.type_name(): ("impl_sha256",),
    ModelProxyArtifact.type_name(): ("model_id", "litellm_config_yaml"),
    HarnessLogArtifact.type_name(): (),  # an output (the harness's own log of what happened): nothing is an input
    HarnessTaskArtifact.type_name(): ("harness", "version", "config_sha256"),  # the task name is in the config digest
    TemplateProbeArtifact.type_name(): ("os", "shells", "interpreters", "base_files"),  # the host's kernel is noise
    ProductRecipeArtifact.type_name(): ("name", "recipe_sha256"),
}
"""Per Artifact event type, the fields that feed the run fingerprint. A test keeps this table complete: every
``*Artifact`` in ``benchwright.events`` has an entry."""


def canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(value: Any) -> str:
    """Full SHA-256 of ``value``'s canonical JSON (the phase input hashes)."""
    return hashlib.sha256(canonical(value).encode()).hexdigest()


def is_artifact(event_type: str) -> bool:
    return event_type.endswith("Artifact")


def load_bearing(event_type: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of one Artifact event that feed the fingerprint. A type without a rule yet feeds its whole
    payload (never silently nothing); a test fails until it gets one here."""
    fields = LOAD_BEARING.get(event_type)
    return dict(data) if fields is None else {name: data.get(name) for name in fields}


class FingerprintInput(BaseModel):
    seq: int
    type: str
    fields: dict[str, Any]
    canonical: str


class FingerprintView(BaseModel):
    """``GET /v1/runs/{id}/fingerprint``: the stored hash and exactly how it is derived."""

    run_id: str
    fingerprint: str | None
    """As stored when the run reached its terminal status (null while running)."""
    recomputed: str
    """Recomputed from the log now; equal to ``fingerprint`` once stored."""
    algorithm: str = "sha256(join(U+001E, canonical JSON of each input)).hexdigest()[:12]"
    inputs: list[FingerprintInput]
    family: dict[str, str | None]
    """The model-free members (subset, impl, per-phase input hashes)."""


def derive(events: Iterable[tuple[int, str, Mapping[str, Any]]]) -> tuple[str, list[FingerprintInput]]:
    """The run fingerprint of a log given as ``(seq, type, data)`` in seq order, with its derivation inputs."""
    inputs = []
    for seq, event_type, data in events:
        if is_artifact(event_type):
            fields = load_bearing(event_type, data)
            inputs.append(FingerprintInput(seq=seq, type=event_type, fields=fields, canonical=canonical(fields)))
    joined = RECORD_SEPARATOR.join(i.canonical for i in inputs)
    return hashlib.sha256(joined.encode()).hexdigest()[:12], inputs


def impl_id(*, benchmark_id: str, impl_sha256: str) -> str:
    """``<benchmark_id>:<first 12 hex of sha256(task_impl.py)>`` (§7)."""
    return f"{benchmark_id}:{impl_sha256[:12]}"


def model_config_hash(model: Mapping[str, Any]) -> str:
    """The model's configuration as Atomize's cache key sees it (identifier, endpoint, params; no secret)."""
    keep = {k: model.get(k) for k in ("identifier", "api_base", "params")}
    return sha256_hex(keep)


def artifact_types() -> list[str]:
    """Every Artifact event type the log can hold (for the completeness check)."""
    return sorted(name for name in EVENT_TYPES if is_artifact(name))
