"""The Driver seam (§8): what a Driver decides in each phase it owns, what it is given, and how it asks for help.

A Driver is the run's locked-down decision maker. The phase activities (``activities/find.py``, ``analyze.py``,
``atomize.py``) do the I/O; at the one point where a judgement is needed they build a :class:`DriverContext` and
call the Driver's method for that phase:

    find(ctx)     -> FindDecision | None      resolve the launch's prompt to a catalog entry (§2 Find)
    analyze(ctx)  -> AnalyzeDecision | None   pick the scorer shape and the subset to run (§2 Analyze, §7, §13)
    atomize(ctx)  -> AtomizeDecision | None   write task_impl.py, optionally after trying it on sample rows in the
                                              work sandbox through ``ctx.workbench`` (§2 Atomize)

Returning ``None`` is allowed only after ``ctx.request_restart(reason)`` or ``ctx.request_review(reason)``: the
phase then closes with PhaseRestartRequested (the workflow re-runs it as invocation n+1, up to the restart cap) or
the run halts ``agent_review: <reason>`` until ``PATCH /v1/runs/{id} {"review_resolution"}``, whose text comes back
as ``ctx.instructions`` on the next invocation. A Driver that cannot do the phase at all raises
:class:`DriverFailed` (the phase fails with its detail; never a silent guess).

Everything a Driver says goes through ``ctx.narrate`` (AgentTextEvent) and ``ctx.emit`` (any other event, e.g. the
LLM driver's ToolCallEvent / ToolResultEvent / its token usage); both are queued and land with the phase's close, so
a retried activity writes them once. Driver code never runs task_impl.py in the worker: ``ctx.workbench`` runs it in
the run's work sandbox.

``driver_for(name)`` returns the Driver for a launch's ``driver`` string: ``builtin`` (the offline template driver,
``benchwright.drivers.builtin``) or ``<provider>://<model>`` (the LLM driver, registered with
:func:`register_driver` under the scheme ``llm``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from benchwright.errors import InvalidInput

if TYPE_CHECKING:
    from benchwright.drivers.catalog import Catalog, CatalogEntry
    from benchwright.events import Event
    from benchwright.schemas import LaunchRequest

DriverPhase = Literal["find", "analyze", "atomize"]


class DriverFailed(InvalidInput):
    """The Driver cannot do this phase (no catalog entry matches, no scorer template fits the columns...).

    A domain error, so the phase fails permanently with the message as PhaseFailed's detail."""

    code = "driver_failed"


@dataclass(frozen=True)
class DatasetSchema:
    """What Analyze saw of the dataset (also handed to Atomize)."""

    format: str
    rows: int
    columns: list[str]
    splits: dict[str, int] = field(default_factory=dict)
    """Split name -> row count, when a column names the split (``split``); §13: each split is a subset."""


@dataclass(frozen=True)
class SampleResult:
    """One sample row run through a candidate task_impl.py in the work sandbox."""

    index: int
    outcome: str
    """``pass``, ``fail`` or ``err`` (§12)."""
    score: float | None
    output: str | None
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class Workbench(Protocol):
    """The Driver's hands in the run's work sandbox (Atomize). Nothing here runs in the worker process."""

    async def check(self, source: str) -> str | None:
        """Load ``source`` as task_impl.py in the sandbox's scorer runtime; the load error, or None when it loads."""

    async def run_samples(self, source: str, rows: list[dict[str, Any]]) -> list[SampleResult]:
        """Run ``source`` on ``rows`` end to end (extract, solve through the run's model route, score), in the
        sandbox; one result per row, in order. Raises ``DriverFailed`` when the source does not load."""


@dataclass(frozen=True)
class ScorerPlan:
    """Analyze's choice of scorer shape, carried to Atomize in the AnalyzeArtifact (not a file)."""

    template: str
    """A template name (``benchwright.drivers.templates.TEMPLATES``), or ``custom`` for a driver-written scorer."""
    fields: dict[str, str]
    """Role -> column, e.g. ``{"input": "question", "reference": "answer"}``."""
    why: str


@dataclass(frozen=True)
class SubsetChoice:
    """The rows the run evaluates, when not all of them (§7 synthetic subsets, §13 splits)."""

    name: str
    indices: list[int]
    """Row indices of the dataset, in the order they become tasks 0..n-1."""
    recipe: str
    """How it was built, in words (``first 50 rows``, ``one row per value of category``...)."""
    synthetic: bool = True
    """False when the subset is a split the source ships."""


