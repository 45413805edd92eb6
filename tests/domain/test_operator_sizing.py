"""Sample-size planning (benchwright.operator.sizing) against the textbook formula n = z²σ²/h²."""

from __future__ import annotations

import math

import pytest

from benchwright.operator.sizing import (
    paired_variance,
    tasks_for_halfwidth,
    tasks_for_paired_halfwidth,
    tasks_for_proportion,
)


def test_one_proportion_matches_the_classic_figures() -> None:
    # p = 0.5, ±2 points at 95 %: 1.96² · 0.25 / 0.02² = 2400.9 → 2401; ±3 points → 1068; ±5 points → 385
    assert tasks_for_proportion(p=0.5, halfwidth=0.02) == 2401
    assert tasks_for_proportion(p=0.5, halfwidth=0.03) == 1068
    assert tasks_for_proportion(p=0.5, halfwidth=0.05) == 385
    # a rate near 0.9 needs fewer: 1.959964² · 0.09 / 0.0004 = 864.3 → 865
    assert tasks_for_proportion(p=0.9, halfwidth=0.02) == 865


def test_paired_difference_uses_the_discordant_fractions() -> None:
    # 20 lost and 12 gained over 100 tasks: σ² = 0.32 − 0.08² = 0.3136
    assert paired_variance(lost=20, gained=12, n=100) == pytest.approx(0.3136)
    expected = math.ceil(1.959963984540054 ** 2 * 0.3136 / 0.02 ** 2)
    assert tasks_for_paired_halfwidth(lost=20, gained=12, n=100, halfwidth=0.02) == expected == 3012
    # nothing discordant observed: planned for the worst case, every task discordant (σ² = 1)
    assert tasks_for_paired_halfwidth(lost=0, gained=0, n=100, halfwidth=0.02) == 9604


def test_refuses_meaningless_plans() -> None:
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            tasks_for_halfwidth(variance=0.25, halfwidth=bad)
    with pytest.raises(ValueError):
        tasks_for_halfwidth(variance=math.inf, halfwidth=0.02)
