"""Which configuration to use, estimated through the noise, with an interval.

The best single observation is biased: among many noisy runs, the luckiest looks best (winner's
curse), and a user who runs it again gets less. So the recommendation is by each configuration's
mean over its runs, penalised by how little is known of it (one standard error: a configuration
measured once does not beat one measured five times on a lucky draw), and its interval comes
from the noise seen between replicates of the same configuration, pooled over all of them (a
configuration measured twice says little alone about the spread).

Losses are compared in log terms when they all have one sign (rates and costs: noise is a share
of the figure, not an amount), so the interval of a rate of 500 is wider than that of a rate of 5.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from fleet.space import key

LEVEL = 0.95
PENALTY_SE = 1.0  # standard errors added to a mean before ranking: the price of knowing little


@dataclass(frozen=True)
class Recommendation:
    params: dict[str, Any]
    loss: float  # the estimate of its mean loss (arithmetic: what a user's runs average)
    low: float | None  # the interval of the mean loss (None: no replicate anywhere, no noise seen)
    high: float | None
    runs: int
    basis: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "loss": self.loss,
            "interval": None if self.low is None else [self.low, self.high],
            "runs": self.runs,
            "basis": self.basis,
        }


class Scale:
    """The losses' own terms: log when they share a sign, as they are otherwise."""

    def __init__(self, losses: Iterable[float]) -> None:
        values = list(losses)
        self.sign = (
            1.0 if values and min(values) > 0 else -1.0 if values and max(values) < 0 else 0.0
        )

    def to(self, loss: float | np.ndarray) -> Any:
        if self.sign == 0.0:
            return loss
        return self.sign * np.log(self.sign * np.asarray(loss, dtype=float))

    def back(self, value: float) -> float:
        if self.sign == 0.0:
            return float(value)
        return float(self.sign * math.exp(self.sign * value))

    def mean_back(self, value: float, sd: float) -> float:
        """The arithmetic mean of losses whose own-terms mean is `value` and spread `sd`: in log
        terms the back of a mean is the geometric mean, below the arithmetic by sd**2/2 (a
        lognormal's), and the intervals were scored against the arithmetic mean."""
        return self.back(value + self.sign * sd * sd / 2)


@dataclass
class Pooled:
    """Every configuration's runs in the losses' own terms, and the noise pooled over them."""

    params: dict[str, dict[str, Any]]
    values: dict[str, list[float]]
    scale: Scale
    sd: float | None  # pooled within-configuration standard deviation (None: no replicate)
    dof: int
    # Configurations with a run that failed or broke a constraint: not recommended while one
    # without is (one rate of 11 among three of 5 under min_rate = 10 was recommended at 11).
    spoiled: frozenset[str] = frozenset()

    @classmethod
    def of(cls, observations: Iterable[tuple[dict[str, Any], float | None]]) -> Pooled:
        params: dict[str, dict[str, Any]] = {}
        raw: dict[str, list[float]] = {}
        spoiled: set[str] = set()
        for chosen, loss in observations:
            if loss is None or not math.isfinite(loss):
                spoiled.add(key(chosen))
                continue
            name = key(chosen)
            params[name] = chosen
            raw.setdefault(name, []).append(loss)
        scale = Scale(v for values in raw.values() for v in values)
        values = {name: [float(scale.to(v)) for v in losses] for name, losses in raw.items()}
        squares, dof = 0.0, 0
        for runs in values.values():
            if len(runs) > 1:
                squares += float(np.var(runs, ddof=1)) * (len(runs) - 1)
                dof += len(runs) - 1
        sd = math.sqrt(squares / dof) if dof else None
        return cls(params, values, scale, sd, dof, frozenset(spoiled & set(values)))

    def ranked(self, penalty: float = PENALTY_SE) -> list[tuple[float, str]]:
        """(mean + penalty standard errors, configuration), best first; those with a failed or
        infeasible run after every one without."""
        sd = self.sd or 0.0
        return [
            (score, name)
            for _, score, name in sorted(
                (
                    name in self.spoiled,
                    float(np.mean(runs)) + penalty * sd / math.sqrt(len(runs)),
                    name,
                )
                for name, runs in self.values.items()
            )
        ]


def recommend(
    observations: Iterable[tuple[dict[str, Any], float | None]], level: float = LEVEL
) -> Recommendation | None:
    """The configuration to use, from every (parameters, loss) observed; None with no result."""
    pooled = Pooled.of(observations)
    if not pooled.values:
        return None
    _, name = pooled.ranked()[0]
    runs = pooled.values[name]
    mean = float(np.mean(runs))
    estimate = pooled.scale.back(mean)
    if pooled.sd is None:
        return Recommendation(
            pooled.params[name], estimate, None, None, len(runs),
            "the best single run: no configuration was measured twice, so the noise is unknown",
        )  # fmt: skip
    # Noise is not the same everywhere (two threads strayed ~9% where one strayed ~5% on the
    # kernels table): where the configuration's own runs spread wider than the pool, its own
    # spread (and its fewer degrees of freedom) sets the interval.
    sd, dof = pooled.sd, pooled.dof
    noise = f"noise pooled over {pooled.dof} replicate{'s' if pooled.dof > 1 else ''}"
    if len(runs) > 2 and float(np.std(runs, ddof=1)) > sd:
        sd, dof = float(np.std(runs, ddof=1)), len(runs) - 1
        # Said as such: "pooled over 8 replicates" stood beside an interval set by 3 runs.
        replicates = f"{pooled.dof} replicate{'s' if pooled.dof > 1 else ''}"
        noise = f"its own runs' spread, wider than the {replicates}' pooled noise"
    # The recommendation is the best of several candidates by their means, so its own mean is
    # biased towards luck (winner's curse): an interval at 95% for it alone covered its true
    # mean in 24 of 30 searches of the kernels table. Intervals that hold for every candidate
    # that competed (measured at least twice) at once, Bonferroni's way, hold for the one
    # picked among them whatever the pick.
    rivals = max(1, sum(len(v) > 1 for v in pooled.values.values()))
    tail = (1 - level) / rivals
    half = float(stats.t.ppf(1 - tail / 2, dof)) * sd / math.sqrt(len(runs))
    back = pooled.scale.mean_back
    low, high = sorted((back(mean - half, sd), back(mean + half, sd)))
    return Recommendation(
        pooled.params[name], back(mean, sd), low, high, len(runs),
        f"mean of {len(runs)} run{'s' if len(runs) > 1 else ''}, {noise} ({level:.0%} interval)",
    )  # fmt: skip
