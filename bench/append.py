"""What one small event append costs: a phase's bracket appends two or three events at a time, several times a phase,
so the fixed cost of an append (its transaction and its four statements) is paid on every run's path to its first
model call. Appends PhaseStarted + PhaseCompleted to one run, ``--n`` times per round, and prints the wall and CPU
time per append. Then the same for a small read (the run row by its key, as ``get_run`` reads it), through
``benchwright.store.db.reader`` (on Postgres one autocommit statement) against a transaction of its own (BEGIN,
the statement, ROLLBACK: what every read paid before), interleaved round by round.

    python bench/append.py                 # SQLite in a temporary directory
    python bench/append.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test   # a schema of its own

Single thread, nothing else running in the process; the machine's load shows in the spread between rounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, text
from sqlmodel import Session

from benchwright.events import PhaseCompleted, PhaseStarted
from benchwright.schemas import LaunchRequest
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate, reader
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.models import Run
from benchwright.store.runs import create_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=400, help="appends per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--postgres", metavar="URL", help="the store on this Postgres database (a schema of its own)")
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
        run = create_run(engine, account_id=account.id, launch=LaunchRequest(dataset="x.jsonl", model="openai/x"),
                         driver="builtin", trials_config={})
        for r in range(args.rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(args.n):
                append_events(engine, run.id, [
                    NewEvent.of(event_key(run.id, "bench", r, i, "started"), PhaseStarted(phase="fetch")),
                    NewEvent.of(event_key(run.id, "bench", r, i, "completed"),
                                PhaseCompleted(phase="fetch", duration_ms=1))])
            print(f"{engine.dialect.name}, round {r}: {1000 * (time.perf_counter() - wall) / args.n:.3f} ms wall, "
                  f"{1000 * (time.process_time() - cpu) / args.n:.3f} ms CPU per two-event append")
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


if __name__ == "__main__":
    main()
