"""Replay: trials looked up in a recorded table (one row per configuration) instead of run, and
`fleet tune compare`, which runs each algorithm over many seeds on such a table and says how close
each got to the table's optimum, and how soon. Real measurements, compared offline: the
algorithms see the same table, so their difference is the search's, not the machine's."""

from __future__ import annotations

import io
import itertools
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from amibake.errors import UserError
from fleet import stats
from fleet.search import engines
from fleet.search.evaluation import Evaluation
from fleet.space import key as space_key
from fleet.tune_spec import (
    MEASURES,
    TuneSpec,
    broken_constraint,
)

log = logging.getLogger("amibake")
# Below this many rows, or with more columns than this, a table's columns are all taken for
# parameters (fleet.replay.configuration_columns: it tries every subset of the columns).
KEYED_FROM = 8
MAX_KEY_COLUMNS = 12
# A column of a table searched without a tune file that says what each configuration costs an
# hour, by its name (price, hourly, usd_per_hour, cost_per_hour, $/h), not a cost per unit of
# work nor a rate (jobs_per_hour): the search's price of each configuration
# (TuneSpec.price_column).
PRICE_NAME = re.compile(
    r"^(?!.*(unit|total)).*(price|hourly|(usd|dollars?|cost)_?(per_?|/ ?)h(ou)?r?\b|\$ ?/ ?h)", re.I
)
# The measures a table's rows are read with besides the objective's column: made numbers.
NUMBERS = ("price_per_hour", "seconds", "rss_mb", "rate")
# The columns a replay table needs for each constraint to be checked on its rows.
CONSTRAINT_COLUMNS = {
    "max_seconds": ("seconds",),
    "max_usd_per_unit": ("seconds", "price_per_hour"),
    "max_rss_mb": ("rss_mb",),
    "min_rate": ("rate",),
}


def read_table(path: Path) -> pd.DataFrame:
    """A replay table, as UTF-8 CSV; a one-line UserError naming it otherwise. Only an empty
    cell is missing: "nan" or "-inf" written in a cell is a value, refused where it is no
    measurement (pandas' default reads "nan", "NA" and "null" as missing, silently)."""
    from amibake.tomlfile import read_text

    text = read_text(path, "replay table")  # a Latin-1 table raised UnicodeDecodeError
    _check_shape(path, text)
    try:
        table = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"{path}: cannot read the replay table: {exc}") from None
    if table.empty:  # a header alone: its parameters then had no values, said as the space's
        raise UserError(
            f"{path}: the replay table has a header ({', '.join(map(str, table.columns))}) but "
            "no rows: add a row per configuration measured"
        )
    return table


def _check_shape(path: Path, text: str) -> None:
    """Every row as wide as the header, whose columns each have a name of their own. pandas read
    a first row one field too wide as an index and shifted every column left (the table then
    measured nothing, silently); a short row's missing cells as failed runs; a blank header as
    "Unnamed: 1" and a repeated one as "threads.1"."""
    import csv

    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        return  # empty: pandas says so
    names = [name.strip() for name in header]
    for number, name in enumerate(names, start=1):
        if not name:
            raise UserError(f"{path}:1: column {number} has no name: name it in the header")
        if names.index(name) != number - 1:
            raise UserError(f"{path}:1: the column {name} appears twice: rename one")
    blank = 0  # the line of a blank row, until a row follows it
    for row in reader:
        if not row:
            blank = blank or reader.line_num
            continue
        if blank:
            # pandas skips it, and every line named after it was one too high
            raise UserError(f"{path}:{blank}: a blank line inside the table: remove it")
        if len(row) != len(header):
            raise UserError(
                f"{path}:{reader.line_num}: {len(row)} fields where the header has "
                f"{len(header)} ({', '.join(names)}): a comma too many or too few"
            )


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def told_apart_by(row: dict[str, Any], other: dict[str, Any], named: list[str]) -> list[str]:
    """The columns, other than `named` and the measures, in which two rows of one configuration
    differ: a parameter the space leaves out (the table is not short of aggregating then)."""
    return [
        name
        for name in row
        if name not in named and name not in NUMBERS and str(row[name]) != str(other.get(name))
    ]


