"""SQLModel tables (``table=True`` classes only). Rows never cross the Temporal or HTTP boundary; schemas do.

``events`` is the source of truth (§5). ``task_rows`` and ``trial_results`` are projections maintained in the
same transaction as the events they are derived from; the ``runs`` row carries the status fields and the
per-run sequence counter that makes seq gapless.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Column, Index, Table, Text, UniqueConstraint, false, text
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


def table_of(model: type[SQLModel]) -> Table:
    """A model's Core table, for the statements the hot paths build once (``store.events``, ``store.control``)."""
    table: Table = model.__table__  # type: ignore[attr-defined]
    return table


class Account(SQLModel, table=True):
    __tablename__ = "accounts"

    id: str = Field(primary_key=True, max_length=36)
    name: str = Field(unique=True, index=True, max_length=200)
    balance_usd: float = 0.0
    """Prepaid balance; billed spend is debited by the ``events_cost`` trigger."""
    local_paths: bool = False
    """The operator lets this account name dataset files on the worker's host (``accounts create --local-paths``;
    the embedded stack's own account has it). The deployment must allow local paths too."""
    admin: bool = False
    """A platform administrator (``accounts create --admin``): may halt any account's run (§9 ``admin`` halt,
    ``POST /v1/admin/runs/{id}/halt``). Set only from the operator's command line, never through the API."""
    curator: bool = False
    """May promote impls official on its OWN private benchmarks (never another account's, never a public one):
    ``benchwright up`` gives it to the embedded stack's own account, so a solo user needs no second admin account
    for ``--impl latest:official``. Set only by the operator, never through the API."""
    created_at: datetime = Field(default_factory=utcnow)


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"
    __table_args__ = (Index("uq_api_keys_account_name", "account_id", "name", unique=True),)

    id: str = Field(primary_key=True, max_length=36)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    key_hash: str = Field(unique=True, max_length=64)
    """sha256 of the key; the key itself is shown once at creation and never stored."""
    prefix: str = Field(max_length=16)
    created_at: datetime = Field(default_factory=utcnow)
    name: str = Field(default="default", max_length=64)
    """Unique within the account (migration 0011): what ``rotate-key`` / ``revoke-key`` name."""
    last_used_at: datetime | None = None
    """When the key last authenticated a request (to the minute: written at most once a minute)."""


class Run(SQLModel, table=True):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_account_created", "account_id", "created_at"),
        # The accounts with runs running, read by every worker's fair share ten times a second (migration 0015).
        Index("ix_runs_running_account", "account_id", sqlite_where=text("status = 'running'"),
              postgresql_where=text("status = 'running'")),
        # A narration's comparison: the newest earlier finished run of the same shape in the account (migration 0023).
        Index("ix_runs_finished_by_registry_shape", "account_id", "benchmark_id", "subset_id", "impl_id",
              "created_at", sqlite_where=text("finished_at IS NOT NULL"),
              postgresql_where=text("finished_at IS NOT NULL")),
        Index("ix_runs_finished_by_fingerprints", "account_id", "subset_fingerprint", "impl_fingerprint",
              "created_at", sqlite_where=text("finished_at IS NOT NULL"),
              postgresql_where=text("finished_at IS NOT NULL")),
    )

    id: str = Field(primary_key=True, max_length=36)
    account_id: str = Field(foreign_key="accounts.id", max_length=36)
    status: str = Field(default="running", max_length=16)
    halted: bool = False
    halt_reason: str | None = Field(default=None, max_length=1000)
    model: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    driver: str = Field(max_length=256)
    launch: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    visibility: str = Field(default="private", max_length=16)
    trials_config: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    phase: str | None = Field(default=None, max_length=32)
    error: str | None = Field(default=None, max_length=4000)
    tasks_total: int = 0
    limits: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    backend: str | None = Field(default=None, max_length=32)
    materialize_mode: str | None = Field(default=None, max_length=16)
    isolation: str | None = Field(default=None, max_length=16)
    # Cost by source in USD. Only the ``events_cost`` database trigger writes these (migration 0002).
    cost_driver: float = 0.0
    cost_model: float = 0.0
    cost_sandbox: float = 0.0
    cost_narration: float = 0.0
    cost_incurred: float = 0.0
    cost_billed: float = 0.0
    proxy_linger_usd: float = 0.0
    billing_markup: float = 1.0
    # Beside cost_narration: the LLM narrator's calls and tokens (migration 0013's trigger, from NarrationUsage).
    narration_calls: int = 0
    narration_prompt_tokens: int = 0
    narration_completion_tokens: int = 0
    next_seq: int = 0
    """The seq the next appended event gets; only ever changed inside an append transaction."""
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    # The fingerprint family (§6, migration 0006; ``benchwright.fingerprint``), written at terminal status.
    fingerprint: str | None = Field(default=None, max_length=12)
    subset_fingerprint: str | None = Field(default=None, max_length=64)
    impl_fingerprint: str | None = Field(default=None, max_length=64)
    fetch_fingerprint: str | None = Field(default=None, max_length=64)
    analyze_fingerprint: str | None = Field(default=None, max_length=64)
    setup_fingerprint: str | None = Field(default=None, max_length=64)
    atomize_fingerprint: str | None = Field(default=None, max_length=64)
    # The run shape (§7): null while running and for a dataset run until it is published.
    benchmark_id: str | None = Field(default=None, max_length=64, index=True)
    subset_id: str | None = Field(default=None, max_length=64, index=True)
    impl_id: str | None = Field(default=None, max_length=80)
    pinned: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    """A pinned launch's resolution (benchmark_id, subset_id, subset_version, impl_id), frozen at launch."""


