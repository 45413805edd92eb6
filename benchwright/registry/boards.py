"""Registry boards: a benchmark's page with its public runs, and a subset's leaderboard. They read run views
(``benchwright.store.runs``), which read the catalog, so they live apart from it: the catalog never imports the
run store back (no import cycle, ``tests/domain/test_import_cycles.py``)."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.errors import NotFound
from benchwright.registry.catalog import _bench_view, _public_runs, _subsets_of, _visible_subset
from benchwright.registry.views import BenchmarkView, Leaderboard, LeaderboardRow
from benchwright.schemas import RunSummary
from benchwright.store.models import Benchmark
from benchwright.store.runs import run_view


def benchmark_detail(engine: Engine, *, account_id: str, benchmark_id: str) -> BenchmarkView:
    """The benchmark with its subsets and its public runs (unlisted and private runs are never listed)."""
    with Session(engine) as session:
        bench = session.get(Benchmark, benchmark_id)
        if bench is None or not (bench.account_id == account_id or bench.visibility == "public"):
            raise NotFound(f"benchmark {benchmark_id} not found")
        view = _bench_view(bench, account_id)
        view.subsets = _subsets_of(session, [bench.id])[bench.id]
        runs = _public_runs(session, benchmark_id=bench.id)
    view.runs = [RunSummary.of(run_view(engine, r)) for r in runs]
    return view


def leaderboard(engine: Engine, *, account_id: str, subset_id: str) -> Leaderboard:
    """Best aggregated score (pass rate) per model across the subset's public ok runs on any of its impls.

    Raises:
        NotFound: no such subset visible to the caller, or its benchmark is private (no public leaderboard).
    """
    with Session(engine) as session:
        subset, bench = _visible_subset(session, account_id=account_id, subset_id=subset_id)
        if bench.visibility != "public":
            raise NotFound(f"subset {subset_id} has no leaderboard: its benchmark is private")
        runs = [r for r in _public_runs(session, subset_id=subset.id) if r.status == "ok" and not r.halted]
    best: dict[str, LeaderboardRow] = {}
    for run in runs:
        view = run_view(engine, run)
        model = str(run.model.get("identifier", ""))
        rate = view.tasks.summary.pass_rate
        row = LeaderboardRow(model=model, best_run_id=run.id, impl_id=run.impl_id, score=rate, pass_rate=rate,
                             pass_at_k=view.tasks.summary.pass_at_k, cost_usd=run.cost_incurred, runs=1)
        held = best.get(model)
        if held is None:
            best[model] = row
            continue
        row.runs = held.runs + 1
        better = (rate if rate is not None else -1.0) > (held.score if held.score is not None else -1.0)
        best[model] = row if better else held.model_copy(update={"runs": row.runs})
    rows = sorted(best.values(), key=lambda r: (-(r.score if r.score is not None else -1.0), r.cost_usd, r.model))
    return Leaderboard(subset_id=subset.id, benchmark_id=bench.id, rows=rows)
