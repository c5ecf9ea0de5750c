"""One interface for every suggestion algorithm, and where each is found by name.

An engine hands out trials (`ask`) and learns their results (`tell`), one at a time and in any
order, so that N trials run at once and a new one is asked as soon as one ends. Given the same
seed and the same sequence of asks and tells, it makes the same suggestions: a resumed search
replays its record through a fresh engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, Protocol

from fleet.search.evaluation import Evaluation, Evaluator
from fleet.space import Space

# name -> "module:factory"; a factory takes (space, seed, startup, budget), startup None for the
# engine's own start for that budget (start_trials of its module). The default is the
# one that measured best on both of issue 22's goals (benchmarks/bench_search.py).
ALGORITHMS: dict[str, str] = {
    "auto": "fleet.search.model:auto",
    "forest": "fleet.search.model:forest",
    "gp": "fleet.search.model:gaussian_process",
    "blend": "fleet.search.model:blend",
    "tpe": "fleet.search.hyperopt_engine:tpe",
    "random": "fleet.search.hyperopt_engine:random",
    "grid": "fleet.search.grid:grid",
}
DEFAULT = "auto"


class Engine(Protocol):
    def ask(self) -> tuple[int, dict[str, Any]] | None:
        """The next trial's id and parameters; None when there is nothing left to try."""

    def tell(self, trial: int, loss: float | None) -> None:
        """A trial's loss (lower is better); None for a trial that failed or broke a target."""


def make(
    algorithm: str,
    space: Space,
    seed: int,
    startup: int | None,
    budget: int,
    *,
    noisy: bool | None = None,
) -> Engine:
    """The named engine. `noisy` False: the evaluator is a lookup (a replay table gives the same
    figure each time), so an engine that races (fleet/search/racing.py: its `noisy`, None until
    its noise check settles it) spends no trial on that check."""
    module, factory = ALGORITHMS[algorithm].split(":")
    engine: Engine = getattr(importlib.import_module(module), factory)(space, seed, startup, budget)
    if noisy is not None and hasattr(engine, "noisy"):
        engine.noisy = noisy
    return engine


def one_at_a_time(
    engine: Engine, evaluate: Evaluator, budget: int
) -> Iterator[tuple[dict[str, Any], Evaluation]]:
    """Up to `budget` trials asked, evaluated and told in turn (offline replay, where only the
    sequence of suggestions matters): each trial's parameters and evaluation."""
    for _ in range(budget):
        asked = engine.ask()
        if asked is None:
            return
        trial, params = asked
        evaluation = evaluate(trial, params)
        engine.tell(trial, evaluation.ok_loss)
        yield params, evaluation
