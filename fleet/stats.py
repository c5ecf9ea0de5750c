"""Statistics for replicated runs: median with a bootstrap interval, spread, and a ranking that
will not pretend to tell apart what the measurements cannot.

A percentile bootstrap of the median (resampling the replicates with replacement) makes no
assumption about the distribution of run times, which are rarely normal (a slow outlier is
common on shared hardware). It is seeded, so a report is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

HIGH_CV = 0.05  # a coefficient of variation above this is flagged: the numbers are noisy


def quantile(values: Sequence[float], q: float) -> float:
    """numpy's linear quantile, where an infinite value (a search that found nothing feasible)
    may be a neighbour: numpy's interpolation makes inf - inf, and so nan, of [1, 2, 3, inf] at
    0.9; the worst tenth there is inf."""
    data = np.sort(np.asarray(values, dtype=float))
    if not len(data):
        raise ValueError("quantile of no values")
    at = (len(data) - 1) * q
    low, high = math.floor(at), math.ceil(at)
    if low == high or data[low] == data[high]:
        return float(data[low])
    if math.isinf(data[high]):
        return float(data[high])
    return float(data[low] + (data[high] - data[low]) * (at - low))


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    low: float  # the bootstrap interval around the median
    high: float
    cv: float  # standard deviation / mean

    @property
    def noisy(self) -> bool:
        return self.cv > HIGH_CV

    def overlaps(self, other: Summary) -> bool:
        return self.low <= other.high and other.low <= self.high


def summarize(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Summary:
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to summarize")
    if not np.all(np.isfinite(data)):
        raise ValueError("values must be finite numbers")
    median = float(np.median(data))
    mean = float(np.mean(data))
    cv = float(np.std(data, ddof=1) / mean) if data.size > 1 and mean != 0 else 0.0
    if data.size == 1:
        return Summary(1, median, median, median, 0.0)
    rng = np.random.default_rng(seed)
    samples = rng.choice(data, size=(resamples, data.size), replace=True)
    medians = np.median(samples, axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(medians, [alpha, 1 - alpha])
    return Summary(int(data.size), median, float(low), float(high), cv)


def ratio(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Summary:
    """The ratio of two groups' medians with a percentile bootstrap interval, each group
    resampled on its own (the runs of two builds are not pairs: a build's 2nd run owes nothing
    to the other's). `cv` is the larger of the two groups' spreads."""
    top, bottom = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if top.size == 0 or bottom.size == 0:
        raise ValueError("no values to compare")
    if not (np.all(np.isfinite(top)) and np.all(np.isfinite(bottom))) or np.any(bottom == 0):
        raise ValueError("values must be finite numbers, and the denominator's non-zero")
    value = float(np.median(top) / np.median(bottom))
    cv = max(summarize(top.tolist()).cv, summarize(bottom.tolist()).cv)
    if top.size == 1 and bottom.size == 1:
        return Summary(1, value, value, value, 0.0)
    rng = np.random.default_rng(seed)
    ratios = np.median(rng.choice(top, size=(resamples, top.size)), axis=1) / np.median(
        rng.choice(bottom, size=(resamples, bottom.size)), axis=1
    )
    alpha = (1 - confidence) / 2
    low, high = np.quantile(ratios, [alpha, 1 - alpha])
    return Summary(int(min(top.size, bottom.size)), value, float(low), float(high), cv)


@dataclass(frozen=True)
class Ranked:
    name: str
    summary: Summary
    rank: int  # 1 = best; equal ranks cannot be told apart


def rank(results: dict[str, Summary], *, lower_is_better: bool = True) -> list[Ranked]:
    """Order by median; a result whose interval overlaps the interval of the group's best joins
    that group and shares its rank ("cannot tell apart")."""
    ordered = sorted(
        results.items(), key=lambda kv: kv[1].median if lower_is_better else -kv[1].median
    )
    ranked: list[Ranked] = []
    group_leader: Summary | None = None
    current = 0
    for position, (name, summary) in enumerate(ordered, start=1):
        if group_leader is None or not summary.overlaps(group_leader):
            group_leader = summary
            current = position
        ranked.append(Ranked(name, summary, current))
    return ranked


def cost_per_unit(seconds_per_unit: float, usd_per_hour: float) -> float:
    """USD for one unit of work, at the price of the market the run used."""
    return seconds_per_unit * usd_per_hour / 3600.0


def pareto(frame: pd.DataFrame) -> pd.Series:
    """True for the rows no other row beats on both time and cost per unit of work."""
    points = frame[["seconds_per_unit", "usd_per_unit"]].to_numpy(dtype=float)
    front = []
    for i, (t, c) in enumerate(points):
        dominated = any(
            (t2 <= t and c2 <= c) and (t2 < t or c2 < c)
            for j, (t2, c2) in enumerate(points)
            if j != i and not math.isnan(c2)
        )
        front.append(not dominated and not math.isnan(c))
    return pd.Series(front, index=frame.index)
