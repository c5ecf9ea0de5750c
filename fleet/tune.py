"""`fleet tune`: search a space with hyperopt's algorithms, driven ask/tell so that N trials run
at once and a new suggestion is made as soon as one ends (hyperopt's `fmin` would block).

The search state is reproducible: trials are asked and told in an order the database records,
with a seeded generator. Resume replays that record through a fresh search (same suggestions,
same results) and then evaluates the trials that were in flight when the controller died, so no
trial is lost or run twice.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Collection
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from amibake import checks, cost, logs, recipes, tomlfile
from amibake.errors import UserError
from amibake.runner import cancel_all
from fleet.results import LOCAL_NOTE, Results, new_run_id
from fleet.search import engines
from fleet.search.evaluation import Evaluation, Evaluator
from fleet.search.recommend import recommend
from fleet.space import TYPE, Space, parse
from fleet.spec import COUNTS as BENCH_COUNTS
from fleet.spec import EXECUTORS, check_type, line_of

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
# A search's budget and its shape, and why no more: past these a number is a typo, and recorded
# it made a run whose budget was never spent (`compare --budget 100000000` ran without end).
MAX_TRIALS = 10000
COUNTS = {
    "trials": (1, MAX_TRIALS, "every trial is built and measured, and the model slows with each"),
    "parallel": (1, 256, "each trial in flight is an instance and a thread here"),
    "replicates": BENCH_COUNTS["replicates"],
    "seed": (0, 2**32 - 1, "a seed is 32 bits"),
    "startup_trials": (0, MAX_TRIALS, "they are trials of the budget"),
}
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
    types: list[str] = field(default_factory=list)
    recipe: str = ""
    replicates: int = 1
    executor: str = "ssh"  # or "batch": trials measured as Batch jobs
    expected_runtime_s: float | None = None  # one replicate, as declared: for the estimate
    raw: dict[str, Any] = field(default_factory=dict)
    # What a trial is expected to cost before any has (the estimate's): the money budget counts
    # the trials in flight at it, not at nothing. Set by the caller; never recorded.
    trial_usd_guess: float = 0.0

    @property
    def startup(self) -> int:
        # hyperopt's default of 20 random trials is a third of a small budget: a quarter here.
        if self.startup_trials is not None:
            return self.startup_trials
        return max(3, min(20, self.trials // 4))


def load(path: Path, overrides: dict[str, Any] | None = None) -> TuneSpec:
    """A tune file with command-line values on top (`overrides`: None for a flag not given)."""
    text, data = tomlfile.read(path, "tune file")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    data.update(given)
    return from_dict(data, str(path), text, path.parent, flags=given)


def from_dict(
    data: dict[str, Any],
    where: str,
    text: str = "",
    base: Path = Path("."),
    flags: Collection[str] = (),
) -> TuneSpec:
    """A tune spec, every value checked; `flags` are the keys the command line gave, whose
    errors name the flag rather than the file."""

    def fail(key: str, message: str) -> UserError:
        if key in flags:
            return UserError(f"{FLAGS.get(key, '--' + key.replace('_', '-'))}: {message}")
        line = line_of(text, key)
        return UserError(f"{where}{f':{line}' if line else ''}: {key}: {message}")

    known = {
        "params", "objective", "algorithm", "seed", "trials", "startup_trials", "parallel",
        "max_usd", "max_hours", "constraints", "replay", "replay_column", "types", "recipe",
        "replicates", "name", "executor", "expected_runtime", "max_cost",
    }  # fmt: skip
    for key in data:
        if key not in known:
            raise fail(key, f"unknown key; known: {', '.join(sorted(known))}")
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
    for instance_type in types:
        check_type(instance_type, fail)  # before a run is recorded, not in every trial
    if types and isinstance(data.get("params"), dict) and TYPE in data["params"]:
        raise fail("types", "the types are named twice: keep types or params.instance_type")
    space = parse(data.get("params"), where, text, types)
    objective = data.get("objective", "runtime")
    if objective not in OBJECTIVES:
        raise fail("objective", f"{objective!r} is not one of {', '.join(OBJECTIVES)}")
    algorithm = data.get("algorithm", engines.DEFAULT)
    if algorithm not in ALGORITHMS:
        raise fail("algorithm", f"{algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    for key, (low, high, why) in COUNTS.items():
        if key in data:
            problem = checks.integer(data[key], low, high, why)
            if problem:
                raise fail(key, problem)
    startup = data.get("startup_trials")
    for key, cap in (("max_usd", None), ("max_hours", MAX_HOURS)):
        if key in data:
            problem = checks.number(data[key], above=0, at_most=cap, why="over a year")
            if problem:
                raise fail(key, f"{problem} (leave it out for no limit)")
    constraints = data.get("constraints", {})
    if not isinstance(constraints, dict) or any(k not in CONSTRAINTS for k in constraints):
        raise fail("constraints", f"a table of {', '.join(CONSTRAINTS)}")
    for key, value in constraints.items():
        # A nan bound compares false with every trial: it would pass them all unchecked.
        problem = checks.number(value, above=0)
        if problem:
            raise fail(key, problem)
    replay = data.get("replay")
    if replay is not None and (not isinstance(replay, str) or not replay):
        raise fail("replay", f"must be the path of a CSV table, not {replay!r}")
    if not isinstance(data.get("replay_column", ""), str):
        raise fail("replay_column", "must be the name of a column of the replay table")
    recipe = data.get("recipe")
    if replay is None and not recipe:
        raise fail("recipe", "name the recipe to tune (or a replay table to search offline)")
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
    expected = data.get("expected_runtime")
    try:
        expected_s = None if expected is None else cost.seconds(expected)
    except ValueError as exc:
        raise fail("expected_runtime", str(exc)) from None
    if algorithm == "grid":
        space.size()  # a continuous parameter is refused here, not mid-search
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
        replay=(base / replay) if replay else None,
        replay_column=str(data.get("replay_column", "metric")),
        types=types,
        recipe=str(data.get("recipe", "")),
        replicates=int(data.get("replicates", 1)),
        executor=str(executor),
        expected_runtime_s=expected_s,
        raw=data,
    )


def new_engine(
    space: Space, algorithm: str, seed: int, startup: int, budget: int
) -> engines.Engine:
    """The search engine of a run (fleet/search/engines.py names them)."""
    return engines.make(algorithm, space, seed, startup, budget)


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


@dataclass
class Outcome:
    run_id: str
    best: dict[str, Any] | None  # the best single trial, as observed
    trials: int
    recommended: dict[str, Any] | None = None  # what to use: see recommendation()
    spent_usd: float = 0.0  # what the run's trials cost, all its controllers together
    stopped: str = ""  # why it stopped with trials left (its money budget), if it did


@dataclass
class Budget:
    """What a search may still start: its trials, money and wall time are the run's, so a
    resumed search counts what its earlier controllers asked, spent and how long they ran."""

    spec: TuneSpec
    asked: int  # trials asked so far
    costs: list[float]  # USD of each trial that cost something
    earlier_hours: float  # earlier controllers' searching time
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def of_run(cls, spec: TuneSpec, results: Results, run_id: str) -> Budget:
        recorded = results.trials(run_id)
        return cls(
            spec,
            asked=int((recorded.state == "asked").sum()) if len(recorded) else 0,
            costs=list(trial_costs(results, run_id).values()),
            earlier_hours=_searched_hours(results, run_id),
        )

    def capped(self, running: int) -> bool:
        """Whether one more trial would pass the money budget. The trials in flight will cost
        too: one more is asked only if they and it, at the mean trial's cost so far (before
        any, the estimate's), stay within it."""
        cap = self.spec.max_usd
        if cap is None:
            return False
        spent = sum(self.costs)
        mean = spent / len(self.costs) if self.costs else self.spec.trial_usd_guess
        return spent >= cap or spent + (running + 1) * mean > cap

    def exhausted(self, running: int) -> bool:
        """No trial is to start now that `running` are in flight."""
        spec = self.spec
        if self.asked >= spec.trials:
            return True
        if self.capped(running):
            return True
        hours = self.earlier_hours + (time.monotonic() - self.started) / 3600
        return spec.max_hours is not None and hours >= spec.max_hours


