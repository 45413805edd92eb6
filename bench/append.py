"""What one small event append costs: a phase's bracket appends two or three events at a time, several times a phase,
so the fixed cost of an append (its transaction and its four statements; on Postgres one call of
``bw_append_events``, migration 0017) is paid on every run's path to its first model call. Appends PhaseStarted +
PhaseCompleted to each of ``--n`` runs per round, and prints the wall and CPU time per append. On Postgres three ways
in turn, round by round, with the server's CPU beside them: the four statements in a transaction (as every append
went before migration 0017), the one call in a transaction (a phase's opening and close) and the one call alone in
autocommit (an append of its own). Then the same for a small read (the run row by its key, as ``get_run`` reads
it), through ``benchwright.store.db.reader`` (on Postgres one autocommit statement) against a transaction of its own
(BEGIN, the statement, ROLLBACK: what every read paid before), interleaved round by round.

    python bench/append.py                 # SQLite in a temporary directory
    python bench/append.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test   # a schema of its own

Then a Materialize batch's appends: ``--tasks`` tasks' results and aggregates in flushes of ``--flush`` tasks (each
flush one append: the events, a trial row and a task row per task), with the wall and CPU per 1,000 tasks, and on
Postgres the server's CPU beside it (every ``postgres`` process of this machine: run it on a quiet one).

Single thread, nothing else running in the process; the machine's load shows in the spread between rounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstack import postgres_cpu_s
from sqlalchemy import Engine, create_engine, text
from sqlmodel import Session

from benchwright.events import MaterializeTaskAggregated, MaterializeTaskResult, PhaseCompleted, PhaseStarted
from benchwright.schemas import LaunchRequest
from benchwright.store import events
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate, reader, session_scope
from benchwright.store.events import NewEvent, append_events, append_in_session, event_key
from benchwright.store.models import Run
from benchwright.store.runs import create_run, get_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=400, help="appends per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--postgres", metavar="URL", help="the store on this Postgres database (a schema of its own)")
    ap.add_argument("--tasks", type=int, default=1000, help="tasks per round of the batch's appends")
    ap.add_argument("--flush", type=int, default=100, help="tasks per append (FLUSH_EVERY is 200 events: 100 tasks)")
    args = ap.parse_args()
    schema = f"bw_append_{uuid.uuid4().hex[:8]}"
    if args.postgres:
        admin = create_engine(args.postgres)
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        sep = "&" if "?" in args.postgres else "?"
        url = f"{args.postgres}{sep}options=-csearch_path%3D{schema}"
    else:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='bw-append-')}/store.db"
    try:
        engine = make_engine(url)
        migrate(engine)
        account, _ = create_account(engine, name="bench", balance_usd=1.0)
        runs = [create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                           driver="builtin", trials_config={}).id for _ in range(args.n)]
        run = get_run(engine, run_id=runs[0])
        # Each append to a run of its own, as a phase's appends are spread over the runs in flight (one run appended
        # to thousands of times churns its row's versions and slows every way alike). On Postgres the ways are
        # interleaved round by round: the four statements (``_append_by_statements``, every append before
        # migration 0017), the one call in a transaction (``append_in_session``, a phase's opening and close) and
        # the one call alone in autocommit (``append_events``).
        small: list[tuple[str, Callable[[Engine, str, list[NewEvent]], object]]] = [("", _alone)]
        if args.postgres:
            small = [("four statements in a transaction", _by_statements), ("one call in a transaction", _in_session),
                     ("one call alone", _alone)]
        for r in range(args.rounds):
            for w, (way, append) in enumerate(small):
                server = postgres_cpu_s() if args.postgres else None
                wall, cpu = time.perf_counter(), time.process_time()
                for i, run_id in enumerate(runs):
                    append(engine, run_id, [
                        NewEvent.of(event_key(run_id, "bench", r, w, i, "started"), PhaseStarted(phase="fetch")),
                        NewEvent.of(event_key(run_id, "bench", r, w, i, "completed"),
                                    PhaseCompleted(phase="fetch", duration_ms=1))])
                said = (f"{engine.dialect.name}, round {r}{', ' + way if way else ''}: "
                        f"{1000 * (time.perf_counter() - wall) / args.n:.3f} ms wall, "
                        f"{1000 * (time.process_time() - cpu) / args.n:.3f} ms CPU")
                if server is not None:
                    said += f", the server's {1000 * (postgres_cpu_s() - server) / args.n:.3f} ms CPU"
                print(said + " per two-event append")
        # On Postgres, the store's two ways of inserting rows (events._COPY_FROM rows or more by COPY), interleaved.
        copy_from = events._COPY_FROM
        ways = [("by COPY", copy_from), ("by INSERT", sys.maxsize)] if args.postgres else [("", copy_from)]
        for r in range(args.rounds):
            for n, (way, threshold) in enumerate(ways):
                if args.postgres:  # as autovacuum soon does: a table never analyzed has its key check seq-scanned
                    with engine.begin() as conn:
                        conn.execute(text("ANALYZE events, trial_results, task_rows"))
                events._COPY_FROM = threshold
                batch_appends(engine, run.id, r * len(ways) + n, tasks=args.tasks, flush=args.flush, way=way)
        events._COPY_FROM = copy_from
        for r in range(args.rounds):
            line = []
            for name, bind in (("in a transaction", engine), ("through reader()", reader(engine))):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(args.n):
                    with Session(bind) as session:
                        session.get(Run, run.id)
                line.append(f"{name} {1000 * (time.perf_counter() - wall) / args.n:.3f} ms wall, "
                            f"{1000 * (time.process_time() - cpu) / args.n:.3f} ms CPU")
            print(f"{engine.dialect.name}, round {r}, one small read: " + "; ".join(line))
        engine.dispose()
    finally:
        if args.postgres:
            with admin.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            admin.dispose()


def _alone(engine: Engine, run_id: str, batch: list[NewEvent]) -> object:
    return append_events(engine, run_id, batch)


def _in_session(engine: Engine, run_id: str, batch: list[NewEvent]) -> object:
    with session_scope(engine) as session:
        return append_in_session(session, run_id, batch)


def _by_statements(engine: Engine, run_id: str, batch: list[NewEvent]) -> object:
    with session_scope(engine) as session:
        return events._append_by_statements(session, run_id, batch, {})


def batch_appends(engine: Engine, run_id: str, round_: int, *, tasks: int, flush: int, way: str) -> None:
    """One round of a batch's appends: ``tasks`` tasks' result and aggregate, ``flush`` tasks per append."""
    batch = []
    for i in range(tasks):
        reply = f"Let me work through this.\n\n**Answer:** {i % 97}"
        batch += [NewEvent.of(event_key(run_id, "bench", round_, i, 0), MaterializeTaskResult(
                       invocation=round_ + 1, index=i, trial=0, score=1.0, outcome="pass", output=reply,
                       meta={"extracted": True, "answer": str(i % 97), "latency_s": 0.05}, cost_usd=0.0)),
                   NewEvent.of(event_key(run_id, "bench", round_, i, "agg"), MaterializeTaskAggregated(
                       invocation=round_ + 1, index=i, score=1.0, outcome="pass", trial_scores=[1.0]))]
    server = postgres_cpu_s() if engine.dialect.name == "postgresql" else None
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(batch), 2 * flush):
        append_events(engine, run_id, batch[start:start + 2 * flush])
    per_k = 1000 / tasks
    how = f"{flush} tasks each{', ' + way if way else ''}"
    line = (f"{engine.dialect.name}, round {round_}, a batch's appends ({how}): "
            f"{(time.perf_counter() - wall) * per_k:.3f} s wall, {(time.process_time() - cpu) * per_k:.3f} s CPU")
    if server is not None:
        line += f", the server's {(postgres_cpu_s() - server) * per_k:.3f} s CPU"
    print(line + " per 1,000 tasks")


if __name__ == "__main__":
    main()
