"""Noisy replay: trials drawn from a table of recorded runs (several per configuration), so that a
search meets the noise a cloud gives it, and is scored by what it recommends, not by its luckiest
draw.

A runs table has a `run` (or `round`) column, one column per parameter and the objective's
column (minimised, as a replay table's: a rate is recorded negated), one row per run. Each
evaluation of a configuration draws one of its runs at random (seeded), each of them once before
any again, as a cloud never gives the same figure twice. A search's score is its
recommendation's true mean (the mean over all of that configuration's recorded runs) against the
best true mean, and whether its interval covers that true mean.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from amibake.errors import UserError
from fleet import replay, stats
from fleet.search import engines
from fleet.search.evaluation import Evaluation
from fleet.search.recommend import Recommendation, recommend
from fleet.space import Space
from fleet.space import key as space_key
from fleet.tune_spec import TuneSpec

RUN_COLUMNS = ("run", "round")


class RunsReplay:
    """A runs table read as the spec reads a replay table: its objective (a cost is the time at
    the row's price), its column and its constraints, checked on each drawn run as a search in
    the cloud meets them, and on a configuration's means for its truth."""

    def __init__(self, path: Path, spec: TuneSpec, seed: int = 0) -> None:
        table = replay.read_table(path)
        if not any(name in table.columns for name in RUN_COLUMNS):
            raise UserError(
                f"{path}:1: a runs table needs a run (or round) column numbering each "
                f"configuration's runs (columns: {', '.join(table.columns)})"
            )
        replay.check_measures(path, table, spec, "runs table", "a run")
        numbered = next(name for name in RUN_COLUMNS if name in table.columns)
        unnumbered = table.index[table[numbered].isna()]
        if len(unnumbered):
            raise UserError(
                f"{path}:{unnumbered[0] + 2}: a configuration with no {numbered}: number each "
                f"configuration's runs (0, 1, ...) in the {numbered} column"
            )
        column = spec.replay_column
        self.path = path
        self.spec = spec
        self.params = list(spec.space.params)
        self.rng = np.random.default_rng(seed)
        self.order: dict[str, list[int]] = {}  # each configuration's runs not drawn yet
        self.space = spec.space
        # the columns check_measures made numbers (a `metric` beside another objective may be
        # text: averaging it raised TypeError)
        measures = [name for name in dict.fromkeys((column, *replay.NUMBERS)) if name in table]
        # each configuration's runs, a failed one (an empty objective) None
        self.runs: dict[str, list[dict[str, Any] | None]] = {}
        self.rows: dict[str, dict[str, Any]] = {}  # each configuration's parameters
        seen: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}  # (config, run) -> line
        for line, (whole, row, measured) in enumerate(
            zip(
                table.to_dict(orient="records"),
                table[self.params].to_dict(orient="records"),
                table[measures].to_dict(orient="records"),
                strict=True,
            ),
            start=2,  # 1: the header
        ):
            clean = self._clean(row)
            name = space_key(clean)
            run = (name, str(whole[numbered]))
            if run in seen:
                # One run twice: rows told apart by a column the space leaves out, or a copy.
                before, first = seen[run]
                unnamed = replay.told_apart_by(whole, first, [*self.params, column, numbered])
                number = whole[numbered]
                if isinstance(number, float) and number.is_integer():
                    number = int(number)  # pandas reads 0 as 0.0 beside a gap
                said = (
                    f"{path}:{line}: {numbered} {number} of the configuration of line {before} "
                    "again"
                )
                if unnamed:
                    raise UserError(
                        f"{said}: the rows differ in {', '.join(unnamed)}, which the space does "
                        f"not name; add [params.{unnamed[0]}] to the tune file"
                    )
                raise UserError(f"{said}; number each configuration's runs once")
            seen[run] = (line, whole)
            self.rows.setdefault(name, clean)
            failed = math.isnan(replay.objective_of(spec, measured))
            self.runs.setdefault(name, []).append(None if failed else measured)
        # A configuration's truth: the mean of each measure over its runs, its objective and
        # constraints read from those means. One whose every run failed (past a memory wall)
        # has none: it fails each time it is drawn, as a failed row of a replay table does.
        self.truth = {
            name: {m: _mean([r[m] for r in runs if r is not None]) for m in measures}
            for name, runs in self.runs.items()
            if any(r is not None for r in runs)
        }
        self.means = {name: replay.objective_of(spec, row) for name, row in self.truth.items()}
        # The best a search of this space could find: a row outside it (a value the --space
        # leaves out) made every search look worse than it was.
        feasible = [
            m
            for name, m in self.means.items()
            if not replay.broken(spec, self.truth[name]) and self.space.names(self.rows[name])
        ]
        if not self.truth:
            raise UserError(
                f"{path}: every run of the runs table failed (each {column} is empty): there "
                "is no best to compare with"
            )
        if not feasible:
            limits = ", ".join(f"{k} = {v:g}" for k, v in spec.constraints.items())
            raise UserError(
                f"{path}: no configuration of the runs table meets the constraints on its "
                f"means ({limits}): there is no best to compare with; relax them"
            )
        self.best = min(feasible)

    def configurations(self) -> list[dict[str, Any]]:
        """The table's configurations the space can name: what a search over it can run."""
        return [row for row in self.rows.values() if self.space.names(row)]

    def _clean(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row's parameters as the space gives them (pandas reads 8 as 8.0 beside a gap)."""
        out = {}
        for name, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                continue  # a conditional parameter this configuration does not have
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            elif hasattr(value, "item"):
                value = value.item()
            out[name] = value
        return out

    def __call__(self, trial: int, params: dict[str, Any]) -> Evaluation:
        runs = self.runs.get(space_key(params))
        if runs is None:
            return Evaluation("failed", reason=f"not in the runs table: {params}")
        drawn = runs[self._next_run(space_key(params), len(runs))]
        if drawn is None:
            return Evaluation("failed", reason="this run failed in the runs table")
        loss = replay.objective_of(self.spec, drawn)
        refused = replay.broken(self.spec, drawn)
        return Evaluation(
            "infeasible" if refused else "ok",
            loss=None if refused else loss,
            metric=float(drawn[self.spec.replay_column]),
            seconds=replay.seconds_of(self.spec, drawn),
            cost_per_unit=replay.cost_of(self.spec, drawn),
            reason=refused,
        )

    def _next_run(self, name: str, count: int) -> int:
        """The next of a configuration's recorded runs, each once in a seeded order before any
        again: drawn with replacement, a replicate was the very run drawn before one time in
        `count`, a repeat no cloud gives, and the search took the twin figures for no noise
        (a zero-width interval that missed the true mean in 6 of 12 seeds, on two runs each)."""
        order = self.order.get(name)
        if not order:
            order = self.order[name] = [int(i) for i in self.rng.permutation(count)]
        return order.pop()

    def true_mean(self, params: dict[str, Any]) -> float:
        """The configuration's mean objective over its runs; inf where those means break a
        constraint (a recommendation the user could not keep) or every run failed."""
        name = space_key(params)
        if name not in self.truth or replay.broken(self.spec, self.truth[name]):
            return math.inf
        return self.means[name]

    def relative(self, loss: float) -> float:
        """A mean loss against the best, 1.0 at the best and above when worse."""
        if self.best > 0:
            return loss / self.best
        return 1 + (loss - self.best) / (abs(self.best) or 1.0)


def _mean(values: list[float]) -> float:
    """The mean of the values measured (nan where none is: a run without an rss_mb)."""
    measured = [v for v in values if not math.isnan(v)]
    return float(np.mean(measured)) if measured else math.nan


@dataclass
class NoisyScore:
    algorithm: str
    ratios: list[float] = field(default_factory=list)  # recommendation's true mean / best
    covered: list[bool] = field(default_factory=list)  # its interval covers its true mean
    intervals: int = 0  # seeds whose recommendation had an interval

    def within(self, share: float) -> int:
        return sum(r <= 1 + share for r in self.ratios)


def run_search(
    algorithm: str, space: Space, evaluate: Any, seed: int, budget: int, startup: int | None
) -> Recommendation | None:
    """One search, one trial at a time, to its recommendation."""
    engine = engines.make(algorithm, space, seed, startup, budget)
    seen = [
        (params, evaluation.ok_loss)
        for params, evaluation in engines.one_at_a_time(engine, evaluate, budget)
    ]
    return recommend(seen)


def compare_noisy(
    path: Path, spec: TuneSpec, algorithms: list[str], seeds: int, budget: int,
    startup: int | None,
) -> list[NoisyScore]:  # fmt: skip
    space = spec.space.holding(RunsReplay(path, spec).configurations())
    spec = dataclasses.replace(spec, space=space)
    out = []
    for algorithm in algorithms:
        score = NoisyScore(algorithm)
        for seed in range(seeds):
            runs = RunsReplay(path, spec, seed=10_000 + seed)
            chosen = run_search(algorithm, space, runs, seed, budget, startup)
            if chosen is None:
                score.ratios.append(math.inf)
                score.covered.append(False)
                continue
            truth = runs.true_mean(chosen.params)
            score.ratios.append(runs.relative(truth))
            if chosen.low is not None and chosen.high is not None:
                score.intervals += 1
                score.covered.append(chosen.low <= truth <= chosen.high)
            else:
                score.covered.append(False)
        out.append(score)
    return out


def compare_noisy_text(rows: list[NoisyScore], budget: int, seeds: int) -> str:
    from tabulate import tabulate

    table = [
        {
            "algorithm": r.algorithm,
            "within 5%": f"{r.within(0.05)}/{len(r.ratios)}",
            "within 2%": f"{r.within(0.02)}/{len(r.ratios)}",
            "recommended/best median": f"{np.median(r.ratios):.4f}",
            "p90 (worst 10%)": f"{stats.quantile(r.ratios, 0.9):.4f}",
            "interval covers": f"{sum(r.covered)}/{len(r.ratios)}"
            + ("" if r.intervals == len(r.ratios) else f" ({r.intervals} had one)"),
        }
        for r in rows
    ]
    return (
        f"{budget} evaluations per seed, {seeds} seeds, each drawing one recorded run; scored by "
        "the recommendation's mean over all its recorded runs against the best mean\n"
        + tabulate(table, headers="keys")
    )
