"""`fleet tune`: the search on replay tables (exact, reproducible, robust to bad trials,
resumable), bad input, and a real search on the local cloud."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from amibake import config
from amibake.cloud import Cloud
from amibake.journal import Journal
from amibake.local import control as local_control
from fleet import bench, control, evaluators, tune
from fleet.cli import main
from fleet.replay import ReplayEvaluator, blind_chance, compare, space_from_table
from fleet.results import Results
from fleet.space import Space
from tests.helpers import ctrl_c_when, tagged_alive, wait_until_clean

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def table(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def known_optimum(tmp_path: Path) -> Path:
    """60 configurations; the unique optimum is a=7, b=x (metric 1)."""
    offsets = {"x": 0, "y": 1, "z": 3}
    return table(
        tmp_path / "space.csv",
        [
            {"a": a, "b": b, "metric": (a - 7) ** 2 + o + 1}
            for a in range(1, 21)
            for b, o in offsets.items()
        ],
    )


def tune_file(tmp_path: Path, replay: Path, **extra: Any) -> Path:
    lines = [
        f'replay = "{replay}"',
        'objective = "metric"',
        *(f"{k} = {json.dumps(v)}" for k, v in extra.items()),
        "[params.a]",
        'kind = "int"',
        "low = 1",
        "high = 20",
        "[params.b]",
        'kind = "categorical"',
        'values = ["x", "y", "z"]',
    ]
    path = tmp_path / "tune.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_search(tmp_path: Path, spec: tune.TuneSpec, **kw: Any) -> tuple[Results, str]:
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    assert spec.replay is not None
    tune.search(spec, ReplayEvaluator(spec.replay, spec), results, run_id, **kw)
    return results, run_id


def sequence(results: Results, run_id: str) -> list[str]:
    trials = results.trials(run_id)
    return list(trials[trials.state == "asked"].params)


@pytest.mark.parametrize("algorithm", ["auto", "tpe"])
def test_a_search_of_9_trials_starts_as_a_comparison_at_9_does(
    tmp_path: Path, algorithm: str
) -> None:
    """The start's size follows the budget searched, not the file's `trials`: `fleet tune
    compare --budget 9` (the file's default 20 trials) measured a start of 4 where a search of
    9 trials started with 3, and so ran another search than the one measured."""
    replay = known_optimum(tmp_path)
    spec = tune.load(tune_file(tmp_path, replay, algorithm=algorithm, trials=9, seed=3))
    results, run_id = run_search(tmp_path, spec)
    compared = tune.load(tune_file(tmp_path, replay, algorithm=algorithm, seed=3))
    asked: list[str] = []

    class Recording(ReplayEvaluator):
        def __call__(self, trial: int, params: dict[str, Any]) -> Any:
            asked.append(json.dumps(params, sort_keys=True))
            return super().__call__(trial, params)

    seeds = spec.seed + 1  # compare runs seeds 0..n-1: the last is the search's own
    compare(compared, Recording(replay, compared), [algorithm], seeds, 9)
    searched = [json.dumps(json.loads(p), sort_keys=True) for p in sequence(results, run_id)]
    assert asked[-9:] == searched


def test_grid_finds_the_known_optimum_exactly(tmp_path: Path) -> None:
    spec = tune.load(tune_file(tmp_path, known_optimum(tmp_path), algorithm="grid", trials=60))
    results, run_id = run_search(tmp_path, spec)
    best = tune.best(results, run_id)
    assert best is not None and best["params"] == {"a": 7, "b": "x"} and best["loss"] == 1
    assert len(sequence(results, run_id)) == 60  # every configuration, each once
    assert len(set(sequence(results, run_id))) == 60


@pytest.mark.parametrize("algorithm", ["tpe", "random"])
def test_tpe_and_random_are_reproducible_given_a_seed(tmp_path: Path, algorithm: str) -> None:
    replay = known_optimum(tmp_path)
    runs = []
    for index, seed in enumerate((3, 3, 4)):
        folder = tmp_path / str(index)
        folder.mkdir()
        spec = tune.load(tune_file(folder, replay, algorithm=algorithm, trials=15, seed=seed))
        results, run_id = run_search(folder, spec)
        runs.append(sequence(results, run_id))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("algorithm", ["tpe", "random"])
def test_no_configuration_runs_twice_until_the_space_is_spent(
    tmp_path: Path, algorithm: str
) -> None:
    """TPE re-proposes its best point again and again (unchecked, 12 of seed 0's 40 trials were
    repeats); a repeat is asked again instead of run. Past the grid's 60, repeats are allowed."""
    replay = known_optimum(tmp_path)
    for seed in range(3):
        folder = tmp_path / f"{algorithm}{seed}"
        folder.mkdir()
        spec = tune.load(tune_file(folder, replay, algorithm=algorithm, trials=40, seed=seed))
        spec.startup_trials = 5
        results, run_id = run_search(folder, spec)
        asked = sequence(results, run_id)
        # none for the noise check either (fleet/search/racing.py): a lookup has no noise
        assert len(asked) == 40 and len(set(asked)) == 40, f"seed {seed}: repeats in {asked}"
    spec = tune.load(tune_file(tmp_path, replay, algorithm=algorithm, trials=63, seed=0))
    results, run_id = run_search(tmp_path, spec)
    asked = sequence(results, run_id)
    assert len(asked) == 63 and len(set(asked)) == 60


def test_a_tune_file_s_search_of_a_partial_table_runs_what_the_table_holds(
    tmp_path: Path,
) -> None:
    """The tune file's space is 60 configurations; the table holds 50 (b = z only up to 10):
    the search's 50 trials are those 50, none failed as not in the table."""
    from fleet import evaluators

    rows = [
        {"a": a, "b": b, "metric": (a - 7) ** 2 + o + 1}
        for a in range(1, 21)
        for b, o in {"x": 0, "y": 1, "z": 3}.items()
        if b != "z" or a <= 10
    ]
    replay = table(tmp_path / "partial.csv", rows)
    spec = tune.load(tune_file(tmp_path, replay, algorithm="random", trials=50, seed=1))
    evaluate = evaluators.evaluator(spec, None)
    assert spec.space.size() == 50
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    tune.search(spec, evaluate, results, run_id)
    trials = results.trials(run_id)
    assert len(set(sequence(results, run_id))) == 50
    assert "failed" not in set(trials.state), trials[trials.state == "failed"]


def test_infeasible_and_failed_trials_are_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    rows = [
        # a = 7 breaks the memory limit; a = 3's memory was not measured (an empty cell).
        {"a": a, "b": b, "metric": (a - 7) ** 2 + 1, "rss_mb": {7: 900, 3: None}.get(a, 100)}
        for a in range(1, 21)
        for b in ("x", "y")  # no row for z: those trials fail
    ]
    replay = table(tmp_path / "t.csv", rows)
    path = tune_file(tmp_path, replay, algorithm="grid", trials=60)
    path.write_text(path.read_text() + "[constraints]\nmax_rss_mb = 500\n")
    results, run_id = run_search(tmp_path, tune.load(path))
    trials = results.trials(run_id)
    final = trials[trials.state != "asked"]
    assert len(final) == 60
    assert set(final.state) == {"ok", "infeasible", "failed"}
    infeasible = final[final.state == "infeasible"]
    assert infeasible.reason.str.contains("max_rss_mb 500").all()
    unmeasured = infeasible[infeasible.params.str.contains('"a": 3')]
    assert len(unmeasured) == 2 and unmeasured.reason.str.contains("cannot be checked").all()
    assert final[final.state == "failed"].reason.str.contains("not in the replay table").all()
    # Said in the run's own log too, trial by trial.
    logged = results.log_path(run_id).read_text()
    assert logged.count(f"[{run_id}] trial ") == len(final[final.state != "ok"]), logged
    best = tune.best(results, run_id)
    assert best is not None and best["params"]["a"] in (6, 8)  # 7 breaks the memory limit


def test_resume_after_the_controller_stops_loses_and_repeats_no_trial(tmp_path: Path) -> None:
    spec = tune.load(tune_file(tmp_path, known_optimum(tmp_path), trials=16, parallel=2))
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    lookup = ReplayEvaluator(known_optimum(tmp_path), spec)

    def evaluator(trial: int, params: dict[str, Any]) -> tune.Evaluation:
        if trial == 1:
            # Asked first, so certainly in flight, and still running when the controller stops
            # after five quick results (a slow later trial could be asked too late to be).
            time.sleep(1.0)
        return lookup(trial, params)

    with pytest.raises(KeyboardInterrupt):
        tune.search(spec, evaluator, results, run_id, stop_after=5)
    before = results.trials(run_id)
    in_flight = set(before[before.state == "asked"].trial) - set(
        before[before.state != "asked"].trial
    )
    assert in_flight  # a trial was running when the controller stopped
    stopped = control.status(results, run_id)
    assert stopped["state"] == "stopped" and stopped["trials_asked"] == len(set(before.trial))
    assert sum(stopped["trials_finished"].values()) == 5
    assert f"fleet tune --resume {run_id}" in control.status_text(stopped)

    tune.search(spec, evaluator, results, run_id)
    finished = control.status(results, run_id)
    assert finished["state"] == "finished" and finished["trials_finished"] == {"ok": 16}
    assert control.status_text(finished).startswith(
        f"run {run_id} (tune): finished; 16/16 trials finished (16 ok), 16 asked; $0.0000 spent\n"
    )
    trials = results.trials(run_id)
    asked = trials[trials.state == "asked"]
    final = trials[trials.state != "asked"]
    assert sorted(asked.trial) == list(range(16))  # the budget, each trial asked once
    assert sorted(final.trial) == list(range(16))  # and finished once: none lost or rerun
    # The in-flight trials were finished with the parameters they were asked with.
    for trial in in_flight:
        assert set(trials[trials.trial == trial].params) == set(
            before[before.trial == trial].params
        )


def test_resume_can_extend_the_budget_but_not_change_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    path = tune_file(tmp_path, known_optimum(tmp_path), trials=10)
    assert main(["tune", str(path), "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    results = Results(tmp_path / "fleet.sqlite")

    def asked() -> int:
        status = control.status(results, run_id)
        assert status["trials_asked"] == sum(status["trials_finished"].values())
        return int(status["trials_asked"])

    assert main(["tune", "--resume", run_id, "--trials", "14"]) == 0
    assert asked() == 14 and control.status(results, run_id)["trials_budget"] == 14
    assert main(["tune", "--resume", "last"]) == 0  # the extended budget is the run's now
    assert asked() == 14
    capsys.readouterr()
    for bad, expected in (
        (["--seed", "3"], "--seed cannot change it"),
        (["--trials", "0"], "--trials: must be an integer from 1 to 10000, not 0"),
        # Below what it has asked: it ran nothing, and read "14/5 trials finished" ever after.
        (
            ["--trials", "5"],
            f"--trials 5: run {run_id} has asked 14 trials already; give at least 14",
        ),
        # Resumed where it ran: elsewhere its instances would not be found.
        (["--region", "eu-west-1"], f"run {run_id} ran on region us-east-1, not eu-west-1"),
    ):
        assert main(["tune", "--resume", run_id, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err, err
    # Not while another controller searches it (both would ask trials).
    other = subprocess.Popen(["sleep", "60"])
    try:
        results.event(run_id, "searching", pid=other.pid, host=socket.gethostname())
        assert main(["tune", "--resume", run_id, "--trials", "20"]) == 2
        assert f"run {run_id} is running already (pid {other.pid})" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
    results.event(run_id, "finished")  # that controller ended
    assert control.status(results, run_id)["trials_budget"] == 14  # the refusals changed nothing
    assert main(["status"]) == 0  # the list of runs shows a tune run's trials
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{run_id}  tune   finished   ") and line.endswith("14/14 trials"), line


def test_an_interrupt_outside_the_wait_still_stops_the_trials_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller stops right after recording a result (not while waiting): the trial still
    running is told to stop, instead of the pool's exit waiting for it to finish."""
    spec = tune.load(tune_file(tmp_path, known_optimum(tmp_path), trials=10, parallel=2))
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    lookup = ReplayEvaluator(spec.replay or Path(), spec)
    stop = threading.Event()  # what cancel_all sets for a cloud trial's runs
    monkeypatch.setattr(tune, "cancel_all", lambda: stop.set() or 1)

    def evaluator(trial: int, params: dict[str, Any]) -> tune.Evaluation:
        if trial == 1:
            stop.wait(30)
        return lookup(trial, params)

    with pytest.raises(KeyboardInterrupt):
        tune.search(spec, evaluator, results, run_id, stop_after=1)  # raised after trial 0
    assert stop.is_set()


def _priced_search(tmp_path: Path, usd: float) -> tuple[Any, Results, str, Any]:
    """A replayed search of 20 trials under a $3.50 budget, each trial costing `usd`."""
    spec = tune.load(tune_file(tmp_path, known_optimum(tmp_path), trials=20, max_usd=3.5))
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    lookup = ReplayEvaluator(spec.replay or Path(), spec)

    def evaluator(trial: int, params: dict[str, Any]) -> tune.Evaluation:
        return dataclasses.replace(lookup(trial, params), usd=usd)

    return spec, results, run_id, evaluator


def test_the_money_budget_counts_trials_in_flight_and_what_a_resumed_search_spent(
    tmp_path: Path,
) -> None:
    """Each trial costs $1 against a $3.50 budget: the search stops asking once the trials in
    flight and one more would pass it, and a resumed search counts what was spent before."""
    spec, results, run_id, evaluator = _priced_search(tmp_path, 1.0)
    with pytest.raises(KeyboardInterrupt):
        tune.search(spec, evaluator, results, run_id, stop_after=2)
    tune.search(spec, evaluator, results, run_id)
    trials = results.trials(run_id)
    assert sorted(trials[trials.state != "asked"].trial) == [0, 1, 2]  # $3 of $3.50
    assert tune.trial_costs(results, run_id) == {0: 1.0, 1: 1.0, 2: 1.0}
    # Two in flight: the first two are asked before any cost is known, then one more fits.
    spec.parallel = 2
    other = tune.start(results, spec, "local", "us-east-1")
    tune.search(spec, evaluator, results, other)
    assert len(results.trials(other).query("state != 'asked'")) == 3


def test_a_resumed_search_counts_the_gain_an_earlier_controller_measured(
    tmp_path: Path,
) -> None:
    """The gain, measured after a search, is spent under the same budget: a resume counted
    the trials alone, ran past the cap ($3.30 said, $3.55 spent of $3.50) and printed less
    than fleet status."""
    from fleet import control

    spec, results, run_id, evaluator = _priced_search(tmp_path, 0.3)
    with pytest.raises(KeyboardInterrupt):
        tune.search(spec, evaluator, results, run_id, stop_after=2)
    results.event(run_id, "gain", usd=0.25, params={})  # as fleet/gain.py records one
    outcome = tune.search(spec, evaluator, results, run_id)  # resumed
    assert len(tune.trial_costs(results, run_id)) == 10  # 10 x $0.30 + $0.25 = $3.25 (11 before)
    assert outcome.spent_usd == pytest.approx(control.status(results, run_id)["spent_usd"])
    assert outcome.spent_usd == pytest.approx(3.25) and outcome.stopped, outcome


def test_the_wall_time_budget_is_the_runs_across_a_resume(tmp_path: Path) -> None:
    spec = tune.load(tune_file(tmp_path, known_optimum(tmp_path), trials=50, max_hours=1 / 3600))
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    lookup = ReplayEvaluator(spec.replay or Path(), spec)

    def evaluator(trial: int, params: dict[str, Any]) -> tune.Evaluation:
        time.sleep(0.25)
        return lookup(trial, params)

    tune.search(spec, evaluator, results, run_id)
    first = len(results.trials(run_id).query("state == 'asked'"))
    assert 1 <= first <= 5  # a second of 0.25 s trials, not the 50 the trial budget allows
    tune.search(spec, evaluator, results, run_id)  # resumed: its second is already spent
    assert len(results.trials(run_id).query("state == 'asked'")) == first


def test_conditional_parameters_appear_only_where_they_apply() -> None:
    spec = tune.from_dict(
        {
            "recipe": "kernels",
            "params": {
                "instance_type": {"kind": "categorical", "values": ["c5a.large", "c7g.large"]},
                "vector_width": {
                    "kind": "categorical",
                    "values": ["256", "512"],
                    "stage": "compile",
                    "flag": "-mprefer-vector-width={}",
                    "when": {"arch": "x86_64"},
                },
                "mcpu": {
                    "kind": "categorical",
                    "values": ["neoverse-n1", "neoverse-v1"],
                    "stage": "compile",
                    "flag": "-mcpu={}",
                    "when": {"arch": "arm64"},
                },
            },
        },
        "inline",
    )
    engine = tune.new_engine(spec.space, "random", 0, 3, spec.trials)
    seen = set()
    for _ in range(30):
        asked = engine.ask()
        assert asked is not None
        trial, params = asked
        engine.tell(trial, 1.0)
        if params["instance_type"] == "c5a.large":
            assert "vector_width" in params and "mcpu" not in params
        else:
            assert "mcpu" in params and "vector_width" not in params
        seen.add(spec.space.cflags(params).split("=")[0])
        # The type picks the instance; it is no flag and no workload argument.
        assert spec.space.args(params) == "" and "c5a" not in spec.space.cflags(params)
    assert seen == {"-mprefer-vector-width", "-mcpu"}
    assert Space.size(spec.space) == 4


def test_compare_reports_each_algorithm_against_the_optimum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    replay = known_optimum(tmp_path)
    argv = ["tune", "compare", "--replay", str(replay), "--algorithms", "tpe,random,grid"]
    assert main([*argv, "--seeds", "3", "--budget", "60", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    rows = {r["algorithm"]: r for r in answer["algorithms"]}
    assert rows["grid"]["ratios"] == [1.0, 1.0, 1.0]  # 60 trials cover the grid of 60
    assert all(r >= 1.0 for r in rows["tpe"]["ratios"] + rows["random"]["ratios"])
    # The convergence page: every seed's best so far after each trial, never rising, ending at
    # the ratio printed; and a plot of them.
    page = Path(answer["files"]["index.html"])
    assert page.parent == tmp_path / "results" / "reports" / "compare-space-60"
    assert page.read_text().count("data:image/png;base64,") == 1
    curves = pd.read_csv(answer["files"]["convergence.csv"])
    assert len(curves) == 3 * 3 * 60
    for (algorithm, seed), curve in curves.groupby(["algorithm", "seed"]):
        values = curve.sort_values("trial").best_over_optimum.tolist()
        assert (
            values == sorted(values, reverse=True) and values[-1] == rows[algorithm]["ratios"][seed]
        )


def test_compare_says_how_big_the_target_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    replay = known_optimum(tmp_path)
    argv = ["tune", "compare", "--replay", str(replay), "--algorithms", "random"]
    assert main([*argv, "--seeds", "2", "--budget", "20"]) == 0
    out = capsys.readouterr().out
    # 20 distinct draws of 60 miss the one optimum with chance 40/60.
    assert "of the 60: 1 within 2% (a blind draw of 20 hits one 33% of the time)" in out, out
    assert blind_chance(60, 0, 20) == 0.0 and blind_chance(60, 2, 60) == 1.0
    assert round(blind_chance(60, 2, 20), 4) == round(1 - (40 * 39) / (60 * 59), 4)


def test_the_tune_file_in_the_help_is_one(tmp_path: Path) -> None:
    import textwrap

    from fleet.cli import TUNE_FILE

    path = tmp_path / "help.toml"
    path.write_text(textwrap.dedent(TUNE_FILE.split("\n", 1)[1]))
    spec = tune.load(path)
    assert spec.recipe == "kernels" and spec.trials == 40 and list(spec.space.params) == ["opt"]


def test_compare_infers_the_parameters_and_says_what_the_table_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measurement columns (seconds, price) are not parameters; a table missing some of the
    space's configurations is said to; a negative start-up count is refused."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    rows = [
        {"a": a, "b": b, "metric": abs(a - 3) + b, "seconds": a + b, "price_per_hour": 0.1 * a}
        for a in range(1, 6)
        for b in (0, 1)
        if (a, b) != (5, 1)  # one configuration never measured
    ]
    replay = table(tmp_path / "partial.csv", rows)
    argv = ["tune", "compare", "--replay", str(replay), "--algorithms", "grid", "--seeds", "1"]
    assert main([*argv, "--budget", "10"]) == 2  # the search runs what the table holds
    assert (
        "--budget 10 is more than the 9 configurations the table holds" in capsys.readouterr().err
    )
    assert main([*argv, "--budget", "9"]) == 0
    out = capsys.readouterr().out
    assert "over the table's 9 configurations (of a grid of 10: the rest are not in it)" in out, out
    assert main([*argv, "--startup-trials", "-1"]) == 2
    assert "--startup-trials must be an integer from 0 to 10000, not -1" in capsys.readouterr().err


def test_a_configuration_whose_measurement_failed_is_a_failed_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty objective cell (on the first row, where a plain min() would take NaN for the
    optimum) fails that trial with its line; the optimum is the best measured one. Cells that
    are not numbers, and a parameter left empty where the table is the space, are refused."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    (tmp_path / "gaps.csv").write_text("a,metric\n1,\n2,3\n3,1\n4,2\n")
    argv = ["tune", "compare", "--replay", str(tmp_path / "gaps.csv"), "--algorithms", "grid"]
    assert main([*argv, "--seeds", "1", "--budget", "4", "--json"]) == 0
    (grid,) = json.loads(capsys.readouterr().out)["algorithms"]
    assert grid["ratios"] == [1.0]  # the optimum is 1 (a=3), not NaN
    found = space_from_table(tmp_path / "gaps.csv", "metric")
    spec = tune.from_dict({**found, "algorithm": "grid", "trials": 4}, "gaps")
    results, run_id = run_search(tmp_path, spec)
    trials = results.trials(run_id)
    failed = trials[trials.state == "failed"]
    assert list(failed.reason) == ["no metric on line 2 of the replay table"]
    best = tune.best(results, run_id)
    assert best is not None and (best["loss"], best["params"]) == (1.0, {"a": 3})
    capsys.readouterr()  # the search's log
    for text, expected in (
        ("a,metric\n1,2\n2,fast\n", "bad.csv:3: metric 'fast' is not a number"),
        ("a,b,metric\n1,x,2\n2,,1\n", "bad.csv:3: b is empty; a table searched without --space"),
        ("a,metric\n1,\n", "bad.csv: the replay table has no metric value on any row"),
    ):
        (tmp_path / "bad.csv").write_text(text)
        assert main(["tune", "compare", "--replay", str(tmp_path / "bad.csv")]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err


def test_bad_tune_input_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    replay = known_optimum(tmp_path)
    head = f'replay = "{replay}"\nobjective = "metric"\n'
    param = '[params.a]\nkind = "int"\nlow = 1\nhigh = 3\n'
    cases = {
        head + 'max_usd = "ten"\n' + param: ":3: max_usd: must be a finite number above 0",
        head + "gain_replicates = 1\n" + param: ":3: gain_replicates: 1 run of each build gives",
        head + "max_hours = -1\n" + param: ":3: max_hours: must be a finite number above 0",
        head
        + param
        + '[constraints]\nmax_seconds = "fast"\n': ":8: max_seconds: must be a finite number",
        head: "the search space is empty",
        head
        + '[params.a]\nkind = "int"\nlow = 5\nhigh = 1\n': ":3: params.a: low 5 is above high 1",
        head + '[params.a]\nkind = "normal"\n': ":3: params.a: unknown kind 'normal'",
        'types = ["c7i.large"]\n'
        + head
        + '[params.instance_type]\nkind = "categorical"\nvalues = ["c5a.large"]\n': ":1: types: the types are named twice",
        head
        + '[params.instance_type]\nkind = "categorical"\nvalues = ["c5a.large"]\nstage = "run"\n'
        + param: ":3: params.instance_type: the instance type is categorical, with values and no",
        head
        + 'executor = "k8s"\n[params.a]\nkind = "int"\nlow = 1\nhigh = 3\n': ":3: executor: 'k8s' is not one of ssh, batch",
        head
        + '[params.a]\nkind = "int"\nlow = 1\nhigh = 3\nwhen = { param = "zz", in = [1] }\n': ":3: params.a: when names an unknown parameter 'zz'",
        f'replay = "{tmp_path / "t.csv"}"\nobjective = "metric"\n'
        '[params.a]\nkind = "int"\nlow = 1\nhigh = 3\n': "t.csv:1: the replay table has no column metric",
    }
    # An instance type that does not exist would fail every trial in turn.
    cases['types = "c5a.large"\n' + head + param] = ":1: types: must be a list of instance types"
    cases['types = ["c5a.nano"]\n' + head + param] = (
        ":1: types: unknown instance type 'c5a.nano': c5a comes in large,"
    )
    cases[head + '[params.instance_type]\nkind = "categorical"\nvalues = ["c5a.tiny"]\n'] = (
        ":3: params.instance_type: unknown instance type 'c5a.tiny'"
    )
    # values that are no list: a traceback (5), or one type's name read letter by letter
    for values in ("5", '"c5a.large"'):
        cases[head + f'[params.instance_type]\nkind = "categorical"\nvalues = {values}\n'] = (
            ":3: params.instance_type: a categorical parameter needs a non-empty list of values"
        )
    # Two types: every trial ran on the first, the second priced and never run.
    cases['types = ["c5a.large", "c6a.large"]\nrecipe = "kernels"\n' + param] = (
        ":1: types: a tune's trials run on one type, not 2: to search over them, make the type "
        'a parameter: [params.instance_type] kind = "categorical", values = ["c5a.large", '
        '"c6a.large"]'
    )
    # A TOML date passed the check, then failed the run's record with a traceback.
    cases["name = 2024-01-01\n" + head + param] = ":1: name: must be a string (quoted)"
    # A constraint the table cannot check would pass every trial unchecked.
    cases[head + param + "[constraints]\nmax_rss_mb = 100\n"] = (
        ":1: the replay table has no column rss_mb (for constraints.max_rss_mb)"
    )
    cases[f'replay = "{tmp_path / "dup.csv"}"\nobjective = "metric"\n' + param] = (
        "dup.csv:4: the configuration of line 2 again (a=1)"
    )
    # ... told apart by a column the space leaves out: that column is named as the parameter
    # missing (it was "line 2 again; aggregate repeats first", as if the table were wrong)
    cases[f'replay = "{tmp_path / "wider.csv"}"\nobjective = "metric"\n' + param] = (
        "wider.csv:3: the configuration of line 2 again (a=1): the rows differ in b, which the "
        "space does not name; add [params.b] to the tune file"
    )
    # a row wider than the header: its line, on one line (pandas' own message ended in a newline)
    cases[f'replay = "{tmp_path / "ragged.csv"}"\nobjective = "metric"\n' + param] = (
        "ragged.csv:3: 3 fields where the header has 1 (a): a comma too many or too few"
    )
    (tmp_path / "ragged.csv").write_text("a\n1\n2,3,4\n")
    table(tmp_path / "t.csv", [{"a": 1, "runtime": 2.0}])
    table(tmp_path / "dup.csv", [{"a": a, "metric": m} for a, m in ((1, 3.0), (2, 2.0), (1, 1.0))])
    table(tmp_path / "wider.csv", [{"a": 1, "b": b, "metric": 2.0 + b} for b in (1, 2)])
    for text, expected in cases.items():
        path = tmp_path / "bad.toml"
        path.write_text(text)
        assert main(["tune", str(path)]) == 2, text
        err = capsys.readouterr().err
        assert err.startswith("fleet: error:") and expected in err, err
        assert err.count("\n") == 1 and err.endswith("\n"), repr(err)  # one line, no blank
    # Refused before anything is recorded: no run in the results.
    assert Results(tmp_path / "results" / "fleet.sqlite").run_ids() == []


def test_a_real_search_on_the_local_cloud(cloud: Cloud) -> None:
    cfg = config.load()
    spec = tune.load(EXAMPLES / "kernels.tune.toml")
    assert (spec.trials, spec.parallel) == (12, 2)
    # Half its trials: as many in flight, past its 4 start-up trials into the model's steps,
    # in half the time (72 s on a 2.5 GHz Xeon for all 12)
    spec.trials = 6
    results = bench.results_db(cfg.results_dir)
    run_id = tune.start(results, spec, cfg.cloud, cfg.region)
    evaluator = evaluators.evaluator(spec, cfg)
    outcome = tune.search(spec, evaluator, results, run_id)
    trials = results.trials(run_id)
    final = trials[trials.state != "asked"]
    # Every trial ran; one may fall under the example's min_rate floor when the machine is busy
    # (the throughput is this machine's, shared with whatever else runs): infeasible, not failed.
    assert len(final) == 6 and set(final.state) <= {"ok", "infeasible"}, final.reason.tolist()
    assert all("min_rate" in r for r in final[final.state == "infeasible"].reason), final.reason
    assert (final.state == "ok").sum() >= 3, final.reason.tolist()
    # Its report opens by saying the trials shared this machine (2 in flight on its cores).
    record = results.run(run_id)
    assert record is not None and record["note"].startswith("Local cloud: every instance type")
    assert "2 trials ran at a time" in record["note"]
    for manifest in final.manifest.map(json.loads):
        assert manifest["app"] == "kernels" and manifest["cflags"].startswith("-O3")
        assert manifest["files"]["bin/kernels"]  # the build's own record, per trial
    replicates = results.replicates(run_id)
    assert sorted(set(replicates.trial)) == list(range(6))
    # Each trial's cost, counted against max_usd: its instance's whole time at its price, which
    # covers at least its replicates' run time.
    spent = tune.trial_costs(results, run_id)
    assert sorted(spent) == list(range(6))
    for trial, rows in replicates.groupby("trial"):
        assert spent[trial] >= (rows.seconds * rows.price_usd_hour).sum() / 3600 > 0
    assert outcome.best is not None
    # The metric is a throughput: the best trial is the fastest, its loss the negated rate.
    assert (
        outcome.best["metric"] == final.metric.max() and outcome.best["loss"] == -final.metric.max()
    )
    # The best configuration, run again, is the same build (its files' hashes) and measures a
    # rate again. Its rate is not compared with the recorded one: on a shared two-core host it
    # moves with the load beside it by more than a wrong build would move it (560 alone, 320-535
    # beside another trial, 160-210 beside a copy of itself; a factor of 2.5 failed with three
    # busy loops started between the runs).
    again, twice = (evaluator(trial, outcome.best["params"]) for trial in (100, 101))
    assert again.state == twice.state == "ok" and again.loss is not None
    recorded = json.loads(final[final.trial == outcome.best["trial"]].manifest.iloc[0])
    assert again.manifest["files"] == twice.manifest["files"] == recorded["files"]
    assert again.loss < 0 and twice.loss is not None and twice.loss < 0  # rates, measured
    for interval in (again.manifest["interval"], twice.manifest["interval"]):
        assert interval[0] <= interval[1] < 0, interval


def test_the_tune_report_shows_best_recommendation_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    replay = known_optimum(tmp_path)
    path = tune_file(tmp_path, replay, algorithm="grid", trials=60)
    assert main(["tune", str(path), "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert main(["report", "last", "--prefer", "time"]) == 0  # `last`: the newest run
    out = capsys.readouterr().out
    first, second = out.splitlines()[:2]
    assert first == f"Replay: every trial was looked up in {replay}, not run."
    assert second.startswith(f"tune run {run_id}: 60 trials")
    assert "the last 10 of 60 trials (all in trials.csv):" in out
    assert "best: metric 1 at trial" in out and '{"a": 7, "b": "x"}' in out
    assert "recommended for time" in out
    assert "importance from 60 feasible trials" in out
    assert "epsilon squared): a 1.00, b 0.00" in out  # a moves the loss by 0-169, b by 0-3
    assert main(["plan", run_id, "--work", "10"]) == 2  # a bench run's projection
    assert f"{run_id} is a fleet tune run; this needs a fleet bench run" in capsys.readouterr().err
    page = (tmp_path / "reports" / run_id / "index.html").read_text()
    # Convergence, result by parameter, importance: supported by 60 trials, so no hint.
    assert page.count("data:image/png;base64,") == 3
    assert "Parameter importance (60 feasible trials)<" in page
    assert len((tmp_path / "reports" / run_id / "trials.csv").read_text().splitlines()) == 61


def test_the_tune_report_names_the_search_that_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that names no algorithm runs the default; the report said "algorithm tpe"."""
    from fleet.search.engines import DEFAULT

    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    assert main(["tune", str(tune_file(tmp_path, known_optimum(tmp_path), trials=6))]) == 0
    capsys.readouterr()
    assert main(["report", "last"]) == 0
    second = capsys.readouterr().out.splitlines()[1]
    assert second.endswith(f"algorithm {DEFAULT}, objective metric") and DEFAULT != "tpe", second
    # --current names a bench run's type to compare with: on a tune run it was ignored, exit 0
    assert main(["report", "last", "--current", "c7i.large"]) == 2
    assert "--current is for bench runs" in capsys.readouterr().err


def test_the_best_is_told_in_the_objectives_own_terms() -> None:
    # A rate is searched negated; the user reads it as the rate, its interval flipped.
    rate = tune.in_own_terms("metric", -104.476, 104.476, [-111.6, -103.5])
    assert rate == "metric 104.476, maximised (95% interval 103.5 .. 111.6)"
    assert tune.in_own_terms("metric", 3.5, 3.5) == "metric 3.5"  # minimised as it is
    assert tune.in_own_terms("runtime", 1.25, 80.0, [1.2, 1.3]) == (
        "runtime 1.25 s (95% interval 1.2 .. 1.3)"
    )
    assert tune.in_own_terms("cost", 2.5e-7, None) == "cost $2.5e-07 per unit of work"


def test_the_tune_plots_read_in_the_objectives_terms_and_the_spaces_order() -> None:
    from fleet.tune_report import _options_in_order, _own_terms

    spec = {"params": {"block": {"values": [16, 32, 64, 128]}, "flag": {"values": ["", "-x"]}}}
    assert _options_in_order("block", pd.Series([128, 16, 64]), spec) == [16, 64, 128]
    assert _options_in_order("flag", pd.Series(["-x", ""]), spec) == ["", "-x"]
    assert _options_in_order("size", pd.Series([10, 2, 5]), spec) == [2, 5, 10]  # not "10" < "2"
    rate = pd.DataFrame({"loss": [-5.0, -7.0], "metric": [5.0, 7.0]})
    values, label, higher = _own_terms(rate, "metric")
    assert list(values) == [5.0, 7.0] and label == "metric (higher is better)" and higher
    values, label, higher = _own_terms(rate.assign(loss=[5.0, 7.0]), "metric")  # as it is
    assert list(values) == [5.0, 7.0] and label == "metric (lower is better)" and not higher
    assert _own_terms(rate.assign(loss=[1.0, 2.0]), "runtime")[1] == (
        "seconds per unit of work (lower is better)"
    )


def test_a_replayed_cost_search_has_its_pareto_front_and_recommendations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cost per unit from the table's seconds and price: the search finds the cheapest; the
    report recommends the fastest for time and the cheapest for cost, with the Pareto plot."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    types = {"c7i.2xlarge": (1.0, 3.6), "c7i.large": (2.0, 0.9), "c6a.large": (5.0, 0.18)}
    replay = table(
        tmp_path / "cost.csv",
        [
            {"instance_type": t, "threads": n, "metric": base / n**0.5, "price_per_hour": price}
            for t, (base, price) in types.items()
            for n in (1, 2)
        ],
    )
    path = tmp_path / "cost.toml"
    path.write_text(
        f'replay = "{replay}"\nobjective = "cost"\nalgorithm = "grid"\ntrials = 6\n'
        '[params.instance_type]\nkind = "categorical"\n'
        'values = ["c7i.2xlarge", "c7i.large", "c6a.large"]\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(path), "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["params"] == {"instance_type": "c6a.large", "threads": 2}
    assert best["loss"] == pytest.approx(5.0 / 2**0.5 * 0.18 / 3600)
    for prefer, expected in (("time", "c7i.2xlarge"), ("cost", "c6a.large")):
        assert main(["report", "last", "--prefer", prefer]) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith(f"recommended for {prefer}"))
        assert f'"instance_type": "{expected}", "threads": 2' in line, line
    page = next((tmp_path / "reports").glob("ft-*/index.html")).read_text()
    assert "Time vs cost (Pareto front)" in page and "Parameter importance (" in page
    assert page.count("data:image/png;base64,") == 4  # and convergence, result by parameter


def test_the_report_gives_one_recommendation_through_noise_not_the_luckiest_run(
    tmp_path: Path,
) -> None:
    """block 32 once read 106 (and 100), block 64 read 103 three times: the report recommends
    64 by its mean, and no second line recommends the lucky 32 by its best run."""
    from fleet.tune_report import make_tune

    results = Results(tmp_path / "fleet.sqlite")
    spec = {"replay": None, "objective": "metric", "algorithm": "auto", "trials": 6}
    results.create_run("ft-noisy", "tune", spec, "aws", "us-east-1")
    runs = [(32, 100.0), (32, 106.0), (64, 103.0), (64, 103.2), (64, 102.8), (128, 104.0)]
    for trial, (block, rate) in enumerate(runs):
        results.trial("ft-noisy", trial, "asked", {"block": block})
        seconds = 1 / rate
        results.trial("ft-noisy", trial, "ok", {"block": block}, loss=-rate, metric=rate,
                      seconds=seconds, cost_per_unit=seconds * 0.0765 / 3600)  # fmt: skip
    report = make_tune(results, results.require("ft-noisy"), tmp_path / "r", False, "balanced")
    said = [x for x in report.text.splitlines() if x.startswith("recommended")]
    assert len(said) == 1 and "{'block': 64}" in said[0], said
    # `fleet status` names the same, not the best trial (the lucky 32 at 106)
    status = control.status_text(control.status(results, "ft-noisy"))
    assert "recommended so far: metric 103" in status and "{'block': 64}" in status, status


def test_a_stated_preference_is_picked_through_the_noise_too(tmp_path: Path) -> None:
    """--prefer cost named the trial with the cheapest single run: block 32's lucky 0.90 among
    1.30, against block 64's steady 1.00, 1.01 and 0.99."""
    from fleet.tune_report import make_tune

    results = Results(tmp_path / "fleet.sqlite")
    spec = {"replay": None, "objective": "cost", "algorithm": "auto", "trials": 5}
    results.create_run("ft-prefer", "tune", spec, "aws", "us-east-1")
    runs = [(64, 1.00), (32, 0.90), (64, 1.01), (32, 1.30), (64, 0.99)]
    for trial, (block, usd) in enumerate(runs):
        results.trial("ft-prefer", trial, "asked", {"block": block})
        results.trial("ft-prefer", trial, "ok", {"block": block}, loss=usd, metric=usd,
                      seconds=usd * 10, cost_per_unit=usd)  # fmt: skip
    for prefer in ("cost", "time"):
        report = make_tune(results, results.require("ft-prefer"), tmp_path / "r", False, prefer)
        said = [x for x in report.text.splitlines() if x.startswith(f"recommended for {prefer}")]
        assert said == [
            f'recommended for {prefer}: {{"block": 64}} (trials 0, 2, 4; mean of 3 runs, noise '
            "pooled over 3 replicates (95% interval))"
        ], said


def test_a_relative_replay_table_is_kept_absolute_for_a_resume_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    replay = known_optimum(tmp_path / "sub")
    tune_file(tmp_path / "sub", Path(replay.name))
    monkeypatch.chdir(tmp_path)
    spec = tune.load(Path("sub") / "tune.toml")
    assert spec.replay == replay.resolve() and spec.replay.is_absolute()


def test_parameter_importance_credits_the_parameter_that_moves_the_loss() -> None:
    import random

    from fleet.tune_report import importance

    rng = random.Random(0)
    rows = []
    for _ in range(200):
        params = {"a": rng.randint(1, 20), "noise": rng.randint(1, 10), "flag": rng.choice("xy")}
        loss = (params["a"] - 7) ** 2 + (60 if params["flag"] == "y" else 0) + rng.random()
        rows.append({"params": json.dumps(params), "loss": loss})
    shares = importance(pd.DataFrame(rows))
    assert list(shares) == ["a", "flag", "noise"], shares
    # A ten-valued parameter with no effect explains ~nothing once corrected for chance (plain
    # eta squared gives it ten groups' worth of noise).
    assert shares["a"] > 0.5 and shares["flag"] > 0.15 and shares["noise"] < 0.03, shares
    assert importance(pd.DataFrame(rows[:3])) == {}  # too few trials to say


def test_ctrl_c_stops_the_trials_in_flight_and_leaves_nothing(
    cloud: Cloud, local_dir: Path, tmp_path: Path, host_family: str
) -> None:
    """Trials run on worker threads, which never see Ctrl-C: the search must stop their runs
    (each then unwinds) rather than wait for their replicates to finish."""
    path = tmp_path / "t.toml"
    path.write_text(
        f'recipe = "kernels"\ntypes = ["{host_family}.large"]\nalgorithm = "grid"\ntrials = 2\n'
        "parallel = 2\nreplicates = 3\n"
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
        '[params.size]\nkind = "categorical"\nvalues = [16]\nstage = "run"\n'
    )
    spec = tune.load(path)
    cfg = config.load()
    results = bench.results_db(cfg.results_dir)
    run_id = tune.start(results, spec, cfg.cloud, cfg.region)

    def both_up() -> bool:
        return len(local_control.status(cfg)["instances"]) >= 2  # type: ignore[index]

    # Staged, and into the first replicate (each takes ~3.5 s), when Ctrl-C comes.
    with ctrl_c_when(both_up, delay_s=3.0), pytest.raises(KeyboardInterrupt):
        tune.search(spec, evaluators.evaluator(spec, cfg), results, run_id)
    journal = Journal(cfg.results_dir / "journal.sqlite")
    runs = [d["amibake_run"] for _, k, d in results.events(run_id) if k == "controller"]
    assert len(runs) == 2
    assert [journal.run_state(r) for r in runs] == ["interrupted", "interrupted"]
    for amibake_run in runs:
        assert tagged_alive(cloud, amibake_run) == [] and journal.alive(amibake_run) == []
    assert wait_until_clean(local_dir) == []
    trials = results.trials(run_id)
    assert set(trials.state) == {"asked"}  # neither was scored: a resume runs both again
    # But what they cost is recorded: a resume's money budget counts it (it was lost).
    spent = tune.trial_costs(results, run_id)
    assert sorted(spent) == [0, 1] and all(usd > 0 for usd in spent.values()), spent


@pytest.mark.e2e
def test_a_sigkilled_search_resumes_after_removing_what_its_trial_left(
    cloud: Cloud, local_dir: Path, tmp_path: Path, host_family: str
) -> None:
    """A controller SIGKILLed mid-trial leaves that trial's instance running: `--resume`
    removes it first, then finishes the search with no trial lost or run twice."""
    from tests.fleet.test_bench import fleet_process
    from tests.helpers import wait_for

    path = tmp_path / "t.toml"
    path.write_text(
        f'recipe = "kernels"\ntypes = ["{host_family}.large"]\nalgorithm = "grid"\ntrials = 2\n'
        "replicates = 3\n"
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    results = bench.results_db(config.load().results_dir)
    before = set(results.run_ids())
    process = fleet_process("tune", str(path))
    try:
        wait_for(lambda: len(set(results.run_ids()) - before) == 1)
        (run_id,) = set(results.run_ids()) - before

        def first_replicate() -> bool:
            rows = results.replicates(run_id)
            return bool(len(rows)) and bool((rows.trial == 0).any())

        wait_for(first_replicate, timeout_s=120)  # trial 0's instance is up and measuring
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        process.kill()
    runs = [d["amibake_run"] for _, k, d in results.events(run_id) if k == "controller"]
    assert any(tagged_alive(cloud, r) for r in runs)  # what the resume has to remove
    assert control.status(results, run_id)["state"] == "stopped"

    assert main(["tune", "--resume", run_id]) == 0
    trials = results.trials(run_id)
    assert sorted(trials[trials.state == "asked"].trial) == [0, 1]
    assert sorted(trials[trials.state != "asked"].trial) == [0, 1]  # each finished once
    assert set(trials[trials.state != "asked"].state) == {"ok"}
    journal = Journal(config.load().results_dir / "journal.sqlite")
    for amibake_run in [
        d["amibake_run"] for _, k, d in results.events(run_id) if k == "controller"
    ]:
        assert tagged_alive(cloud, amibake_run) == [] and journal.alive(amibake_run) == []
    assert wait_until_clean(local_dir) == []


def test_a_cloud_trial_is_timed_per_unit_of_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels report a rate and run for a fixed time: their wall seconds say nothing of
    speed. Time (the runtime objective, max_seconds, the report's time) is per unit of work, as
    cost is."""
    from fleet.trial import CloudEvaluator

    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    cfg = config.load()
    replicates = pd.DataFrame(
        {
            "metric": [200.0, 250.0, 225.0],  # work per second
            "seconds": [1.2, 1.3, 1.25],  # each run's wall time
            "price_usd_hour": [0.036] * 3,
            "rss_max_mb": [50.0] * 3,
        }
    )

    def score(objective: str, **constraints: float) -> tune.Evaluation:
        spec = tune.from_dict(
            {
                "recipe": "kernels",
                "types": ["c5a.large"],
                "objective": objective,
                "constraints": constraints,
                "params": {"threads": {"kind": "int", "low": 1, "high": 2, "stage": "run"}},
            },
            "t.toml",
        )
        return CloudEvaluator(spec, cfg)._score(replicates, {}, 0.0)

    runtime = score("runtime")
    assert runtime.loss == pytest.approx(1 / 225) and runtime.seconds == pytest.approx(1 / 225)
    low, high = runtime.manifest["interval"]
    assert low <= 1 / 250 and 1 / 200 <= high < 2 / 200  # at least the runs' range: 3 runs
    # One replicate has no interval: "95% interval 0.0044 .. 0.0044" claimed what one run
    # cannot, and told the recommendation apart from every other trial's.
    with_one = CloudEvaluator(
        tune.from_dict(
            {
                "recipe": "kernels",
                "types": ["c5a.large"],
                "objective": "runtime",
                "params": {"threads": {"kind": "int", "low": 1, "high": 2, "stage": "run"}},
            },
            "t.toml",
        ),
        cfg,
    )._score(replicates.iloc[:1], {}, 0.0)
    assert with_one.state == "ok" and with_one.manifest["interval"] is None
    cost = score("cost")
    assert cost.loss == pytest.approx(1 / 225 * 0.036 / 3600) and cost.loss == cost.cost_per_unit
    assert cost.seconds == pytest.approx(1 / 225)
    slow = score("runtime", max_seconds=0.004)
    assert slow.state == "infeasible" and slow.reason == "max_seconds 0.004 broken: 0.004444"
    assert score("runtime", max_seconds=0.005).state == "ok"
    # A memory ceiling with no memory figure (a run shorter than the monitor's first sample)
    # is not passed unchecked.
    replicates["rss_max_mb"] = [None] * 3
    unchecked = score("runtime", max_rss_mb=100)
    assert unchecked.state == "infeasible"
    assert unchecked.reason.startswith("max_rss_mb 100 cannot be checked: the trial has no memory")


def kernels_evaluator(monkeypatch: pytest.MonkeyPatch, results: Path, **spec: Any) -> Any:
    """A cloud evaluator of the kernels recipe on a type given as data (nothing launches: the
    tests call its scoring, or stand in for its build and measurement)."""
    from fleet.trial import CloudEvaluator

    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(results))
    threads = {"threads": {"kind": "int", "low": 1, "high": 2, "stage": "run"}}
    raw = {"recipe": "kernels", "types": ["c5a.large"], "params": threads, **spec}
    return CloudEvaluator(tune.from_dict(raw, "t.toml"), config.load())


def test_a_trial_is_scored_on_its_own_attempt_and_fails_when_a_replicate_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ways a cloud trial was scored on runs it should not have been: the rows a killed
    controller's attempt left under the same trial number (a resume runs the trial again), and
    the replicates that survived when the others timed out (the fast one of three led the
    search to a configuration that mostly fails)."""
    from types import SimpleNamespace

    evaluator = kernels_evaluator(monkeypatch, tmp_path, objective="metric", replicates=3)
    columns = ("trial", "state", "started", "metric", "error")
    dead = [(0, "ok", time.time() - 600, 1000.0, "")]  # the killed attempt's run
    rows: list[tuple[Any, ...]] = []

    def measure(label: str, trial: int, params: Any, todo: Any, artifacts: Any) -> float:
        now = time.time()
        rows.extend((trial, state, now, metric, error) for state, metric, error in this)
        return 0.25

    def frame(run_id: str) -> pd.DataFrame:
        table = pd.DataFrame(dead + rows, columns=columns)
        return table.assign(seconds=1.0, price_usd_hour=0.036, rss_max_mb=50.0)

    monkeypatch.setattr(evaluator, "_build", lambda *_: (SimpleNamespace(manifest={}), 0.0))
    monkeypatch.setattr(evaluator, "_measure", measure)
    evaluator.results, evaluator.run_id = SimpleNamespace(replicates=frame), "ft-test"
    this = [("ok", 200.0, ""), ("ok", 210.0, ""), ("ok", 190.0, "")]
    scored = evaluator(0, {"threads": 1})
    assert scored.state == "ok" and scored.manifest["n"] == 3 and scored.metric == 200.0
    rows.clear()
    this = [("ok", 400.0, ""), ("failed", 0.0, "timed out after 60 s"), ("failed", 0.0, "")]
    failed = evaluator(0, {"threads": 2})
    assert failed.state == "failed" and failed.usd == 0.25
    assert failed.reason == "2 of 3 replicates failed: timed out after 60 s", failed.reason


def test_a_trial_s_cost_counts_its_build_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search of compile flags builds each trial on an instance of its own: the estimate
    counted those instances and the money budget did not (a trial cost its measurement only)."""
    import sqlite3
    from types import SimpleNamespace

    opt = {"opt": {"kind": "categorical", "values": ["-O2", "-O3"], "stage": "compile"}}
    evaluator = kernels_evaluator(monkeypatch, tmp_path, objective="metric", params=opt)
    journal = Journal(tmp_path / "journal.sqlite")
    journal.start_run("ab-build", "build c5a kernels", "local", "us-east-1")
    journal.created("ab-build", "instance", "i-0123456789abcdef0", "us-east-1", "local")
    journal.deleted("instance", "i-0123456789abcdef0")
    journal.close()
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:  # it lived 100 s
        db.execute("UPDATE resources SET created = deleted - 100")

    def build_run(instance_type: str, variant: Any, on_open: Any) -> Any:
        on_open(SimpleNamespace(run_id="ab-build"))
        state = SimpleNamespace(instance_type="c5a.large", market="spot", artifact=tmp_path,
                                manifest={})  # fmt: skip
        return SimpleNamespace(ok=True, state=state)

    recorded: list[tuple[Any, ...]] = []

    def measure(label: str, trial: int, params: Any, todo: Any, artifacts: Any) -> float:
        recorded.append((trial, "ok", time.time(), 200.0, ""))
        return 0.25

    def frame(run_id: str) -> pd.DataFrame:
        table = pd.DataFrame(recorded, columns=("trial", "state", "started", "metric", "error"))
        return table.assign(seconds=1.0, price_usd_hour=0.036, rss_max_mb=50.0)

    monkeypatch.setattr(evaluator, "_build_run", build_run)
    monkeypatch.setattr(evaluator, "_measure", measure)
    monkeypatch.setattr(evaluator, "price_of", lambda *_: 36.0)  # a cent a second
    events: list[dict[str, Any]] = []
    evaluator.results = SimpleNamespace(
        replicates=frame, event=lambda run_id, kind, **detail: events.append(detail)
    )
    evaluator.run_id = "ft-test"
    scored = evaluator(0, {"opt": "-O3"})
    assert scored.state == "ok" and scored.usd == pytest.approx(0.25 + 1.00, abs=0.01)
    assert events == [{"amibake_run": "ab-build"}]  # and fleet kill knows the build's run


def test_a_trial_s_replicates_each_count_in_the_recommendation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cloud trial keeps each replicate's loss, and the recommendation pools them: a TPE
    search whose every trial ran 3 replicates (no configuration asked twice) gave one loss per
    trial and so never an interval."""
    evaluator = kernels_evaluator(monkeypatch, tmp_path, objective="metric", replicates=3)
    spec = evaluator.spec
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, spec, "local", "us-east-1")
    rates = {1: [100.0, 104.0, 98.0], 2: [190.0, 200.0, 205.0]}  # work per second, maximised
    for trial, (threads, values) in enumerate(rates.items()):
        frame = pd.DataFrame(
            {"metric": values, "seconds": [1.0] * 3, "price_usd_hour": [0.036] * 3,
             "rss_max_mb": [50.0] * 3}
        )  # fmt: skip
        evaluation = evaluator._score(frame, {}, 0.0)
        assert evaluation.manifest["losses"] == [-v for v in values]
        tune._record(results, run_id, trial, {"threads": threads}, evaluation)
    chosen = tune.recommendation(results, run_id)
    assert chosen is not None and chosen["params"] == {"threads": 2}
    # A rate's runs are averaged in log terms, and the mean read back as the arithmetic one (a
    # lognormal's sd**2/2 above the geometric), the spread the wider of its own and the pool's.
    logs = [np.log(v) for v in rates.values()]
    pooled = math.sqrt(sum(float(np.var(x, ddof=1)) for x in logs) / 2)
    sd = max(pooled, float(np.std(logs[1], ddof=1)))
    mean = -math.exp(float(np.mean(logs[1])) + sd * sd / 2)
    assert chosen["runs"] == 3 and chosen["loss"] == pytest.approx(mean)
    assert chosen["loss"] == pytest.approx(-np.mean(rates[2]), rel=1e-3)
    low, high = chosen["interval"]
    assert low < mean < high  # from the replicates' spread, pooled over both trials
    # A replayed trial keeps one loss: it counts once, as before.
    results.trial(run_id, 2, "ok", {"threads": 1}, loss=-150.0, metric=150.0)
    assert tune.recommendation(results, run_id)["runs"] == 3


def test_min_rate_on_a_workload_timed_in_seconds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(Path(__file__).parents[1] / "recipes" / "trivial", recipes / "trivial")
    with (recipes / "trivial" / "recipe.toml").open("a") as recipe:
        recipe.write('\n[bench]\ncommand = "true"\n')  # no metric: the run's seconds
    monkeypatch.setenv("AMIBAKE_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    path = tmp_path / "t.toml"
    path.write_text(
        'recipe = "trivial"\ntypes = ["c5a.large"]\n[constraints]\nmin_rate = 5\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(path)]) == 2
    assert capsys.readouterr().err == (
        "fleet: error: constraints.min_rate: trivial's metric is a time, not a rate; bound it "
        "with max_seconds\n"
    )
    assert Results(tmp_path / "results" / "fleet.sqlite").run_ids() == []


def test_a_search_with_no_feasible_trial_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    rows = [{"a": a, "b": b, "metric": a, "rss_mb": 900} for a in range(1, 21) for b in "xyz"]
    path = tune_file(tmp_path, table(tmp_path / "t.csv", rows), trials=5)
    path.write_text(path.read_text() + "[constraints]\nmax_rss_mb = 500\n")
    assert main(["tune", str(path)]) == 1
    assert "5 trials; none feasible" in capsys.readouterr().out
    # Status says it failed, not "finished 5/5" (issue 27).
    assert main(["status"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert " failed " in line and "5/5 trials" in line, line


def test_resume_names_a_run_of_the_other_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    results = Results(tmp_path / "fleet.sqlite")
    results.create_run("fb-0123456789", "bench", {}, "local", "us-east-1", "")
    results.create_run("ft-0123456789", "tune", {}, "local", "us-east-1", "")
    assert main(["tune", "--resume", "fb-0123456789"]) == 2
    assert capsys.readouterr().err == (
        "fleet: error: fb-0123456789 is not a fleet tune run (fleet bench --resume?)\n"
    )
    assert main(["bench", "--resume", "ft-0123456789"]) == 2
    assert (
        "ft-0123456789 is not a fleet bench run (fleet tune --resume?)" in capsys.readouterr().err
    )


def test_a_run_parameter_the_workload_cannot_take_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Passed as --NAME VALUE, a misspelt parameter failed every trial with the workload's
    # "unknown argument"; a recipe whose command has no {args} dropped it without a word.
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    path = tmp_path / "t.toml"
    run_param = '[params.{}]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    for recipe, name, expected in (
        ("kernels", "treads", "params.treads: kernels's workload takes no 'treads' (its "
         "[bench.parameters]: threads, size, block, in "),
        ("zstd", "threads", "params.threads: zstd's bench command (bin/zstd -b{level} "
         "-i{seconds}) has no {args} to pass it; its parameters: level, seconds"),
    ):  # fmt: skip
        path.write_text(f'recipe = "{recipe}"\ntypes = ["c5a.large"]\n' + run_param.format(name))
        assert main(["tune", str(path)]) == 2
        err = capsys.readouterr().err
        said = f"fleet: error: {path}:3: {expected}"  # of the tune file's line
        assert err.startswith(said) and err.count("\n") == 1, err
    assert Results(tmp_path / "results" / "fleet.sqlite").run_ids() == []
    # Said how to pass it, it goes: the check is for names the recipe never declared.
    path.write_text(
        'recipe = "kernels"\ntypes = ["c5a.large"]\n'
        + run_param.format("min_time")
        + 'arg = "--min-time {}"\n'
    )
    evaluator: Any = evaluators.evaluator(tune.load(path), config.load())
    assert evaluator.workload == "bin/kernels {args}"


def test_the_report_says_the_recommendation_ready_to_use_and_how_far_importance_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27: the best was a Python dict, importance a line with no warning at a handful of
    trials, and --json had neither."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    rows = [
        {"threads": t, "opt": o, "metric": t * (2 if o == "-O3" else 1)}
        for t in range(1, 9)
        for o in ("-O2", "-O3")
    ]
    replay = table(tmp_path / "t.csv", rows)
    path = tmp_path / "tune.toml"
    path.write_text(
        f'replay = "{replay}"\nobjective = "metric"\ntrials = 6\nseed = 3\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 8\nstage = "run"\n'
        '[params.opt]\nkind = "categorical"\nvalues = ["-O2", "-O3"]\nstage = "compile"\n'
    )
    assert main(["tune", str(path)]) == 0
    searched = capsys.readouterr().out
    assert main(["report", "last", "--no-html", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    chosen = made["recommended"]["params"]
    use = made["recommended"]["use"]
    assert f"\n{use}\n" in searched  # the search's own last lines say it too
    assert use.startswith("use: build with CFLAGS=\"<the family's tuned flags> ")
    assert f'CFLAGS="<the family\'s tuned flags> {chosen["opt"]}"' in use
    assert f'run with "--threads {chosen["threads"]}"' in use
    assert made["best"]["params"].keys() == {"threads", "opt"}
    assert made["importance"]["trials"] == 6 and made["importance"]["supported"] is False
    assert made["answer"].startswith("recommended: ")
    assert main(["report", "last", "--no-html"]) == 0
    text = capsys.readouterr().out
    assert use in text and "a hint, not a finding: 6 feasible trials for 2 parameters" in text
    # The page's chart says so too.
    assert main(["report", "last"]) == 0
    page = (tmp_path / "results" / "reports" / made["run_id"] / "index.html").read_text()
    assert (
        "Parameter importance (6 feasible trials): a hint, not a finding (about 10 would support "
        "it)" in page
    )


CONSTRAINED_SPACE = """objective = "metric"
{extra}
[constraints]
max_seconds = {max_seconds}
[params.a]
kind = "int"
low = 1
high = 6
[params.b]
kind = "categorical"
values = ["x", "y"]
"""


def test_compare_scores_against_the_best_configuration_that_meets_the_constraints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimum `compare` measures against is the best a search may recommend: the best row
    that breaks max_seconds made a whole grid look 4 times worse than it was. A file's trials
    are the comparison's budget, as they are its search's."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    # metric a (+0.5 for y); seconds 10 - a: the best metrics are the slow ones
    rows = [
        {"a": a, "b": b, "metric": a + (0.5 if b == "y" else 0), "seconds": 10 - a}
        for a in range(1, 7)
        for b in ("x", "y")
    ]
    replay = table(tmp_path / "t.csv", rows)
    space = tmp_path / "space.toml"
    space.write_text(CONSTRAINED_SPACE.format(extra="trials = 12", max_seconds=6.5))
    argv = ["tune", "compare", "--replay", str(replay), "--space", str(space)]
    assert main([*argv, "--algorithms", "grid", "--seeds", "2", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["algorithms"][0]["ratios"] == [1.0, 1.0]  # a = 4, x: 4, not a = 1's 1
    curves = pd.read_csv(answer["files"]["convergence.csv"])
    assert len(curves) == 2 * 12  # the file's 12 trials, not compare's default 20 (or 10)
    assert main([*argv, "--algorithms", "grid", "--seeds", "1"]) == 0
    assert "of the 12: 1 within 2%" in capsys.readouterr().out
    # No row meets them: nothing to compare with, said before any search.
    space.write_text(CONSTRAINED_SPACE.format(extra="", max_seconds=1))
    assert main([*argv, "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{replay}: no configuration of the replay table meets the constraints" in err, err


def test_compare_on_runs_reads_the_space_file_s_objective_column_and_constraints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compare --replay-runs --space FILE` scores what the file asks for: its cost objective
    over its own column, within its constraints (it read a `metric` column and minimised it,
    whatever the file said)."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    # seconds 20 - 2a (a = 6 fastest), price 0.1 a: cost ~ (20 - 2a) a, cheapest at a = 1;
    # max_seconds 15 leaves a >= 3, cheapest a = 3 (b = x, y alike but for a run's jitter)
    rows = [
        {
            "run": r,
            "a": a,
            "b": b,
            "seconds": 20 - 2 * a + 0.01 * r,
            "price_per_hour": 0.1 * a,
            "metric": "NA" if a == 2 else a,
        }  # a column the file does not search: text is fine
        for a in range(1, 7)
        for b in ("x", "y")
        for r in range(2)
    ]
    runs = table(tmp_path / "runs.csv", rows)
    space = tmp_path / "space.toml"
    head = 'objective = "cost"\nreplay_column = "seconds"'
    space.write_text(CONSTRAINED_SPACE.format(extra=head, max_seconds=15).replace(
        'objective = "metric"\n', ""))  # fmt: skip
    argv = ["tune", "compare", "--replay-runs", str(runs), "--space", str(space), "--json"]
    assert main([*argv, "--algorithms", "grid", "--seeds", "2", "--budget", "12"]) == 0
    ratios = json.loads(capsys.readouterr().out)["algorithms"][0]["ratios"]
    assert ratios == [pytest.approx(1.0, abs=0.002)] * 2, ratios
    space.write_text(space.read_text().replace("max_seconds = 15", "max_seconds = 1"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{runs}: no configuration of the runs table meets the constraints" in err, err


def test_a_tune_reads_its_types_as_a_bench_file_does() -> None:
    """C5a.Large is c5a.large in a bench file; a tune file refused it as no EC2 type."""
    spec = tune.from_dict(
        {
            "recipe": "kernels",
            "types": [" C5a.Large "],
            "params": {
                "opt": {
                    "kind": "categorical",
                    "values": ["-O2", "-O3"],
                    "stage": "compile",
                    "flag": "{}",
                }
            },
        },
        "t.toml",
    )
    assert spec.types == ["c5a.large"] and spec.instance_type({}) == "c5a.large"
