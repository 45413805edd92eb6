"""``GET /v1/registry/benchmarks`` carries each benchmark's subsets, as the detail read gives them, so the
dashboard's Benchmarks page needs one request rather than one more per card."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _finished(http: httpx.AsyncClient, stack: Stack, folder: Path, rows: int) -> str:
    """A finished run over bytes no other run of the session has (a public one feeds the phase cache: the other
    tests' runs must not hit it)."""
    dataset = folder / f"rows-{rows}-{uuid.uuid4().hex[:8]}.jsonl"
    dataset.write_text("".join(json.dumps({**json.loads(line), "nonce": dataset.name}) + "\n"
                               for line in (SAMPLE / "arithmetic.jsonl").read_text().splitlines()[:rows]))
    run = await launch(http, {"dataset": str(dataset),
                              "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
    await wait_terminal(http, run["id"])
    return str(run["id"])


async def _publish(http: httpx.AsyncClient, run_id: str, benchmark: str, subset: str,
                   visibility: str) -> dict[str, Any]:
    resp = await http.post("/v1/registry/publish", json={"run_id": run_id, "benchmark": benchmark, "subset": subset,
                                                          "visibility": visibility})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _listed(body: dict[str, Any], benchmark_id: str) -> dict[str, Any] | None:
    return next((b for b in body["benchmarks"] if b["id"] == benchmark_id), None)


async def test_the_benchmark_list_carries_each_benchmarks_subsets(stack: Stack, tmp_path: Path) -> None:
    name = f"listed-{uuid.uuid4().hex[:6]}"
    async with stack.http() as owner, stack.http(stack.other_key) as other:
        first = await _publish(owner, await _finished(owner, stack, tmp_path, 4), name, "four", "public")
        second = await _publish(owner, await _finished(owner, stack, tmp_path, 6), name, "six", "public")
        private = await _publish(owner, await _finished(owner, stack, tmp_path, 3), f"{name}-private", "three",
                                 "private")
        assert first["benchmark_id"] == second["benchmark_id"]

        for http in (owner, other):  # a public benchmark: listed, with its subsets, for everyone
            listing = (await http.get("/v1/registry/benchmarks")).json()
            detail = (await http.get(f"/v1/registry/benchmarks/{first['benchmark_id']}")).json()
            bench = _listed(listing, first["benchmark_id"])
            assert bench is not None
            assert bench["subsets"] == detail["subsets"]  # the same shape and content as the detail read
            assert [(s["id"], s["name"], [(v["version"], v["count"]) for v in s["snapshots"]],
                     [i["id"] for i in s["impls"]]) for s in bench["subsets"]] == [
                (first["subset_id"], "four", [(1, 4)], [first["impl_id"]]),
                (second["subset_id"], "six", [(1, 6)], [second["impl_id"]])]
            assert bench["runs"] == []  # runs stay on the detail read

        mine = _listed((await owner.get("/v1/registry/benchmarks")).json(), private["benchmark_id"])
        assert mine is not None and [s["id"] for s in mine["subsets"]] == [private["subset_id"]]
        assert _listed((await other.get("/v1/registry/benchmarks")).json(), private["benchmark_id"]) is None
