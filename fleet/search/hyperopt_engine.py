"""hyperopt's TPE and random search, driven ask/tell (hyperopt's own `fmin` would block until
every trial ended, so N trials could not run at once)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from fleet.search.evaluation import PENALTY
from fleet.search.racing import Racing
from fleet.space import Space, key

REDRAWS = 50  # suggestions asked for before a configuration already seen is run again
TPE_REDRAWS = 1  # of them from TPE; the rest are random


class Hyperopt:
    def __init__(self, space: Space, algorithm: str, seed: int, startup: int) -> None:
        from hyperopt import Domain, Trials, rand, tpe

        self.space = space
        self.rng = np.random.default_rng(seed)
        self._count = 0  # trials handed out; the next one's id
        self._docs: dict[int, dict[str, Any]] = {}
        self.hp_space = space.hyperopt()
        self.domain = Domain(lambda _: 0.0, self.hp_space)
        self.trials = Trials()
        self.suggest = (
            partial(tpe.suggest, n_startup_jobs=startup) if algorithm == "tpe" else rand.suggest
        )
        self._random = rand.suggest
        self._asked: set[str] = set()  # every configuration handed out
        self._distinct: float = math.inf if space.continuous else space.size()
        # A space narrowed to the configurations that can run (a replay table's rows): a draw
        # outside them is dropped as a repeat is, not run to fail
        self._runnable = None if space.only is None else {key(c) for c in space.only}

    def ask(self) -> tuple[int, dict[str, Any]] | None:
        import hyperopt
        from hyperopt import JOB_STATE_ERROR

        # Once every configuration has run, a repeat is all there is: the first runnable draw.
        fresh = len(self._asked) < self._distinct
        for attempt in range(REDRAWS):
            # TPE's next pick after a seen one is mostly that one again (it takes the best of 24
            # candidates from the same density): then hyperopt's random suggestion instead.
            suggest = self.suggest if attempt < TPE_REDRAWS else self._random
            ids = self.trials.new_trial_ids(1)
            docs = suggest(ids, self.domain, self.trials, int(self.rng.integers(2**31 - 1)))
            self.trials.insert_trial_docs(docs)
            self.trials.refresh()
            doc = self.trials._dynamic_trials[-1]
            values = {k: v[0] for k, v in doc["misc"]["vals"].items() if v}
            chosen = self.space.active(
                self.space.from_sample(hyperopt.space_eval(self.hp_space, values))
            )
            seen = key(chosen)
            runs = self._runnable is None or seen in self._runnable
            if (runs and (seen not in self._asked or not fresh)) or attempt == REDRAWS - 1:
                break  # new, or the last try: nearly every configuration seen, run it again
            # A configuration already run (or running): a trial spent on it would only measure
            # it again (TPE re-proposes its best point often: 2 of 22 trials on a 220-point
            # table, 12 of 40 on a 60-point one). The suggestion is dropped (an errored doc,
            # which hyperopt's algorithms ignore) and another asked for. Replicates are how to
            # measure a point again.
            doc["state"] = JOB_STATE_ERROR
            self.trials.refresh()
        missed = self._runnable is not None and (
            seen not in self._runnable or (fresh and seen in self._asked)
        )
        if missed:
            # A narrowed space whose untried configurations the draws keep missing (52 of 400,
            # 30 of them asked: a draw is new and runnable 1 time in 18): one of them at
            # random, recorded as hyperopt's own draw so that TPE learns from it.
            chosen = self._untried()
            seen = key(chosen)
            vals = self.space.hyperopt_values(chosen)
            doc["misc"]["vals"] = vals
            doc["misc"]["idxs"] = {label: [doc["tid"]] if v else [] for label, v in vals.items()}
            self.trials.refresh()
        self._asked.add(seen)
        trial = self._count
        self._count += 1
        self._docs[trial] = doc
        return trial, chosen

    def _untried(self) -> dict[str, Any]:
        """A runnable configuration not yet asked (any runnable one once all were)."""
        assert self.space.only is not None
        fresh = [c for c in self.space.only if key(c) not in self._asked] or self.space.only
        return dict(fresh[int(self.rng.integers(len(fresh)))])

    def tell(self, trial: int, loss: float | None) -> None:
        from hyperopt import JOB_STATE_DONE, STATUS_OK

        doc = self._docs.pop(trial)
        doc["state"] = JOB_STATE_DONE
        doc["result"] = {"loss": PENALTY if loss is None else loss, "status": STATUS_OK}
        self.trials.refresh()


def start_trials(budget: int) -> int:
    """TPE's random start when none is set: hyperopt's default of 20 is a third of a small
    budget, so a quarter of it here, 3 to 20."""
    return max(3, min(20, budget // 4))


# Each races its finalists over the last share of its budget where the measurements are noisy
# (fleet/search/racing.py): asking no configuration twice, it recommended one lucky run under
# noise, without an interval (compare --replay-runs: "interval covers 0/5 (0 had one)").


def tpe(space: Space, seed: int, startup: int | None, budget: int) -> Racing:
    start = start_trials(budget) if startup is None else startup
    return Racing(Hyperopt(space, "tpe", seed, start), budget)


def random(space: Space, seed: int, startup: int | None, budget: int) -> Racing:
    return Racing(Hyperopt(space, "random", seed, 0), budget)  # no model: every draw random
