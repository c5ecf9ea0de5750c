"""The forest surrogate: scikit-learn's ExtraTreesRegressor with bootstrap, grown tree by tree.

It grows the same trees as `ExtraTreesRegressor(n_estimators, bootstrap=True,
min_samples_leaf, random_state=seed)` (tests/fleet/test_search_forest.py holds it to that), so
what the search measured with sklearn's forest still holds, in less time: the forest's own fit
clones and re-validates its template for every tree and seeds a new RandomState twice a tree
(about 1 ms a tree, most of a step's time at 300 trials, whose goal is 50 ms). Here the trees
are made once per fit from their parameters, one RandomState is re-seeded for each (1 us
against 76), and the inputs are converted once for all of them.
"""

from __future__ import annotations

import numpy as np

# sklearn draws each tree's seed below this (sklearn.ensemble._base._set_random_states)
_MAX_SEED = int(np.iinfo(np.int32).max)


def predict(
    X: np.ndarray, y: np.ndarray, at: np.ndarray, seed: int, trees: int, leaf: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each of `at`'s predicted mean and spread over the trees, fitted to (X, y)."""
    from sklearn.tree import ExtraTreeRegressor

    # sklearn's trees split on float32 and fit float64 targets in a column
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    at32 = np.ascontiguousarray(at, dtype=np.float32)
    target = np.asarray(y, dtype=np.float64).reshape(-1, 1)
    n = len(X32)
    draws = np.random.RandomState(seed)
    state = np.random.RandomState(0)
    each = np.empty((trees, len(at32)))
    for t in range(trees):
        tree_seed = int(draws.randint(_MAX_SEED))
        state.seed(tree_seed)  # the bootstrap sample, as the forest draws it from the tree's seed
        counts = np.bincount(state.randint(0, n, n), minlength=n).astype(np.float64)
        state.seed(tree_seed)  # and the tree's splits, from the same seed afresh
        tree = ExtraTreeRegressor(min_samples_leaf=leaf, random_state=state)
        tree.fit(X32, target, sample_weight=counts, check_input=False)
        each[t] = tree.predict(at32, check_input=False)
    return each.mean(axis=0), each.std(axis=0)
