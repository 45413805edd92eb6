"""Find's side of the registry (issue 11): the registered subsets a caller can see, as entries Find ranks beside
the deployment's catalog, and the scorer a run resolved that way scores with.

A prompt naming a registered benchmark resolves like a pinned launch (§3): the subset's current snapshot is the
dataset and, when the subset has an official impl, its exact task_impl.py is the scorer (``latest:official``) and
the run is pinned to it, so it is filed under (benchmark, subset, impl) at its end. Without an official impl the
Driver writes the scorer and the run stays unfiled (it can be published later). Only benchmarks the caller may
see are entries: its own, and public ones. Another account's private benchmark is never a candidate, not even
in the "nearest" hints of a failed Find.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.drivers.catalog import CatalogEntry, RegistryRef
from benchwright.registry.blobs import BlobStore
from benchwright.registry.catalog import _latest_snapshot, _visible
from benchwright.store.models import Benchmark, Impl, Run, Subset, SubsetImpl


def _official_impl(session: Session, subset_id: str) -> str | None:
    """The subset's most recently promoted official impl (``latest:official``), or None."""
    impl = session.execute(
        select(Impl).join(SubsetImpl, SubsetImpl.impl_id == Impl.id)
        .where(SubsetImpl.subset_id == subset_id, col(Impl.official).is_(True))
        .order_by(Impl.promoted_at.desc())).scalars().first()  # type: ignore[union-attr]
    return impl.id if impl is not None else None


def registry_entries(engine: Engine, *, account_id: str) -> list[CatalogEntry]:
    """Every (benchmark, subset) with a snapshot that ``account_id`` can see, the caller's own benchmarks first,
    then public ones, oldest first within each (so a name two accounts use resolves to the caller's own, as a
    pinned launch's name look-up does). Entry name ``<benchmark>/<subset>``; aliases: the benchmark's name and id
    and the subset's id (naming the benchmark alone picks its first subset)."""
    out: list[CatalogEntry] = []
    with Session(engine) as session:
        benches = list(session.execute(select(Benchmark).where(_visible(account_id))).scalars())
        benches.sort(key=lambda b: (b.account_id != account_id, b.created_at, b.id))
        for bench in benches:
            subsets = session.execute(select(Subset).where(Subset.benchmark_id == bench.id)
                                      .order_by(Subset.created_at, Subset.id)).scalars().all()
            for sub in subsets:
                snap = _latest_snapshot(session, sub.id)
                if snap is None:
                    continue
                ref = RegistryRef(benchmark_id=bench.id, benchmark_name=bench.name, subset_id=sub.id,
                                  subset_name=sub.name, subset_version=snap.version, tasks=snap.count,
                                  impl_id=_official_impl(session, sub.id), own=bench.account_id == account_id)
                out.append(CatalogEntry(
                    name=f"{bench.name}/{sub.name}", aliases=(bench.name, bench.id, sub.id), format="jsonl",
                    description=f"registered benchmark '{bench.name}', subset '{sub.name}' ({snap.count} tasks)",
                    registry=ref))
    return out


def found_scorer(engine: Engine, blobs: BlobStore, *, run_id: str) -> str | None:
    """The task_impl.py a prompt launch scores with because Find pinned it to a registered subset's official impl
    (exactly that impl's bytes), or None (not a prompt launch, or no impl pinned)."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        launch = (run.launch or {}) if run else {}
        impl_id = (run.pinned or {}).get("impl_id") if run else None
        if not impl_id or launch.get("dataset") is not None or launch.get("task_impl") is not None:
            return None
        impl = session.get(Impl, impl_id)
        if impl is None:
            return None
        return blobs.read_bytes(impl.impl_fingerprint).decode()
