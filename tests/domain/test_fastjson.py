"""``benchwright.fastjson``: orjson's text where it means what ``json.dumps`` means, ``json``'s result (or error)
where orjson would refuse or write a value its own way."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
from typing import Any

import pytest

from benchwright import fastjson


class Letter(enum.StrEnum):
    A = "A"


class Rank(enum.IntEnum):
    FIRST = 1


class Ratio(float):
    pass


@dataclasses.dataclass
class Point:
    x: int


SAME = [
    {"op": "task", "id": 7, "row": {"input": "What is 2+2?", "reference": "4", "choices": ["3", "4"]}},
    {"text": "Réponse : **B** — naïve café, 日本語, emoji 🧪, \u2028 line separator, tab\t, quote \" and \\"},
    {"think": "<think>\nLet me see... $\\frac{1}{2}$\n</think>\nThe answer is \\boxed{4}."},
    {"score": 1.0, "half": 0.5, "tiny": 5e-324, "neg": -0.0, "big": 1.7976931348623157e308, "none": None},
    {"ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1], "flags": [True, False]},
    {"nested": [[[{"deep": [1, {"er": []}]}]]], "empty": {}, "tuple": (1, 2)},
    {"enum": Letter.A, "rank": Rank.FIRST},
    {"wide": 2**64, "wider": -(2**70)},  # beyond 64 bits: orjson refuses, json writes them
    {3: "int key", 2.5: "float key", True: "bool key", None: "null key"},  # json makes these strings
    {"surrogate": "\ud800 lone"},  # not UTF-8: orjson refuses, json escapes it
    {"ratio": Ratio(0.25)},
]


@pytest.mark.parametrize("value", SAME, ids=range(len(SAME)))
def test_the_text_means_what_json_dumps_means(value: Any) -> None:
    expected = json.loads(json.dumps(value))
    assert json.loads(fastjson.dumps(value)) == expected
    assert json.loads(fastjson.dumps_bytes(value)) == expected


def test_the_hot_path_text_is_orjson_s_compact_utf8() -> None:
    value = {"a": [1, 2], "b": "café"}
    assert fastjson.dumps(value) == '{"a":[1,2],"b":"café"}'
    assert fastjson.dumps_bytes(value) == '{"a":[1,2],"b":"café"}'.encode()


def test_a_value_json_refuses_is_refused_as_json_refuses_it() -> None:
    for value in ({"when": dt.datetime(2026, 12, 5, tzinfo=dt.UTC)}, {"p": Point(1)}, {"s": {1, 2}}, object()):
        with pytest.raises(TypeError) as theirs:
            json.dumps(value)
        with pytest.raises(TypeError) as ours:
            fastjson.dumps(value)
        assert str(ours.value) == str(theirs.value)
        with pytest.raises(TypeError):
            fastjson.dumps_bytes(value)


def test_a_store_column_writes_nan_and_infinity_as_null() -> None:
    """The one difference, by choice: JSON has no NaN (``json`` writes a bare ``NaN`` that Postgres refuses)."""
    assert json.loads(fastjson.dumps({"x": math.nan, "y": math.inf, "z": -math.inf})) == {"x": None, "y": None,
                                                                                          "z": None}
    # the same when json writes the value (an int wider than 64 bits beside it): a NaN is never stored as NaN
    assert json.loads(fastjson.dumps({"wide": 2**70, "x": [math.nan, (1.5, -math.inf)]})) == {
        "wide": 2**70, "x": [None, [1.5, None]]}


def test_a_request_body_keeps_a_nan_as_json_writes_it() -> None:
    """A model request asked with a NaN goes out as ``json.dumps`` writes it, not as another request with ``null``;
    a ``null`` that was asked for stays one."""
    for value in ({"temperature": math.nan, "stop": None}, {"messages": [{"x": [1.0, -math.inf]}]}):
        assert fastjson.dumps_bytes(value) == json.dumps(value).encode()
    assert fastjson.dumps_bytes({"stop": None, "t": 0.5}) == b'{"stop":null,"t":0.5}'
