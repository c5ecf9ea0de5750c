"""Medians with intervals, noise flags, and rankings that say "cannot tell apart"."""

from __future__ import annotations

import math

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


def test_the_interval_of_three_runs_covers_the_true_median_at_its_confidence() -> None:
    """A bench's default is 3 replicates. The bootstrap alone made their [min, max] of them, a
    "95%" interval that covered the true median in 3 of 4 benches."""
    rng = np.random.default_rng(5)
    trials = 400
    covered = 0
    for seed in range(trials):
        runs = np.exp(rng.normal(math.log(100.0), 0.05, 3))  # log-normal: its median is 100
        summary = stats.summarize(list(runs), seed=seed, resamples=500)
        covered += summary.low <= 100.0 <= summary.high
    assert covered >= 0.92 * trials, covered / trials


def test_identical_builds_are_seldom_called_different() -> None:
    rng = np.random.default_rng(6)
    trials = 300
    apart = 0
    for seed in range(trials):
        one, two = (np.exp(rng.normal(0.0, 0.05, 3)) for _ in range(2))
        summary = stats.ratio(one, two, seed=seed, resamples=500)
        assert summary.low <= summary.median <= summary.high
        apart += not summary.low <= 1.0 <= summary.high
    assert apart <= 0.08 * trials, apart / trials


def test_a_wide_interval_that_reaches_the_best_ranks_first_with_it() -> None:
    """Ranked against its group's leader alone, d ranked 2nd behind a tight c, and the answer
    named a alone as the cheapest although d may well be cheaper."""
    a = stats.Summary(3, 100.5, 100.0, 101.0, 0.01)
    c = stats.Summary(3, 104.5, 104.0, 105.0, 0.01)
    d = stats.Summary(3, 120.0, 60.0, 300.0, 0.5)
    ranked = {r.name: r.rank for r in stats.rank({"a": a, "c": c, "d": d})}
    assert ranked == {"a": 1, "d": 1, "c": 2}
    # higher is better: the same rule from the other side
    ranked = {r.name: r.rank for r in stats.rank({"a": a, "c": c, "d": d}, lower_is_better=False)}
    assert ranked == {"d": 1, "c": 1, "a": 2}
