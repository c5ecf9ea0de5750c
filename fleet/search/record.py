"""What a search's record says, read from the results database: the best trial, the
recommendation through the noise, what each trial cost, the budget as resumed, and a loss in
the objective's own terms. `fleet status`, the reports and the search read it; it imports no
search, evaluator or page (ARCHITECTURE.md: the search core's record)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from fleet.results import Results
from fleet.search.recommend import recommend


def best(results: Results, run_id: str) -> dict[str, Any] | None:
    trials = results.trials(run_id)
    ok = trials[trials.state == "ok"]
    if ok.empty:
        return None
    row = ok.loc[ok.loss.idxmin()]
    return {
        "trial": int(row.trial),
        "loss": float(row.loss),
        "params": json.loads(row.params),
        "metric": row.metric,
    }


def recommendation(results: Results, run_id: str) -> dict[str, Any] | None:
    """The configuration to use, estimated through the noise (fleet/search/recommend.py): a
    trial's replicates and the search's repeats of a configuration count together. With its
    metric as the user reads it, and an interval where the noise could be measured."""
    trials = results.trials(run_id)
    ok = trials[trials.state == "ok"]
    # A configuration's runs that broke a constraint count against it (a failed trial may be
    # the cloud's doing, and is left out): it was recommended on its one run that passed.
    broke = trials[trials.state == "infeasible"]
    chosen = recommend(
        [(json.loads(row.params), loss) for row in ok.itertuples() for loss in _losses(row)]
        + [(json.loads(row.params), None) for row in broke.itertuples()]
    )
    if chosen is None:
        return None
    out = chosen.as_dict()
    same = ok[ok.params.map(lambda text: json.loads(text) == chosen.params)]
    metrics = same.metric.dropna()
    out["metric"] = float(metrics.mean()) if len(metrics) else None
    return out


def _losses(row: Any) -> list[float]:
    """A trial's losses, one per replicate where its manifest keeps them (a cloud trial's),
    else its one loss (a replayed trial's, or one recorded before they were kept)."""
    kept = json.loads(row.manifest or "{}").get("losses") if isinstance(row.manifest, str) else None
    return [float(v) for v in kept] if kept else [float(row.loss)]


def recommendation_text(objective: str, chosen: dict[str, Any]) -> str:
    """A recommendation as `fleet tune` and `fleet report` say it."""
    loss, metric = chosen["loss"], chosen["metric"]
    # A rate is searched negated: its estimate is the loss's, read back as the rate.
    rate = objective == "metric" and metric is not None and loss < 0 < metric
    described = in_own_terms(objective, loss, -loss if rate else metric, chosen["interval"])
    return f"{described} with {chosen['params']} ({chosen['basis']})"


def is_rate(objective: str, loss: float, metric: Any) -> bool:
    """Whether a trial's loss is its metric negated: a rate, which the search maximises."""
    return bool(
        objective == "metric" and metric is not None and not pd.isna(metric) and loss == -metric
    )


def in_own_terms(
    objective: str, loss: float, metric: Any, interval: list[float] | None = None
) -> str:
    """A loss as the user stated the objective: a rate is searched negated (minimised), but
    "-104.5" reads as a mistake where "metric 104.5, maximised" does not."""
    rate = is_rate(objective, loss, metric)
    sign = -1.0 if rate else 1.0
    value = sign * loss
    text = {
        "runtime": f"runtime {value:.6g} s",
        "cost": f"cost ${value:.4g} per unit of work",
    }.get(objective, f"metric {value:.6g}" + (", maximised" if rate else ""))
    if interval:
        low, high = sorted(sign * bound for bound in interval)
        text += f" (95% interval {low:.4g} .. {high:.4g})"
    return text


def trial_costs(results: Results, run_id: str) -> dict[int, float]:
    """USD each trial of the run cost, by trial (those that cost nothing are not recorded). A
    trial run twice (its controller killed between its cost and its result) cost both runs."""
    costs: dict[int, float] = {}
    for _, kind, detail in results.events(run_id):
        if kind == "spent":
            costs[detail["trial"]] = costs.get(detail["trial"], 0.0) + detail["usd"]
    return costs


def gain_spend(results: Results, run_id: str) -> float:
    """USD the run's gain measurements cost (fleet/gain.py records each), all its controllers
    together: spent beside the trials, under the same money budget."""
    return float(sum(d.get("usd", 0.0) for _, kind, d in results.events(run_id) if kind == "gain"))


def run_spend(results: Results, run_id: str) -> float:
    """USD the run has spent: its trials' and its gain measurements'."""
    return sum(trial_costs(results, run_id).values()) + gain_spend(results, run_id)


def budget_changes(results: Results, run_id: str) -> dict[str, Any]:
    """--trials and --parallel given on resuming the run, the latest of each."""
    changes: dict[str, Any] = {}
    for _, kind, detail in results.events(run_id):
        if kind == "budget":
            changes.update(detail)
    return changes
