"""Uncertainty for scores and comparisons: pure functions, no store, no HTTP (issue 17).

Every estimate here treats the *task* as the unit of sampling: a benchmark's tasks are a sample from the tasks
it stands for, so a pass rate on n tasks is known to about ±1/√n, and two runs on the same tasks are compared
task by task (paired), which is far sharper than comparing two independent pass rates.

Formulas (z = 1.959964, the 97.5 % normal quantile, for 95 % intervals):

* **Pass rate, Wilson score interval** (k passes of n scored tasks, p̂ = k/n):
  ``centre = (p̂ + z²/2n) / (1 + z²/n)``, ``half = z·√(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n)``.
  Unlike the Wald interval p̂ ± z·SE it stays inside [0, 1] and keeps its coverage near 0 and 1. The standard
  error reported beside it is the plain ``SE = √(p̂(1−p̂)/n)``. O(1) from counts, so a live run's summary has it.
* **Mean scores and aggregated trials, percentile bootstrap over tasks**: resample the n per-task values with
  replacement B times (seed fixed, so the same data gives the same interval), take the 2.5th and 97.5th
  percentiles of the resampled means; SE is the standard deviation of those means.
* **Paired pass/fail difference** (B − A on the same tasks): with b = tasks A passed and B failed, c = tasks A
  failed and B passed, the difference is (c − b)/n. Its 95 % interval is Agresti–Min's adjusted Wald interval
  (add ½ to each cell of the 2×2 table): ``d = (c − b)/(n + 2)``,
  ``SE = √((b' + c') − (c' − b')²/n') / n'`` with b' = b + ½, c' = c + ½, n' = n + 2.
* **McNemar's exact test**: under "no difference" each discordant task is equally likely to have flipped either
  way, so min(b, c) ~ Binomial(b + c, ½); two-sided ``p = min(1, 2·P(X ≤ min(b, c)))``, computed with exact
  integers.
* **Paired scores**: the per-task differences dᵢ = scoreᴮᵢ − scoreᴬᵢ get a bootstrap interval for their mean
  (as above) and a sign-flip permutation test: under "no difference" each dᵢ is as likely to be −dᵢ, so
  ``p = (1 + #{|mean(±dᵢ)| ≥ |mean(dᵢ)|}) / (R + 1)`` over R random sign assignments.

* **A median, distribution-free** (n paired measurements, e.g. a bench's rounds): the interval between the order
  statistics x₍ᵣ₎ and x₍ₙ₊₁₋ᵣ₎ covers the median with probability ``1 − 2·P(B ≤ r − 1)``, B ~ Binomial(n, ½);
  r is the largest that keeps that at 95 % (n = 10: x₍₂₎ to x₍₉₎, 97.9 %). Below 6 values no interval narrower than
  the whole range reaches 95 %, and the range is returned (its coverage ``1 − 2⁻⁽ⁿ⁻¹⁾``, less than 95 %).

``scipy.stats`` checks these in tests/domain/test_stats.py; it is not a runtime dependency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# numpy imports these on their first use (np.random.default_rng; np.quantile, through np.unique): ~25 ms of a finished
# run's first read, the long poll's answer waiting on it, instead of the process's start.
import numpy.ma
import numpy.random

__all__ = ["Z95", "Estimate", "Interval", "bootstrap_mean", "mcnemar_exact", "median_interval",
           "paired_proportion_difference", "pareto_optimal", "proportion_se", "sign_flip_p", "wilson_interval"]

Z95 = 1.959963984540054
"""The 97.5 % quantile of the standard normal: a 95 % two-sided interval is ±Z95 standard errors."""
BOOTSTRAP_REPLICATES = 2000
"""Resamples per bootstrap interval: the percentiles' Monte Carlo error is ~0.1 point at n = 1,000 tasks."""
PERMUTATIONS = 10_000
"""Sign assignments per permutation test: p = 0.05 is resolved to about ±0.004."""
_DISTINCT_FOR_MULTINOMIAL = 256
"""With at most this many distinct values, a resample is drawn as multinomial counts over them: O(distinct)
instead of O(n) per replicate (2,000 replicates over 10,000 tasks with 6 distinct values: 24 ms, against 0.36 s by
index; 10,000 continuous values by index: 0.27 s)."""
_CHUNK_ELEMENTS = 4_000_000
"""Bound on one random matrix (replicates × tasks) drawn at once: ~32 MB of float64."""


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its standard error and 95 % interval."""

    value: float
    se: float
    interval: Interval


def proportion_se(*, successes: int, n: int) -> float | None:
    """``√(p̂(1−p̂)/n)``, or None when nothing was scored."""
    if n <= 0:
        return None
    p = successes / n
    return math.sqrt(p * (1 - p) / n)


def wilson_interval(*, successes: int, n: int, z: float = Z95) -> Interval | None:
    """The Wilson score interval of a binomial proportion (formula in the module docstring); None when n = 0.

    Raises:
        ValueError: counts out of range (successes < 0 or > n).
    """
    if not 0 <= successes <= max(n, 0):
        raise ValueError(f"successes must be in [0, n]; got {successes} of {n}")
    if n == 0:
        return None
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def median_interval(values: Sequence[float], *, confidence: float = 0.95) -> Interval:
    """A distribution-free interval for the median of ``values`` from its order statistics (formula in the module
    docstring): the narrowest symmetric pair whose coverage is at least ``confidence``, or the whole range when even
    that falls short (fewer than 6 values at 95 %).

    Raises:
        ValueError: no values, or ``confidence`` outside (0, 1).
    """
    if not values:
        raise ValueError("the median of no values has no interval")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    xs, n = sorted(values), len(values)
    r, below = 1, 0  # below: #{outcomes of B ≤ r − 1}, out of 2ⁿ
    while r + 1 <= (n + 1) // 2:
        wider_below = below + math.comb(n, r)  # the next pair in, x₍ᵣ₊₁₎ .. x₍ₙ₋ᵣ₎, leaves out B ≤ r
        if 1 - 2 * wider_below / 2**n < confidence:
            break
        r, below = r + 1, wider_below
    return Interval(xs[r - 1], xs[n - r])


def mcnemar_exact(*, b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (b: A passed, B failed; c: the reverse).

    Exact integer arithmetic: 2·Σ_{i≤min(b,c)} C(b+c, i) / 2^(b+c), so it holds for any count (20,000 discordant
    pairs took 0.06 s here).
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0; got b={b}, c={c}")
    m, k = b + c, min(b, c)
    if m == 0 or 2 * k == m:
        return 1.0
    term, tail = 1, 1
    for i in range(1, k + 1):
        term = term * (m - i + 1) // i
        tail += term
    return float(min(1.0, 2 * tail / 2**m))


def paired_proportion_difference(*, b: int, c: int, n: int, z: float = Z95) -> Estimate:
    """B's pass rate minus A's on the same n tasks, with Agresti–Min's 95 % interval (module docstring).

    Args:
        b: tasks A passed and B failed.
        c: tasks A failed and B passed.
        n: tasks both runs scored (concordant ones included).
    """
    if n <= 0 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"need 0 <= b + c <= n and n > 0; got b={b}, c={c}, n={n}")
    bp, cp, nprime = b + 0.5, c + 0.5, n + 2
    se = math.sqrt(max((bp + cp) - (cp - bp) ** 2 / nprime, 0.0)) / nprime
    centre = (cp - bp) / nprime
    return Estimate(value=(c - b) / n, se=se,
                    interval=Interval(max(-1.0, centre - z * se), min(1.0, centre + z * se)))


def _resampled_means(values: np.ndarray, replicates: int, rng: np.random.Generator) -> np.ndarray:
    n = len(values)
    distinct, counts = np.unique(values, return_counts=True)
    if len(distinct) <= _DISTINCT_FOR_MULTINOMIAL:
        draws = rng.multinomial(n, counts / n, size=replicates)
        return np.asarray(draws @ distinct / n, dtype=float)
    out = np.empty(replicates)
    rows = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, replicates, rows):
        size = min(rows, replicates - start)
        out[start:start + size] = values[rng.integers(0, n, size=(size, n))].mean(axis=1)
    return out


def bootstrap_mean(*, values: Sequence[float], replicates: int = BOOTSTRAP_REPLICATES, seed: int = 0,
                   level: float = 0.95) -> Estimate | None:
    """The mean of ``values`` with a percentile-bootstrap interval over them (one value per task).

    Deterministic: the same values and seed give the same interval. None when there are no values.
    """
    if not values:
        return None
    data = np.asarray(values, dtype=float)
    means = _resampled_means(data, replicates, np.random.default_rng(seed))
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Estimate(value=float(data.mean()), se=float(means.std(ddof=1)) if replicates > 1 else 0.0,
                    interval=Interval(float(low), float(high)))


def sign_flip_p(*, diffs: Sequence[float], permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided paired permutation p-value for "the mean difference is 0" (module docstring).

    Tasks with dᵢ = 0 contribute nothing whatever their sign, so only the non-zero ones are permuted.
    """
    d = np.asarray([x for x in diffs if x != 0], dtype=float)
    if len(d) == 0:
        return 1.0
    observed = abs(d.sum()) - 1e-12 * len(d)  # ties count as "at least as extreme" despite float rounding
    rng = np.random.default_rng(seed)
    extreme = 0
    rows = max(1, _CHUNK_ELEMENTS // len(d))
    for start in range(0, permutations, rows):
        size = min(rows, permutations - start)
        signs = rng.integers(0, 2, size=(size, len(d)), dtype=np.int8) * 2 - 1
        extreme += int((np.abs(signs @ d) >= observed).sum())
    return (1 + extreme) / (permutations + 1)


def pareto_optimal(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (cost, quality) points: True where no other point is at most as costly and at least as good, and
    strictly better in one of the two (cheaper, or better)."""
    flags = []
    for i, (cost, quality) in enumerate(points):
        dominated = any(
            j != i and c <= cost and q >= quality and (c < cost or q > quality) for j, (c, q) in enumerate(points))
        flags.append(not dominated)
    return flags