@dataclass(frozen=True)
class FindDecision:
    entry: CatalogEntry
    why: str


@dataclass(frozen=True)
class AnalyzeDecision:
    plan: ScorerPlan | None
    """None when the launch brought its own task_impl.py (the Driver still chose the subset)."""
    subset: SubsetChoice | None = None


@dataclass(frozen=True)
class AtomizeDecision:
    source: str
    """task_impl.py."""
    origin: str
    """What wrote it: ``template:<name>`` or the driver's name (AtomizeArtifact.source)."""
    note: str
    """One sentence for the log: what the scorer does and why."""


@dataclass
class PhaseRequest:
    kind: Literal["restart", "review"]
    reason: str


@dataclass
class DriverContext:
    """Everything one phase invocation gives its Driver. Fields a phase has no use for are None/empty."""

    run_id: str
    phase: DriverPhase
    invocation: int
    launch: LaunchRequest
    narrate: Callable[[str], None]
    """Say something in the log (AgentTextEvent for this phase)."""
    emit: Callable[[Event], None]
    """Queue any other event to land with the phase's close."""
    instructions: str | None = None
    """A reviewer's resolution text, when this invocation re-runs after human review."""
    catalog: Catalog | None = None
    """Find: the deployment's dataset catalog."""
    schema: DatasetSchema | None = None
    """Analyze, Atomize: the dataset's shape."""
    sample_rows: list[dict[str, Any]] = field(default_factory=list)
    """Analyze, Atomize: the first rows of the (subset's) tasks, at most ``SAMPLE_ROWS``."""
    all_rows: Callable[[], Iterator[dict[str, Any]]] | None = None
    """Analyze: stream every row of the dataset once (to build a subset without holding the rows in memory)."""
    plan: ScorerPlan | None = None
    """Atomize: what Analyze chose."""
    workbench: Workbench | None = None
    """Atomize: run candidate task_impl.py in the work sandbox."""
    request: PhaseRequest | None = None
    """Set by ``request_restart`` / ``request_review``; the activity turns it into the phase's control."""

    def request_restart(self, reason: str) -> None:
        """Ask for this phase to start over as invocation n+1 (capped per run, §10)."""
        self.request = PhaseRequest(kind="restart", reason=reason)

    def request_review(self, reason: str) -> None:
        """requestHumanReview: halt ``agent_review: <reason>`` until a reviewer resolves it (§10)."""
        self.request = PhaseRequest(kind="review", reason=reason)


SAMPLE_ROWS = 20
"""Rows a Driver is shown by default (and the builtin driver's template selection reads)."""


class Driver(Protocol):
    """A run's Driver. Each method may call ``ctx.request_restart``/``ctx.request_review`` and return None."""

    name: str

    async def find(self, ctx: DriverContext) -> FindDecision | None:
        """Resolve ``ctx.launch.prompt`` against ``ctx.catalog``. Raises DriverFailed when nothing fits."""

    async def analyze(self, ctx: DriverContext) -> AnalyzeDecision | None:
        """Choose the scorer shape (unless the launch brought task_impl.py) and the subset (scoping phrase)."""

    async def atomize(self, ctx: DriverContext) -> AtomizeDecision | None:
        """Write task_impl.py for ``ctx.plan`` (and ``ctx.instructions``), trying it via ``ctx.workbench``."""


DriverFactory = Callable[[str], Driver]
"""Builds a Driver from the launch's driver string (``builtin``, ``openrouter://deepseek/...``)."""

_FACTORIES: dict[str, DriverFactory] = {}


def register_driver(kind: str, factory: DriverFactory) -> None:
    """Make ``driver_for`` build drivers of ``kind``: ``builtin``, or ``llm`` for every ``<provider>://<model>``."""
    _FACTORIES[kind] = factory


def driver_kind(name: str) -> str:
    """``llm`` for a ``<provider>://<model>`` string, else the name itself."""
    return "llm" if "://" in name else name


def driver_for(name: str) -> Driver:
    """The Driver a launch's ``driver`` string names.

    Raises:
        DriverFailed: no driver of that kind is installed in this worker.
    """
    factory = _FACTORIES.get(driver_kind(name))
    if factory is None:
        raise DriverFailed(f"no driver '{name}' is installed in this worker (have: {', '.join(sorted(_FACTORIES))})")
    return factory(name)
