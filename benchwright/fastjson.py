"""JSON text for the hot paths, by orjson where it gives what ``json.dumps`` would mean (issue 25).

A Materialize trial encodes JSON several times: the model request's body (in the worker, and again in the credential
proxy), its events' and projection rows' JSON columns in the store, and the worker's lines to the scorer runtime (a
task, a model reply). ``json.dumps`` took ~7 % of the worker's time there in a 10,000-task run; orjson does the same
work in a fifth of the time. (A scorer-pipe line whose row holds a NaN is written by ``json``, as before: the scorer
gets the NaN as it was.)

The text differs in form, and in meaning only for a NaN in the store (below): no spaces after separators, characters
beyond ASCII written as UTF-8 instead of ``\\u`` escapes. What orjson refuses, ``json`` is asked instead, so the
result (or the error) is the one ``json.dumps`` gives: integers wider than 64 bits, keys that are not strings, a
string with a lone surrogate, and any type orjson would otherwise write its own way (dataclasses, datetimes, a
``float`` or other subclass: passed through to the fallback). Nothing else ``json`` writes is written differently;
two things it refuses orjson writes (an ``Enum`` that is neither a ``str`` nor an ``int``, as its value; a ``UUID``,
as its string), which never reach these paths: they carry what ``model_dump(mode="json")`` and JSON decoding give.

In the store's columns one difference remains by choice: a NaN or an infinity is written as ``null``, however the
value is written (JSON has neither; ``json`` writes a bare ``NaN``, which Postgres refuses, so such an event failed
there and was kept as NaN on SQLite; both stores now keep ``null``). The values on the hot path are checked finite
before (``normalize_score``, a scorer's meta by ``to_jsonable_python(inf_nan_mode="null")``). A request body keeps a
NaN as ``json`` writes it (``dumps_bytes``): a request asked with one is not sent as another.

Reading (``loads``) is the same bargain the other way: orjson reads the text where it gives the value ``json.loads``
gives, and ``json`` reads the rest, so a value (or an error) never differs. A trial reads JSON six times (the scorer
runtime's three messages and the model's reply in the worker, the request and the reply in the credential proxy),
~2-3 µs each by ``json``, a quarter of that by orjson."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import orjson

_PASS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError  # anything orjson does not write natively goes to ``json`` as it is


def dumps(value: Any) -> str:
    """``json.dumps(value)``'s meaning as compact UTF-8 text, a NaN or an infinity as ``null`` (the store's JSON
    columns)."""
    try:
        return orjson.dumps(value, default=_refuse, option=_PASS).decode()
    except TypeError:
        return json.dumps(_finite(value))


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity as None, as orjson writes them (containers copied, the rest as is)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps_bytes(value: Any, fallback: Callable[[Any], str] = json.dumps) -> bytes:
    """``json.dumps(value).encode()``'s meaning, as UTF-8 bytes (a model request's body, a line to the scorer
    runtime). Here even a NaN or an infinity is written as ``json`` writes it (a bare ``NaN``, which the endpoint
    refuses), not as ``null``: a request asked with a NaN is not sent as another request. ``fallback`` writes what
    orjson does not (``json.dumps`` with the caller's options: the scorer pipe's writes a value of another type as
    its ``str``)."""
    try:
        out = orjson.dumps(value, default=_refuse, option=_PASS)
    except TypeError:
        return fallback(value).encode()
    if b"null" in out and _non_finite(value):
        return fallback(value).encode()
    return out


_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
"""A ``bytes.translate`` table: each digit to ``0``, anything else to a space."""
_WIDE = b"0" * 19
"""Nineteen digits in a row: an integer this long may not fit in 64 bits (eighteen always do)."""
_OPENINGS = 512
"""Text with fewer opening brackets nests less deep than ``json`` can read from any of its callers."""


def loads(data: bytes, fallback: Callable[[bytes], Any] = json.loads) -> Any:
    """``json.loads(data)``: the same value, or the same error, read by orjson where it reads the same.

    ``fallback`` (``json.loads``, or the caller's way of reading the text by ``json``) reads instead what orjson
    refuses (a NaN or an infinity, a lone surrogate, bytes that are not UTF-8, and every error, so that the error
    raised is ``json``'s), text with nineteen digits in a row anywhere (orjson reads an integer wider than 64 bits
    as a float, silently, where ``json`` keeps it exact) and text with ``_OPENINGS`` brackets or more (orjson reads
    nesting up to 1,024 deep, where ``json`` stops at the interpreter's recursion limit, 1,000 frames with the
    caller's). (Checked against ``json`` in ``tests/domain/test_fastjson.py``: floats read alike, duplicate keys keep
    the last, raw control characters in a string refused by both.)"""
    if ((len(data) < _OPENINGS or data.count(b"[") + data.count(b"{") < _OPENINGS)
            and _WIDE not in data.translate(_DIGITS)):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return fallback(data)


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    return False
