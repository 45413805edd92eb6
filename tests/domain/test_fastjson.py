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


# -- reading: ``loads`` gives what ``json.loads`` gives, value or error --------------------------------------------

READ_SAME = [
    # a scorer runtime's messages and a model's reply, as they come
    b'{"op": "start", "id": 12}',
    '{"op": "call", "call": 3, "task": 12, "messages": [{"role": "user", "content": "Réponse : **B** — 日本語 🧪"}],'
    ' "params": {"temperature": 0.0, "max_tokens": 512}}'.encode(),
    b'{"op": "result", "id": 12, "ok": true, "score": {"score": 1.0, "extracted": "\\\\boxed{4}"}, "output": '
    b'"<think>\\nLet me see... $\\\\frac{1}{2}$\\n</think>\\nThe answer is 4."}',
    b'{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"4"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":40,"completion_tokens":12,"total_tokens":52}}',
    # numbers at the edges: 64 bits and beyond (orjson reads the wider ones as floats: json must read them)
    b'[18446744073709551615, -9223372036854775808, 9223372036854775807, 999999999999999999]',
    b'[18446744073709551616, -9223372036854775809, 123456789012345678901234567890, -99999999999999999999]',
    b'{"score": 1234567890123456789.5, "long": 0.1000000000000000055511151231257827, "e": 1e-400}',
    b'[-0, -0.0, 0.1, 5e-324, 1.7976931348623157e308, 1E5, 1e+5, 2.5e-3]',
    # what orjson refuses and json reads
    b'[NaN, Infinity, -Infinity, 1e400]',
    b'"\\ud800 lone surrogate"',
    b'\xff\xfe[\x001\x00]\x00',  # UTF-16 with a BOM: json sniffs it
    # read alike by both
    b'{"a": 1, "b": 2, "a": 3}',
    b' \t\n[true, false, null, "\\u0000", "\\/", {"\\ud83d\\ude00": 1}]\r\n',
]


@pytest.mark.parametrize("text", READ_SAME, ids=range(len(READ_SAME)))
def test_reading_gives_what_json_loads_gives(text: bytes) -> None:
    expected = json.loads(text)
    got = fastjson.loads(text)
    assert _typed(got) == _typed(expected)


def _typed(value: Any) -> Any:
    """``value`` with each number's type beside it and a NaN made comparable: an int read as a float differs."""
    if isinstance(value, dict):
        return [(k, _typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value.hex())
    return (type(value).__name__, value)


@pytest.mark.parametrize("text", [b"", b"[1,]", b'{"a": 1} x', b'"a\tb"', b"[01]", b"[.5]", b"\xff\xff",
                                  b'"\\x41"', b"{'a': 1}"])
def test_reading_refuses_what_json_loads_refuses_with_its_error(text: bytes) -> None:
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    with pytest.raises(ValueError) as ours:
        fastjson.loads(text)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_nesting_past_the_openings_bound_is_read_by_json() -> None:
    text = b"[" * 520 + b"]" * 520
    asked: list[bytes] = []
    assert fastjson.loads(text, lambda t: asked.append(t) or json.loads(t)) == json.loads(text)
    assert asked == [text]


def test_nesting_json_cannot_read_is_refused_as_json_refuses_it() -> None:
    """orjson reads 1,010 levels; ``json`` stops at the recursion limit, and so does ``loads``."""
    text = b"[" * 1010 + b"]" * 1010
    with pytest.raises(RecursionError):
        json.loads(text)
    with pytest.raises(RecursionError):
        fastjson.loads(text)


def test_reading_many_random_numbers_gives_json_s_floats_and_ints() -> None:
    """orjson's own number parser against ``json``'s on 20,000 random numbers of every shape (correctly rounded
    both: read bit for bit the same)."""
    import random
    import struct

    rng = random.Random(25)
    texts = []
    for i in range(20_000):
        kind = i % 4
        if kind == 0:
            x = struct.unpack("d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            texts.append(repr(x) if math.isfinite(x) else "0")
        elif kind == 1:
            digits = rng.randint(0, 17)
            texts.append(f"{rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 300):.{digits}e}")
        elif kind == 2:
            texts.append(f"{rng.randint(-10**18, 10**18)}.{rng.randint(0, 10**rng.randint(1, 17))}")
        else:
            texts.append(f"{rng.randint(-10**25, 10**25)}")
    text = ("[" + ",".join(texts) + "]").encode()
    assert _typed(fastjson.loads(text)) == _typed(json.loads(text))
    for one in texts[:2000]:
        assert _typed(fastjson.loads(one.encode())) == _typed(json.loads(one))


def test_what_orjson_reads_is_read_by_orjson_and_the_rest_by_the_fallback() -> None:
    """The fallback is asked only for what orjson cannot read the same (so the hot path is orjson's)."""
    asked: list[bytes] = []

    def fallback(text: bytes) -> Any:
        asked.append(text)
        return json.loads(text)

    assert fastjson.loads(b'{"op": "start", "id": 12}', fallback) == {"op": "start", "id": 12}
    assert fastjson.loads(b'{"n": 123456789012345678}', fallback) == {"n": 123456789012345678}
    assert asked == []
    assert fastjson.loads(b'{"n": 1234567890123456789}', fallback) == {"n": 1234567890123456789}
    assert fastjson.loads(b"[NaN]", fallback)[0] != 0
    assert asked == [b'{"n": 1234567890123456789}', b"[NaN]"]
