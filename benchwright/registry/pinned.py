"""The launch side of pinned mode (§3): which launch bodies are pinned, what they may not combine, and how a pinned
subset snapshot is read back as a dataset."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from benchwright.errors import DatasetError, InvalidInput, NotFound
from benchwright.registry.blobs import BlobStore
from benchwright.registry.catalog import REGISTRY_SOURCE, Pin, _visible, benchmark_of_run, resolve_pinned
from benchwright.schemas import LaunchRequest
from benchwright.store.models import Benchmark, Run, Subset, SubsetSnapshot


def resolve_pin(engine: Engine, blobs: BlobStore, *, account_id: str, launch: LaunchRequest) -> Pin | None:
    """The pin of a launch naming ``benchmark``/``subset``/``impl``, else None (after the dataset-side checks).

    Raises:
        InvalidInput: a dataset and a benchmark together; no dataset at all; a ``registry:`` dataset given by hand;
            ``public`` without a public benchmark (the message says why).
        NotFound: naming which of benchmark, subset or impl did not resolve.
    """
    pinned = launch.benchmark is not None or launch.subset is not None or launch.impl is not None
    if pinned and launch.dataset is not None:
        raise InvalidInput("give either a dataset or a pinned benchmark + subset (+ impl), not both",
                           code="dataset_and_benchmark")
    if not pinned:
        if launch.dataset is not None and launch.dataset.startswith(REGISTRY_SOURCE):
            raise InvalidInput(f"'{REGISTRY_SOURCE}' datasets are the registry's own; launch with benchmark and "
                               "subset instead", code="invalid_dataset")
        if launch.dataset is None and getattr(launch, "prompt", None) is None:
            raise InvalidInput("a launch needs a dataset (or a pinned benchmark + subset)", code="missing_dataset")
        if launch.dataset is not None and launch.visibility == "public":
            raise InvalidInput("a dataset launch cannot be public: public runs are listed on a public benchmark; "
                               "launch it private or unlisted and publish it (POST /v1/registry/publish)",
                               code="needs_public_benchmark")
        return None
    pin = resolve_pinned(engine, blobs, account_id=account_id, benchmark=launch.benchmark, subset=launch.subset,
                         impl=launch.impl)
    if launch.visibility == "public" and not pin.benchmark_public:
        raise InvalidInput(f"this run cannot be public: benchmark {pin.benchmark_id} is private (public runs are "
                           "listed on a public benchmark)", code="needs_public_benchmark")
    return pin


def fetch_pinned(engine: Engine, blobs: BlobStore, *, source: str, dest_dir: Path) -> tuple[Path, str, int]:
    """Copy a pinned subset snapshot (``registry:<subset_id>@<version>``) into ``dest_dir`` as its dataset.

    Returns:
        The file (JSONL), its sha256 and its size.

    Raises:
        DatasetError: no such snapshot, or its blob is missing.
    """
    subset_id, _, version = source[len(REGISTRY_SOURCE):].rpartition("@")
    with Session(engine) as session:
        snap = session.get(SubsetSnapshot, (subset_id, int(version))) if version.isdigit() else None
    if snap is None or not blobs.has(snap.tasks_sha256):
        raise DatasetError(f"the pinned subset snapshot {source} is not in the registry", code="fetch_failed")
    dest = dest_dir / "dataset.jsonl"
    dest_dir.mkdir(parents=True, exist_ok=True)
    blobs.copy_to(snap.tasks_sha256, dest)
    return dest, snap.tasks_sha256, dest.stat().st_size


def leaderboard_note(session: Session, run: Run, *, fresh: bool = False) -> str | None:
    """Why ``run`` will not appear on a leaderboard, in words a person can act on; None when it will (a public run
    on a public benchmark, once it finishes ok). Leaderboards list the public ok runs of public benchmarks only.
    ``fresh``: ``run`` was read from the store just now (the API's reads), so its pin is not read again."""
    # A pin is set after the row is made: unless just read, read what is stored now.
    stored = run if fresh else session.get(Run, run.id) or run
    bench = benchmark_of_run(session, stored)
    if bench is None:
        return ("it is on no benchmark (a dataset or prompt launch): file it with 'benchwright registry publish "
                f"{stored.id} --benchmark B --subset S --visibility public', or launch with --benchmark/--subset")
    if bench.visibility != "public":
        return (f"its benchmark '{bench.name}' ({bench.id}) is private, and private benchmarks have no leaderboard "
                f"(make it public: PATCH /v1/registry/benchmarks/{bench.id} {{\"visibility\": \"public\"}})")
    if stored.visibility != "public":
        return (f"the run is {stored.visibility}: leaderboards list public runs only (launch with --visibility "
                "public)")
    if stored.finished_at is not None and (stored.status != "ok" or stored.halted):
        return "it did not finish ok (leaderboards list runs that did)"
    return None


def resolve_subset(engine: Engine, *, account_id: str, ref: str, benchmark: str | None = None) -> str:
    """The id of the subset ``ref`` names among those the caller can see: a subset id; a subset name (on
    ``benchmark``, an id or name, when given, or written ``benchmark/subset``); or a benchmark's id or name when
    that benchmark has one subset.

    Raises:
        NotFound: nothing visible is called that.
        InvalidInput: ``ambiguous_subset``: several are, listed as ``benchmark/subset (subset id)``.
    """
    with Session(engine) as session:
        exact = session.get(Subset, ref)
        if exact is not None and benchmark is None:
            owner = session.get(Benchmark, exact.benchmark_id)
            if owner is not None and (owner.account_id == account_id or owner.visibility == "public"):
                return exact.id
        if benchmark is None and "/" in ref:  # "benchmark/subset", as the errors below list them
            benchmark, _, ref = ref.partition("/")
        benches = list(session.execute(select(Benchmark).where(_visible(account_id))).scalars())
        if benchmark is not None:
            benches = [b for b in benches if benchmark in (b.id, b.name)]
        by_id = {b.id: b for b in benches}
        subsets = list(session.execute(select(Subset).where(col(Subset.benchmark_id).in_(list(by_id))))
                       .scalars()) if by_id else []
        found = [s for s in subsets if ref in (s.id, s.name)]
        if not found and benchmark is None:  # a benchmark named alone stands for its only subset
            found = [s for s in subsets if ref in (by_id[s.benchmark_id].id, by_id[s.benchmark_id].name)]
            if len({s.benchmark_id for s in found}) == 1 and len(found) > 1:
                raise InvalidInput(f"benchmark '{ref}' has {len(found)} subsets; name one: " + ", ".join(
                    f"{by_id[s.benchmark_id].name}/{s.name} ({s.id})" for s in found), code="ambiguous_subset")
        if not found:
            on = f" on benchmark '{benchmark}'" if benchmark else ""
            raise NotFound(f"no subset or benchmark called '{ref}'{on} that you can see", code="subset_not_found")
        if len(found) > 1:
            raise InvalidInput(f"'{ref}' names {len(found)} subsets; give one of them as benchmark/subset or by id: "
                               + ", ".join(f"{by_id[s.benchmark_id].name}/{s.name} ({s.id})" for s in found),
                               code="ambiguous_subset")
        return str(found[0].id)
