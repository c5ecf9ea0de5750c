"""The forest surrogate (fleet/search/forest.py) grows scikit-learn's own ExtraTreesRegressor
trees: what the search measured with sklearn's forest must still hold after the speed-up, so
its predictions are held to the forest's, exactly, on tables given as data."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import ExtraTreesRegressor

from fleet.search.forest import predict


def sklearn_forest(
    X: np.ndarray, y: np.ndarray, at: np.ndarray, seed: int, trees: int, leaf: int
) -> tuple[np.ndarray, np.ndarray]:
    forest = ExtraTreesRegressor(
        n_estimators=trees, bootstrap=True, min_samples_leaf=leaf, random_state=seed
    )
    forest.fit(X, y)
    each = np.stack([tree.predict(at) for tree in forest.estimators_])
    return each.mean(axis=0), each.std(axis=0)


@pytest.mark.parametrize(
    ("rows", "columns", "seed", "trees", "leaf"),
    [(3, 1, 0, 48, 1), (9, 4, 7919, 48, 1), (40, 6, 123457, 16, 2), (120, 3, 2**31 - 2, 8, 3)],
)
def test_the_forest_grows_sklearn_s_trees(
    rows: int, columns: int, seed: int, trees: int, leaf: int
) -> None:
    data = np.random.default_rng(rows * 31 + columns)
    # Mixed: ordered numbers, a few repeated values (ties sklearn's splitter must see alike),
    # and a target far from unit scale
    X = np.column_stack(
        [
            data.normal(size=rows) * 10**c if c % 2 else data.integers(0, 4, rows)
            for c in range(columns)
        ]
    ).astype(np.float64)
    y = np.exp(data.normal(size=rows)) * 1e3
    at = np.vstack([X, data.normal(size=(25, columns))])
    mean, sd = predict(X, y, at, seed, trees, leaf)
    want_mean, want_sd = sklearn_forest(X, y, at, seed, trees, leaf)
    assert sd.max() > 0, "a forest of bootstrapped trees that all agree tests nothing"
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=0)
    np.testing.assert_allclose(sd, want_sd, rtol=1e-9, atol=1e-12)


def test_another_seed_grows_another_forest() -> None:
    data = np.random.default_rng(5)
    X, y = data.normal(size=(30, 3)), data.normal(size=30)
    at = data.normal(size=(10, 3))
    first, _ = predict(X, y, at, 1, 24, 1)
    again, _ = predict(X, y, at, 1, 24, 1)
    other, _ = predict(X, y, at, 2, 24, 1)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