class EventRow(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("run_id", "seq", name="uq_events_run_seq"),
        # A run's events of one type, without reading the rest of its log (migration 0016).
        Index("ix_events_run_type", "run_id", "type", "seq"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id", max_length=36)
    seq: int
    type: str = Field(max_length=64)
    data: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    idem_key: str = Field(unique=True, max_length=300)
    created_at: datetime = Field(default_factory=utcnow)


class TaskRow(SQLModel, table=True):
    """Projection of MaterializeTaskAggregated: one row per (run, invocation, task index)."""

    __tablename__ = "task_rows"

    run_id: str = Field(foreign_key="runs.id", primary_key=True, max_length=36)
    invocation: int = Field(primary_key=True)
    index: int = Field(primary_key=True)
    outcome: str = Field(max_length=8)
    score: float | None = None
    trial_scores: list[float | None] = Field(sa_column=Column(JSON, nullable=False))
    no_answer: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    """A ``fail`` whose every trial reported ``score_meta.extracted == false`` (``benchwright.scoring.results``)."""
    trials_scored: int | None = None
    """Its trials that produced a score (``trial_scores`` not None: outcome not ``err``), pass@k's n. None on a row an
    older writer projected (``benchwright.store.intervals.trial_counts`` then counts the trial rows)."""
    trials_passed: int | None = None
    """Its trials that passed (a score >= ``PASS_THRESHOLD``), pass@k's c."""


class TrialResult(SQLModel, table=True):
    """Projection of MaterializeTaskResult: one row per (run, invocation, task index, trial)."""

    __tablename__ = "trial_results"
    __table_args__ = (
        # The trials that errored, for the narration's top errors (migration 0016).
        Index("ix_trial_results_errored", "run_id", "invocation", sqlite_where=text("outcome = 'err'"),
              postgresql_where=text("outcome = 'err'")),
    )

    run_id: str = Field(foreign_key="runs.id", primary_key=True, max_length=36)
    invocation: int = Field(primary_key=True)
    index: int = Field(primary_key=True)
    trial: int = Field(primary_key=True)
    outcome: str = Field(max_length=8)
    score: float | None = None
    output: str | None = None
    meta: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    error: str | None = None
    input: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """What the model saw on the scorer's last model call, bounded (``benchwright.scoring.host``)."""


class Secret(SQLModel, table=True):
    """A provider secret. The value is write-only: no route, log, event or sandbox but the model proxy sees it."""

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("account_id", "name", name="uq_secrets_account_name"),)

    id: str = Field(primary_key=True, max_length=36)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    name: str = Field(max_length=128)
    value: str = Field(default="", max_length=8192)
    """Legacy plaintext (before migration 0011); emptied once the row is encrypted at the next start with a key."""
    key_id: str | None = Field(default=None, max_length=16)
    """The deployment key ``ciphertext`` is encrypted under (``benchwright.security.crypto``); None: still plaintext."""
    ciphertext: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """base64 of nonce + AES-GCM ciphertext of the value, the row id as associated data."""
    host_pattern: str | None = Field(default=None, max_length=300)
    created_at: datetime = Field(default_factory=utcnow)


class HostPolicyRow(SQLModel, table=True):
    """An account's host policy default mode (§11); a fresh account has none and defaults to allow."""

    __tablename__ = "host_policies"

    account_id: str = Field(foreign_key="accounts.id", primary_key=True, max_length=36)
    default_mode: str = Field(default="allow", max_length=8)


class HostRuleRow(SQLModel, table=True):
    __tablename__ = "host_rules"
    __table_args__ = (UniqueConstraint("account_id", "pattern", name="uq_host_rules_account_pattern"),)

    id: str = Field(primary_key=True, max_length=36)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    pattern: str = Field(max_length=300)
    action: str = Field(max_length=8)
    created_at: datetime = Field(default_factory=utcnow)


class BlockedHost(SQLModel, table=True):
    """The blocked-host log: one row per (run, host), counting refusals."""

    __tablename__ = "blocked_hosts"

    run_id: str = Field(foreign_key="runs.id", primary_key=True, max_length=36)
    host: str = Field(primary_key=True, max_length=300)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    seen_count: int = 0
    first_seen: datetime = Field(default_factory=utcnow)
    last_seen: datetime = Field(default_factory=utcnow)


class AccountSettings(SQLModel, table=True):
    __tablename__ = "account_settings"

    account_id: str = Field(foreign_key="accounts.id", primary_key=True, max_length=36)
    compute: str | None = Field(default=None, max_length=32)
    """The account's saved compute provider (§4 level 2); None means the deployment default."""


class Benchmark(SQLModel, table=True):
    """A registry benchmark (§7); ``public`` ones list their public runs and have leaderboards."""

    __tablename__ = "benchmarks"

    id: str = Field(primary_key=True, max_length=64)
    name: str = Field(index=True, max_length=200)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    visibility: str = Field(default="private", max_length=16)
    created_at: datetime = Field(default_factory=utcnow)


class Subset(SQLModel, table=True):
    __tablename__ = "benchmark_subsets"
    __table_args__ = (UniqueConstraint("benchmark_id", "name", name="uq_subsets_benchmark_name"),)

    id: str = Field(primary_key=True, max_length=64)
    benchmark_id: str = Field(foreign_key="benchmarks.id", index=True, max_length=64)
    name: str = Field(max_length=200)
    rolling: bool = False
    """The task list may grow (append-only); runs pin the snapshot they saw at launch."""
    default_trials: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    created_at: datetime = Field(default_factory=utcnow)


class SubsetSnapshot(SQLModel, table=True):
    """One version of a subset's task list: a JSONL blob (its sha256 is the subset fingerprint)."""

    __tablename__ = "subset_snapshots"

    subset_id: str = Field(foreign_key="benchmark_subsets.id", primary_key=True, max_length=64)
    version: int = Field(primary_key=True)
    tasks_sha256: str = Field(max_length=64)
    count: int
    created_at: datetime = Field(default_factory=utcnow)


class Impl(SQLModel, table=True):
    """An immutable scorer: ``<benchmark_id>:<first 12 hex of sha256(task_impl.py)>``."""

    __tablename__ = "benchmark_subset_impls"

    id: str = Field(primary_key=True, max_length=80)
    benchmark_id: str = Field(foreign_key="benchmarks.id", index=True, max_length=64)
    impl_fingerprint: str = Field(max_length=64)
    """The full sha256 of task_impl.py; the source is the blob of that digest."""
    official: bool = False
    promoted_at: datetime | None = None
    self_curated: bool = False
    """Made official by its benchmark's owner (a ``curator`` account, on a private benchmark), not by an admin: it
    stops being official when the benchmark goes public."""
    created_at: datetime = Field(default_factory=utcnow)


class SubsetImpl(SQLModel, table=True):
    """Which impls have scored which subsets (``latest:official`` picks among a subset's)."""

    __tablename__ = "subset_impls"

    subset_id: str = Field(foreign_key="benchmark_subsets.id", primary_key=True, max_length=64)
    impl_id: str = Field(foreign_key="benchmark_subset_impls.id", primary_key=True, max_length=80)
    created_at: datetime = Field(default_factory=utcnow)


class PhaseCell(SQLModel, table=True):
    """What one phase of one run produced, under its model-free input hash (§2): the cross-run cache's cells.

    Written for every run when the phase completes; only cells of finished public runs are ever served (``served``)."""

    __tablename__ = "phase_fingerprints"
    __table_args__ = (
        # The cache's lookup: the newest served cell of an input, by key (migration 0024).
        Index("ix_phase_fingerprints_served", "phase", "input_hash", "created_at", sqlite_where=text("served = 1"),
              postgresql_where=text("served")),
    )

    run_id: str = Field(foreign_key="runs.id", primary_key=True, max_length=36)
    phase: str = Field(primary_key=True, max_length=32)
    input_hash: str = Field(index=True, max_length=64)
    artifacts: list[dict[str, Any]] = Field(sa_column=Column(JSON, nullable=False))
    """The phase's Artifact events as ``{"type", "data"}``, replayed verbatim by a hit."""
    snapshot_id: str | None = Field(default=None, max_length=64)
    files: dict[str, str] = Field(sa_column=Column(JSON, nullable=False))
    """Work-directory files the phase wrote (name -> blob sha256), which later phases read."""
    result: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    """The phase result's ``tasks`` and ``detail``."""
    source_run_id: str | None = Field(default=None, max_length=36)
    """For a cell copied by a hit, the run that did the work."""
    created_at: datetime = Field(default_factory=utcnow)
    served: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    """Whether the cell may be served: its run has finished and is public. Kept by the store's triggers (migration
    0024) whenever a cell is written or its run's visibility or end changes; never written by this code."""


class RunFork(SQLModel, table=True):
    """The fork tree (§10): one row per forked run naming its parent, written with the fork's RunLaunched."""

    __tablename__ = "run_forks"

    run_id: str = Field(foreign_key="runs.id", primary_key=True, max_length=36)
    parent_run_id: str = Field(foreign_key="runs.id", index=True, max_length=36)
    rewind_to: str | None = Field(default=None, max_length=32)
    """As requested (the Fork phase's ForkDecided event has the point it settled on)."""
    kind: str = Field(default="fork", max_length=16)
    """``fork`` or ``replay``."""
    created_at: datetime = Field(default_factory=utcnow)


class AuditEntry(SQLModel, table=True):
    """One admin or operator action (issue 23): who, when, what, on what (``benchwright.security.audit``).
    Append-only."""

    __tablename__ = "audit_log"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, index=True)
    actor: str = Field(max_length=300)
    """``account:<name>`` for an admin account over the API, ``cli:<os user>`` for the operator's command line."""
    actor_account_id: str | None = Field(default=None, max_length=36)
    action: str = Field(max_length=64, index=True)
    """``run.admin_halt``, ``impl.promote``, ``account.create``, ``account.credit``, ``account.key_create``..."""
    target: str = Field(max_length=300)
    """``<kind>:<id or name>``, e.g. ``run:<id>``, ``impl:<id>``, ``account:<name>``."""
    detail: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    """What was done (a reason, an amount, a flag); never a secret or a key."""


