"""Statistics for replicated runs: median with an interval, spread, and a ranking that will not
pretend to tell apart what the measurements cannot.

The interval is the union of two: a percentile bootstrap of the median (resampling the
replicates with replacement), which makes no assumption about the distribution of run times
(rarely normal: a slow outlier is common on shared hardware), and Student's t interval on the
log values, which holds its confidence with few replicates. Alone, the bootstrap of 3 runs is
their [min, max] and covers the true median 75% of the time, not 95 (of 5 runs, 94%): a bench's
default of 3 replicates then told identical types apart one time in ten. Run times are positive
and skewed to the slow side, so the t interval is taken on their logs; where a value is not
positive, the bootstrap's interval stands alone. It is seeded, so a report is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as distributions

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
    low: float  # the interval around the median (see the module's docstring)
    high: float
    cv: float  # standard deviation / mean

    @property
    def noisy(self) -> bool:
        return self.cv > HIGH_CV


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
    low, high = float(low), float(high)
    if np.all(data > 0):  # a time or a rate; a value at or below 0 keeps the bootstrap alone
        t_low, t_high = _t_interval(np.log(data), confidence)
        low, high = min(low, math.exp(t_low)), max(high, math.exp(t_high))
    return Summary(int(data.size), median, low, high, cv)


def _t_interval(logs: np.ndarray, confidence: float) -> tuple[float, float]:
    """Student's t interval of the mean of the values' logs (their geometric mean's, once
    back): on the values themselves it reached below 0 around a run of 0, and a rate's interval
    then turned into costs of both signs."""
    half = _t_quantile(confidence, logs.size - 1) * np.std(logs, ddof=1) / math.sqrt(logs.size)
    return float(np.mean(logs) - half), float(np.mean(logs) + half)


def _t_quantile(confidence: float, dof: float) -> float:
    return float(distributions.t.ppf(1 - (1 - confidence) / 2, dof))


def ratio(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Summary:
    """The ratio of two groups' medians with an interval: the union of a percentile bootstrap,
    each group resampled on its own (the runs of two builds are not pairs: a build's 2nd run
    owes nothing to the other's), and Welch's t interval of the difference of their mean logs
    where both have two or more positive values (as `summarize`: the bootstrap of 3 runs against
    3 called identical builds different one time in ten). `cv` is the larger of the two groups'
    spreads."""
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
    low, high = (float(v) for v in np.quantile(ratios, [alpha, 1 - alpha]))
    if min(top.size, bottom.size) > 1 and np.all(top > 0) and np.all(bottom > 0):
        logs = (np.log(top), np.log(bottom))
        parts = [np.var(g, ddof=1) / g.size for g in logs]
        shift = float(np.mean(logs[0]) - np.mean(logs[1]))
        spread = math.sqrt(sum(parts))
        if spread > 0:  # Welch-Satterthwaite degrees of freedom
            pairs = zip(parts, logs, strict=True)
            dof = sum(parts) ** 2 / sum(v**2 / (g.size - 1) for v, g in pairs)
            half = _t_quantile(confidence, dof) * spread
            low, high = min(low, math.exp(shift - half)), max(high, math.exp(shift + half))
    return Summary(int(min(top.size, bottom.size)), value, low, high, cv)


@dataclass(frozen=True)
class Ranked:
    name: str
    summary: Summary
    rank: int  # 1 = best; equal ranks cannot be told apart


def rank(results: dict[str, Summary], *, lower_is_better: bool = True) -> list[Ranked]:
    """Order by median; a result's rank is one more than the number of results surely better
    than it (whose interval lies wholly on the better side of its own). So every result whose
    interval overlaps the best's ranks first with it: ranked against the leader of a group
    alone, a wide interval that reached the best ranked second behind a tight one, and the
    answer named one cheapest where the data could not tell which."""
    ordered = sorted(
        results.items(), key=lambda kv: kv[1].median if lower_is_better else -kv[1].median
    )

    def better(one: Summary, than: Summary) -> bool:
        return one.high < than.low if lower_is_better else one.low > than.high

    return [
        Ranked(name, summary, 1 + sum(better(other, summary) for _, other in ordered))
        for name, summary in ordered
    ]


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
