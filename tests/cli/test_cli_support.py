"""The run flags' folding into JSON and the progress bar's tasks/s and ETA (plain functions, no stack)."""

from __future__ import annotations

import pytest

from benchwright.cli.support import BadFlag, Throughput, flat, nested, trials_block


def test_limits_nest_and_parse_numbers() -> None:
    assert nested("--limit", ["run.cost=5", "attempt.duration=0.5", "phase:fetch.duration=1e3", "run.x=inf"]) == {
        "run": {"cost": 5, "x": "inf"}, "attempt": {"duration": 0.5}, "phase:fetch": {"duration": 1000.0}}
    with pytest.raises(BadFlag, match="run is already set to a value"):
        nested("--limit", ["run=5", "run.cost=3"])


def test_metadata_is_text_unless_typed_and_aggregator_params_keep_key_names_as_text() -> None:
    assert flat("--metadata", ["sha=0123", "shots:=5", "tags:=[1, 2]", "q=a=b"], numbers=False) == {
        "sha": "0123", "shots": 5, "tags": [1, 2], "q": "a=b"}
    with pytest.raises(BadFlag, match="not JSON"):
        flat("--metadata", ["x:={"], numbers=False)
    assert trials_block(k=None, aggregator="min_above", params=["field=7", "threshold=0.8"]) == {
        "aggregator": {"name": "min_above", "field": "7", "threshold": 0.8}}
    assert trials_block(k=None, aggregator=None, params=[]) is None
    assert trials_block(k=4, aggregator=None, params=[]) == {"plan": {"k": 4}}


def test_throughput_uses_a_sliding_window_and_restarts_with_a_new_invocation() -> None:
    meter = Throughput(window_s=10)
    assert meter.rate() is None and meter.eta_s(100) is None
    for second in range(31):  # 2 tasks/s for 20 s, then 10 tasks/s
        meter.add(float(second), 2 * second if second <= 20 else 40 + 10 * (second - 20))
    assert meter.rate() == pytest.approx(10.0)
    assert meter.eta_s(50) == pytest.approx(5.0) and meter.eta_s(0) == 0.0
    meter.add(31.0, 3)  # a re-run of Materialize counts from zero
    assert meter.rate() is None