def search(
    spec: TuneSpec,
    evaluate: Evaluator,
    results: Results,
    run_id: str,
    *,
    stop_after: int | None = None,
) -> Outcome:
    """Run (or finish) a search: `parallel` trials in flight, a new one asked as each ends."""
    with logs.run_log(results.log_path(run_id)):
        return _search(spec, evaluate, results, run_id, stop_after)


def _search(
    spec: TuneSpec, evaluate: Evaluator, results: Results, run_id: str, stop_after: int | None
) -> Outcome:
    engine = new_engine(spec.space, spec.algorithm, spec.seed, spec.startup, spec.trials)
    if hasattr(evaluate, "results"):  # a cloud evaluator records its replicates in the run
        evaluate.run_id, evaluate.results = run_id, results  # type: ignore[attr-defined]
    in_flight = _replay_record(engine, results, run_id)
    budget = Budget.of_run(spec, results, run_id)
    # Who runs the search: `fleet status` and `fleet kill` find the controller by it.
    results.event(run_id, "searching", pid=os.getpid(), host=socket.gethostname())
    done = 0

    try:
        with ThreadPoolExecutor(spec.parallel, thread_name_prefix="trial") as pool:
            futures: dict[Future[Evaluation], tuple[int, dict[str, Any]]] = {
                pool.submit(evaluate, t, p): (t, p) for t, p in in_flight
            }
            # The trials run on worker threads, which never see Ctrl-C (or SIGTERM): wherever
            # it lands here, their runs are stopped so each unwinds what it created now, instead
            # of the pool's exit waiting for them to finish their replicates first.
            try:
                while True:
                    while len(futures) < spec.parallel and not budget.exhausted(len(futures)):
                        asked_now = engine.ask()
                        if asked_now is None:
                            break
                        trial, params = asked_now
                        budget.asked += 1
                        results.trial(run_id, trial, "asked", params)
                        futures[pool.submit(evaluate, trial, params)] = (trial, params)
                    if not futures:
                        break
                    finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for future in finished:
                        trial, params = futures.pop(future)
                        try:
                            evaluation = future.result()
                        except Exception as exc:  # one trial's crash must not end the search
                            evaluation = Evaluation("failed", reason=f"{type(exc).__name__}: {exc}")
                        engine.tell(trial, loss_of(spec, evaluation))
                        _record(results, run_id, trial, params, evaluation)
                        if evaluation.usd:
                            budget.costs.append(evaluation.usd)
                        done += 1
                        if stop_after is not None and done >= stop_after:
                            raise KeyboardInterrupt  # tests: a controller stopped mid-search
            except KeyboardInterrupt:
                stopped = cancel_all()
                log.warning("[%s] interrupted: stopping %d trials in flight", run_id, stopped)
                raise
    except BaseException as exc:
        # Said in the record, so `fleet status` shows a stopped search and how to resume it
        # even while the process that ran it lives on (a caller that caught the interrupt).
        results.event(run_id, "stopped", reason=str(exc) or type(exc).__name__)
        raise
    spent = sum(budget.costs)
    reason = ""
    if budget.asked < spec.trials and budget.capped(0):
        # Stopped by the money budget with trials left: said so, and resumable with a new one.
        reason = f"max cost ${spec.max_usd:g}: one more trial would pass it"
        log.warning("[%s] stopped: %s, %d of %d trials", run_id, reason, budget.asked, spec.trials)
        results.event(run_id, "stopped", reason=reason, cap=spec.max_usd, spent=spent)
    else:
        results.event(run_id, "finished")
    return Outcome(
        run_id,
        best(results, run_id),
        budget.asked,
        recommendation(results, run_id),
        spent_usd=spent,
        stopped=reason,
    )


