"""Input bounds (issue 23): every number a request body carries is finite and bounded, and a JSON value is no larger
than its field allows. ``benchwright.schemas`` applies them to request bodies, ``benchwright.runs.limits`` to limits."""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

_J = TypeVar("_J")


def check_json_size(value: _J, *, limit: int, what: str) -> _J:
    """Refuse a JSON value larger than ``limit`` bytes serialized (a ValueError names the field and the limit)."""
    size = len(json.dumps(value, separators=(",", ":"), default=str))
    if size > limit:
        raise ValueError(f"{what} is {size} bytes serialized; at most {limit} are accepted")
    return value


MAX_JSON_NUMBER = float(2**53)
"""Largest magnitude of any number in a request body that no narrower range covers (``metadata``, ``model.params``,
``harness_config``, trials parameters...): exactly representable as a double, and far from every integer column."""
MAX_DURATION_S = 366 * 24 * 3600.0
"""Longest duration a launch may ask for (a limit in seconds): a year, far inside ``timedelta``'s range (~8.6e13 s,
past which the workflow could not build its timer) and Go's (~292 years, Temporal's own durations)."""
NUMBER_RANGES: dict[str, tuple[float, float, bool, str]] = {
    # quantity: (low, high, low is exclusive, unit)
    "cost": (0.0, 1_000_000.0, True, "USD"),
    "duration": (0.0, MAX_DURATION_S, True, "seconds"),
    "attempts": (1, 100, False, "whole number"),
    "driver_steps": (1, 100_000, False, "whole number"),
    "driver_tokens": (1, 10**10, False, "whole number"),
    "max_cost_cents": (0.0, 100_000_000.0, True, "cents"),
    "max_duration_ms": (0.0, MAX_DURATION_S * 1000, True, "milliseconds"),
    "max_tasks": (1, 10**8, False, "whole number"),
    "cost_per_token": (0.0, 1.0, False, "USD per token"),
}
"""The range of each number ``limits`` (by quantity), ``constraints`` (by key) and ``metadata.limit`` (as
``max_tasks``) may hold: ``benchwright.runs.limits`` enforces the same table, the API refuses values outside it
with 422."""
MAX_PRICE_PER_TOKEN = NUMBER_RANGES["cost_per_token"][1]
"""Upper bound of a launch's own per-token price, in USD (the dearest model priced today is ~1e-4)."""


def number_problem(value: Any, *, path: str, low: float = -MAX_JSON_NUMBER, high: float = MAX_JSON_NUMBER,
                   low_exclusive: bool = False, unit: str = "") -> str | None:
    """Why ``value`` (a JSON number) is not acceptable at ``path``, or None: not finite, or outside the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    in_range = math.isfinite(value) and (low < value if low_exclusive else low <= value) and value <= high
    if in_range:
        return None
    what = f" ({unit})" if unit else ""
    if low == -high:
        return f"{path} must be a finite number within ±{_shown(high)}{what}, got {_shown(value)}"
    above = f"greater than {_shown(low)}" if low_exclusive else f"at least {_shown(low)}"
    return f"{path} must be a finite number {above} and at most {_shown(high)}{what}, got {_shown(value)}"


def _shown(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, int) and abs(x) >= 10**16:
        return f"an integer of {len(str(abs(x)))} digits"
    if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e16:
        return f"{int(x):,}"
    return f"{x:g}"


def check_numbers(value: Any, *, path: str) -> None:
    """Refuse (ValueError naming the path and the range) any number in ``value`` (JSON: dicts, lists, scalars)
    that is not finite or lies outside ±``MAX_JSON_NUMBER``; ``limits``/``constraints``/``metadata.limit`` keys
    are held to their own ``NUMBER_RANGES``."""
    stack: list[tuple[Any, str, str | None]] = [(value, path, None)]
    while stack:
        item, where, quantity = stack.pop()
        if isinstance(item, dict):
            for key, sub in item.items():
                sub_path = f"{where}.{key}" if where else str(key)
                stack.append((sub, sub_path, _range_key(sub_path, str(key))))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}[{i}]", None) for i, sub in enumerate(item))
        else:
            bounds = NUMBER_RANGES.get(quantity) if quantity else None
            problem = number_problem(item, path=where, low=bounds[0], high=bounds[1], low_exclusive=bounds[2],
                                     unit=bounds[3]) if bounds else number_problem(item, path=where)
            if problem:
                raise ValueError(problem)


def _range_key(path: str, key: str) -> str | None:
    """The ``NUMBER_RANGES`` entry that bounds the value at ``path``, if one does."""
    parts = path.split(".")
    if len(parts) >= 3 and parts[-3] == "limits":
        return key
    if parts[-2:-1] == ["constraints"]:
        return key
    if parts[-2:] == ["metadata", "limit"]:
        return "max_tasks"
    if key in ("input_cost_per_token", "output_cost_per_token"):
        return "cost_per_token"
    return None
