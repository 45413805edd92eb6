"""The store's JSON columns (``benchwright.fastjson`` through the engine's ``json_serializer``), on SQLite and
Postgres, by each way an append writes them (one event alone: Postgres's one call; a batch: its ``COPY``): what is
read back is what ``json.dumps`` would have stored, text of every script and width included; a NaN comes back as
None on both stores."""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from benchwright.events import MaterializeTaskResult
from benchwright.store.events import NewEvent, append_events, event_key, read_events
from benchwright.store.models import TrialResult

REPLIES = [
    "<think>\nThe capital of France... Paris.\n</think>\n\n**Answer: A**",
    "Réponse : $\\frac{1}{2}$, donc \\boxed{B} — naïve café",
    "答案是 C。🧪 \u2028 \"quoted\" \\ back\tslash",
    "The answer is (D)" + " hedge" * 300,
]
META = {"extracted": "A", "wide": 2**70, "small": 5e-324, "deep": [[{"k": [1, None, True]}]], "text": REPLIES[2]}


def _read_back(value: Any) -> Any:
    return json.loads(json.dumps(value))


def test_json_columns_read_back_what_json_dumps_would_have_stored(store_run: tuple[Engine, str]) -> None:
    engine, run_id = store_run
    results = [NewEvent.of(event_key(run_id, "m", i), MaterializeTaskResult(
        invocation=1, index=i, trial=0, score=1.0, outcome="pass", output=REPLIES[i % len(REPLIES)],
        meta=META)) for i in range(12)]
    alone = NewEvent(key=event_key(run_id, "note"), type="BenchNote", data={"x": math.nan, "y": -math.inf,
                                                                           "text": REPLIES[1], "wide": -(2**66)})
    append_events(engine, run_id, results)  # a batch (by COPY on Postgres)
    append_events(engine, run_id, [alone])  # one event alone (one call on Postgres)

    stored = {row.idem_key: row.data for row in read_events(engine, run_id)}
    for event in results:
        assert stored[event.key] == _read_back(event.data)
    assert stored[alone.key] == {"x": None, "y": None, "text": REPLIES[1], "wide": -(2**66)}
    with Session(engine) as session:
        rows = session.execute(select(TrialResult).where(TrialResult.run_id == run_id)).scalars().all()
    assert len(rows) == len(results) and all(row.meta == _read_back(META) for row in rows)