def _record(
    results: Results, run_id: str, trial: int, params: dict[str, Any], evaluation: Evaluation
) -> None:
    """A finished trial into the run's record: what it cost, then its result."""
    if evaluation.usd:
        results.event(run_id, "spent", trial=trial, usd=evaluation.usd)
    results.trial(
        run_id,
        trial,
        evaluation.state,
        params,
        loss=evaluation.loss,
        metric=evaluation.metric,
        seconds=evaluation.seconds,
        cost_per_unit=evaluation.cost_per_unit,
        reason=evaluation.reason,
        manifest=evaluation.manifest,
    )
    if evaluation.state != "ok":
        log.info("[%s] trial %d %s: %s", run_id, trial, evaluation.state, evaluation.reason)


def _searched_hours(results: Results, run_id: str) -> float:
    """How long earlier controllers of this run searched: each from its start to the last trial
    it recorded (a controller killed while idle is not charged for the time after)."""
    starts = [at for at, kind, _ in results.events(run_id) if kind == "searching"]
    recorded = results.trials(run_id)
    times = recorded["at"] if len(recorded) else pd.Series(dtype=float)
    seconds = 0.0
    for start, end in zip(starts, [*starts[1:], math.inf], strict=False):  # the last: no end
        inside = times[(times >= start) & (times < end)]
        if len(inside):
            seconds += float(inside.max()) - start
    return seconds / 3600


