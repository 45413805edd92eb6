"""Plain-function domain logic: launch resolution, the plan, display_status, datasets, the scorer template."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchwright.data.dataset_access import DatasetAccess, LocalPathRules
from benchwright.data.datasets import analyze_dataset, detect_format, fetch_dataset, iter_rows, read_task_rows
from benchwright.errors import DatasetError, InvalidInput
from benchwright.runs.launch import resolve_launch, resolve_trials
from benchwright.runs.pipeline import QUICK_PHASES, batch_bounds, local_attempt, plan_batches, plan_phases
from benchwright.runs.status import display_status
from benchwright.schemas import PHASES, LaunchRequest
from benchwright.scoring.aggregators import TrialsConfig

LOCAL = LocalPathRules(deployment=True, account=True)
LOCAL_ACCESS = DatasetAccess(local=LOCAL)


def _launch(**kw: object) -> LaunchRequest:
    return LaunchRequest.model_validate({"dataset": "https://example.invalid/d.jsonl", "model": "openai/x", **kw})


def test_plan_skips_find_for_a_dataset_launch_and_runs_the_rest_in_order() -> None:
    plan = plan_phases(_launch())
    assert [p.phase for p in plan] == list(PHASES)
    assert {p.phase: p.skip_reason for p in plan if p.skip_reason} == {"find": "dataset given at launch"}


Q = set(QUICK_PHASES)


@pytest.mark.parametrize(("change", "driver", "backend", "whole", "cached_only"), [
    ({}, "builtin", "local", Q, set()),
    ({"dataset": "https://example.invalid/d.jsonl"}, "builtin", "local", Q - {"fetch"}, {"fetch"}),
    ({"task_impl": "class Scorer: ..."}, "builtin", "local", Q - {"atomize"}, set()),
    ({}, "openai://gpt-x", "local", set(), set()),  # an LLM driver's calls take seconds
    ({}, "builtin", "e2b", set(), set()),  # remote sandboxes
    ({}, "builtin", None, set(), set()),  # a RunInput from before the backend was carried
    ({"requirements": ["numpy"]}, "builtin", "local", Q - {"setup"}, {"setup"}),
    ({"requirements": ["numpy"], "dataset": "https://example.invalid/d.jsonl"}, "builtin", "local",
     Q - {"fetch", "setup"}, {"fetch", "setup"}),
    ({"dataset": None, "benchmark": "gsm8k"}, "builtin", "local", Q - {"fetch"}, set()),  # Find's source
    ({"dataset": None, "harness": "lmeval", "harness_config": {"tasks": ["x"]}}, "builtin", "local", set(), set()),
    ({"dataset": None, "recipe": "terminal-basics"}, "builtin", "local", set(), set()),
])
def test_which_phases_are_tried_in_the_workflow_task_and_behind_which_patch(
        change: dict[str, object], driver: str, backend: str | None, whole: set[str], cached_only: set[str]) -> None:
    launch = LaunchRequest.model_construct(**{**_launch(dataset="/data/d.jsonl").__dict__, **change})
    attempts = {p: a for p in PHASES if (a := local_attempt(p, launch, driver, backend)) is not None}
    assert {p for p, a in attempts.items() if not a.cached_only} == whole
    assert {p for p, a in attempts.items() if a.cached_only} == cached_only
    # A plain run's phases came with quick-phases-local; every attempt added since is behind cached-phases-local
    newer = {p for p, a in attempts.items() if a.since_cached_phases}
    assert newer == (set(attempts) if change.get("requirements") else cached_only)


def test_trials_precedence_launch_then_subset_default_then_k1_any_pass() -> None:
    launch = TrialsConfig.model_validate({"plan": {"k": 3}, "aggregator": {"name": "mean"}})
    subset = TrialsConfig.model_validate({"plan": {"k": 5}, "aggregator": {"name": "majority_on", "field": "a"}})
    assert resolve_trials(launch, subset) == launch
    assert resolve_trials(None, subset) == subset
    fallback = resolve_trials(None, None)
    assert (fallback.plan.k, fallback.aggregator.name) == (1, "any_pass")
    broken_default = TrialsConfig.model_validate({"plan": {"k": 2}, "aggregator": {"name": "weighted_mean"}})
    with pytest.raises(InvalidInput, match="weight"):
        resolve_trials(None, broken_default)  # whichever config wins is validated
    assert resolve_launch(_launch(), default_driver="builtin", local_paths=LocalPathRules(),
                          subset_default_trials=subset).trials == subset


def test_resolve_launch_defaults_and_refusals() -> None:
    resolved = resolve_launch(_launch(), default_driver="builtin", local_paths=LocalPathRules())
    assert resolved.driver == "builtin" and resolved.trials.plan.k == 1
    assert resolved.trials.aggregator.name == "any_pass"
    with pytest.raises(InvalidInput, match="did you mean 'builtin'"):
        resolve_launch(_launch(driver="builtn"), default_driver="builtin", local_paths=LOCAL)
    with pytest.raises(InvalidInput) as err:
        resolve_launch(_launch(dataset="/etc/passwd"), default_driver="builtin", local_paths=LocalPathRules())
    assert err.value.code == "local_paths_disabled"
    assert resolve_launch(_launch(dataset="/tmp/x.jsonl"), default_driver="builtin", local_paths=LOCAL)


def test_model_string_and_object_are_one_schema_and_retired_keys_are_refused() -> None:
    assert _launch().model.identifier == "openai/x"
    assert _launch(model={"identifier": "openai/x", "api_base": "http://h/v1"}).model.api_base == "http://h/v1"
    with pytest.raises(ValueError, match="retired launch key; use 'driver'"):
        _launch(agent="x")
    with pytest.raises(ValueError, match="api_base must be an http"):
        _launch(model={"identifier": "openai/x", "api_base": "file:///etc"})


STATUS_TABLE = [
    ("running", False, None, "running"), ("ok", False, None, "ok"), ("error", False, None, "error"),
    ("running", True, "operator_pause", "paused"), ("running", True, "agent_review: unsure", "waiting"),
    ("running", True, "restart_cap_exceeded: atomize", "waiting"), ("running", True, "operator_kill", "killed"),
    ("ok", True, "operator_kill: too slow", "killed"), ("error", True, "admin: abuse", "killed"),
    ("running", True, "limit_exceeded:run.cost", "halted"), ("running", True, "balance_exhausted", "halted"),
    ("error", True, "something new", "halted"),
]


@pytest.mark.parametrize("status, halted, reason, shown", STATUS_TABLE)
def test_display_status_folding(status: str, halted: bool, reason: str | None, shown: str) -> None:
    assert display_status(status=status, halted=halted, halt_reason=reason) == shown


def test_batch_bounds_cover_every_index_once() -> None:
    bounds = batch_bounds(1001, 250)
    assert bounds[0] == (0, 250) and bounds[-1] == (1000, 1001)
    assert [i for a, b in bounds for i in range(a, b)] == list(range(1001))
    assert batch_bounds(0, 250) == []


@pytest.mark.parametrize("total, batch_tasks, parallel, sizes, in_flight", [
    (1, 1000, 4, [1], 1),
    (1000, 1000, 4, [1000], 1),  # one batch with the whole concurrency, not four with a quarter each
    (1001, 1000, 4, [501, 500], 2),
    (3000, 1000, 4, [1000, 1000, 1000], 3),
    (5000, 1000, 4, [625] * 8, 4),  # 5 batches rounded up to 8: two full rounds of 4, no half-empty last one
    (10_000, 1000, 4, [834] * 4 + [833] * 8, 4),
    (10_000, 2500, 4, [2500] * 4, 4),  # the default: one full round
    (7, 2, 1, [2, 2, 2, 1], 1),
    (0, 1000, 4, [], 1),
])
def test_plan_batches_covers_every_task_once_in_even_full_rounds(total: int, batch_tasks: int, parallel: int,
                                                                 sizes: list[int], in_flight: int) -> None:
    bounds, running = plan_batches(total, batch_tasks, parallel)
    assert [b - a for a, b in bounds] == sizes
    assert running == in_flight
    assert [i for a, b in bounds for i in range(a, b)] == list(range(total))
    assert all(b - a <= batch_tasks for a, b in bounds)
    assert len(bounds) <= parallel or len(bounds) % parallel == 0


@pytest.mark.parametrize("name, text, fmt", [
    ("d.jsonl", '{"question": "q", "answer": "a"}\n\n{"question": "q2", "answer": "b"}\n', "jsonl"),
    ("d.json", '[{"input": "q", "target": "a"}, {"input": "q2", "target": "b"}]', "json"),
    ("d.csv", "prompt,completion\nq,a\nq2,b\n", "csv"),
    ("d.data", '  [{"problem": "q", "solution": "a"}, {"problem": "q2", "solution": "b"}]', "json"),
])
def test_formats_are_detected_and_normalized(tmp_path: Path, name: str, text: str, fmt: str) -> None:
    src = tmp_path / name
    src.write_text(text)
    assert detect_format(src) == fmt
    out = tmp_path / "tasks.jsonl"
    analysis = analyze_dataset(source=src, fmt=fmt, tasks_path=out)
    assert analysis.rows == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r[analysis.columns[0]] for r in rows] == ["q", "q2"]


def test_the_normalized_tasks_are_each_row_as_json_dumps_writes_it(tmp_path: Path) -> None:
    """tasks.jsonl's bytes feed fingerprints and caches: each row as ``json.dumps(row, ensure_ascii=False,
    default=str)`` writes it, whatever the source's escapes; columns in first-seen order; a split counted from the
    first column named split in any case, when its value is a string."""
    rows = [{"Split": "test", "q": "é ✓", "n": 1.5, "x": None}, {"SPLIT": 3, "q": [1, {"a": "b"}]},
            {"split": "train", "Split": "x"}, {"q": "\u2028 line sep"}, {"q": float("inf")}]
    src = tmp_path / "odd.jsonl"
    src.write_text("\n".join(json.dumps(r, ensure_ascii=bool(i % 2)) for i, r in enumerate(rows)) + "\n\n  \n")
    out = tmp_path / "tasks.jsonl"
    analysis = analyze_dataset(source=src, fmt="jsonl", tasks_path=out)
    assert out.read_text(encoding="utf-8") == "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n"
                                                      for r in rows)
    assert (analysis.rows, analysis.columns) == (5, ["Split", "q", "n", "x", "SPLIT", "split"])
    assert analysis.splits == {"test": 1, "train": 1}  # {"SPLIT": 3} is no split; "train" is its row's first


def test_a_jsonl_dataset_reads_as_json_reads_it(tmp_path: Path) -> None:
    """Rows are read by orjson where it reads what ``json`` reads (``benchwright.fastjson``): an integer wider than 64
    bits, a NaN and an infinity keep ``json``'s values, a line of Unicode whitespace is skipped, and so are the task
    rows read back; a line that is not UTF-8, a BOM and a lone surrogate fail as before, naming the line."""
    src = tmp_path / "d.jsonl"
    src.write_bytes(b'{"q": "a", "n": 123456789012345678901234567890, "x": NaN, "y": -Infinity}\n'
                    + "\u00a0\u2003\n".encode() + b'{"q": "\xc3\xa9", "n": -9223372036854775809}\n')
    rows = list(iter_rows(src, "jsonl"))
    assert [r["n"] for r in rows] == [123456789012345678901234567890, -9223372036854775809]
    assert all(type(r["n"]) is int for r in rows) and math.isnan(rows[0]["x"]) and rows[0]["y"] == -math.inf
    assert rows[1]["q"] == "é"
    out = tmp_path / "tasks.jsonl"
    analyze_dataset(source=src, fmt="jsonl", tasks_path=out)
    back = read_task_rows(out, 0, 2)
    assert [r["n"] for r in back] == [r["n"] for r in rows] and math.isnan(back[0]["x"])
    for raw, message in ((b'{"q": "a"}\n{"q": "\xff"}\n', "line 2 is not UTF-8"),
                         (b'\xef\xbb\xbf{"q": "a"}\n', "line 1 is not valid JSON"),
                         (b'{"q": "a"}\n{"q": "\\ud800"}\n', "row 2 holds text that is not valid Unicode")):
        src.write_bytes(raw)
        with pytest.raises(DatasetError, match=message):
            analyze_dataset(source=src, fmt="jsonl", tasks_path=out)


def test_dataset_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{oops\n')
    with pytest.raises(DatasetError, match="line 2 is not valid JSON"):
        list(iter_rows(bad, "jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match="no rows"):
        analyze_dataset(source=empty, fmt="jsonl", tasks_path=tmp_path / "t.jsonl")
    with pytest.raises(DatasetError, match="no dataset file"):
        fetch_dataset(source=str(tmp_path / "nope.jsonl"), dest_dir=tmp_path / "w", access=LOCAL_ACCESS)


def test_fetch_hashes_what_it_copies(tmp_path: Path) -> None:
    import hashlib

    src = tmp_path / "d.jsonl"
    src.write_text('{"question": "q", "answer": "a"}\n')
    fetched = fetch_dataset(source=str(src), dest_dir=tmp_path / "work", access=LOCAL_ACCESS)
    assert fetched.sha256 == hashlib.sha256(src.read_bytes()).hexdigest() and fetched.bytes == src.stat().st_size

