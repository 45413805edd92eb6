"""Deployment settings, read once at the edges (``api/main.py``, ``worker.py``, the CLI) and passed down.

Every field can be set from the environment as ``BENCHWRIGHT_<FIELD>``; workflows never read settings.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

TASK_QUEUE = "benchwright-runs"


def default_data_dir() -> Path:
    return Path.home() / ".benchwright"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BENCHWRIGHT_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    """Where the embedded stack keeps its SQLite store, Temporal database, run work directories and dev.json."""

    database_url: str | None = None
    """SQLAlchemy URL of the store; default is ``sqlite:///<data_dir>/benchwright.db``. Postgres:
    ``postgresql+psycopg://user@host:5432/db``."""

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    task_queue: str = TASK_QUEUE

    default_driver: str = "builtin"
    """Driver used when a launch names none. The embedded stack configures the offline ``builtin`` driver."""

    catalog_path: Path | None = None
    """The dataset catalog Find resolves natural-language prompts against (YAML or JSON: name, aliases,
    description, url or bundled path, format, splits, license; ``benchwright.drivers.catalog``). Unset: the bundled
    one, ``benchwright/samples/catalog.yaml``, with one sample dataset per scorer template."""
    driver_api_base: str | None = None
    """Where LLM drivers (``<provider>://<model>``) send their calls instead of the provider's own endpoint (a
    gateway, or the scripted-LLM test double in tests). Deployment-wide on purpose: the driver's credential goes
    wherever this points, so a launch can never choose it."""
    driver_input_cost_per_token: float | None = None
    driver_output_cost_per_token: float | None = None
    """USD per token for LLM-driver calls; when unset, LiteLLM's price map for the driver's model (else 0)."""
    driver_max_steps: int = Field(default=30, ge=1)
    """``phase.driver_steps`` for launches that set none: the LLM driver's model calls per phase invocation."""
    driver_max_tokens: int = Field(default=1_000_000, ge=1)
    """``run.driver_tokens`` for launches that set none: the LLM driver's tokens over the whole run."""
    driver_timeout_s: float = Field(default=120.0, gt=0)
    """Bound on one LLM-driver model call (LiteLLM retries transient faults twice within it)."""
    driver_sample_tasks: int = Field(default=10, ge=1)
    """Most sample tasks one runScorer tool call may run in the work sandbox."""

    narrator: str = "builtin"
    """Who writes each terminal run's narration (``benchwright.report.narration``): ``builtin`` (deterministic, free) or
    a LiteLLM model string (``openai/gpt-4o-mini``), whose spend is the run's cost.narration (billed). A failing or
    slow LLM narrator falls back to the builtin text; narration never blocks or fails a run."""
    narrator_api_base: str | None = None
    """Where the LLM narrator's calls go instead of the provider's own endpoint (a gateway; the scripted-LLM double
    in tests). A deployment setting: the narrator's key goes wherever this points."""
    narrator_api_key: SecretStr | None = None
    """The LLM narrator's provider key (``BENCHWRIGHT_NARRATOR_API_KEY``); never logged or echoed."""
    narrator_input_cost_per_token: float | None = Field(default=None, ge=0, le=1)
    narrator_output_cost_per_token: float | None = Field(default=None, ge=0, le=1)
    """USD per token for narrator calls; unset, LiteLLM's price map for the narrator's model (else 0)."""
    narrator_timeout_s: float = Field(default=30.0, gt=0, le=600)
    """Bound on the LLM narrator's call; past it the builtin text is recorded (the report still follows)."""

    @field_validator("narrator")
    @classmethod
    def _narrator_shape(cls, v: str) -> str:
        from benchwright.report.narration import check_narrator  # one rule, beside the narrator

        return check_narrator(v)

    allow_local_paths: bool = False
    """Whether Fetch may read a dataset from a path on the worker's host. Off by default, so a shared server never
    reads its host's files for a caller; ``benchwright up`` (the one-machine embedded stack) turns it on."""

    dataset_roots: list[Path] = Field(default_factory=list)
    """When set (``BENCHWRIGHT_DATASET_ROOTS='["/srv/datasets"]'``), local dataset paths must resolve under one of
    these directories. Local paths also need the account's ``local_paths`` flag, and are never read from the data
    directory or the host's secret-holding places (``benchwright.data.dataset_access``)."""

    dataset_fetch_timeout_s: float = 600.0
    """Longest a dataset download may take in all (connect and read are bounded separately, at 10 s and 30 s)."""

    allow_fault_injection: bool = False
    """Honour ``metadata.fault_injection`` on launches (tests only): makes a phase fail once after its events."""

    materialize_concurrency: int = 128
    """SUT calls in flight per run during Materialize."""

    materialize_batch_tasks: int = 2500
    """Most tasks per Materialize batch activity (all trials of a task stay in one batch); see
    ``benchwright.runs.pipeline.plan_batches``."""

    materialize_parallel_batches: int = 4
    """Batch activities of one run in flight at once; the concurrency is split between them."""

    sut_timeout_s: float = 120.0
    sut_retries: int = 2
    """Most retries of one model call after a transient fault (connection, 429, 5xx, timeout); 429/503 waits honour
    ``Retry-After`` and never outlast the trial attempt's duration limit (``benchwright.llm.sut``)."""
    sut_probe_timeout_s: float = 30.0
    """Bound on each try of Attach's liveness probe (one ``max_tokens=1`` completion through the scorer's route)."""
    sut_probe_retries: int = 3
    """Retries of the probe after a transient fault (429, 5xx, connection) before Attach fails."""
    sut_breaker_threshold: int = 10
    """Consecutive fatal model-call failures (unreachable, 401/403, 404) with no success between that halt a run
    ``sut_unavailable`` during Materialize (``benchwright.llm.breaker``)."""

    default_attempt_duration_s: float = Field(default=300.0, gt=0)
    """``attempt.duration`` for launches that set none, so a scorer that never returns yields err rows, never a
    stuck run (a launch's ``limits.attempt.duration`` overrides it). Published by ``GET /v1/limits``."""
    scorer_load_s: float = Field(default=60.0, gt=0)
    """How long a scorer runtime may take to import task_impl.py and build its Scorer before it is killed."""
    materialize_batch_duration_s: float = Field(default=36_000.0, gt=0)
    """Ceiling on one Materialize batch's scoring (10 h: under the workflow's 12 h batch timeout, so the batch ends
    with err rows rather than being retried by Temporal); it also bounds the scorer sandbox's CPU and wall time."""

    temporal_ui_url: str | None = None
    signin_key_file: str | None = None
    """Where the dashboard's sign-in page says the embedded stack's API key is (``benchwright up`` sets its
    ``DIR/dev.json``); unset on a shared deployment, whose sign-in page names no server path."""

    deployment_key: SecretStr | None = None
    """The deployment key(s) that encrypt provider secrets and Temporal payloads (``benchwright.security.crypto``):
    base64 of 32 bytes, several comma-separated during a rotation (the first encrypts). Unset:
    ``deployment_key_file``."""
    deployment_key_file: Path | None = None
    """A file of deployment keys, one a line, the first encrypting. Unset: ``<data_dir>/deployment.key`` if it
    exists (``benchwright up`` creates it, mode 0600)."""
    temporal_ui_codec: bool = False
    """Serve the Temporal UI's codec path (``/v1/admin/codec/ui/<token>``, the token derived from the deployment
    key), which ``benchwright up`` hands its dev server's UI. Off elsewhere: there the codec answers admins only."""

    default_compute: str = "local"
    """The deployment's compute backend (§4 level 3). The embedded stack has only ``local``."""
    sandbox0_kubeconfig: str | None = None
    """A kubeconfig file for the sandbox0 backend (Kubernetes pods); with ``sandbox0_in_cluster`` unset and this
    unset, sandbox0 is not configured here (``benchwright.sandbox.sandbox0``)."""
    sandbox0_in_cluster: bool = False
    """Use the worker pod's service account for sandbox0 (a worker running inside the cluster)."""
    sandbox0_namespace: str = "benchwright-sandboxes"
    sandbox0_image: str = "python:3.12-slim"
    """The sandbox pods' image: ``sh``, coreutils, ``tar`` and ``sandbox0_python`` must be in it."""
    sandbox0_instance_size: str = "sandbox0-2cpu-4gb"
    """CPU and memory requests/limits of every sandbox pod, and the size billed (``sandbox_usd_per_hour``)."""
    sandbox0_python: str = "python3"
    """The interpreter that runs the scorer runtime inside sandbox pods."""
    sandbox0_pod_egress_url: str | None = None
    """The egress proxy as a pod's commands reach it, when not at the worker's own proxy address (a sidecar)."""
    e2b_api_key: str | None = None
    """An E2B key; when unset the backend is not configured here."""
    e2b_template: str = "base"
    e2b_instance_size: str = "e2b-2cpu-2gb"
    """The template's size: billed (``sandbox_usd_per_hour``) and compared against by the limits wrapper."""
    e2b_python: str = "python3"
    e2b_api_url: str | None = None
    e2b_sandbox_url: str | None = None
    """Where the E2B SDK sends REST and envd calls (unset: E2B's own; the tests point them at the E2B double)."""
    harbor_templates: dict[str, dict[str, str]] = Field(default_factory=dict)
    """harbor task environments on a remote backend (``benchwright.harness.harbor_remote``): backend name ->
    {the ``FROM`` image of a task's Dockerfile -> the template that stands in for it there (an E2B template id, a
    sandbox0 image)}, e.g. ``{"e2b": {"ubuntu:24.04": "bw-harbor-ubuntu"}}``. An image with no entry is refused
    before harbor starts (there is no Docker engine to build it); the local backend needs none (its host image
    stands in for every ``FROM``)."""
    sandbox_usd_per_hour: dict[str, float] = Field(default_factory=lambda: {
        # E2B's published per-second prices, $0.000014 per vCPU-s and $0.0000045 per GiB-s, i.e. per hour
        # $0.0504 per vCPU + $0.0162 per GiB.
        "e2b-2cpu-2gb": 0.1332, "e2b-4cpu-4gb": 0.2664, "e2b-8cpu-8gb": 0.5328,
        # sandbox0: the shared cluster's list price per pod-hour by size (a self-hosted cluster sets its own).
        "sandbox0-1cpu-2gb": 0.04, "sandbox0-2cpu-4gb": 0.08, "sandbox0-4cpu-8gb": 0.16})
    """USD per sandbox-hour by instance size (§9 cost.sandbox = Σ lifetime × this rate). A size missing here is
    refused when its backend is opened; the local backend's sizes fall back to ``local_sandbox_usd_per_hour``."""
    blob_store_url: str | None = None
    """Where blobs (snapshots of remote sandboxes, phase hand-offs) go: ``s3://bucket/prefix`` or ``file:///path``;
    default ``<data_dir>/blobs`` (``benchwright.data.blobs``)."""
    blob_s3_endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO...) for an ``s3://`` blob store; credentials from boto3's usual chain."""

    allow_unisolated: bool = False
    """Run sandboxes as plain directories and processes where the kernel forbids namespaces (recorded on the run
    as isolation 'none'). Off: such a host refuses to run scorers, with a clear error."""
    egress_proxy_host: str = "127.0.0.1"
    """Where each sandbox's egress proxy listens, and the address sandboxes reach it at: loopback for the local
    backend; an address of the worker that pods (sandbox0) or micro-VMs (e2b) can route to otherwise."""
    egress_internal_allowed: list[str] = Field(default_factory=list)
    """``host:port`` endpoints on internal addresses that sandboxes may reach through the egress proxy (an internal
    package mirror, say). Every other loopback/private/link-local target is refused whatever an account allows."""
    model_internal_allowed: list[str] = Field(default_factory=list)
    """``host:port`` model endpoints on internal addresses that runs of any account may name as ``api_base`` (a
    self-hosted vLLM on the private network, say; ``benchwright.llm.model_access``). Accounts trusted with the machine
    (``local_paths``) may name any; every other internal target is refused."""
    pip_index_url: str | None = None
    """The package index Setup's ``pip install`` uses (``PIP_INDEX_URL``), e.g. an internal mirror listed in
    ``egress_internal_allowed``; unset, pip's default index (still through the egress proxy and host policy)."""
    local_sandbox_usd_per_hour: float = 0.0
    """The local backend's rate per sandbox-hour (the embedded stack's own machine costs nothing extra)."""
    local_materialize_mode: str = "sequential"
    """How Materialize runs on the local backend: ``sequential`` (in the work sandbox) or ``fanout`` (a task
    sandbox per task). An infrastructure setting of the deployment; the scorer never chooses (§4)."""
    fanout_sandboxes: int = 8
    """Task sandboxes alive at once during a fanout Materialize on the local backend."""
    sandbox_warm_pool: int = Field(default=1, ge=0, le=8)
    """Namespaced sandboxes a worker process (``benchwright worker``/``up``) keeps ready on its local backend, each
    with a scorer runtime waiting in it (``benchwright.sandbox.local.warm``): a run's sandbox is then claimed, not
    made, and its scorer runtime handed over, not started (~90 ms less before a batch's first model call). 0: none
    (every sandbox made on demand, as in-process test workers do)."""
    proxy_linger_s: float = 30.0
    """How long a worker's credential proxy stays up without a run's route before it exits (the warm window that
    spares the next run its start-up; metered to the run that left it idle as cost.proxy_linger). A run's own
    route, and its key, are revoked the moment the run ends."""
    proxy_keep_ready: bool = True
    """A worker process (``benchwright worker``/``up``) keeps a credential proxy up at all times: one started ahead of
    any run, and again whenever one lingered out (``benchwright.proxy.model_proxy.keep_a_proxy_ready``). It holds no
    key and no route until a run registers, and lingers only once that route is gone; a run after a quiet spell then
    does not wait ~0.1-0.2 s for a proxy to start. Off: proxies are started by the runs that need them."""
    proxy_route_sweep_s: float = 2.0
    """How often a worker revokes, at its own credential proxy, the routes of runs that ended (a route registered
    by a phase that ran on this host while the run's own revocation ran on another): the longest a per-run key
    outlives its run on a worker other than the one that ended it. While the worker's proxy holds no route a sweep
    is one control-socket round trip (none with no proxy up): no listing of run directories, no query. 0 turns the
    sweep off."""
    workdir_sweep_s: float = Field(default=60.0, ge=0, le=86_400)
    """How often a worker removes the work directories (``DIR/runs/<id>/work``: copies of a run's dataset and task
    files, restored from the blob store whenever a phase or a fork needs them) of runs that ended more than
    ``workdir_linger_s`` ago (``benchwright.runs.workdirs``). 0 turns the sweep off (they are then kept for good)."""
    workdir_linger_s: float = Field(default=600.0, ge=0, le=30 * 86_400)
    """How long a run's work directory outlives the run on a worker: a fork of a run that just ended reads its files
    there instead of from the blob store."""
    proxy_usd_per_hour: float = 0.0
    harness_dir: Path | None = None
    """Where harness runtimes live (``benchwright harness install``: one venv per harness version, mounted
    read-only into bridge runs' sandboxes); default ``<data_dir>/harness``."""

    max_body_bytes: int = 1024 * 1024
    """Largest request body the API reads (1 MiB): a larger one is refused with 413 ``payload_too_large`` before
    it is parsed. A launch's own fields are bounded tighter (metadata 64 KiB serialized, task_impl 512 KiB)."""

    quota_runs: int = Field(default=100, ge=1, le=10_000_000)
    """Runs an account may have running at once (``benchwright.security.quotas``); a launch over it answers 429. An
    admin overrides it per account (``benchwright accounts quota NAME --runs N``)."""
    quota_model_calls: int = Field(default=256, ge=1, le=10_000_000)
    """Model calls of one account in flight at once on one worker, across all of its runs: the surplus waits for
    the account's own calls to end, so one account cannot take the worker from the others (``--model-calls``)."""
    quota_tasks: int = Field(default=1_000_000, ge=1, le=10_000_000)
    """Tasks of an account's running runs not yet scored; a launch while the account holds this many answers 429
    (``--tasks``)."""
    quota_retry_after_s: int = Field(default=30, ge=1, le=86_400)
    """The ``Retry-After`` a quota's 429 carries."""
    fair_phase_slots: int = Field(default=2, ge=1, le=4096)
    """While several accounts have work on a worker, the pipeline phases (fetch, analyze, setup, attach, atomize,
    ...) it runs at once are shared out: each account runs at most ``fair_phase_slots // accounts`` (at least one),
    the rest of its phases wait for its own. Alone, an account is not bounded
    (``benchwright.security.fair_share.FairShare``)."""
    fair_lag_target_ms: float = Field(default=50.0, gt=0, le=10_000)
    """While several accounts have work on a worker and its event loop answers later than this, the account that has
    used the worker most lately has its model calls in flight cut back (and let grow again while the loop answers
    within half of it); ``benchwright.security.fair_share.FairShare``."""
    worker_max_activities: int = Field(default=64, ge=1, le=4096)
    """Activities one worker process runs at once (Temporal's ``max_concurrent_activities``)."""
    worker_cpu: str = Field(default="off", pattern=r"^(off|auto|[0-9]{1,4})$")
    """The CPU a worker process keeps its threads on (``benchwright.stack.cpu``): ``off`` (wherever the kernel puts
    them), ``auto`` (the highest-numbered CPU the worker may run on, when it may run on two or more) or a CPU's
    number. A worker's threads hand work to one another all the time, and on one CPU a hand-off wakes no idle CPU:
    ~16 % less worker CPU per task on a 2-CPU virtual machine. The processes it starts (sandboxes, the credential
    proxy) keep every CPU. ``benchwright up`` asks ``auto`` for its one worker; where several workers share a host,
    give each a CPU of its own or leave this off."""
    worker_eager_activities: bool = False
    """Temporal's eager activity dispatch: a workflow's next activity straight to the worker slot its last one
    freed, skipping the task queue (a few ms sooner per activity). Off: every activity goes through the queue, where
    the accounts' fairness keys share the slots out (``benchwright.security.quotas``)."""

    initial_balance_usd: float = 10.0
    """Balance a new account starts with (``benchwright accounts credit`` adds more)."""
    billing_markup: float = 1.0
    """Multiplier on the platform portion of cost (sandbox, driver, narration) that is billed to the balance."""

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'benchwright.db'}"

    def configured_backends(self) -> tuple[str, ...]:
        backends = ["local"]
        if self.sandbox0_kubeconfig or self.sandbox0_in_cluster:
            backends.append("sandbox0")
        if self.e2b_api_key:
            backends.append("e2b")
        return tuple(backends)

    def sandboxes_dir(self) -> Path:
        return self.data_dir / "sandboxes"

    def runs_dir(self) -> Path:
        return self.data_dir / "runs"
