"""Racing the finalists: the last share of a search's budget spent on replicates, so that its
recommendation (fleet/search/recommend.py) rests on several runs and has an interval, not on one
lucky run with none.

With a budget of RACE_FROM or more, one replicate of the incumbent at the start of the last
RACE_SHARE (a wrapped engine's: WRAPPED_SHARE) tells whether the measurements are noisy. If
they are, the rest of the budget races the finalists (`next_replicate`); if not (a replayed
table, a deterministic simulation), the search explores to the end. The model search
(fleet/search/model.py) races this way among its own phases; any other engine is wrapped in
`Racing` (hyperopt's TPE and random search, which never ask a configuration twice: they
recommended a single run, without an interval, under noise).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

import numpy as np

from fleet.search.recommend import Pooled
from fleet.space import key

RACE_FROM = 12  # budgets below this explore to the end: a replicate costs too large a share
RACE_SHARE = 0.4  # of 0.3-0.5 on the kernels runs table, 0.4 measured best (bench_search)
FINALISTS = 3  # each run at least twice before racing picks among them
SAME = 1e-9  # relative: a replicate this close to the first run is the same measurement
K = TypeVar("K")  # a configuration's handle: its key, or a candidate's index


# A wrapped engine's share. On the kernels runs table (30 seeds; random at 18 evaluations, TPE
# at 22; median of the recommendation's true mean over the best): racing none 1.0325 and 1.0264,
# with no interval; 0.1 1.0424 and 1.0264; 0.2 1.0412 and 1.0241; 0.3 1.0412 and 1.0325; 0.4
# 1.053 and 1.0325. Each racing share gave an interval in 30/30 seeds, covering in 29-30.
# Random search's draws are worth more than the model's late ones: it keeps 0.2.
WRAPPED_SHARE = 0.2


def race_at(budget: int, share: float = RACE_SHARE) -> int | None:
    """The trial from which a search of `budget` trials races; None: it explores to the end."""
    return budget - round(budget * share) if budget >= RACE_FROM else None


def noisy(first: float | None, again: float | None) -> bool:
    """Whether a replicate of a configuration says the measurements are noisy. A failure twice
    says nothing of noise: explore on."""
    if first is None or again is None:
        return False
    return abs(again - first) > SAME * max(abs(first), abs(again), 1e-300)


def next_replicate(
    runs: Mapping[str, list[float | None]],
    params: Mapping[str, dict[str, Any]],
    busy: Collection[str],
) -> str | None:
    """The configuration (by key) to run again. First each of the FINALISTS best by mean gets a
    second run: racing one configuration alone, the one kept is the one whose draws stayed
    lucky, and its own runs then understate the noise (a recommendation 5% better than its true
    mean, inside an interval of +-1%, was seen that way). Then the configuration that could
    still be best runs again: lowest mean minus two standard errors. None: no result yet."""
    pooled = Pooled.of((params[name], r) for name, losses in runs.items() for r in losses)
    if not pooled.values:
        return None
    by_mean = sorted(pooled.values, key=lambda name: float(np.mean(pooled.values[name])))
    for name in by_mean[:FINALISTS]:
        if len(pooled.values[name]) < 2 and name not in busy:
            return name
    sd = pooled.sd if pooled.sd is not None else 0.0
    bounds = sorted(
        (float(np.mean(v)) - 2 * sd / math.sqrt(len(v)), name) for name, v in pooled.values.items()
    )
    for _, name in bounds:
        if name not in busy:
            return name
    return bounds[0][1]


class Racing:
    """An engine (fleet/search/engines.py) whose last share of the budget races its finalists:
    the wrapped engine asks until then, and after it where the measurements are not noisy, or
    once it has nothing left to ask. A replicate is the wrapper's own trial: the wrapped engine
    is told only the trials it asked."""

    def __init__(self, inner: Any, budget: int, share: float = WRAPPED_SHARE) -> None:
        self.inner = inner
        self.race_at = race_at(budget, share)
        self.runs: dict[str, list[float | None]] = {}
        self.params: dict[str, dict[str, Any]] = {}
        self.pending: dict[int, str] = {}  # trial -> its configuration's key
        self.inner_trial: dict[int, int] = {}  # trial -> the wrapped engine's id of it
        self.count = 0
        self.noisy: bool | None = None
        self.check: int | None = None  # the trial that replicates the incumbent

    def ask(self) -> tuple[int, dict[str, Any]] | None:
        ok = self._results()
        again: str | None = None
        if self.race_at is not None and self.count >= self.race_at and ok:
            if self.noisy is None and self.check is None:
                self.check = self.count
                again = min(ok, key=lambda name: ok[name])  # the incumbent, again
            elif self.noisy:
                again = next_replicate(self.runs, self.params, set(self.pending.values()))
        if again is None:
            asked = self.inner.ask()
            if asked is not None:
                inner, chosen = asked
                trial = self._hand_out(chosen)
                self.inner_trial[trial] = inner
                return trial, chosen
            if not ok:
                return None
            again = next_replicate(self.runs, self.params, set(self.pending.values()))
            if again is None:
                return None
        return self._hand_out(self.params[again]), dict(self.params[again])

    def tell(self, trial: int, loss: float | None) -> None:
        name = self.pending.pop(trial)
        self.runs.setdefault(name, []).append(loss)
        if trial in self.inner_trial:
            self.inner.tell(self.inner_trial.pop(trial), loss)
        if trial == self.check:
            self.noisy = noisy(self.runs[name][0], loss)

    def _hand_out(self, chosen: dict[str, Any]) -> int:
        trial = self.count
        self.count += 1
        name = key(chosen)
        self.params.setdefault(name, dict(chosen))
        self.pending[trial] = name
        return trial

    def _results(self) -> dict[str, float]:
        return means(self.runs)


def means(runs: Mapping[K, list[float | None]]) -> dict[K, float]:
    """Each configuration run with a result: its mean loss (its failed runs left out)."""
    out = {}
    for name, losses in runs.items():
        good = [r for r in losses if r is not None]
        if good:
            out[name] = float(np.mean(good))
    return out
