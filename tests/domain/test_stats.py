"""benchwright.comparison.stats against textbook values and scipy.stats (the independent oracle, test-only)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats as sp

from benchwright.comparison.stats import (
    bootstrap_mean,
    mcnemar_exact,
    median_interval,
    paired_proportion_difference,
    pareto_optimal,
    proportion_se,
    sign_flip_p,
    wilson_interval,
)


@pytest.mark.parametrize(("k", "n", "low", "high"), [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605),
                                                     (0, 20, 0.0, 0.1611), (29, 29, 0.8830, 1.0)])
def test_wilson_matches_newcombes_table(k: int, n: int, low: float, high: float) -> None:
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3.
    ci = wilson_interval(successes=k, n=n)
    assert ci is not None
    assert ci.low == pytest.approx(low, abs=6e-5) and ci.high == pytest.approx(high, abs=6e-5)


def test_wilson_matches_scipy_everywhere() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 5000)
        k = rng.randint(0, n)
        ours = wilson_interval(successes=k, n=n)
        theirs = sp.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert ours is not None
        assert ours.low == pytest.approx(theirs.low, abs=1e-9) and ours.high == pytest.approx(theirs.high, abs=1e-9)


def test_wilson_edges() -> None:
    assert wilson_interval(successes=0, n=0) is None
    assert proportion_se(successes=0, n=0) is None
    assert proportion_se(successes=80, n=100) == pytest.approx(0.04)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        wilson_interval(successes=5, n=4)


def test_mcnemar_exact_known_value_and_scipy() -> None:
    # b=3, c=12: p = 2 * (C(15,0)+C(15,1)+C(15,2)+C(15,3)) / 2^15 = 2 * 576 / 32768
    assert mcnemar_exact(b=3, c=12) == pytest.approx(1152 / 32768, rel=1e-12)
    assert mcnemar_exact(b=0, c=0) == 1.0 and mcnemar_exact(b=7, c=7) == 1.0
    rng = random.Random(3)
    for _ in range(100):
        b, c = rng.randint(0, 300), rng.randint(0, 300)
        if b + c == 0:
            continue
        expected = sp.binomtest(min(b, c), b + c, 0.5).pvalue
        assert mcnemar_exact(b=b, c=c) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_large_counts_stay_exact() -> None:
    p = mcnemar_exact(b=4_000, c=4_400)  # float binomial tails underflow long before this
    assert p == pytest.approx(sp.binomtest(4_000, 8_400, 0.5).pvalue, rel=1e-6)
    assert 0 < mcnemar_exact(b=0, c=5_000) < 1e-300 or mcnemar_exact(b=0, c=5_000) == 0.0


def test_paired_difference_agresti_min_by_hand() -> None:
    # b=5, c=15, n=100: b'=5.5, c'=15.5, n'=102; centre 10/102, SE = sqrt(21 - 100/102)/102
    est = paired_proportion_difference(b=5, c=15, n=100)
    se = math.sqrt(21 - 100 / 102) / 102
    assert est.value == pytest.approx(0.10)
    assert est.se == pytest.approx(se)
    assert est.interval.low == pytest.approx(10 / 102 - 1.959963984540054 * se)
    assert est.interval.high == pytest.approx(10 / 102 + 1.959963984540054 * se)
    symmetric = paired_proportion_difference(b=9, c=9, n=50)
    assert symmetric.interval.low == pytest.approx(-symmetric.interval.high)
    with pytest.raises(ValueError):
        paired_proportion_difference(b=60, c=50, n=100)


def test_paired_difference_covers_the_truth() -> None:
    # Coverage over 400 simulated paired samples of n=200 with true difference +0.05: near 95 %.
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(400):
        cells = rng.multinomial(200, [0.70, 0.05, 0.10, 0.15])  # both pass, A only, B only, neither
        est = paired_proportion_difference(b=int(cells[1]), c=int(cells[2]), n=200)
        covered += est.interval.low <= 0.05 <= est.interval.high
    assert 0.91 <= covered / 400 <= 0.99


def test_bootstrap_matches_scipy_percentile() -> None:
    rng = np.random.default_rng(5)
    for values in (rng.random(400), rng.integers(0, 2, 1000).astype(float), rng.integers(0, 6, 700) / 5):
        ours = bootstrap_mean(values=list(values), replicates=4000, seed=1)
        theirs = sp.bootstrap((values,), np.mean, method="percentile", n_resamples=4000, random_state=2)
        assert ours is not None
        assert ours.value == pytest.approx(values.mean())
        width = theirs.confidence_interval.high - theirs.confidence_interval.low
        assert ours.interval.low == pytest.approx(theirs.confidence_interval.low, abs=0.06 * width)
        assert ours.interval.high == pytest.approx(theirs.confidence_interval.high, abs=0.06 * width)
        assert ours.se == pytest.approx(theirs.standard_error, rel=0.06)
        assert ours.se == pytest.approx(values.std(ddof=1) / math.sqrt(len(values)), rel=0.06)


def test_bootstrap_is_deterministic_and_handles_edges() -> None:
    values = [0.0, 0.5, 1.0, 1.0, 0.25] * 40
    assert bootstrap_mean(values=values, seed=3) == bootstrap_mean(values=values, seed=3)
    assert bootstrap_mean(values=[]) is None
    constant = bootstrap_mean(values=[1.0] * 10)
    assert constant is not None and constant.interval.low == constant.interval.high == 1.0


def test_sign_flip_matches_scipys_exact_paired_permutation() -> None:
    x = np.array([0.9, 0.8, 1.0, 0.7, 0.95, 0.6, 0.85, 0.9, 0.75, 0.8])
    y = np.array([0.7, 0.75, 0.8, 0.72, 0.6, 0.65, 0.7, 0.8, 0.7, 0.9])
    exact = sp.permutation_test((x, y), lambda a, b: np.mean(a - b), permutation_type="samples",
                                n_resamples=np.inf).pvalue
    assert sign_flip_p(diffs=list(x - y), permutations=20_000, seed=4) == pytest.approx(exact, abs=0.01)
    assert sign_flip_p(diffs=[0.0, 0.0]) == 1.0


def test_pareto_optimal() -> None:
    # (cost, quality): the cheapest, the best, and one strictly between them are optimal; dominated ones are not.
    points = [(0.01, 0.60), (0.02, 0.58), (0.05, 0.80), (0.03, 0.70), (0.05, 0.79), (0.03, 0.70)]
    assert pareto_optimal(points) == [True, False, True, True, False, True]


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 10, 12, 20, 31, 100])
def test_a_medians_interval_is_the_widest_order_statistics_scipy_gives_95_percent(n: int) -> None:
    values = [random.Random(n).uniform(0.8, 1.4) for _ in range(n)]
    ci = median_interval(values)
    xs = sorted(values)
    # scipy's binomial: the largest r with P(r <= B <= n - r) >= 0.95, B ~ Binomial(n, 1/2) (1-based order stats)
    rs = [r for r in range(1, (n + 1) // 2 + 1) if sp.binom.cdf(n - r, n, 0.5) - sp.binom.cdf(r - 1, n, 0.5) >= 0.95]
    r = max(rs, default=1)
    assert (ci.low, ci.high) == (xs[r - 1], xs[n - r])
    assert ci.low <= float(np.median(values)) <= ci.high
    if n == 10:
        assert (ci.low, ci.high) == (xs[1], xs[8])  # x(2)..x(9): 97.9 %; x(3)..x(8) would be 89 %
    if n < 6:
        assert (ci.low, ci.high) == (xs[0], xs[-1])


def test_a_medians_interval_refuses_no_values_and_a_confidence_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0, 2.0], confidence=1.0)