def _replay_record(
    engine: engines.Engine, results: Results, run_id: str
) -> list[tuple[int, dict[str, Any]]]:
    """Bring a fresh search to the recorded state; return the trials asked but never told."""
    recorded = results.trials(run_id)
    pending: dict[int, dict[str, Any]] = {}
    for row in recorded.itertuples():
        params = json.loads(row.params)
        if row.state == "asked":
            asked = engine.ask()
            if asked is None or asked[0] != row.trial or asked[1] != params:
                raise UserError(
                    f"run {run_id}: the search does not replay as recorded (trial {row.trial}); "
                    "was the tune file changed? Start a new run instead"
                )
            pending[int(row.trial)] = params
        else:
            engine.tell(int(row.trial), row.loss if row.state == "ok" else None)
            pending.pop(int(row.trial), None)
    return sorted(pending.items())


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
    chosen = recommend((json.loads(row.params), float(row.loss)) for row in ok.itertuples())
    if chosen is None:
        return None
    out = chosen.as_dict()
    same = ok[ok.params.map(lambda text: json.loads(text) == chosen.params)]
    metrics = same.metric.dropna()
    out["metric"] = float(metrics.mean()) if len(metrics) else None
    return out


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


def resumed(results: Results, run_id: str, changes: dict[str, Any]) -> TuneSpec:
    """The spec a resumed search runs with: the run's own, with the budget changes made when
    it was resumed before and now (recorded, as the run's spec is never rewritten)."""
    record = results.require(run_id)
    raw = {**record["spec"], **budget_changes(results, run_id)}
    # Checked before it is recorded; a bad change is said of its flag.
    spec = from_dict({**raw, **changes}, f"run {run_id}", flags=changes)
    if changes:
        results.event(run_id, "budget", **changes)
    return spec


def trial_costs(results: Results, run_id: str) -> dict[int, float]:
    """USD each trial of the run cost, by trial (those that cost nothing are not recorded). A
    trial run twice (its controller killed between its cost and its result) cost both runs."""
    costs: dict[int, float] = {}
    for _, kind, detail in results.events(run_id):
        if kind == "spent":
            costs[detail["trial"]] = costs.get(detail["trial"], 0.0) + detail["usd"]
    return costs


def budget_changes(results: Results, run_id: str) -> dict[str, Any]:
    """--trials and --parallel given on resuming the run, the latest of each."""
    changes: dict[str, Any] = {}
    for _, kind, detail in results.events(run_id):
        if kind == "budget":
            changes.update(detail)
    return changes


def evaluator(spec: TuneSpec, config: Any) -> Evaluator:
    """How trials are evaluated: looked up in a replay table, or built and run on the cloud."""
    if spec.replay is not None:
        from fleet.replay import ReplayEvaluator

        return ReplayEvaluator(spec.replay, spec)
    from fleet.trial import CloudEvaluator

    # What the workload takes, before anything else is asked of the cloud or the prices.
    spec.space.check_workload(recipes.load(spec.recipe, config.recipes_dir))
    return CloudEvaluator(spec, config)


def start(results: Results, spec: TuneSpec, cloud_name: str, region: str) -> str:
    run_id = new_run_id("ft")
    raw = {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.raw.items()}
    if spec.replay is not None:
        raw["replay"] = str(spec.replay)
    results.create_run(run_id, "tune", raw, cloud_name, region, note(spec, cloud_name))
    return run_id


def note(spec: TuneSpec, cloud_name: str) -> str:
    """What the report says first: where the trials' figures came from, when not from separate
    machines. On the local cloud the trials in flight also share this machine's cores, so a
    run-time parameter such as threads is measured under that sharing."""
    if spec.replay is not None:
        return f"Replay: every trial was looked up in {spec.replay}, not run."
    if cloud_name != "local":
        return ""
    if spec.parallel <= 1:
        return LOCAL_NOTE
    return (
        f"{LOCAL_NOTE} {spec.parallel} trials ran at a time on its {os.cpu_count()} cores, so "
        "run-time parameters such as threads were measured sharing them."
    )
