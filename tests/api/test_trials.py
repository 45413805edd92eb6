"""Trials end to end: k results per task, one aggregated row, the frozen trials_config, pass@k, drill-down."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")

# A scorer whose trials differ: trial outcomes come from the model (accuracy 0.5 is fixed per question), so this
# impl alternates its verdict by a per-call counter to give each task mixed trials, and reports the parsed answer
# in score_meta for majority_on.
MIXED_IMPL = '''
import itertools
_calls = itertools.count()

class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut(self.extract(row))

    def score(self, row, response):
        n = next(_calls)
        return {"score": 1.0 if (n % 3 == 0) else 0.0, "answer": response.strip(), "weight": 1 + n % 2}
'''


async def test_k3_records_three_trials_per_task_and_one_aggregate(stack: Stack) -> None:
    trials = {"plan": {"k": 3}, "aggregator": {"name": "mean"}}
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "trials": trials})
        assert run["trials_config"] == {"plan": {"k": 3}, "aggregator": {"name": "mean", "field": None,
                                                                          "weight": None, "threshold": None}}
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        detail = (await http.get(f"/v1/runs/{run['id']}/tasks/7")).json()
        missing = await http.get(f"/v1/runs/{run['id']}/tasks/60")

    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    aggregated = [e["data"] for e in events if e["type"] == "MaterializeTaskAggregated"]
    assert Counter(r["index"] for r in results) == {i: 3 for i in range(60)}
    assert {(r["index"], r["trial"]) for r in results} == {(i, t) for i in range(60) for t in range(3)}
    assert all(r["invocation"] == 1 for r in results)
    assert sorted(a["index"] for a in aggregated) == list(range(60))
    assert all(a["trial_scores"] == [1.0, 1.0, 1.0] and a["outcome"] == "pass" for a in aggregated)
    assert final["trials_config"]["plan"]["k"] == 3
    assert final["tasks"]["summary"]["pass_at_k"] == {"pass@1": 1.0, "pass@3": 1.0}
    assert [t["trial"] for t in detail["trials"]] == [0, 1, 2]
    assert all(t["output"] and t["outcome"] == "pass" for t in detail["trials"])
    assert missing.status_code == 404


@pytest.mark.parametrize("aggregator, outcome", [
    ({"name": "any_pass"}, "pass"),
    ({"name": "all_pass"}, "fail"),
    ({"name": "majority_on", "field": "answer"}, None),
    ({"name": "weighted_mean", "weight": "weight"}, "fail"),
    ({"name": "min_above", "field": "weight", "threshold": 1}, None),
])
async def test_aggregators_reduce_mixed_trials_server_side(stack: Stack, aggregator: dict, outcome: str | None) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "task_impl": MIXED_IMPL, "trials": {"plan": {"k": 3}, "aggregator": aggregator}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok"
    narration = [e["data"]["text"] for e in events if e["type"] == "AgentTextEvent" and e["data"]["phase"] == "atomize"]
    assert narration == ["Using the task_impl.py supplied at launch, verbatim."]
    by_index: dict[int, list[dict]] = {}
    for e in events:
        if e["type"] == "MaterializeTaskResult":
            by_index.setdefault(e["data"]["index"], []).append(e["data"])
    from benchwright.scoring.aggregators import AggregatorConfig, TrialOutcome, aggregate

    for e in events:
        if e["type"] != "MaterializeTaskAggregated":
            continue
        trials = sorted(by_index[e["data"]["index"]], key=lambda t: t["trial"])
        expected = aggregate(AggregatorConfig(**aggregator),
                             [TrialOutcome(trial=t["trial"], score=t["score"], meta=t["meta"]) for t in trials])
        assert (e["data"]["score"], e["data"]["outcome"]) == (expected.score, expected.outcome)
    # pass@k comes from each task row's counts (migration 0018): the trials' own outcomes must give the same.
    from benchwright.scoring.aggregators import pass_at_k

    counts = [(sum(t["outcome"] != "err" for t in trials), sum(t["outcome"] == "pass" for t in trials))
              for trials in by_index.values()]
    for size in (1, 3):
        values = [pass_at_k(n, c, size) for n, c in counts if n >= size]
        assert final["tasks"]["summary"]["pass_at_k"][f"pass@{size}"] == pytest.approx(sum(values) / len(values))
    outcomes = Counter(e["data"]["outcome"] for e in events if e["type"] == "MaterializeTaskAggregated")
    if outcome is not None:
        # the per-call counter makes ~1/3 of trials pass, so every row has mixed trials only in aggregate
        assert outcomes[outcome] > 0


async def test_scorer_failures_are_err_rows_not_a_failed_run(stack: Stack, dev_models: DevModels) -> None:
    impl = '''
class Scorer:
    def extract(self, row):
        return row["question"]
    def solve(self, row, call_sut):
        if row["id"].endswith("3"):
            raise RuntimeError("scorer bug on purpose")
        return call_sut(self.extract(row))
    def score(self, row, response):
        if row["id"].endswith("5"):
            return float("nan")
        return 1.0 if response.strip() == row["answer"] else 0.0
'''
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "task_impl": impl})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks")).json()["tasks"]
        detail = (await http.get(f"/v1/runs/{run['id']}/tasks/3")).json()
    s = final["tasks"]["summary"]
    assert final["status"] == "ok" and s["errored"] == 12 and s["passed"] == 48 and s["pass_rate"] == 1.0
    assert {t["index"] for t in tasks if t["outcome"] == "err"} == {i for i in range(60) if i % 10 in (3, 5)}
    assert "scorer bug on purpose" in detail["trials"][0]["error"]
    assert "Traceback" in detail["trials"][0]["meta"]["trace"]


async def test_unloadable_task_impl_fails_atomize_with_a_clear_error(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url},
                                  "task_impl": "class Scorer:\n    def extract(self, row): return 1\n"})
        events = await wait_terminal(http, run["id"])
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert failed and failed[0]["phase"] == "atomize" and failed[0]["error_type"] == "ScorerInvalid"
    assert "Scorer has no method solve" in failed[0]["detail"]


async def test_sut_failure_for_good_is_err(stack: Stack, dev_models: DevModels) -> None:
    # Live at Attach (the provider lists the model), then every completion answers 500 through its retries: each
    # task is err. (A dead endpoint fails Attach instead, and a refused key halts the run:
    # tests/api/test_sut_faults.py.)
    from benchwright.testkit.devmodel import DevModelConfig, Fault, load_answers

    url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl"),
                                                faults=(Fault(500, first=0),)))
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": url}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        detail = (await http.get(f"/v1/runs/{run['id']}/tasks/0")).json()
    assert final["status"] == "ok" and final["tasks"]["summary"]["errored"] == 60
    assert final["tasks"]["summary"]["pass_rate"] is None
    assert "answered HTTP 500" in detail["trials"][0]["error"]
