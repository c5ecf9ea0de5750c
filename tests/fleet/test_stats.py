"""Medians with bootstrap intervals, noise flags, and rankings that say "cannot tell apart"."""

from __future__ import annotations

import numpy as np
import pytest

from fleet import stats


def test_the_interval_contains_the_median_and_narrows_with_more_replicates() -> None:
    rng = np.random.default_rng(1)
    few = stats.summarize(list(rng.normal(10.0, 0.5, 5)))
    many = stats.summarize(list(rng.normal(10.0, 0.5, 200)))
    for summary in (few, many):
        assert summary.low <= summary.median <= summary.high
    assert (many.high - many.low) < (few.high - few.low)
    assert abs(many.median - 10.0) < 0.2


def test_it_is_reproducible_for_a_seed() -> None:
    values = [3.1, 2.9, 3.4, 3.0, 5.0]
    assert stats.summarize(values, seed=7) == stats.summarize(values, seed=7)


def test_noise_is_flagged() -> None:
    assert not stats.summarize([10.0, 10.1, 9.9, 10.0]).noisy
    assert stats.summarize([10.0, 14.0, 7.0, 12.0]).noisy


def test_one_replicate_has_no_spread_and_bad_input_is_refused() -> None:
    single = stats.summarize([4.2])
    assert (single.low, single.median, single.high, single.cv) == (4.2, 4.2, 4.2, 0.0)
    with pytest.raises(ValueError, match="no values"):
        stats.summarize([])
    with pytest.raises(ValueError, match="finite"):
        stats.summarize([1.0, float("nan")])


def test_overlapping_intervals_share_a_rank() -> None:
    fast = stats.summarize([10.0, 10.2, 9.9, 10.1, 10.0])
    also_fast = stats.summarize([10.1, 10.3, 10.0, 10.2, 10.1])
    slow = stats.summarize([14.0, 14.2, 13.9, 14.1, 14.0])
    ranked = stats.rank({"c7i": also_fast, "c7a": fast, "m5": slow})
    assert [(r.name, r.rank) for r in ranked] == [("c7a", 1), ("c7i", 1), ("m5", 3)]
    higher = stats.rank({"c7i": also_fast, "m5": slow}, lower_is_better=False)
    assert [r.name for r in higher] == ["m5", "c7i"]


def test_cost_per_unit_of_work() -> None:
    # 36 s a unit at 0.10 USD/hour is 0.001 USD a unit.
    assert stats.cost_per_unit(36.0, 0.10) == pytest.approx(0.001)


def test_the_worst_tenth_of_searches_that_found_nothing_feasible_is_inf_not_nan() -> None:
    # numpy's interpolation makes nan of inf - inf: a comparison printed "p90 nan".
    assert stats.quantile([1.0, 2.0, 3.0, np.inf], 0.9) == np.inf
    assert stats.quantile([np.inf] * 5, 0.9) == np.inf
    # Away from inf it is numpy's linear quantile.
    values = [1.0, 1.2, 1.05, 1.5, 1.1, 1.3]
    assert stats.quantile(values, 0.9) == pytest.approx(float(np.quantile(values, 0.9)))
    assert stats.quantile([1.0] * 9 + [np.inf], 0.5) == 1.0