def check_measures(path: Path, table: pd.DataFrame, spec: TuneSpec, kind: str, row: str) -> None:
    """That the table has the columns the spec's parameters, objective and constraints read, and
    that its measures are finite numbers or empty (a `row` that failed): made floats in place.
    A replay table and a runs table are read alike."""
    column = spec.replay_column
    needed = {name: "" for name in [column, *spec.space.params]}
    if spec.objective == "cost":
        needed["price_per_hour"] = ""
    if spec.price_column != "price_per_hour":  # named, not the default a table may leave out
        needed.setdefault(spec.price_column, " (for price_column)")
    # A constraint whose measure the table lacks would pass every trial unchecked.
    timed = spec.objective in ("runtime", "cost")  # the objective's column is the time
    for constraint in spec.constraints:
        for name in CONSTRAINT_COLUMNS[constraint]:
            if not (name == "seconds" and timed):
                needed.setdefault(name, f" (for constraints.{constraint})")
    missing = [f"{name}{why}" for name, why in needed.items() if name not in table.columns]
    if missing:
        raise UserError(
            f"{path}:1: the {kind} has no column {', '.join(missing)} "
            f"(columns: {', '.join(table.columns)})"
        )
    # Finite numbers or nothing: an empty cell is a configuration whose measurement failed.
    # A -inf metric was taken for the best, and compare printed nan for every ratio.
    for name in dict.fromkeys((column, *NUMBERS, spec.price_column)):
        if name not in table.columns:
            continue
        numbers = pd.to_numeric(table[name], errors="coerce")
        finite = np.isfinite(numbers.to_numpy(dtype=float, na_value=np.nan))
        bad = table[name].notna().to_numpy() & ~finite
        if bad.any():
            first = int(bad.nonzero()[0][0])
            line = first + 2  # 1: the header
            value = table[name].iloc[first]
            what = "a finite number" if _is_float(str(value)) else "a number"
            raise UserError(
                f"{path}:{line}: {name} {str(value)!r} is not {what} "
                f"(leave the cell empty for {row} that failed)"
            )
        table[name] = numbers.astype(float)
    # A price, and a time, is above 0: a price of -0.1 was recommended as a negative cost, one of
    # 0 as free, a runtime of -3 s as the fastest.
    above_zero = {spec.price_column: "price", "price_per_hour": "price", "seconds": "time"}
    if timed:
        above_zero[column] = "time"
    for name, what in above_zero.items():
        if name not in table.columns:
            continue
        low = table[name].notna().to_numpy() & ~(table[name].to_numpy(dtype=float) > 0)
        if low.any():
            first = int(low.nonzero()[0][0])
            raise UserError(
                f"{path}:{first + 2}: {name} {table[name].iloc[first]:g} is not a {what} above 0 "
                f"(leave the cell empty for {row} that failed)"
            )


