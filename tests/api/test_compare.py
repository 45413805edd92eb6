"""Paired comparisons, rankings and the frontier on the real stack: dev-model runs on a 2,000-task dataset
(issue 17)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from benchwright.comparison.stats import mcnemar_exact, wilson_interval
from benchwright.testkit.devmodel import DevModelConfig, is_answered_correctly
from tests.api.helpers import launch, wait_terminal
from tests.conftest import DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
N = 2000


def _dataset(path: Path, n: int) -> list[str]:
    questions = []
    with path.open("w") as f:
        for i in range(n):
            q = f"What is {i} plus 17? (item {i})"
            questions.append(q)
            f.write(json.dumps({"question": q, "answer": str(i + 17)}) + "\n")
    return questions


class Runs:
    def __init__(self, questions: list[str], ids: dict[str, str]) -> None:
        self.questions, self.ids = questions, ids


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def runs(stack: Stack, dev_models: DevModels, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runs]:
    data = tmp_path_factory.mktemp("compare")
    questions = _dataset(data / "big.jsonl", N)
    _dataset(data / "small.jsonl", 50)
    answers = {q: str(i + 17) for i, q in enumerate(questions)}
    # (accuracy, hash seed, price per input token): the 0.80 "b" model is the priciest, so it is off the frontier
    models = {"a80": (0.80, "", 1e-6), "b85": (0.85, "", 2e-6), "c80": (0.80, "other", 3e-6)}
    urls = {name: await dev_models.start(DevModelConfig(answers=answers, accuracy=acc, seed=seed))
            for name, (acc, seed, _) in models.items()}
    async with stack.http() as http:
        launched = {name: await launch(http, {"dataset": str(data / "big.jsonl"), "model": {
            "identifier": "openai/dev", "api_base": urls[name], "input_cost_per_token": models[name][2]}})
            for name in models}
        launched["small"] = await launch(http, {"dataset": str(data / "small.jsonl"),
                                                "model": {"identifier": "openai/dev", "api_base": urls["a80"]}})
        await asyncio.gather(*(wait_terminal(http, run["id"]) for run in launched.values()))
    yield Runs(questions, {name: run["id"] for name, run in launched.items()})


def _expected(questions: list[str], acc: float, seed: str = "") -> set[int]:
    return {i for i, q in enumerate(questions) if is_answered_correctly(q, acc, seed)}


async def test_every_run_carries_its_interval(stack: Stack, runs: Runs) -> None:
    async with stack.http() as http:
        summary = (await http.get(f"/v1/runs/{runs.ids['a80']}")).json()["tasks"]["summary"]
    passed = len(_expected(runs.questions, 0.80))
    assert summary["passed"] == passed and summary["failed"] == N - passed
    ci = wilson_interval(successes=passed, n=N)
    assert ci is not None and summary["pass_rate_ci"] == pytest.approx([ci.low, ci.high])
    assert summary["pass_rate_ci"][0] < summary["pass_rate"] < summary["pass_rate_ci"][1]
    assert summary["pass_rate_se"] == pytest.approx((passed / N * (1 - passed / N) / N) ** 0.5)
    assert summary["mean_score"] is None  # pass/fail with k = 1: Wilson says it all


async def test_better_model_wins_with_the_right_flips(stack: Stack, runs: Runs) -> None:
    async with stack.http() as http:
        resp = await http.get("/v1/compare", params={"a": runs.ids["a80"], "b": runs.ids["b85"]})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    at80, at85 = _expected(runs.questions, 0.80), _expected(runs.questions, 0.85)
    assert body["gained"] == sorted(at85 - at80) and body["lost"] == sorted(at80 - at85) == []
    assert body["compared"] == N and body["tasks"] == N
    assert body["difference"] == pytest.approx((len(at85) - len(at80)) / N)
    assert body["p_value"] == pytest.approx(mcnemar_exact(b=0, c=len(at85 - at80)))
    assert body["significant"] and body["p_value"] < 1e-10
    low, high = body["difference_ci"]
    assert 0 < low < body["difference"] < high
    assert body["verdict"].startswith("B is better than A by ") and "on 2,000 tasks" in body["verdict"]
    print(body["verdict"])


async def test_equal_models_with_different_seeds_are_not_told_apart(stack: Stack, runs: Runs) -> None:
    async with stack.http() as http:
        body = (await http.get("/v1/compare", params={"a": runs.ids["a80"], "b": runs.ids["c80"]})).json()
    first, second = _expected(runs.questions, 0.80), _expected(runs.questions, 0.80, "other")
    assert body["gained"] == sorted(second - first) and body["lost"] == sorted(first - second)
    assert len(body["gained"]) > 200 and len(body["lost"]) > 200  # many flips both ways, ...
    assert not body["significant"] and body["p_value"] > 0.05  # ... that cancel out
    assert body["difference_ci"][0] < 0 < body["difference_ci"][1]
    assert body["verdict"].startswith("No significant difference")
    print(body["verdict"])


async def test_different_shapes_and_unreadable_runs_are_refused(stack: Stack, runs: Runs) -> None:
    async with stack.http() as http:
        resp = await http.get("/v1/compare", params={"a": runs.ids["a80"], "b": runs.ids["small"]})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "different_shape" and "dataset_id" in resp.json()["error"]["message"]
        resp = await http.get("/v1/frontier", params={"runs": f"{runs.ids['a80']},{runs.ids['small']}"})
        assert resp.status_code == 400 and "dataset_id" in resp.json()["error"]["message"]
        assert (await http.get("/v1/compare", params={"a": runs.ids["a80"]})).status_code == 400
    async with stack.http(stack.other_key) as other:
        resp = await other.get("/v1/compare", params={"a": runs.ids["a80"], "b": runs.ids["b85"]})
        assert resp.status_code == 404 and runs.ids["a80"] in resp.json()["error"]["message"]
    async with stack.http() as http:
        for name in ("a80", "b85"):
            assert (await http.patch(f"/v1/runs/{runs.ids[name]}", json={"visibility": "unlisted"})).status_code == 200
    async with stack.http(stack.other_key) as other:  # unlisted: anyone with the ids may compare them (§12)
        assert (await other.get("/v1/compare", params={"a": runs.ids["a80"], "b": runs.ids["b85"]})).status_code == 200


async def test_ranking_and_frontier(stack: Stack, runs: Runs) -> None:
    ids = runs.ids
    async with stack.http() as http:
        ranked = (await http.get("/v1/compare", params={"runs": f"{ids['a80']},{ids['c80']},{ids['b85']}"})).json()
        points = (await http.get("/v1/frontier", params={"runs": f"{ids['c80']},{ids['a80']},{ids['b85']}"})).json()
    order = [r["run_id"] for r in ranked["runs"]]
    assert order[0] == ids["b85"] and ranked["runs"][0]["p_vs_leader"] is None
    assert all(r["p_vs_leader"] < 0.05 and not r["tied_with_leader"] for r in ranked["runs"][1:])
    assert all(r["pass_rate_ci"][0] < r["pass_rate"] < r["pass_rate_ci"][1] for r in ranked["runs"])
    by_run = {p["run_id"]: p for p in points["points"]}
    assert [p["run_id"] for p in points["points"]] == [ids["a80"], ids["b85"], ids["c80"]]  # cheapest first
    assert by_run[ids["a80"]]["pareto_optimal"] and by_run[ids["b85"]]["pareto_optimal"]
    assert not by_run[ids["c80"]]["pareto_optimal"]  # costlier and worse than b85
    assert 0 < by_run[ids["a80"]]["cost_per_task"] < by_run[ids["b85"]]["cost_per_task"]


async def _cli(stack: Stack, *args: str) -> str:
    """Run the real CLI in a subprocess against the stack (asyncio: the stack's API serves from this loop)."""
    import os
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchwright.cli", *args, "--api-url", stack.api_url, "--api-key", stack.api_key,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_cli_show_compare_rank_frontier(stack: Stack, runs: Runs) -> None:
    ids = runs.ids
    shown = await _cli(stack, "show", ids["a80"])
    assert "95 % CI [" in shown and "(Wilson)" in shown and "on 2000 scored tasks" in shown
    verdict = await _cli(stack, "compare", ids["a80"], ids["b85"])
    assert verdict.startswith("B is better than A by ") and "tasks flipped to pass, 0 to fail" in verdict
    ranked = await _cli(stack, "compare", ids["a80"], ids["c80"], ids["b85"])
    assert ranked.index(ids["b85"]) < ranked.index(ids["a80"])
    table = await _cli(stack, "frontier", ids["a80"], ids["b85"], ids["c80"])
    starred = [line for line in table.splitlines() if line.strip().startswith("│ *")]
    assert len(starred) == 2 and not any(ids["c80"] in line for line in starred)
