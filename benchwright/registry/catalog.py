"""The registry (§7): benchmarks, subsets (with append-only snapshots), immutable impls; publishing a finished run,
promoting an impl to official, resolving a pinned launch, browsing, and per-subset leaderboards.

Who sees what: a benchmark is visible to its owner, and to everyone when it is ``public``. Anything under a
benchmark the caller cannot see answers "not found", exactly like a benchmark that does not exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.drivers.catalog import REGISTRY_SOURCE as _REGISTRY_SOURCE
from benchwright.errors import Conflict, InvalidInput, NotFound
from benchwright.events import AtomizeArtifact
from benchwright.fingerprint import impl_id as make_impl_id
from benchwright.registry.blobs import BlobStore
from benchwright.registry.views import (
    LATEST_OFFICIAL,
    BenchmarkList,
    BenchmarkView,
    ImplView,
    PublishRequest,
    PublishResult,
    SnapshotView,
    SubsetView,
)
from benchwright.scoring.aggregators import TrialsConfig
from benchwright.security import audit
from benchwright.store.db import session_scope
from benchwright.store.models import (
    Account,
    Benchmark,
    EventRow,
    Impl,
    PhaseCell,
    Run,
    Subset,
    SubsetImpl,
    SubsetSnapshot,
    utcnow,
)

REGISTRY_SOURCE = _REGISTRY_SOURCE
"""The dataset of a pinned run: ``registry:<subset_id>@<version>``, a subset snapshot Fetch copies from the blob
store. Only the API and Find write it (a launch that names one itself is refused)."""


# -- look-ups ---------------------------------------------------------------------------------------------------


def _visible(account_id: str) -> Any:
    return or_(Benchmark.account_id == account_id, Benchmark.visibility == "public")


def find_benchmark(session: Session, *, account_id: str, ref: str) -> Benchmark | None:
    """By id, then by exact name (the caller's own first, then the oldest public one)."""
    row = session.get(Benchmark, ref)
    if row is not None and (row.account_id == account_id or row.visibility == "public"):
        return row
    named = list(session.execute(select(Benchmark).where(Benchmark.name == ref, _visible(account_id))).scalars())
    named.sort(key=lambda b: (b.account_id != account_id, b.created_at))
    return named[0] if named else None


def find_subset(session: Session, *, benchmark_id: str, ref: str) -> Subset | None:
    row = session.get(Subset, ref)
    if row is not None and row.benchmark_id == benchmark_id:
        return row
    return session.execute(select(Subset).where(Subset.benchmark_id == benchmark_id, Subset.name == ref)
                           ).scalars().first()


def _latest_snapshot(session: Session, subset_id: str) -> SubsetSnapshot | None:
    return session.execute(select(SubsetSnapshot).where(SubsetSnapshot.subset_id == subset_id)
                           .order_by(SubsetSnapshot.version.desc())).scalars().first()  # type: ignore[attr-defined]


def _visible_subset(session: Session, *, account_id: str, subset_id: str) -> tuple[Subset, Benchmark]:
    subset = session.get(Subset, subset_id)
    bench = session.get(Benchmark, subset.benchmark_id) if subset else None
    if subset is None or bench is None or not (bench.account_id == account_id or bench.visibility == "public"):
        raise NotFound(f"subset {subset_id} not found")
    return subset, bench


def benchmark_of_run(session: Session, run: Run) -> Benchmark | None:
    """The benchmark a run is filed under: its run shape, or for a pinned run still running, its pin."""
    bench_id = run.benchmark_id or (run.pinned or {}).get("benchmark_id")
    return session.get(Benchmark, bench_id) if bench_id else None


def check_can_be_public(session: Session, run: Run) -> None:
    """§12: a public run is listed on its benchmark, which must be public too.

    Raises:
        InvalidInput: the run is on no benchmark, or on a private one (the message says which).
    """
    bench = benchmark_of_run(session, run)
    if bench is None:
        raise InvalidInput(f"run {run.id} cannot be public: public runs are listed on their benchmark and this run "
                           "is on none; publish it (POST /v1/registry/publish) with visibility public",
                           code="needs_public_benchmark")
    if bench.visibility != "public":
        raise InvalidInput(f"run {run.id} cannot be public: its benchmark '{bench.name}' ({bench.id}) is private; "
                           "make the benchmark public first", code="needs_public_benchmark")


# -- publish and promote ----------------------------------------------------------------------------------------


def publish(engine: Engine, blobs: BlobStore, *, account_id: str, req: PublishRequest) -> PublishResult:
    """File a finished ``ok`` run as a (benchmark, subset, impl) triple; benchmark and subset are created when
    they do not exist. A subset's task list is immutable, except that a ``rolling`` one may grow by appending.

    Raises:
        NotFound: the run is not the caller's.
        Conflict: the run is not finished ok, lacks its task list or scorer, or its tasks differ from the subset's.
        InvalidInput: ``public`` on a private benchmark.
    """
    with session_scope(engine) as session:
        run = session.get(Run, req.run_id)
        if run is None or run.account_id != account_id:
            raise NotFound(f"run {req.run_id} not found")
        if run.finished_at is None or run.status != "ok" or run.halted:
            raise Conflict(f"run {run.id} is not finished ok (status {run.status}"
                           f"{', halted' if run.halted else ''}); only a finished run can be published",
                           code="not_publishable")
        tasks_sha, count, impl_sha = _run_contents(session, blobs, run)
        bench = find_benchmark(session, account_id=account_id, ref=req.benchmark)
        if bench is None:
            bench = Benchmark(id=f"bm-{uuid.uuid4().hex[:12]}", name=req.benchmark, account_id=account_id,
                              visibility="public" if req.visibility == "public" else "private")
            session.add(bench)
            session.flush()
        subset = find_subset(session, benchmark_id=bench.id, ref=req.subset)
        if subset is None:
            subset = Subset(id=f"ss-{uuid.uuid4().hex[:12]}", benchmark_id=bench.id, name=req.subset,
                            rolling=req.rolling,
                            default_trials=req.default_trials.model_dump(mode="json") if req.default_trials else None)
            session.add(subset)
            session.flush()
        version = _snapshot_for(session, blobs, subset, tasks_sha=tasks_sha, count=count)
        impl = _impl_for(session, bench, impl_sha)
        if session.get(SubsetImpl, (subset.id, impl.id)) is None:
            session.add(SubsetImpl(subset_id=subset.id, impl_id=impl.id))
        run.benchmark_id, run.subset_id, run.impl_id = bench.id, subset.id, impl.id
        run.impl_fingerprint = impl_sha
        if req.visibility == "public":
            check_can_be_public(session, run)
        run.visibility = req.visibility
        return PublishResult(run_id=run.id, benchmark_id=bench.id, subset_id=subset.id, subset_version=version,
                             impl_id=impl.id, visibility=req.visibility)


def _run_contents(session: Session, blobs: BlobStore, run: Run) -> tuple[str, int, str]:
    """The run's task rows (blob digest, count) and its scorer's digest (the last Atomize invocation's)."""
    cell = session.get(PhaseCell, (run.id, "analyze"))
    tasks_sha = cell.files.get("tasks.jsonl") if cell else None
    impl = session.execute(select(EventRow.data)
                           .where(EventRow.run_id == run.id, EventRow.type == AtomizeArtifact.type_name())
                           .order_by(EventRow.seq.desc())).scalars().first()  # type: ignore[attr-defined]
    impl_sha = impl.get("impl_sha256") if impl else None
    if not tasks_sha or not blobs.has(tasks_sha) or not impl_sha or not blobs.has(impl_sha):
        raise Conflict(f"run {run.id} has no stored task list or scorer to publish", code="not_publishable")
    count = sum(1 for _ in blobs.path(tasks_sha).open("rb"))
    return tasks_sha, count, impl_sha


def _snapshot_for(session: Session, blobs: BlobStore, subset: Subset, *, tasks_sha: str, count: int) -> int:
    """The subset version holding exactly these tasks, appending one to a rolling subset when they extend it."""
    latest = _latest_snapshot(session, subset.id)
    if latest is not None and latest.tasks_sha256 == tasks_sha:
        return latest.version
    known = session.execute(select(SubsetSnapshot.version).where(SubsetSnapshot.subset_id == subset.id,
                                                                 SubsetSnapshot.tasks_sha256 == tasks_sha)).scalar()
    if known is not None:
        return int(known)
    if latest is not None:
        if not subset.rolling:
            raise Conflict(f"subset '{subset.name}' ({subset.id}) has other tasks than run's; a subset's tasks never "
                           "change (publish under a new subset, or use a rolling one)", code="subset_mismatch")
        if not _extends(blobs, old=latest.tasks_sha256, new=tasks_sha):
            raise Conflict(f"rolling subset '{subset.name}' only grows by appending tasks: the run's tasks do not "
                           f"begin with the subset's {latest.count} current ones", code="subset_mismatch")
    version = (latest.version + 1) if latest else 1
    session.add(SubsetSnapshot(subset_id=subset.id, version=version, tasks_sha256=tasks_sha, count=count))
    return version


def _extends(blobs: BlobStore, *, old: str, new: str) -> bool:
    """``new`` starts with every line of ``old`` (old tasks are never removed or renumbered)."""
    with blobs.path(old).open("rb") as a, blobs.path(new).open("rb") as b:
        while chunk := a.read(1 << 20):
            if b.read(len(chunk)) != chunk:
                return False
    return True


def _impl_for(session: Session, bench: Benchmark, impl_sha: str) -> Impl:
    ident = make_impl_id(benchmark_id=bench.id, impl_sha256=impl_sha)
    impl = session.get(Impl, ident)
    if impl is None:
        impl = Impl(id=ident, benchmark_id=bench.id, impl_fingerprint=impl_sha)
        session.add(impl)
        session.flush()
    elif impl.impl_fingerprint != impl_sha:  # 48 bits collided: never let one id name two scorers
        raise Conflict(f"impl id {ident} already names a different scorer", code="impl_collision")
    return impl


def promote(engine: Engine, *, account: Account, impl_id: str) -> ImplView:
    """Mark an impl official. An admin may promote any impl. A ``curator`` account (the embedded stack's own) may
    promote impls of its OWN private benchmarks: that changes only what its own ``latest:official`` launches score
    with, and the impl stops being official if the benchmark goes public (``set_benchmark_visibility``). Nobody
    else may: an impl the caller cannot see is "not found", as for the admin halt.

    Raises:
        NotFound: no such impl, or the caller is neither an admin nor the curating owner of its benchmark.
        InvalidInput: ``promotion_refused``: a curator's own benchmark that is public (only an admin curates it).
    """
    with session_scope(engine) as session:
        impl = session.get(Impl, impl_id)
        bench = session.get(Benchmark, impl.benchmark_id) if impl is not None else None
        if impl is None or bench is None:
            raise NotFound(f"impl {impl_id} not found")
        if not account.admin:
            if not account.curator or bench.account_id != account.id:
                raise NotFound(f"impl {impl_id} not found")
            if bench.visibility == "public":
                raise InvalidInput(f"benchmark '{bench.name}' ({bench.id}) is public: only an admin makes its impls "
                                   "official (you curate your own private benchmarks)", code="promotion_refused")
        impl.official = True
        impl.promoted_at = utcnow()
        impl.self_curated = not account.admin
        audit.record(session, actor=audit.account_actor(account), actor_account_id=account.id,
                     action="impl.promote", target=f"impl:{impl_id}", detail={"benchmark_id": impl.benchmark_id})
        return _impl_view(impl)


# -- pinned launches -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    benchmark_id: str
    subset_id: str
    subset_version: int
    impl_id: str
    source: str
    """task_impl.py of the impl, exactly."""
    default_trials: TrialsConfig | None
    benchmark_public: bool

    @property
    def dataset(self) -> str:
        return f"{REGISTRY_SOURCE}{self.subset_id}@{self.subset_version}"

    def record(self) -> dict[str, Any]:
        return {"benchmark_id": self.benchmark_id, "subset_id": self.subset_id,
                "subset_version": self.subset_version, "impl_id": self.impl_id}


def resolve_pinned(engine: Engine, blobs: BlobStore, *, account_id: str, benchmark: str | None, subset: str | None,
                   impl: str | None) -> Pin:
    """§3 pinned mode: benchmark and subset by id then exact name, impl by id or ``latest:official`` (the default:
    the most recently promoted official impl that has scored the subset); the subset's current snapshot is pinned.

    Raises:
        InvalidInput: benchmark or subset missing.
        NotFound: naming which of benchmark, subset or impl did not resolve.
    """
    if not benchmark or not subset:
        raise InvalidInput("a pinned launch names both benchmark and subset (impl is optional: latest:official)",
                           code="incomplete_pin")
    with Session(engine) as session:
        bench = find_benchmark(session, account_id=account_id, ref=benchmark)
        if bench is None:
            raise NotFound(f"benchmark '{benchmark}' not found", code="benchmark_not_found")
        sub = find_subset(session, benchmark_id=bench.id, ref=subset)
        snap = _latest_snapshot(session, sub.id) if sub else None
        if sub is None or snap is None:
            raise NotFound(f"subset '{subset}' not found on benchmark '{bench.name}' ({bench.id})",
                           code="subset_not_found")
        chosen = _pick_impl(session, bench=bench, subset=sub, ref=impl or LATEST_OFFICIAL)
        source = blobs.read_bytes(chosen.impl_fingerprint).decode()
        trials = TrialsConfig.model_validate(sub.default_trials) if sub.default_trials else None
        return Pin(benchmark_id=bench.id, subset_id=sub.id, subset_version=snap.version, impl_id=chosen.id,
                   source=source, default_trials=trials, benchmark_public=bench.visibility == "public")


def _pick_impl(session: Session, *, bench: Benchmark, subset: Subset, ref: str) -> Impl:
    if ref == LATEST_OFFICIAL:
        impl: Impl | None = session.execute(
            select(Impl).join(SubsetImpl, SubsetImpl.impl_id == Impl.id)
            .where(SubsetImpl.subset_id == subset.id, col(Impl.official).is_(True))
            .order_by(Impl.promoted_at.desc())).scalars().first()  # type: ignore[union-attr]
        if impl is None:
            raise NotFound(f"impl latest:official not found: subset '{subset.name}' ({subset.id}) has no official "
                           "impl yet (an admin promotes one)", code="impl_not_found")
        return impl
    found = session.get(Impl, ref)
    if found is None or found.benchmark_id != bench.id:
        raise NotFound(f"impl '{ref}' not found on benchmark '{bench.name}' ({bench.id})", code="impl_not_found")
    return found


# -- browse ---------------------------------------------------------------------------------------------------


def _impl_view(impl: Impl, source: str | None = None) -> ImplView:
    return ImplView(id=impl.id, benchmark_id=impl.benchmark_id, impl_fingerprint=impl.impl_fingerprint,
                    official=impl.official, promoted_at=impl.promoted_at, created_at=impl.created_at, source=source)


def _subset_views(session: Session, subsets: Sequence[Subset]) -> list[SubsetView]:
    """These subsets, each with its snapshots and impls: two queries however many there are, so the benchmark list
    can carry every benchmark's subsets (the dashboard's cards) for about the cost of one detail read."""
    ids = [s.id for s in subsets]
    snaps: dict[str, list[SnapshotView]] = {i: [] for i in ids}
    impls: dict[str, list[ImplView]] = {i: [] for i in ids}
    if ids:
        for snap in session.execute(select(SubsetSnapshot).where(col(SubsetSnapshot.subset_id).in_(ids))
                                    .order_by(SubsetSnapshot.version)).scalars():
            snaps[snap.subset_id].append(SnapshotView(version=snap.version, tasks_sha256=snap.tasks_sha256,
                                                      count=snap.count, created_at=snap.created_at))
        for subset_id, impl in session.execute(
                select(SubsetImpl.subset_id, Impl).join(SubsetImpl, SubsetImpl.impl_id == Impl.id)
                .where(col(SubsetImpl.subset_id).in_(ids)).order_by(Impl.created_at)).all():
            impls[subset_id].append(_impl_view(impl))
    return [SubsetView(id=s.id, benchmark_id=s.benchmark_id, name=s.name, rolling=s.rolling,
                       default_trials=s.default_trials, created_at=s.created_at, snapshots=snaps[s.id],
                       impls=impls[s.id]) for s in subsets]


def _subsets_of(session: Session, benchmark_ids: list[str]) -> dict[str, list[SubsetView]]:
    """benchmark id -> its subsets (oldest first), as ``_subset_views`` gives them."""
    out: dict[str, list[SubsetView]] = {b: [] for b in benchmark_ids}
    if benchmark_ids:
        rows = session.execute(select(Subset).where(col(Subset.benchmark_id).in_(benchmark_ids))
                               .order_by(Subset.created_at)).scalars().all()
        for view in _subset_views(session, rows):
            out[view.benchmark_id].append(view)
    return out


def _bench_view(bench: Benchmark, account_id: str) -> BenchmarkView:
    return BenchmarkView(id=bench.id, name=bench.name, visibility=bench.visibility,
                         owned=bench.account_id == account_id, created_at=bench.created_at,
                         identicon=f"/v1/registry/benchmarks/{bench.id}/identicon.svg")


def list_benchmarks(engine: Engine, *, account_id: str) -> BenchmarkList:
    """The benchmarks the account sees, each with its subsets as the detail read gives them (not its runs)."""
    with Session(engine) as session:
        rows = session.execute(select(Benchmark).where(_visible(account_id))
                               .order_by(Benchmark.created_at)).scalars().all()
        subsets = _subsets_of(session, [b.id for b in rows])
        return BenchmarkList(benchmarks=[_bench_view(b, account_id).model_copy(update={"subsets": subsets[b.id]})
                                         for b in rows])


def _public_runs(session: Session, *, benchmark_id: str | None = None, subset_id: str | None = None) -> list[Run]:
    query = select(Run).where(Run.visibility == "public", Run.finished_at.is_not(None))  # type: ignore[union-attr]
    if benchmark_id:
        query = query.where(Run.benchmark_id == benchmark_id)
    if subset_id:
        query = query.where(Run.subset_id == subset_id)
    return list(session.execute(query.order_by(Run.created_at.desc())).scalars())  # type: ignore[attr-defined]


def subset_detail(engine: Engine, *, account_id: str, subset_id: str) -> SubsetView:
    with Session(engine) as session:
        subset, _ = _visible_subset(session, account_id=account_id, subset_id=subset_id)
        return _subset_views(session, [subset])[0]


def impl_detail(engine: Engine, blobs: BlobStore, *, account_id: str, impl_id: str) -> ImplView:
    with Session(engine) as session:
        impl = session.get(Impl, impl_id)
        bench = session.get(Benchmark, impl.benchmark_id) if impl else None
        if impl is None or bench is None or not (bench.account_id == account_id or bench.visibility == "public"):
            raise NotFound(f"impl {impl_id} not found")
        return _impl_view(impl, blobs.read_bytes(impl.impl_fingerprint).decode())


def set_benchmark_visibility(engine: Engine, *, account_id: str, benchmark_id: str, visibility: str) -> BenchmarkView:
    """Owner only. Making a benchmark private turns its public runs unlisted (a public run needs a public
    benchmark), which also takes their phase cells out of the cache."""
    with session_scope(engine) as session:
        bench = session.get(Benchmark, benchmark_id)
        if bench is None or bench.account_id != account_id:
            raise NotFound(f"benchmark {benchmark_id} not found")
        if visibility == "public" and bench.visibility != "public":
            # the owner's own promotions were for its private use: for everyone, only an admin makes impls official
            for impl in session.execute(select(Impl).where(Impl.benchmark_id == bench.id,
                                                           col(Impl.self_curated).is_(True))).scalars():
                impl.official, impl.self_curated, impl.promoted_at = False, False, None
        bench.visibility = visibility
        if visibility == "private":
            for run in session.execute(select(Run).where(
                    Run.benchmark_id == bench.id, Run.visibility == "public")).scalars():
                run.visibility = "unlisted"
        return _bench_view(bench, account_id)