def _text(value: Any) -> str:
    """A parameter's value as a key compares it: "" for none; a whole float as the integer
    (pandas reads a column of numbers with a gap as floats: 128.0, which matched no 128 of the
    tune file, and the row was dropped without a word); text without its edge spaces."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def objective_of(spec: TuneSpec, row: dict[str, Any]) -> float:
    """A row's objective, minimised: its column, or for cost that time at the row's price."""
    value = float(row[spec.replay_column])
    if spec.objective == "cost":
        return value * float(row["price_per_hour"]) / 3600
    return value


def seconds_of(spec: TuneSpec, row: dict[str, Any]) -> float | None:
    """Seconds per unit of work: a `seconds` column, else the objective's column when it is a
    time (runtime, or cost's seconds); a custom metric's table has none."""
    if "seconds" in row:
        return float(row["seconds"])
    return float(row[spec.replay_column]) if spec.objective in ("runtime", "cost") else None


def cost_of(spec: TuneSpec, row: dict[str, Any]) -> float | None:
    """USD per unit of work, where the table prices the row."""
    seconds, price = seconds_of(spec, row), row.get("price_per_hour")
    if seconds is None or price is None or (isinstance(price, float) and math.isnan(price)):
        return None
    return seconds * float(price) / 3600


def broken(spec: TuneSpec, row: dict[str, Any]) -> str:
    """The first of the spec's constraints the row breaks, or ''."""
    return broken_constraint(
        spec, seconds=seconds_of(spec, row), row=row, usd_per_unit=cost_of(spec, row)
    )


class ReplayEvaluator:
    """Trials looked up in a recorded table (one row per configuration) instead of run."""

    noisy = False  # a lookup gives the same figure each time: a search spends no noise check

    def __init__(self, path: Path, spec: TuneSpec) -> None:
        # A table holds configurations, looked up exactly: a continuous parameter's draws (a
        # uniform 1.4417...) are never in it, and every trial failed "not in the replay table".
        if spec.space.continuous:
            raise UserError(
                f"{path}: a replay table holds configurations, not ranges: "
                f"{', '.join(spec.space.continuous)} is continuous; make it int or categorical "
                "with the table's values"
            )
        table = read_table(path)
        column = spec.replay_column
        check_measures(path, table, spec, "replay table", "a configuration")
        if table[column].isna().all():
            raise UserError(f"{path}: the replay table has no {column} value on any row")
        self.path = path
        self.spec = spec
        self.column = column
        self.params = list(spec.space.params)
        self.table: dict[tuple[str, ...], dict[str, Any]] = {}
        self.lines: dict[tuple[str, ...], int] = {}  # where each configuration is
        for line, row in enumerate(table.to_dict(orient="records"), start=2):  # 1: the header
            key = self._key(row)
            if key in self.lines:  # which measurement is the configuration's? Not ours to pick
                said = ", ".join(f"{p}={v}" for p, v in zip(self.params, key, strict=True))
                unnamed = told_apart_by(row, self.table[key], [*self.params, column])
                if unnamed:
                    raise UserError(
                        f"{path}:{line}: the configuration of line {self.lines[key]} again "
                        f"({said}): the rows differ in {', '.join(unnamed)}, which the space "
                        f"does not name; add [params.{unnamed[0]}] to the tune file"
                    )
                raise UserError(
                    f"{path}:{line}: the configuration of line {self.lines[key]} again "
                    f"({said}); a replay table has one row per configuration (aggregate "
                    "repeats first)"
                )
            self.lines[key] = line
            self.table[key] = row

    def _key(self, values: dict[str, Any]) -> tuple[str, ...]:
        return tuple(_text(values.get(p)) for p in self.params)

    def configurations(self) -> list[dict[str, Any]]:
        """The table's configurations in the space's own values: what a search over the table
        can run (Space.holding). A row the space cannot name (a value it does not list) is
        none of them."""
        return [chosen for chosen, _ in self._named()]

    def prices(self) -> dict[str, float]:
        """What each configuration costs an hour, by key (Space.holding), where the table has
        the spec's price column and a price above 0 on the configuration's row: a run's price
        is known before it runs, whether or not it succeeded."""
        column = self.spec.price_column
        out = {}
        for chosen, row in self._named():
            value = row.get(column)
            if isinstance(value, int | float) and math.isfinite(value) and value > 0:
                out[space_key(chosen)] = float(value)
        return out

    def _named(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        space = self.spec.space
        named = {name: {_text(v): v for v in space.params[name].options()} for name in self.params}
        for key, row in self.table.items():
            texts = zip(self.params, key, strict=True)
            chosen = {name: named[name].get(text) for name, text in texts if text != ""}
            if None not in chosen.values() and space.names(chosen):
                yield chosen, row

    def _measured(self) -> list[float]:
        """The objective of every configuration the table has a measurement for that meets the
        constraints: the optimum a search is scored against is one it may recommend (the best
        row breaking max_seconds made every search look worse than it was)."""
        values = (
            objective_of(self.spec, row)
            for _, row in self._named()  # of this space: one outside it no search could find
            if not broken(self.spec, row)
        )
        return [value for value in values if not math.isnan(value)]

    def optimum(self) -> float:
        measured = self._measured()
        if not measured:
            limits = ", ".join(f"{k} = {v:g}" for k, v in self.spec.constraints.items())
            raise UserError(
                f"{self.path}: no configuration of the replay table meets the constraints "
                f"({limits}): there is no optimum to compare with; relax them"
            )
        return min(measured)

    def near_optimum(self, tolerance: float) -> int:
        """How many of the table's configurations are within `tolerance` of its optimum (as
        `compare` measures it): the size of the target a search has to hit."""
        optimum = self.optimum()
        scale = abs(optimum) or 1.0
        return sum(1 for value in self._measured() if value - optimum <= tolerance * scale)

    def __call__(self, trial: int, params: dict[str, Any]) -> Evaluation:
        key = self._key(params)
        row = self.table.get(key)
        if row is None:
            return Evaluation("failed", reason=f"not in the replay table: {params}")
        value = objective_of(self.spec, row)
        if math.isnan(value):
            line = self.lines[key]
            empty = self.column if pd.isna(row[self.column]) else "price_per_hour"
            return Evaluation("failed", reason=f"no {empty} on line {line} of the replay table")
        # Time and cost per unit where the table has them: the report's Pareto front and its
        # time or cost recommendation work on a replayed search as on a run one.
        seconds, cost = seconds_of(self.spec, row), cost_of(self.spec, row)
        refused = broken(self.spec, row)
        return Evaluation(
            "infeasible" if refused else "ok",
            loss=None if refused else value,
            metric=float(row[self.column]),
            seconds=seconds,
            cost_per_unit=cost,
            reason=refused,
        )


@dataclass
class Comparison:
    algorithm: str
    ratios: list[float]  # best found / optimum, per seed
    to_2pct: list[int | None]  # trials needed to get within 2%, per seed (None: never)
    to_5pct: list[int | None]
    # best so far / optimum after each trial, per seed (nan before a feasible trial): the
    # convergence curves `compare` plots
    curves: list[list[float]] = field(default_factory=list)


def configuration_columns(table: pd.DataFrame, names: list[str]) -> list[str]:
    """The columns among `names` that make a row's configuration: the fewest that tell every row
    apart and either hold half or more of their combinations (a grid) or leave aside only
    columns that look measured (`_measured`: a table laid out by total vCPUs), whole numbers
    and words before fractions, fewest values first. The others were measured (a runtime, a
    price per hour) or describe them (a type's vCPUs, a cluster's total): a public table of
    cluster runs keeps them under names of its own, and searched as parameters they made a
    space of every runtime times every configuration, nearly none of it in the table. A column
    with a value per row is no parameter beside others (a grid's parameter repeats); one with an
    empty cell is none either (a failed run's runtime). Where no columns qualify (a small table,
    a sample of a space rather than its grid), all are parameters, as written."""
    if len(table) < KEYED_FROM or len(names) > MAX_KEY_COLUMNS:
        return list(names)
    values = {n: int(table[n].nunique()) for n in names}
    usable = [
        n
        for n in names
        if not table[n].isna().any() and (len(names) == 1 or values[n] < len(table))
    ]
    # Whole numbers and words first: an hourly price tells the rows of a table laid out by
    # total apart as well as its node count does, and a fraction is seldom a chosen value
    chosen = [n for n in usable if not _fractional(table[n])]
    for pool in (chosen, usable):
        for size in range(1, len(pool) + 1):
            fits = []
            for subset in itertools.combinations(pool, size):
                if table.duplicated(list(subset)).any():
                    continue
                grid = math.prod(values[n] for n in subset)
                # A table laid out by the cluster's total (node counts set per size: 16-112
                # vCPUs makes 15 node counts for 84 rows) holds less than half its grid, yet is
                # no sample of a space: the columns it sets aside are measured by their values.
                rest = [n for n in names if n not in subset]
                if 2 * len(table) >= grid or all(_measured(table[n]) for n in rest):
                    fits.append((grid, list(subset)))
            if fits:
                return min(fits)[1]
    return list(names)


def _fractional(column: pd.Series) -> bool:
    numbers = pd.to_numeric(column, errors="coerce")
    return bool(numbers.notna().all() and (numbers % 1 != 0).any())


def _measured(column: pd.Series) -> bool:
    """Whether a column's values look measured rather than chosen: a gap (a failed run's
    runtime), fractions (seconds, dollars), or a value of its own on most rows."""
    if column.isna().any():
        return True
    return _fractional(column) or column.nunique() > len(column) / 2


def space_from_table(path: Path, column: str, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """With no tune file, `compare` searches the table's own configurations: every column but
    the objective and the other measurements a replay table may hold (MEASURES, and those
    `configuration_columns` sets aside by their values) is a categorical parameter of its
    distinct values."""
    table = read_table(path)
    if column not in table.columns:
        raise UserError(
            f"{path}:1: the replay table has no column {column} (columns: "
            f"{', '.join(table.columns)}); name it with --objective-column"
        )
    names = [n for n in table.columns if n != column and n not in MEASURES and n not in exclude]
    chosen = configuration_columns(table, names)
    skipped = [n for n in names if n not in chosen]
    if skipped:
        log.info(
            "%s: searching %s (the fewest columns that tell the rows apart); %s read as measured "
            "or describing them, not searched (give the space with --space to search one)",
            path,
            ", ".join(chosen),
            ", ".join(skipped),
        )
    priced = [n for n in skipped if PRICE_NAME.search(str(n)) and _priced(table[n])]
    if priced:
        log.info("%s: %s read as each configuration's price per hour", path, priced[0])
    params = {}
    for name in chosen:
        if table[name].isna().any():
            line = int(table[name].isna().to_numpy().nonzero()[0][0]) + 2  # 1: the header
            raise UserError(
                f"{path}:{line}: {name} is empty; a table searched without --space needs every "
                "parameter on every row (a conditional parameter's space goes in --space)"
            )
        values = sorted(table[name].unique().tolist())
        params[name] = {
            "kind": "categorical",
            "values": [v.item() if hasattr(v, "item") else v for v in values],
        }
    found = {"params": params, "replay": str(path), "replay_column": column, "objective": "metric"}
    return found | ({"price_column": priced[0]} if priced else {})


def _priced(column: pd.Series) -> bool:
    """Whether a column could be each row's price: a number above 0 on every row (a failed
    run's price is as known as a finished one's)."""
    numbers = pd.to_numeric(column, errors="coerce")
    return bool(numbers.notna().all() and (numbers > 0).all())


def compare(
    spec: TuneSpec, evaluator: ReplayEvaluator, algorithms: list[str], seeds: int, budget: int
) -> list[Comparison]:
    """Each algorithm over `seeds` seeds on the replay table, `budget` trials each, one at a time
    (what matters here is the sequence of suggestions, not wall time)."""
    optimum = evaluator.optimum()
    scale = abs(optimum) or 1.0
    space = spec.space.holding(evaluator.configurations(), evaluator.prices())
    out = []
    for algorithm in algorithms:
        comparison = Comparison(algorithm, [], [], [])
        for seed in range(seeds):
            engine = engines.make(
                algorithm, space, seed, spec.startup, budget, noisy=evaluator.noisy
            )
            best_so_far = math.inf
            curve: list[float] = []
            reached: dict[float, int | None] = {0.02: None, 0.05: None}
            trials = engines.one_at_a_time(engine, evaluator, budget)
            for index, (_, evaluation) in enumerate(trials):
                if evaluation.state == "ok" and evaluation.loss is not None:
                    best_so_far = min(best_so_far, evaluation.loss)
                for tolerance in reached:
                    if reached[tolerance] is None and best_so_far - optimum <= tolerance * scale:
                        reached[tolerance] = index + 1
                curve.append(
                    _relative(best_so_far, optimum) if best_so_far < math.inf else math.nan
                )
            comparison.ratios.append(_relative(best_so_far, optimum))
            comparison.curves.append(curve)
            comparison.to_2pct.append(reached[0.02])
            comparison.to_5pct.append(reached[0.05])
        out.append(comparison)
    return out


def _relative(best: float, optimum: float) -> float:
    """best / optimum, 1.0 at the optimum and above it when worse, whatever the optimum's sign
    (a negated rate's is negative): then 1 + the distance as a share of the optimum."""
    if optimum > 0:
        return best / optimum
    return 1 + (best - optimum) / (abs(optimum) or 1.0)


def blind_chance(configurations: int, near: int, budget: int) -> float:
    """The chance that `budget` distinct configurations, drawn blindly, include one of the `near`
    ones: what a search must beat to have learnt anything from the table."""
    miss = 1.0
    for drawn in range(min(budget, configurations)):
        miss *= max(configurations - near - drawn, 0) / (configurations - drawn)
    return 1.0 - miss


def compare_text(
    rows: list[Comparison], budget: int, searched: int, near: dict[float, int], grid_size: int
) -> str:
    """The comparison's table, with what a blind search would find: `searched` configurations
    of the table, of a grid of `grid_size` that its parameters' values make."""
    from tabulate import tabulate

    def median_trials(values: list[int | None]) -> str:
        hit = sorted(v for v in values if v is not None)
        if not hit:
            return "never"
        return f"{int(np.median(hit))} ({len(hit)}/{len(values)} seeds)"

    table = [
        {
            "algorithm": r.algorithm,
            "best/optimum median": f"{np.median(r.ratios):.4f}",
            "p90 (worst 10%)": f"{stats.quantile(r.ratios, 0.9):.4f}",
            "trials to 2%": median_trials(r.to_2pct),
            "trials to 5%": median_trials(r.to_5pct),
        }
        for r in rows
    ]
    # A table whose optimum stands alone (one configuration within 2%, its neighbours inside
    # the machine's noise) is a needle no algorithm finds quickly: say how big the target is.
    targets = "; ".join(
        f"{near[t]} within {t:.0%} (a blind draw of {budget} hits one "
        f"{blind_chance(searched, near[t], budget):.0%} of the time)"
        for t in sorted(near)
    )
    # A table that holds part of its grid (node counts set per size, a configuration never
    # run) is searched over what it holds: say so, a search on the cloud would have the grid.
    part = f" (of a grid of {grid_size}: the rest are not in it)" if searched < grid_size else ""
    return (
        f"{budget} trials per seed over the table's {searched} configurations{part}; "
        "best/optimum 1.0000 is the table's optimum\n"
        f"of the {searched}: {targets}\n" + tabulate(table, headers="keys")
    )
