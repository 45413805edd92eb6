"""Sample-size planning (issue 26): how many tasks a measurement needs for an interval of a given half-width.

Normal approximation, the textbook formula ``n = z² · σ² / h²`` for a 95 % (``z = 1.96``) interval of half-width
``h`` on a mean whose per-task variance is ``σ²``:

- one pass rate ``p``: ``σ² = p (1 − p)`` (``p = 0.5`` and ``h = 0.02`` give the classic 2,401);
- a paired difference of two pass rates over the same tasks (what ``benchwright.comparison.compare`` measures): each
  task's difference is +1 (gained), −1 (lost) or 0, so with discordant fractions ``b`` (lost) and ``c`` (gained)
  ``σ² = (b + c) − (c − b)²``.
"""

from __future__ import annotations

import math

from benchwright.comparison.stats import Z95

__all__ = ["paired_variance", "tasks_for_halfwidth", "tasks_for_paired_halfwidth", "tasks_for_proportion"]

MAX_PLANNED_TASKS = 10_000_000
"""Plans beyond this are reported as this (a variance near zero over a tiny half-width is no plan anyone runs)."""


def tasks_for_halfwidth(*, variance: float, halfwidth: float, z: float = Z95) -> int:
    """Tasks needed for a ``±halfwidth`` interval on a mean of per-task variance ``variance``.

    Raises:
        ValueError: a half-width outside (0, 1] or a negative or non-finite variance.
    """
    if not (0 < halfwidth <= 1) or not math.isfinite(variance) or variance < 0:
        raise ValueError(f"need 0 < halfwidth <= 1 and a finite variance >= 0, got {halfwidth}, {variance}")
    return min(MAX_PLANNED_TASKS, max(1, math.ceil(z * z * variance / (halfwidth * halfwidth))))


def tasks_for_proportion(*, p: float, halfwidth: float, z: float = Z95) -> int:
    """Tasks for a ``±halfwidth`` interval on one pass rate near ``p``."""
    p = min(max(p, 0.0), 1.0)
    return tasks_for_halfwidth(variance=p * (1 - p), halfwidth=halfwidth, z=z)


def paired_variance(*, lost: int, gained: int, n: int) -> float:
    """Per-task variance of the paired difference from the discordant counts over ``n`` compared tasks."""
    if n <= 0:
        return 0.0
    b, c = lost / n, gained / n
    return max(0.0, (b + c) - (c - b) ** 2)


def tasks_for_paired_halfwidth(*, lost: int, gained: int, n: int, halfwidth: float, z: float = Z95) -> int:
    """Tasks for a ``±halfwidth`` interval on the paired difference, at the discordance observed over ``n``
    tasks (none observed: the worst case, every task discordant, ``σ² = 1``)."""
    variance = paired_variance(lost=lost, gained=gained, n=n) if lost + gained else 1.0
    return tasks_for_halfwidth(variance=variance, halfwidth=halfwidth, z=z)
