"""Find resolves a prompt against the registry as well as the catalog (issue 11 with issue 9): a prompt naming a
registered benchmark the caller can see runs on that subset's snapshot, pinned to its official impl when there
is one (scored with that impl's exact bytes, filed under the benchmark); without one the Driver writes the
scorer and the run stays unfiled; another account's private benchmark is never found, not even as a hint."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from benchwright.testkit.devmodel import DevModelConfig
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROWS = [json.loads(line) for line in (SAMPLE / "arithmetic.jsonl").read_text().splitlines() if line.strip()]


def _account(stack: Stack, *, admin: bool = False, local_paths: bool = False) -> str:
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        return create_account(engine, name=f"find-{uuid.uuid4().hex[:8]}", balance_usd=100.0, admin=admin,
                              local_paths=local_paths)[1]
    finally:
        engine.dispose()


async def _run(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = await launch(http, body)
    events = await wait_terminal(http, run["id"])
    return (await http.get(f"/v1/runs/{run['id']}")).json(), events


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


async def _registered(http: httpx.AsyncClient, model: dict[str, str], benchmark: str,
                      visibility: str) -> dict[str, Any]:
    """A finished arithmetic run published as ``benchmark``/all."""
    run, _ = await _run(http, {"dataset": str(SAMPLE / "arithmetic.jsonl"), "model": model})
    assert run["status"] == "ok", run.get("error")
    resp = await http.post("/v1/registry/publish", json={"run_id": run["id"], "benchmark": benchmark, "subset": "all",
                                                         "visibility": visibility})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_a_prompt_naming_a_public_benchmark_runs_its_snapshot_with_the_official_impl(
        stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(DevModelConfig(answers={r["question"]: r["answer"] for r in ROWS}))
    model = {"identifier": "openai/dev", "api_base": url}
    name = f"sums{uuid.uuid4().hex[:6]}"
    async with stack.http() as owner:
        pub = await _registered(owner, model, name, "public")
    async with stack.http(_account(stack, admin=True)) as admin:
        assert (await admin.post(f"/v1/registry/impls/{pub['impl_id']}/promote")).json()["official"] is True
        impl = (await admin.get(f"/v1/registry/impls/{pub['impl_id']}")).json()
    async with stack.http(_account(stack)) as other:  # another account: the benchmark is public
        run, events = await _run(other, {"prompt": f"evaluate on {name} please", "model": model})
    assert run["status"] == "ok", run.get("error")
    [found] = _of(events, "DatasetResolved")
    assert found["source"] == f"registry:{pub['subset_id']}@{pub['subset_version']}"
    assert (found["benchmark_id"], found["subset_id"], found["impl_id"]) == (
        pub["benchmark_id"], pub["subset_id"], pub["impl_id"])
    assert found["name"] == f"{name}/all" and "registered benchmark" in found["why"]
    assert "official impl" in found["why"] and pub["impl_id"] in found["why"]
    assert _of(events, "FetchArtifact")[0]["source"] == found["source"]
    [atomized] = _of(events, "AtomizeArtifact")
    assert atomized["impl_sha256"] == impl["impl_fingerprint"] and atomized["source"] == "launch"  # not the Driver's
    assert (run["benchmark_id"], run["subset_id"], run["impl_id"]) == (
        pub["benchmark_id"], pub["subset_id"], pub["impl_id"])  # filed under the benchmark, like a pinned run
    assert run["tasks"]["summary"]["total"] == len(ROWS) and run["tasks"]["summary"]["passed"] == len(ROWS)


async def test_private_benchmarks_are_found_by_their_owner_only(stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(DevModelConfig(answers={r["question"]: r["answer"] for r in ROWS}))
    model = {"identifier": "openai/dev", "api_base": url}
    name = f"hidden{uuid.uuid4().hex[:6]}"
    owner_key = _account(stack, local_paths=True)  # its dataset run reads the bundled sample file
    async with stack.http(owner_key) as owner:
        pub = await _registered(owner, model, name, "private")
        mine, mine_events = await _run(owner, {"prompt": f"run {name}", "model": model})
    async with stack.http(_account(stack)) as stranger:
        theirs, their_events = await _run(stranger, {"prompt": f"run {name}", "model": model})
    # The owner finds it; no official impl, so the Driver writes the scorer and the run is not filed.
    assert mine["status"] == "ok", mine.get("error")
    [found] = _of(mine_events, "DatasetResolved")
    assert found["benchmark_id"] == pub["benchmark_id"] and found["impl_id"] is None
    assert "no official impl" in found["why"] and "the caller's own" in found["why"]
    assert _of(mine_events, "AtomizeArtifact")[0]["source"].startswith("template:")
    assert mine["impl_id"] is None and mine["benchmark_id"] is None
    # Anyone else: Find fails, and the private benchmark is not among the nearest entries either.
    assert theirs["status"] == "error"
    [failed] = _of(their_events, "PhaseFailed")
    assert failed["phase"] == "find" and "nearest are" in failed["detail"]
    assert name not in json.dumps(their_events).replace(f"run {name}", "")
