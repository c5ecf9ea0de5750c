"""The saved kernels tables that `make bench` compares searches on (benchmarks/data/): they are
what the saved runs say, every configuration has all its rounds, and fleet tune reads them."""

from __future__ import annotations

import json

import pandas as pd

from benchmarks import bench_tune
from fleet import tune

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
    (comparison,) = tune.compare(spec, evaluator, ["grid"], 1, spec.space.size())
    assert comparison.ratios == [1.0]  # the whole grid finds the optimum exactly