class AccountQuota(SQLModel, table=True):
    """An admin's per-account overrides of the deployment's quotas (``benchwright.security.quotas``; migration 0012). A
    null column means the deployment's default for that quota."""

    __tablename__ = "account_quotas"

    account_id: str = Field(foreign_key="accounts.id", primary_key=True, max_length=36)
    runs: int | None = None
    """Runs of the account running at once."""
    model_calls: int | None = None
    """The account's model calls in flight at once on one worker."""
    tasks: int | None = None
    """Tasks of the account's running runs not yet scored."""
    updated_at: datetime = Field(default_factory=utcnow)


class OperatorSession(SQLModel, table=True):
    """One Operator session (issue 26, ``benchwright.operator``; migration 0014): its goal, budget, state and
    answer. Its log is ``operator_events``; ``next_seq`` is that log's counter, as ``runs.next_seq`` is a run's."""

    __tablename__ = "operator_sessions"
    __table_args__ = (Index("ix_operator_sessions_account_created", "account_id", "created_at"),)

    id: str = Field(primary_key=True, max_length=36)
    account_id: str = Field(foreign_key="accounts.id", max_length=36)
    operator: str = Field(max_length=64)
    status: str = Field(default="running", max_length=16)
    goal: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    limits: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    runs: list[str] = Field(sa_column=Column(JSON, nullable=False))
    """Ids of the runs the session launched, in launch order."""
    answer: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    next_seq: int = 0
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class OperatorEvent(SQLModel, table=True):
    """An Operator session's append-only log: the run log's shape (seq, type, data, idempotency key)."""

    __tablename__ = "operator_events"
    __table_args__ = (UniqueConstraint("session_id", "seq", name="uq_operator_events_session_seq"),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="operator_sessions.id", max_length=36)
    seq: int
    type: str = Field(max_length=64)
    data: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    idem_key: str = Field(unique=True, max_length=300)
    created_at: datetime = Field(default_factory=utcnow)
