"""What a `fleet tune` file says: the space, the objective, the constraints and the budget,
checked; and how a trial's evaluation becomes the search's loss. The search (fleet/tune.py),
its evaluators (fleet/replay.py, fleet/trial.py) and its estimate (fleet/plan.py) import it,
and it imports none of them."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amibake import checks, cost, recipes, tomlfile
from amibake.errors import UserError, did_you_mean
from fleet.search import engines
from fleet.search.evaluation import Evaluation
from fleet.space import TYPE, Space, parse
from fleet.spec import COUNTS as BENCH_COUNTS
from fleet.spec import EXECUTORS, check_type, image_problem, line_of, metric_from

log = logging.getLogger("amibake")

ALGORITHMS = tuple(engines.ALGORITHMS)
OBJECTIVES = ("runtime", "metric", "cost")
CONSTRAINTS = ("max_seconds", "max_usd_per_unit", "max_rss_mb", "min_rate")
# What each constraint reads, as the reason names it when a trial lacks it.
CONSTRAINT_MEASURE = {
    "max_seconds": "time per unit",
    "max_usd_per_unit": "cost per unit (no price)",
    "max_rss_mb": "memory figure (the monitor took no sample: a run under 1 s, or no psutil)",
    "min_rate": "rate",
}
# A replay table's columns that are measurements, never parameters: the objective's default
# column, time and price per unit, and what the constraints read (rss_mb, rate).
MEASURES = ("metric", "seconds", "price_per_hour", "rss_mb", "rate")
# The engines that read configurations as features (fleet/search/model.py).
MODEL_ALGORITHMS = ("auto", "gp", "forest", "blend")
# A search's budget and its shape, and why no more: past these a number is a typo, and recorded
# it made a run whose budget was never spent (`compare --budget 100000000` ran without end).
MAX_TRIALS = 10000
COUNTS = {
    "trials": (1, MAX_TRIALS, "every trial is built and measured, and the model slows with each"),
    "parallel": (1, 256, "each trial in flight is an instance and a thread here"),
    "replicates": BENCH_COUNTS["replicates"],
    "seed": (0, 2**32 - 1, "a seed is 32 bits"),
    "startup_trials": (0, MAX_TRIALS, "they are trials of the budget"),
    "gain_replicates": (
        0,
        BENCH_COUNTS["replicates"][1],
        "runs of each build after the search; 0 measures no gain",
    ),
}
# After a cloud search: runs of the recommendation, the generic build and the standard levels,
# side by side (fleet/gain.py). Three is the fewest with an interval that means something.
GAIN_REPLICATES = 3
MAX_HOURS = 24 * 366.0  # a search that runs for more than a year is a typo
# The flag that gives a key on the command line, where it is not --KEY.
FLAGS = {"replay_column": "--objective-column", "max_usd": "--max-cost"}


@dataclass
class TuneSpec:
    space: Space
    objective: str = "runtime"
    algorithm: str = engines.DEFAULT
    seed: int = 0
    trials: int = 20
    startup_trials: int | None = None
    parallel: int = 1
    max_usd: float | None = None
    max_hours: float | None = None
    constraints: dict[str, float] = field(default_factory=dict)
    replay: Path | None = None
    replay_column: str = "metric"
    # The replay table's column of what each configuration costs an hour (a cluster's or a
    # node's): the search's price of it, beside or instead of the catalog's.
    price_column: str = "price_per_hour"
    types: list[str] = field(default_factory=list)
    recipe: str = ""
    replicates: int = 1
    executor: str = "ssh"  # or "batch": trials measured as Batch jobs
    expected_runtime_s: float | None = None  # one replicate, as declared: for the estimate
    gain_replicates: int = GAIN_REPLICATES
    raw: dict[str, Any] = field(default_factory=dict)
    image: str = ""  # an ECR image run with `command` (fleet/container.py); no recipe then
    command: str = ""
    metric: dict[str, Any] = field(default_factory=dict)  # the image's [metric], as written
    gpus: int = 0
    # What a trial is expected to cost before any has (the estimate's): the money budget counts
    # the trials in flight at it, not at nothing. Set by the caller; never recorded.
    trial_usd_guess: float = 0.0

    def instance_type(self, params: dict[str, Any]) -> str:
        """The type a configuration runs on: its own when the type is a parameter."""
        return str(params.get(TYPE) or self.types[0])

    @property
    def startup(self) -> int | None:
        """The start's trials as the user set them; None leaves them to the engine, which sizes
        its start to the budget it is given (a comparison's budget is not the file's trials)."""
        return self.startup_trials


def load(path: Path, overrides: dict[str, Any] | None = None, *, searched: bool = True) -> TuneSpec:
    """A tune file with command-line values on top (`overrides`: None for a flag not given)."""
    text, data = tomlfile.read(path, "tune file")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    data.update(given)
    return from_dict(data, str(path), text, path.parent, flags=given, searched=searched)


def from_dict(
    data: dict[str, Any],
    where: str,
    text: str = "",
    base: Path = Path("."),
    flags: Collection[str] = (),
    *,
    searched: bool = True,
) -> TuneSpec:
    """A tune spec, every value checked; `flags` are the keys the command line gave, whose
    errors name the flag rather than the file. `searched`: by its own algorithm (`compare`
    runs the algorithms it is given, and checks the space for them)."""

    def fail(key: str, message: str) -> UserError:
        if key in flags:
            return UserError(f"{FLAGS.get(key, '--' + key.replace('_', '-'))}: {message}")
        line = line_of(text, key)
        return UserError(f"{where}{f':{line}' if line else ''}: {key}: {message}")

    known = {
        "params", "objective", "algorithm", "seed", "trials", "startup_trials", "parallel",
        "max_usd", "max_hours", "constraints", "replay", "replay_column", "price_column",
        "types", "recipe",
        "replicates", "name", "executor", "expected_runtime", "max_cost", "gain_replicates",
        "image", "command", "metric", "gpus",
    }  # fmt: skip
    for key in data:
        if key not in known:
            raise fail(
                key, f"unknown key{did_you_mean(key, known)}; known: {', '.join(sorted(known))}"
            )
    cap_key = "max_cost" if "max_cost" in data and "max_usd" not in flags else "max_usd"
    if "max_cost" in data:
        # The money budget by the name bench files use (and --max-cost): one budget, two names.
        if "max_usd" in data and "max_usd" not in flags:
            raise fail("max_cost", "is max_usd by another name: give one of them")
        cap = data.pop("max_cost")
        problem = checks.number(cap, above=0)
        if problem:
            raise fail("max_cost", f"{problem} (leave it out for no limit)")
        if "max_usd" not in flags:
            data["max_usd"] = cap
    types = data.get("types", [])
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise fail("types", 'must be a list of instance types, e.g. ["c5a.large"]')
    types = [t.strip().lower() for t in types]  # as a bench file reads them: C5a.Large is c5a.large
    # A replay table builds nothing, nor does an image: any type EC2 names is in; a recipe needs
    # a catalog family.
    image = data.get("image")
    builds = data.get("replay") is None and not image
    for instance_type in types:
        check_type(instance_type, fail, build=builds)  # before a run is recorded, not per trial
    if types and isinstance(data.get("params"), dict) and TYPE in data["params"]:
        raise fail("types", "the types are named twice: keep types or params.instance_type")
    if len(types) > 1:
        # Every trial ran on the first (the others were priced and checked, never run).
        raise fail(
            "types",
            f"a tune's trials run on one type, not {len(types)}: to search over them, make the "
            f'type a parameter: [params.instance_type] kind = "categorical", values = '
            f"{json.dumps(types)}",
        )
    name = data.get("name", "")
    if not isinstance(name, str):  # a TOML date was accepted, then failed the run's record
        raise fail("name", f"must be a string (quoted), not {name!r}")
    space = parse(data.get("params"), where, text, types, build=builds)
    objective = data.get("objective", "runtime")
    if objective not in OBJECTIVES:
        raise fail("objective", f"{objective!r} is not one of {', '.join(OBJECTIVES)}")
    algorithm = data.get("algorithm", engines.DEFAULT)
    if algorithm not in ALGORITHMS:
        guess = did_you_mean(str(algorithm), ALGORITHMS)
        raise fail("algorithm", f"{algorithm!r} is not one of {', '.join(ALGORITHMS)}{guess}")
    for key, (low, high, why) in COUNTS.items():
        if key in data:
            problem = checks.integer(data[key], low, high, why)
            if problem:
                raise fail(key, problem)
    if data.get("gain_replicates") == 1:  # "95%: 0.94 to 0.94" from one run each
        raise fail(
            "gain_replicates",
            "1 run of each build gives a ratio with no interval: 0 measures no gain, 2 or more "
            "one with an interval",
        )
    startup = data.get("startup_trials")
    for key, cap in (("max_usd", None), ("max_hours", MAX_HOURS)):
        if key in data:
            problem = checks.number(data[key], above=0, at_most=cap, why="over a year")
            if problem:
                raise fail(key, f"{problem} (leave it out for no limit)")
    constraints = data.get("constraints", {})
    if not isinstance(constraints, dict):
        raise fail("constraints", f"a table of {', '.join(CONSTRAINTS)}")
    for key in constraints:
        if key not in CONSTRAINTS:  # named, with the one meant: "a table of ..." named neither
            guess = did_you_mean(key, CONSTRAINTS)
            raise fail(key, f"unknown constraint{guess}; known: {', '.join(CONSTRAINTS)}")
    for key, value in constraints.items():
        # A nan bound compares false with every trial: it would pass them all unchecked.
        problem = checks.number(value, above=0)
        if problem:
            raise fail(key, problem)
    replay = data.get("replay")
    if replay is not None and (not isinstance(replay, str) or not replay):
        raise fail("replay", f"must be the path of a CSV table, not {replay!r}")
    for column in ("replay_column", "price_column"):
        if not isinstance(data.get(column, ""), str):
            raise fail(column, "must be the name of a column of the replay table")
        if column in data and replay is None:  # read nowhere without a table
            raise fail(column, "names a column of a replay table: give replay = TABLE.csv too")
    if replay is not None and data.get("replay_column") in space.params:
        raise fail(
            "replay_column",
            f"{data['replay_column']!r} is a parameter the search sets, not what it minimises",
        )
    recipe = data.get("recipe")
    if not image:
        for key in ("command", "metric", "gpus"):
            if key in data:
                # Read only for an image; a recipe's command and metric are its [bench]'s.
                raise fail(key, "is for an image's tune (image = ...); drop it, or name the image")
    container = _container(data, space, fail) if image else {}
    if replay is None and not recipe and not image:
        raise fail(
            "recipe",
            "name the recipe to tune, or an image and its command (or a replay table to search "
            "offline)",
        )
    if recipe is not None:
        try:
            recipes.check_name(recipe)
        except UserError as exc:
            raise fail("recipe", str(exc)) from None
    if replay is None and not types and TYPE not in space.params:
        raise fail("types", "name the instance type (or make instance_type a parameter)")
    executor = data.get("executor", "ssh")
    if executor not in EXECUTORS:
        raise fail("executor", f"{executor!r} is not one of {', '.join(EXECUTORS)}")
    if executor == "batch" and data.get("max_usd") is not None and data.get("replay") is None:
        # As a bench's max_cost: Batch starts and stops the hosts, and fleet sees a job's host
        # only once the job has run, so a trial's cost would be counted short of what it spent.
        raise fail(cap_key, "caps tunes on the ssh executor only; batch trials run on the queue's")
    expected = data.get("expected_runtime")
    try:
        expected_s = None if expected is None else cost.seconds(expected)
    except ValueError as exc:
        raise fail("expected_runtime", str(exc)) from None
    if algorithm == "grid":
        space.size()  # a continuous parameter is refused here, not mid-search
    if algorithm in MODEL_ALGORITHMS and searched:
        from fleet.search.features import unexplained

        # A type the model cannot read as features: refused before the run is recorded (it
        # was refused when the engine was made, leaving a run that could never finish).
        unread = unexplained(space)
        if unread is not None:
            raise unread
    return TuneSpec(
        space=space,
        objective=objective,
        algorithm=algorithm,
        seed=int(data.get("seed", 0)),
        trials=int(data.get("trials", 20)),
        startup_trials=startup,
        parallel=int(data.get("parallel", 1)),
        max_usd=data.get("max_usd"),
        max_hours=data.get("max_hours"),
        constraints={k: float(v) for k, v in constraints.items()},
        # absolute: a resume from another directory reads the same table
        replay=(base / replay).resolve() if replay else None,
        replay_column=str(data.get("replay_column", "metric")),
        price_column=str(data.get("price_column", "price_per_hour")),
        types=types,
        recipe=str(data.get("recipe", "")),
        replicates=int(data.get("replicates", 1)),
        executor=str(executor),
        expected_runtime_s=expected_s,
        # An image has no builds: nothing for the gain to compare (refused when asked for).
        gain_replicates=int(data.get("gain_replicates", 0 if image else GAIN_REPLICATES)),
        raw=data,
        **container,
    )


def _container(data: dict[str, Any], space: Space, fail: Any) -> dict[str, Any]:
    """An image's tune (no recipe): its command, metric and GPUs, checked; the search tunes
    run-time parameters only (and the instance type), for there is nothing to compile."""
    command = str(data.get("command", ""))
    problem = image_problem(data["image"], str(data.get("recipe") or ""), command)
    if problem:
        raise fail("image", problem)
    for param in space.params.values():
        if param.stage == "compile":
            raise fail(
                "params",
                f"params.{param.name} is a compile flag and an image has nothing to compile: "
                'give it stage = "run" (an argument through {args}), or tune a recipe',
            )
    if any(p.stage == "run" for p in space.params.values()) and "{args}" not in command:
        raise fail("command", f"({command}) has no {{args}} to take the run parameters")
    if data.get("gain_replicates"):
        raise fail("gain_replicates", "the gain compares builds, and an image has none: drop it")
    raw_metric = data.get("metric", {})
    if not isinstance(raw_metric, dict):
        raise fail("metric", "must be a table: [metric] kind = ...")
    try:
        metric_from(raw_metric, {})
    except ValueError as exc:
        raise fail("metric", str(exc)) from None
    gpus = data.get("gpus", 0)
    problem = checks.integer(gpus, *BENCH_COUNTS["gpus"])
    if problem:
        raise fail("gpus", problem)
    image = str(data["image"]).strip()
    return {"image": image, "command": command, "metric": raw_metric, "gpus": gpus}


def new_engine(
    space: Space,
    algorithm: str,
    seed: int,
    startup: int | None,
    budget: int,
    noisy: bool | None = None,
) -> engines.Engine:
    """The search engine of a run (fleet/search/engines.py names them)."""
    return engines.make(algorithm, space, seed, startup, budget, noisy=noisy)


def loss_of(spec: TuneSpec, evaluation: Evaluation) -> float | None:
    return evaluation.loss if evaluation.state == "ok" else None


def broken_constraint(
    spec: TuneSpec,
    *,
    seconds: float | None = None,
    row: dict[str, Any] | None = None,
    usd_per_unit: float | None = None,
    rss_mb: float | None = None,
    rate: float | None = None,
) -> str:
    """The first service-level target the trial breaks, or ''."""
    limits = spec.constraints
    row = row or {}
    rss_mb = rss_mb if rss_mb is not None else row.get("rss_mb")
    rate = rate if rate is not None else row.get("rate")
    checks: list[tuple[str, Any, bool]] = [
        ("max_seconds", seconds, False),
        ("max_usd_per_unit", usd_per_unit, False),
        ("max_rss_mb", rss_mb, False),
        ("min_rate", rate, True),  # a floor; the others are ceilings
    ]
    for name, value, floor in checks:
        if name not in limits:
            continue
        if value is None or (isinstance(value, float) and math.isnan(value)):
            # Not passed unchecked (an empty cell in a replay table is no figure either): the
            # target is the user's, not optional.
            lacking = CONSTRAINT_MEASURE[name]
            return f"{name} {limits[name]:g} cannot be checked: the trial has no {lacking}"
        broken = float(value) < limits[name] if floor else float(value) > limits[name]
        if broken:
            return f"{name} {limits[name]:g} broken: {float(value):.4g}"
    return ""
