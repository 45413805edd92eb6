"""A model that answers with NUL characters, on either store: the run is scored and ends ``ok``, each task once.

Postgres holds no NUL in text (nor reads a ``\\u0000`` in JSON with ``->>``, as the cost trigger does), so there
each stored reply carries U+FFFD in its place; SQLite keeps the reply as it came. Before this was handled, every
append of a batch holding such a reply failed on Postgres, and the run never finished.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchwright.testkit.devmodel import DevModelConfig
from tests.conftest import DevModels
from tests.faults.kit import exactly_once, start_stack, wait_for, write_dataset
from tests.store.conftest import _postgres_schema_url

pytestmark = pytest.mark.asyncio(loop_scope="session")
TASKS = 40


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None  # the stack's default: SQLite in its data directory
    else:
        yield from _postgres_schema_url()


async def test_a_model_answering_with_nul_characters_is_scored_and_stored(
        database_url: str | None, dev_models: DevModels, tmp_path: Path) -> None:
    answers = write_dataset(tmp_path / "tasks.jsonl", TASKS)
    replies = {q: f"Sure.\x00 The answer is **{a}**.\x00" for q, a in answers.items()}
    url = await dev_models.start(DevModelConfig(answers=replies))
    stack = await start_stack(tmp_path, model_hosts=list(dev_models.allowed), database_url=database_url)
    try:
        run_id = await stack.launch({"dataset": str(tmp_path / "tasks.jsonl"), "concurrency": 8,
                                     "model": {"identifier": "openai/dev", "api_base": url}})
        await wait_for(lambda: stack.finished([run_id]), "the run finished", 120, every_s=0.2)
        run = stack.runs()[run_id]
        assert (run.status, run.halted, run.error) == ("ok", False, None)
        exactly_once(stack.results(run_id), TASKS)
        async with stack.http() as http:
            view = (await http.get(f"/v1/runs/{run_id}")).json()
            page = (await http.get(f"/v1/runs/{run_id}/tasks", params={"limit": TASKS})).json()
        assert view["tasks"]["summary"]["passed"] == TASKS
        nul = "\x00" if database_url is None else "\ufffd"
        assert {t["output"] for t in page["tasks"]} == {
            reply.replace("\x00", nul) for reply in replies.values()}
        assert len(page["tasks"]) == TASKS
    finally:
        await stack.close()
