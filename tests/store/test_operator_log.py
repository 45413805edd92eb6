"""An Operator session's log on SQLite and Postgres (migration 0014): gapless seq, idempotent appends, the answer,
and ownership."""

from __future__ import annotations

import pytest

from benchwright.errors import NotFound
from benchwright.operator.events import OperatorDecision
from benchwright.operator.goals import Answer, SessionCreate
from benchwright.operator.store import (
    append_session_events,
    create_session,
    finish_session,
    get_session,
    read_session_events,
    session_key,
    session_view,
)
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.events import NewEvent


def test_session_log_is_gapless_idempotent_and_owned(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    owner, _ = create_account(engine, name="owner")
    other, _ = create_account(engine, name="other")
    req = SessionCreate.model_validate({"goal": {"question": "regressed", "reference_run": "r1"},
                                        "limits": {"session": {"runs": 2, "cost": 1.5}}})
    create_session(engine, session_id="s1", account_id=owner.id, req=req)

    def decision(n: int) -> NewEvent:
        return NewEvent.of(session_key("s1", "decision", n), OperatorDecision(action="launch", reason=f"step {n}"))

    assert append_session_events(engine, "s1", [decision(1), decision(2)], add_run="run-a") == 2
    assert append_session_events(engine, "s1", [decision(2), decision(3)], add_run="run-a") == 1  # a retry
    events = read_session_events(engine, session_id="s1")
    assert [(e.seq, e.type) for e in events] == [(0, "SessionStarted"), (1, "OperatorDecision"),
                                                 (2, "OperatorDecision"), (3, "OperatorDecision")]
    assert events[0].data["limits"] == {"session": {"runs": 2, "cost": 1.5}}
    answer = Answer(outcome="no_significant_difference", sentence="No significant difference.", needed_tasks=3012)
    finish_session(engine, session_id="s1", status="answered", answer=answer)
    finish_session(engine, session_id="s1", status="answered", answer=answer)  # repeated: nothing new
    view = session_view(engine, get_session(engine, session_id="s1", account_id=owner.id))
    assert view.status == "answered" and view.runs == ["run-a"] and view.answer == answer
    assert view.finished_at is not None and view.cost == 0.0
    assert [e.type for e in read_session_events(engine, session_id="s1", after=3)] == ["SessionAnswered"]
    with pytest.raises(NotFound):
        get_session(engine, session_id="s1", account_id=other.id)
    with pytest.raises(NotFound):
        append_session_events(engine, "nope", [decision(9)])
