"""The registry (§7): publish, promote, browse, identicons, leaderboards; and a run's fingerprint (§6)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from api.deps import AccountDep, StateDep
from api.errors import BODY, responses
from benchwright.fingerprint import FingerprintView, derive
from benchwright.registry import boards, catalog
from benchwright.registry.blobs import BlobStore
from benchwright.registry.identicon import identicon_svg
from benchwright.registry.pinned import resolve_subset
from benchwright.registry.shape import family, readable_run, run_events
from benchwright.registry.views import (
    BenchmarkList,
    BenchmarkPatch,
    BenchmarkView,
    ImplView,
    Leaderboard,
    PublishRequest,
    PublishResult,
    SubsetView,
)

router = APIRouter(prefix="/v1", tags=["registry"])
Ident = Annotated[str, Path(max_length=120)]


def _blobs(state: StateDep) -> BlobStore:
    return BlobStore.from_settings(state.settings)


@router.post("/registry/publish", response_model=PublishResult, responses=responses(*BODY, 404, 409))
def publish(body: PublishRequest, account: AccountDep, state: StateDep) -> PublishResult:
    """File a finished run under (benchmark, subset) with its impl; creates what does not exist yet."""
    return catalog.publish(state.engine, _blobs(state), account_id=account.id, req=body)


@router.post("/registry/impls/{impl_id}/promote", response_model=ImplView, responses=responses(404))
def promote(impl_id: Ident, account: AccountDep, state: StateDep) -> ImplView:
    """Mark an impl official (admin accounts only); ``latest:official`` launches pick it up from then on."""
    return catalog.promote(state.engine, account=account, impl_id=impl_id)


@router.get("/registry/benchmarks", response_model=BenchmarkList, responses=responses())
def benchmarks(account: AccountDep, state: StateDep) -> BenchmarkList:
    """Benchmarks you own and public ones, each with its subsets (their snapshots and impls)."""
    return catalog.list_benchmarks(state.engine, account_id=account.id)


@router.get("/registry/benchmarks/{benchmark_id}", response_model=BenchmarkView, responses=responses(404))
def benchmark(benchmark_id: Ident, account: AccountDep, state: StateDep) -> BenchmarkView:
    """One benchmark: its subsets, their snapshots and impls, and its public runs."""
    return boards.benchmark_detail(state.engine, account_id=account.id, benchmark_id=benchmark_id)


@router.patch("/registry/benchmarks/{benchmark_id}", response_model=BenchmarkView, responses=responses(*BODY, 404))
def patch_benchmark(benchmark_id: Ident, body: BenchmarkPatch, account: AccountDep, state: StateDep) -> BenchmarkView:
    """Make your benchmark public or private (private turns its public runs unlisted)."""
    return catalog.set_benchmark_visibility(state.engine, account_id=account.id, benchmark_id=benchmark_id,
                                            visibility=body.visibility)


@router.get("/registry/benchmarks/{benchmark_id}/identicon.svg", response_class=Response,
            responses={200: {"content": {"image/svg+xml": {"schema": {"type": "string"}}}}})
def identicon(benchmark_id: Ident) -> Response:
    """The benchmark's tile, derived from its id alone (same id, byte-identical SVG); no key needed for an <img>."""
    return Response(identicon_svg(benchmark_id), media_type="image/svg+xml",
                    headers={"Cache-Control": "public, max-age=31536000, immutable"})


@router.get("/registry/subsets/{subset_id}", response_model=SubsetView, responses=responses(404))
def subset(subset_id: Ident, account: AccountDep, state: StateDep) -> SubsetView:
    """One subset: rolling flag, default trials, its snapshots (append-only versions) and its impls."""
    return catalog.subset_detail(state.engine, account_id=account.id, subset_id=subset_id)


@router.get("/registry/subsets/{subset_id}/leaderboard", response_model=Leaderboard, responses=responses(400, 404))
def leaderboard(subset_id: Ident, account: AccountDep, state: StateDep,
                benchmark: Annotated[str | None, Query(max_length=200, description=(
                    "The benchmark (id or name) whose subset ``subset_id`` names by name."))] = None) -> Leaderboard:
    """Best score per model over the subset's public runs on any impl; a private benchmark has none (404).
    ``subset_id`` may be a subset's name (with ``benchmark``, or unique among what you can see) or a benchmark's
    name when it has one subset; an ambiguous name is refused (400) listing the matches."""
    resolved = resolve_subset(state.engine, account_id=account.id, ref=subset_id, benchmark=benchmark)
    return boards.leaderboard(state.engine, account_id=account.id, subset_id=resolved)


@router.get("/registry/impls/{impl_id}", response_model=ImplView, responses=responses(404))
def impl(impl_id: Ident, account: AccountDep, state: StateDep) -> ImplView:
    """One impl with its task_impl.py source."""
    return catalog.impl_detail(state.engine, _blobs(state), account_id=account.id, impl_id=impl_id)


@router.get("/runs/{run_id}/fingerprint", response_model=FingerprintView, responses=responses(404))
async def fingerprint(run_id: Annotated[str, Path(max_length=64)], account: AccountDep,
                      state: StateDep) -> FingerprintView:
    """The run fingerprint as stored, recomputed from the log with its exact inputs, and the model-free family."""
    run = await run_in_threadpool(readable_run, state.engine, run_id=run_id, account_id=account.id)

    def read() -> FingerprintView:
        with Session(state.engine) as session:
            events = run_events(session, run.id)
            members = family(session, run, events)
        recomputed, inputs = derive(events)
        return FingerprintView(run_id=run.id, fingerprint=run.fingerprint, recomputed=recomputed, inputs=inputs,
                               family=members)

    return await run_in_threadpool(read)
