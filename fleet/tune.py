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
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from amibake import logs, progress
from amibake.errors import UserError
from amibake.runner import allow_runs, cancel_all
from fleet import control
from fleet.results import LOCAL_NOTE, Results, new_run_id
from fleet.search import engines
from fleet.search.evaluation import Evaluation, Evaluator
from fleet.search.record import (
    best,
    budget_changes,
    gain_spend,
    in_own_terms,
    is_rate,
    recommendation,
    recommendation_text,
    run_spend,
    trial_costs,
)
from fleet.spec import Metric, metric_label
from fleet.tune_spec import (
    ALGORITHMS,
    COUNTS,
    MAX_TRIALS,
    TuneSpec,
    broken_constraint,
    from_dict,
    load,
    loss_of,
    new_engine,
)

# The search, and (re-exported, as `tune.load` and `tune.best` read well at the call) what it
# is given (fleet/tune_spec.py) and what its record says (fleet/search/record.py).
__all__ = [
    "ALGORITHMS",
    "COUNTS",
    "MAX_TRIALS",
    "Budget",
    "Evaluation",
    "Outcome",
    "TuneSpec",
    "best",
    "broken_constraint",
    "budget_changes",
    "from_dict",
    "in_own_terms",
    "is_rate",
    "load",
    "loss_of",
    "new_engine",
    "note",
    "recommendation",
    "recommendation_text",
    "resumed",
    "run_spend",
    "search",
    "start",
    "trial_costs",
]

log = logging.getLogger("amibake")


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
    besides_usd: float = 0.0  # spent beside the trials: earlier controllers' gain measurements

    @classmethod
    def of_run(cls, spec: TuneSpec, results: Results, run_id: str) -> Budget:
        recorded = results.trials(run_id)
        return cls(
            spec,
            asked=int((recorded.state == "asked").sum()) if len(recorded) else 0,
            costs=list(trial_costs(results, run_id).values()),
            earlier_hours=_searched_hours(results, run_id),
            # A resume counted the trials alone: with a gain measured before it, the search
            # ran past the cap its user approved.
            besides_usd=gain_spend(results, run_id),
        )

    def capped(self, running: int) -> bool:
        """Whether one more trial would pass the money budget. The trials in flight will cost
        too: one more is asked only if they and it, at the mean trial's cost so far (before
        any, the estimate's), stay within it."""
        cap = self.spec.max_usd
        if cap is None:
            return False
        trials = sum(self.costs)
        mean = trials / len(self.costs) if self.costs else self.spec.trial_usd_guess
        spent = trials + self.besides_usd
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
    # The engine as first planned: a model search splits its budget into phases (a start, then
    # a race among finalists from 60% of it), so an engine made for an extended budget asks
    # other trials than the record holds. Built for the first budget, it replays the record
    # and goes on past that budget.
    first = results.require(run_id)["spec"].get("trials", TuneSpec.trials)  # the default if unset
    planned = replace(spec, trials=int(first))
    # A replay table's lookup is known to be without noise: no trial spent finding that out
    noisy = getattr(evaluate, "noisy", None)
    engine = new_engine(
        spec.space, spec.algorithm, spec.seed, planned.startup, planned.trials, noisy
    )
    if hasattr(evaluate, "results"):  # a cloud evaluator records its replicates in the run
        evaluate.run_id, evaluate.results = run_id, results  # type: ignore[attr-defined]
    in_flight = _replay_record(engine, results, run_id)
    budget = Budget.of_run(spec, results, run_id)
    # Who runs the search: `fleet status` and `fleet kill` find the controller by it.
    results.event(run_id, "searching", **control.this_process())
    done = 0
    # One line per trial told, with elapsed time and what is left at the pace so far.
    counter = progress.Counter(run_id, spec.trials, budget.asked - len(in_flight), noun="trials")
    metric = getattr(evaluate, "metric", None)  # what a trial's number is, where known

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
                        counter.advance(trial_line(trial, evaluation, metric))
                        done += 1
                        if stop_after is not None and done >= stop_after:
                            raise KeyboardInterrupt  # tests: a controller stopped mid-search
            except BaseException as exc:  # Ctrl-C, or the loop's own failure: none goes on
                stopped = cancel_all()
                why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed ({exc})"
                log.warning("[%s] %s: stopping %d trials in flight", run_id, why, stopped)
                _spent_in_flight(results, run_id, futures)
                raise
            finally:
                counter.close()
    except BaseException as exc:
        # Said in the record, so `fleet status` shows a stopped search and how to resume it
        # even while the process that ran it lives on (a caller that caught the interrupt).
        results.event(run_id, "stopped", reason=str(exc) or type(exc).__name__)
        raise
    finally:
        allow_runs()  # the pool's trials have all ended: this process's next runs may run
    spent = sum(budget.costs) + budget.besides_usd
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


def trial_line(trial: int, evaluation: Evaluation, metric: Metric | None) -> str:
    """A trial's end as its progress line says it: its metric named with its unit, and a
    geomean of several metrics said to be one ("geomean of every throughput=... match")."""
    if evaluation.state != "ok":
        return f"trial {trial} {evaluation.state}"
    if evaluation.metric is None:
        return f"trial {trial} ok"
    name = metric_label(metric) if metric is not None else "metric"
    return f"trial {trial} ok: {name} {evaluation.metric:.4g}"


def _spent_in_flight(
    results: Results, run_id: str, futures: dict[Future[Evaluation], tuple[int, dict[str, Any]]]
) -> None:
    """What the trials stopped in flight cost, once each has unwound: recorded (their results
    are not: a resume runs them again), so that a resumed search's money budget counts it. It
    was lost, and a resume could pass the cap the user approved."""
    for future, (trial, _) in futures.items():
        try:
            evaluation = future.result()
        except Exception:  # a crashed trial: it says nothing of its cost
            continue
        if evaluation.usd:
            results.event(run_id, "spent", trial=trial, usd=evaluation.usd)


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
