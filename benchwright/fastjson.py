"""JSON text for the hot paths, by orjson where it gives what ``json.dumps`` would mean (issue 25).

A Materialize trial encodes JSON several times: the model request's body (in the worker, and again in the credential
proxy), and its events' and projection rows' JSON columns in the store. ``json.dumps`` took ~7 % of the worker's time
there in a 10,000-task run; orjson does the same work in a fifth of the time. (The scorer pipe's lines stay
``json``'s: a dataset row may hold a NaN, which a scorer must get as it was.)

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
NaN as ``json`` writes it (``dumps_bytes``): a request asked with one is not sent as another."""

from __future__ import annotations

import json
import math
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


def dumps_bytes(value: Any) -> bytes:
    """``json.dumps(value).encode()``'s meaning, as UTF-8 bytes (a model request's body). Here even a NaN or an
    infinity is written as ``json`` writes it (a bare ``NaN``, which the endpoint refuses), not as ``null``: a
    request asked with a NaN is not sent as another request."""
    try:
        out = orjson.dumps(value, default=_refuse, option=_PASS)
    except TypeError:
        return json.dumps(value).encode()
    if b"null" in out and _non_finite(value):
        return json.dumps(value).encode()
    return out


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    return False
