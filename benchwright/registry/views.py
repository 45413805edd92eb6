"""What the registry routes accept and return (pydantic; table rows never cross the HTTP boundary)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from benchwright.schemas import RunSummary, Visibility
from benchwright.scoring.aggregators import TrialsConfig

BenchmarkVisibility = Literal["private", "public"]
LATEST_OFFICIAL = "latest:official"


class PublishRequest(BaseModel):
    """``POST /v1/registry/publish``: file a finished run under (benchmark, subset) with its impl."""

    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(max_length=64)
    benchmark: str = Field(min_length=1, max_length=200, pattern=r"^[^\s/][^/]*$")
    """An existing benchmark's id or exact name, or the name of a new one (created, owned by you)."""
    subset: str = Field(min_length=1, max_length=200, pattern=r"^[^\s/][^/]*$")
    """An existing subset of that benchmark (id or name), or the name of a new one."""
    visibility: Visibility = "private"
    """The run's visibility after publishing; a new benchmark is public when this is ``public``."""
    rolling: bool = False
    """For a new subset: its task list may grow (append-only)."""
    default_trials: TrialsConfig | None = None
    """For a new subset: the trials config launches against it get unless they bring their own (§7)."""


class BenchmarkPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    visibility: BenchmarkVisibility


class SnapshotView(BaseModel):
    version: int
    tasks_sha256: str
    """The subset fingerprint of this version (sha256 of its task rows, one JSON object per line)."""
    count: int
    created_at: datetime


class ImplView(BaseModel):
    id: str
    benchmark_id: str
    impl_fingerprint: str
    official: bool
    promoted_at: datetime | None
    created_at: datetime
    source: str | None = None
    """task_impl.py, byte for byte (on ``GET /v1/registry/impls/{id}``)."""


class SubsetView(BaseModel):
    id: str
    benchmark_id: str
    name: str
    rolling: bool
    default_trials: dict[str, Any] | None
    snapshots: list[SnapshotView]
    impls: list[ImplView]
    created_at: datetime


class BenchmarkView(BaseModel):
    id: str
    name: str
    visibility: BenchmarkVisibility
    owned: bool
    """The caller owns it."""
    identicon: str
    """``/v1/registry/benchmarks/{id}/identicon.svg``."""
    subsets: list[SubsetView] = Field(default_factory=list)
    """Its subsets, oldest first, with their snapshots and impls (on the list and on the detail read alike)."""
    runs: list[RunSummary] = Field(default_factory=list)
    """Its public runs (on ``GET /v1/registry/benchmarks/{id}``)."""
    created_at: datetime


class BenchmarkList(BaseModel):
    benchmarks: list[BenchmarkView]


class PublishResult(BaseModel):
    run_id: str
    benchmark_id: str
    subset_id: str
    subset_version: int
    impl_id: str
    visibility: Visibility


class LeaderboardRow(BaseModel):
    model: str
    best_run_id: str
    impl_id: str | None
    score: float | None
    """The best aggregated score: the run's pass rate."""
    pass_rate: float | None
    pass_at_k: dict[str, float]
    cost_usd: float
    """The best run's incurred cost."""
    runs: int
    """Public runs of this model on the subset (any impl)."""


class Leaderboard(BaseModel):
    subset_id: str
    benchmark_id: str
    rows: list[LeaderboardRow]
