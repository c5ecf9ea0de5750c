"""The saved kernels tables that `make bench` compares searches on (benchmarks/data/): they are
what the saved runs say, every configuration has all its rounds, and fleet tune reads them."""

from __future__ import annotations

import json

import pandas as pd

from benchmarks import bench_tune
from fleet.replay import compare

KEYS = ["threads", "block", "size"]


def runs() -> pd.DataFrame:
    return pd.read_csv(bench_tune.RUNS).astype({"block": "Int64"})


def test_the_saved_tables_are_the_medians_of_the_saved_runs() -> None:
    suite, matmul = bench_tune.tables(runs())
    for path, rates in ((bench_tune.SUITE, suite), (bench_tune.MATMUL, matmul)):
        saved = pd.read_csv(path).set_index(KEYS)["metric"].sort_index()
        assert len(saved) >= 200, f"{path.name}: the issue asks for at least 200 configurations"
        pd.testing.assert_series_equal(
            (-rates).sort_index(), saved, check_names=False, check_index_type=False, rtol=1e-12
        )


def test_every_configuration_was_measured_in_every_round() -> None:
    measured = json.loads(bench_tune.PROVENANCE.read_text())["measured"]
    data = runs()
    assert set(data.kernel) == set(bench_tune.KERNELS) == set(measured)
    for kernel, group in data.groupby("kernel"):
        counts = group.groupby(KEYS, dropna=False).size()
        blocks = len(bench_tune.BLOCKS) if kernel == "matmul" else 1
        assert len(counts) == len(bench_tune.THREADS) * blocks * len(bench_tune.SIZES), kernel
        assert (counts == measured[kernel]["rounds"]).all(), kernel


def test_fleet_tune_searches_the_saved_table() -> None:
    spec, evaluator = bench_tune.replay(bench_tune.SUITE)
    assert spec.space.size() == len(pd.read_csv(bench_tune.SUITE))
    (comparison,) = compare(spec, evaluator, ["grid"], 1, spec.space.size())
    assert comparison.ratios == [1.0]  # the whole grid finds the optimum exactly


def test_main_effects_keeps_an_additive_table_and_each_parameters_mean() -> None:
    import numpy as np

    rows = [(t, b, s) for t in (1, 2) for b in (8, 16, 32) for s in (2, 3)]
    additive = pd.DataFrame(rows, columns=KEYS)
    additive["metric"] = -np.exp(
        0.4 * additive.threads - 0.01 * additive.block + 0.1 * additive.size
    )
    fitted, residual = bench_tune.main_effects(additive)
    assert residual < 1e-12
    pd.testing.assert_frame_equal(fitted, additive, rtol=1e-12)
    # One configuration 10% faster: an interaction the fit spreads over its parameters' means.
    bumped = additive.copy()
    bumped.loc[0, "metric"] *= 1.1
    fitted, residual = bench_tune.main_effects(bumped)
    assert residual > 0.01 and fitted.loc[0, "metric"] > bumped.loc[0, "metric"]
    logs, fit = np.log(-bumped.metric), np.log(-fitted.metric)
    for key in KEYS:  # each parameter's mean log rate is the table's
        pd.testing.assert_series_equal(
            fit.groupby(bumped[key]).mean(), logs.groupby(bumped[key]).mean()
        )
