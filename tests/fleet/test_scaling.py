"""The scaling curve (fleet/search/scaling.py) the search learns a cluster's cost around."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fleet.search.model import CURVE_FROM, ModelSearch
from fleet.search.scaling import TIME_BETTER, Curve, basis, fit
from fleet.space import parse

# (total vCPUs, nodes) of nine clusters, and a curve: 0.2 h serial, 40 vCPU-hours of parallel
# work, 0.05 h per e-fold of nodes
CLUSTERS = np.array([(2, 1), (4, 1), (8, 2), (16, 2), (16, 4), (32, 4), (32, 8), (64, 8), (8, 1)])
TRUE = np.array([0.2, 40.0, 0.05])


def hours(rows: np.ndarray) -> np.ndarray:
    return np.asarray(basis(rows[:, 0].astype(float), rows[:, 1].astype(float)) @ TRUE)


def test_the_curve_is_recovered_from_runs_on_it() -> None:
    found = fit(basis(*CLUSTERS[:6].T.astype(float)), hours(CLUSTERS[:6]))
    assert found is not None
    theta, miss = found
    assert np.allclose(theta, TRUE, rtol=1e-6) and miss < 1e-9
    # and says what the three clusters it did not see take
    assert np.allclose(basis(*CLUSTERS[6:].T.astype(float)) @ theta, hours(CLUSTERS[6:]))


def test_runs_slowed_near_their_memory_wall_do_not_bend_the_curve() -> None:
    # the two smallest clusters ran out of memory's room and took 2.5 times as long: the curve
    # is the runs' lower envelope, so it still says what the others take (least squares, the
    # default of a regression, would put it between)
    slow = hours(CLUSTERS[:7]) * np.array([2.5, 2.5, 1, 1, 1, 1, 1])
    found = fit(basis(*CLUSTERS[:7].T.astype(float)), slow)
    assert found is not None
    predicted = basis(*CLUSTERS.T.astype(float)) @ found[0]
    assert np.allclose(predicted[2:], hours(CLUSTERS[2:]), rtol=0.02), predicted / hours(CLUSTERS)


def test_a_loss_is_read_as_a_cost_or_a_time_whichever_the_runs_fit() -> None:
    usd = np.array([0.1, 0.2, 0.4, 0.8, 0.8, 1.6, 1.6, 3.2, 0.35])  # per hour, per cluster
    curve = Curve(CLUSTERS[:, 0].astype(float), CLUSTERS[:, 1].astype(float), usd)
    ran = list(range(6))
    as_cost = curve.expected(ran, hours(CLUSTERS[:6]) * usd[:6])
    as_time = curve.expected(ran, hours(CLUSTERS[:6]))
    assert as_cost is not None and as_time is not None
    assert np.allclose(as_cost, np.log(hours(CLUSTERS) * usd))
    assert np.allclose(as_time, np.log(hours(CLUSTERS)))


def test_no_curve_where_it_cannot_be_fitted() -> None:
    terms = basis(*CLUSTERS[:2].T.astype(float))
    assert fit(terms, hours(CLUSTERS[:2])) is None  # fewer runs than the curve has terms
    vcpus, nodes = CLUSTERS.T.astype(float)
    unpriced = Curve(vcpus, nodes, np.array([np.nan] + [1.0] * 8))
    assert unpriced.expected(list(range(6)), hours(CLUSTERS[:6])) is None


SPACE = {
    "instance_type": {
        "kind": "categorical",
        "values": [f"{f}.{s}" for f in ("c7g", "m7i") for s in ("large", "xlarge", "2xlarge")],
    },
    "nodes": {"kind": "categorical", "values": [1, 2, 4, 8]},
}


def _search(space: dict[str, Any], losses: list[float]) -> ModelSearch:
    search = ModelSearch(parse(space, "t", "", []), 0, 4, 9, "blend")
    for i, loss in enumerate(losses):
        search.runs[i] = [loss]
    return search


@pytest.mark.parametrize("results", [CURVE_FROM - 1, CURVE_FROM])
def test_the_search_learns_around_the_curve_once_enough_runs_are_in(results: int) -> None:
    prior = _search(SPACE, [1.0 + i for i in range(results)])._training()[3]
    assert (prior is not None) == (results >= CURVE_FROM)


def test_no_curve_for_losses_that_are_not_costs_or_times() -> None:
    # a negative loss (a rate to maximise), or a space without a node count
    assert _search(SPACE, [-1.0 - i for i in range(CURVE_FROM)])._training()[3] is None
    alone = {"instance_type": SPACE["instance_type"]}
    assert _search(alone, [1.0 + i for i in range(CURVE_FROM)])._training()[3] is None


def test_a_cost_is_read_as_a_cost_unless_a_time_fits_the_runs_far_better() -> None:
    # costs off the curve by up to a fifth: here the time curve misses them a little less (its
    # log-of-nodes term grows with the cluster, as a cost does), not half as much
    usd = np.array([0.1, 0.2, 0.4, 0.8, 0.8, 1.6, 1.6, 3.2, 0.35])
    costs = hours(CLUSTERS[:6]) * np.array([1.04, 0.96, 1.21, 1.03, 0.85, 1.11]) * usd[:6]
    terms = basis(*CLUSTERS[:6].T.astype(float))
    as_cost, as_time = fit(terms, costs / usd[:6]), fit(terms, costs)
    assert as_cost is not None and as_time is not None
    assert as_time[1] < as_cost[1] < TIME_BETTER * as_time[1]
    curve = Curve(CLUSTERS[:, 0].astype(float), CLUSTERS[:, 1].astype(float), usd)
    expected = curve.expected(list(range(6)), costs)
    every = basis(*CLUSTERS.T.astype(float))
    assert expected is not None and np.allclose(expected, np.log(every @ as_cost[0] * usd))


def test_runs_that_cannot_tell_the_terms_apart_give_no_curve() -> None:
    one_node = np.array([(2, 1), (4, 1), (8, 1), (16, 1), (32, 1), (64, 1)])
    assert fit(basis(*one_node.T.astype(float)), hours(one_node)) is None


def _extrapolation_error(curve_from: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """How far, on average in log terms, the search's posterior misses the untried candidates'
    costs after eight runs of m7i and one of c7g, each family at its own speed on the curve."""
    monkeypatch.setattr("fleet.search.model.CURVE_FROM", curve_from)
    speed = {"c7g": 1.0, "m7i": 0.8}
    vcpus = {"large": 2, "xlarge": 4, "2xlarge": 8}
    search = ModelSearch(parse(SPACE, "t", "", []), 0, 4, 9, "blend")
    assert search.curve is not None
    usd = search.curve.usd

    def cost(i: int) -> float:
        family, size = search.candidates[i]["instance_type"].split(".")
        nodes = search.candidates[i]["nodes"]
        total = vcpus[size] * nodes
        return float(usd[i] * (0.2 + 40.0 / (total * speed[family]) + 0.05 * np.log(nodes)))

    one = {"instance_type": "c7g.xlarge", "nodes": 2}
    ran = [
        i
        for i, c in enumerate(search.candidates)
        if c["instance_type"].startswith("m7i") or c == one
    ]
    for i in ran:
        search.runs[i] = [cost(i)]
    untried = [i for i in range(len(search.candidates)) if i not in ran]
    posterior = search._posterior(untried)
    assert posterior is not None
    return float(np.mean(np.abs(posterior[0] - np.log([cost(i) for i in untried]))))


def test_one_family_s_runs_and_the_curve_say_what_another_size_costs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_curve = _extrapolation_error(CURVE_FROM, monkeypatch)
    alone = _extrapolation_error(10**6, monkeypatch)  # the control: the surrogate alone
    assert with_curve < 0.5 * alone, (with_curve, alone)
