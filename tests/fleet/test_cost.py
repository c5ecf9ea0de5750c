"""Cost before spending (issue 27): what a bench, a tune, a build or a bake will launch and spend
is said before anything is launched; without a terminal a large estimate needs --yes or a cap;
--dry-run creates nothing; and --max-cost stops a run cleanly, saying what it spent."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from amibake import cost
from amibake.cli import main as amibake
from amibake.cloud import Cloud
from amibake.steps.preflight import SPOT_ROLE_PATH
from fleet import bench, control, plan, prices, spec, tune
from fleet.cli import main
from fleet.results import ReplicateRow, Results
from tests.fleet.test_bench import assert_nothing_left, results_of

CHEAP, DEAR = "c5a.large", "c5a.xlarge"  # plain commands: any type runs on the local cloud


def spot(instance_type: str) -> float:
    """The catalog's spot price of a type (the median over its zones), USD an hour."""
    return prices.lookup(instance_type).spot_median


def journal_runs(results_dir: Path) -> list[str]:
    path = results_dir / "journal.sqlite"
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT run_id FROM runs")]


def test_the_estimate_is_the_catalogs_price_times_the_planned_hours(tmp_path: Path) -> None:
    results = Results(tmp_path / "fleet.sqlite")
    overrides: dict[str, Any] = {
        "types": [CHEAP, DEAR],
        "command": "echo 1",
        "replicates": 3,
        "warmups": 1,
        "expected_runtime": "2m",
    }
    planned = spec.load(None, overrides)
    estimate = plan.bench_estimate(planned, results, tmp_path, "us-east-1", bench.plan(planned))
    # One instance per type: its launch and staging, then its 4 replicates of 2 minutes each.
    hours = {t: (plan.SETUP_S + 4 * 120) / 3600 for t in (CHEAP, DEAR)}
    assert estimate.hours == pytest.approx(sum(hours.values()))
    assert estimate.usd == pytest.approx(sum(h * spot(t) for t, h in hours.items()))
    assert "expected_runtime 2 min" in " ".join(estimate.basis)
    # On-demand is priced on-demand.
    on_demand = spec.load(None, {**overrides, "spot": False})
    estimate = plan.bench_estimate(on_demand, results, tmp_path, "us-east-1", bench.plan(planned))
    expected = sum(h * prices.lookup(t).on_demand for t, h in hours.items())
    assert estimate.usd == pytest.approx(expected)

    # An earlier run of the same workload is the basis once there is one: its median per type.
    earlier = "fb-0000000001"
    results.create_run(earlier, "bench", planned.to_json(), "local", "us-east-1")
    for index, seconds in enumerate((10.0, 30.0, 20.0)):
        results.record(earlier, ReplicateRow(CHEAP, "tuned", index, False, "ok", seconds=seconds))
    estimate = plan.bench_estimate(planned, results, tmp_path, "us-east-1", bench.plan(planned))
    line = next(x for x in estimate.lines if x.instance_type == CHEAP)
    assert line.hours == pytest.approx((plan.SETUP_S + 4 * 20.0) / 3600)
    assert f"run {earlier} of the same workload" in " ".join(estimate.basis)
    # Without either, a stated guess.
    guessed = spec.load(None, {**overrides, "expected_runtime": None, "command": "echo 2"})
    estimate = plan.bench_estimate(guessed, results, tmp_path, "us-east-1", bench.plan(guessed))
    assert estimate.hours == pytest.approx(2 * (plan.SETUP_S + 4 * plan.GUESS_REPLICATE_S) / 3600)
    assert "a guess" in " ".join(estimate.basis)


def test_a_tune_is_estimated_per_trial_at_its_types_price(tmp_path: Path) -> None:
    searched = tune.from_dict(
        {
            "recipe": "kernels",
            "types": [CHEAP],
            "trials": 6,
            "replicates": 2,
            "expected_runtime": "30s",
            "max_cost": 2.5,  # the money budget under the name bench files use
            "params": {"threads": {"kind": "int", "low": 1, "high": 2, "stage": "run"}},
        },
        "t.toml",
    )
    assert searched.max_usd == 2.5
    estimate = plan.tune_estimate(
        searched, Results(tmp_path / "f.sqlite"), tmp_path, "us-east-1", 6
    )
    hours = 6 * (plan.SETUP_S + 2 * 30) / 3600  # no compile parameter: no build per trial
    # Then the gain: 3 runs of the recommendation (the standard build: nothing is compiled in)
    # and of the generic build, on one more instance; the generic one built first.
    hours += (plan.SETUP_S + 3 * 2 * 30) / 3600
    built = next(line for line in estimate.lines if "compile flags" in line.what)
    assert built.instances == 1 and "up to 1 build of" in built.what, built.what
    builder_hours = built.hours
    assert estimate.hours == pytest.approx(hours + builder_hours)
    assert estimate.usd == pytest.approx(
        hours * spot(CHEAP) + builder_hours * spot(built.instance_type)
    )
    # Without the gain, the trials alone.
    alone = replace(searched, gain_replicates=0)
    estimate = plan.tune_estimate(alone, Results(tmp_path / "f.sqlite"), tmp_path, "us-east-1", 6)
    assert estimate.hours == pytest.approx(6 * (plan.SETUP_S + 2 * 30) / 3600)


def test_the_cap_counts_what_is_spent_and_what_is_in_flight() -> None:
    """One more replicate on every instance up, and a new instance's launch too: past the cap,
    nothing more starts; a type's measured replicates replace the estimate's."""
    price = 36.0  # USD an hour: a cent a second
    board = bench.Board("fb-1", total=10, cap=1.0, expected={"": 10.0})

    def state(label: str, measured: list[float]) -> Any:
        return SimpleNamespace(label=label, measured=measured, spot=True, price_of=lambda *_: price)

    # Not launched: its launch and staging and a replicate, (180 + 10) s at 1 cent: $1.90.
    assert "max cost $1" in board.may_start(state("a.large", []))
    board.cap = 2.0
    assert board.may_start(state("a.large", [])) == ""
    # Up, it spends by the second: spent + one more replicate at its measured median.
    board.live["a.large"] = (board_time() - 150.0, price)  # $1.50 spent so far
    assert board.may_start(state("a.large", [50.0, 60.0, 70.0])) != ""  # 1.50 + 0.60 > 2
    assert board.may_start(state("a.large", [1.0, 2.0, 3.0])) == ""  # 1.50 + 0.02
    board.live["b.large"] = (board_time(), price)  # another instance in flight: 10 s more
    assert board.may_start(state("a.large", [1.0, 2.0, 3.0])) == ""  # 1.50 + 0.02 + 0.10
    board.cap = 1.6
    assert "would pass it" in board.may_start(state("a.large", [1.0, 2.0, 3.0]))
    assert board.capped


def test_types_let_start_at_once_each_count_the_others_launches() -> None:
    """The gate held a type's launch only while deciding it: three types it let start at once,
    none up yet, each saw the cap free of the other two ($5.70 of launches under a $2 cap)."""
    price = 36.0  # a cent a second: a launch, staging and a replicate, (180 + 10) s, is $1.90
    board = bench.Board("fb-1", total=3, cap=4.0, expected={"": 10.0})

    def state(label: str) -> Any:
        return SimpleNamespace(
            label=label, measured=[], spot=True, price_of=lambda *_: price,
            price=price, launched_at=board_time(),
        )  # fmt: skip

    a, b, c = state("a.large"), state("b.large"), state("c.large")
    assert board.may_start(a) == "" and board.may_start(b) == ""  # $3.80 of $4
    assert "would pass it" in board.may_start(c)
    board.update(b, "failed")  # b ended before its instance was up: its hold goes
    assert board.may_start(c) == ""
    board.update(a, "staging")  # a is up: its time counts from its launch, not the hold
    assert "a.large" in board.live and "a.large" not in board.reserved
    assert board.may_start(a) == ""  # its own hold never counted against it


def test_a_rerun_on_a_new_instance_keeps_the_first_instances_spend() -> None:
    """A spot reclaim starts the type over on a new instance: the first one's time was paid."""
    price = 36.0
    board = bench.Board("fb-1", total=3)
    now = board_time()
    first = SimpleNamespace(label="a.large", price=price, launched_at=now - 100.0)
    board.update(first, "staging")
    again = SimpleNamespace(label="a.large", price=price, launched_at=now - 10.0)
    board.update(again, "staging")
    # 90 s of the first instance until the second's launch, and 10 s of the second: $1.00.
    assert board.spent_now() == pytest.approx(1.0, abs=0.05)


def board_time() -> float:
    return time.time()


def test_a_large_estimate_without_a_terminal_needs_yes_or_a_cap(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cost, "terminal", lambda: False)
    results = results_of(cloud)
    runs, journaled = results.run_ids(), journal_runs(cloud.config.results_dir)
    # A workload no earlier test ran: the estimate is the stated guess, not another run's pace
    # (in a full suite an earlier "echo 1" run made it cheap enough to go ahead).
    never_run = f"echo {uuid.uuid4().hex}"
    argv = ["bench", "--types", CHEAP, "--command", never_run, "--replicates", "1000"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fleet: error: the estimate is $"), err
    assert "--yes" in err and "--max-cost USD" in err
    hours = (plan.SETUP_S + 1001 * plan.GUESS_REPLICATE_S) / 3600
    assert f"${hours * spot(CHEAP):.2f}" in err and hours * spot(CHEAP) > cost.THRESHOLD_USD
    # Asked at a terminal, "no" launches nothing either.
    monkeypatch.setattr(cost, "terminal", lambda: True)
    monkeypatch.setattr("sys.stdin", SimpleNamespace(readline=lambda: "n\n", isatty=lambda: True))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Proceed? [y/N]" in err and "not launched" in err
    assert results.run_ids() == runs and journal_runs(cloud.config.results_dir) == journaled
    # The same for amibake build, whose threshold this one family's build passes here.
    monkeypatch.setattr(cost, "terminal", lambda: False)
    monkeypatch.setattr(cost, "THRESHOLD_USD", 0.0001)
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(cloud.config.results_dir / "fresh"))
    iam = cloud.client("iam")
    for role in iam.list_roles(PathPrefix=SPOT_ROLE_PATH)["Roles"]:  # a fresh account's
        iam.delete_service_linked_role(RoleName=role["RoleName"])
    assert amibake(["build", "--family", "c5a", "--recipe", "kernels"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("amibake: error: the estimate is $"), err
    assert "--yes" in err and "--max-cost" not in err
    assert journal_runs(cloud.config.results_dir / "fresh") == []
    # Refused before the go-ahead: not even the account's spot role was made.
    assert iam.list_roles(PathPrefix=SPOT_ROLE_PATH)["Roles"] == []


def test_an_unpriced_type_without_a_terminal_needs_yes_even_when_capped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unpriced lines add no dollars to the sum: counted as free, 64 hours of a type without a
    price passed the gate below THRESHOLD_USD, and a cap, which cannot count them, let it by."""
    monkeypatch.setattr(cost, "terminal", lambda: False)
    priced = cost.Line("c7i.large: 1 replicate", "c7i.large", 1, 0.1, 0.1)
    unpriced = cost.Line("x9.48xlarge: 8 replicates", "x9.48xlarge", 8, 64.0, None)
    cost.approve(cost.Estimate("a cheap run", [priced]), "shown", yes=False)
    assert "shown" in capsys.readouterr().err
    estimate = cost.Estimate("a run", [priced, unpriced])
    assert estimate.usd <= cost.THRESHOLD_USD
    for capped in (False, True):
        with pytest.raises(cost.UserError) as refused:
            cost.approve(estimate, "shown", yes=False, capped=capped, cap_flag="--max-cost")
        said = str(refused.value)
        assert "no price for x9.48xlarge" in said and "--yes" in said and "\n" not in said
    assert "shown" not in capsys.readouterr().err
    cost.approve(estimate, "shown", yes=True)  # asked for, it runs


def test_dry_run_says_what_would_run_and_creates_nothing(
    cloud: Cloud,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    host_family: str,
) -> None:
    results = results_of(cloud)
    runs, journaled = results.run_ids(), journal_runs(cloud.config.results_dir)
    argv = ["bench", "--types", f"{CHEAP},{DEAR}", "--command", "echo 1", "--replicates", "2"]
    assert main([*argv, "--warmups", "0", "--dry-run", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dry_run"] and shown["created"] == []
    assert [line["instance_type"] for line in shown["estimate"]["lines"]] == [CHEAP, DEAR]
    assert shown["estimate"]["usd"] > 0
    tuned = tmp_path / "t.toml"
    tuned.write_text(
        f'recipe = "kernels"\ntypes = ["{host_family}.large"]\ntrials = 3\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(tuned), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("will run: 3 trials of kernels") and "(dry run: nothing was created)" in out
    )
    assert results.run_ids() == runs and journal_runs(cloud.config.results_dir) == journaled
    # amibake build --dry-run shows its estimate too: the build instance at the catalog's price.
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))  # no earlier build
    assert amibake(["build", "--family", "c7a", "--recipe", "kernels", "--dry-run", "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)[0]["estimate"]
    assert estimate["usd"] == pytest.approx(spot("c7a.large") * cost.GUESS_BUILD_S / 3600)
    assert journal_runs(tmp_path / "results") == []


def test_max_cost_stops_a_real_bench_cleanly_and_says_what_it_spent(
    cloud: Cloud, local_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two types one after the other, a cap between what the first and the second need to
    start: the first runs its replicates, the second is never launched, and the run is
    recorded as stopped at the cap with nothing left behind."""
    first = (plan.SETUP_S + 1) * spot(CHEAP) / 3600  # launch, staging and a 1 s replicate
    second = (plan.SETUP_S + 1) * spot(DEAR) / 3600
    cap = (first + second) / 2
    bench_file = tmp_path / "capped.toml"
    bench_file.write_text(
        f'types = ["{CHEAP}", "{DEAR}"]\ncommand = "sleep 0.5; echo value=1"\n'
        'metric = "value=(\\\\d+)"\nreplicates = 2\nwarmups = 0\nconcurrency = 1\n'
        'expected_runtime = "1s"\n'
    )
    assert main(["bench", str(bench_file), "--max-cost", f"{cap:.6f}", "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    run_id = summary["run_id"]
    assert summary["types"][CHEAP]["replicates_left"] == 0
    assert summary["types"][DEAR] == {
        "ok": True,
        "error": "",
        "replicates_left": 2,
        "instances": 0,
        "stopped": summary["stopped"],
    }
    assert summary["stopped"].startswith(f"max cost ${float(f'{cap:.6f}'):g}")
    assert 0 < summary["spent_usd"] <= cap
    results = results_of(cloud)
    assert control.status(results, run_id)["state"] == "stopped"
    stopped = [d for _, k, d in results.events(run_id) if k == "stopped"]
    assert stopped and stopped[-1]["reason"].startswith("max cost") and stopped[-1]["spent"] > 0
    assert set(results.replicates(run_id).instance_type) == {CHEAP}
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_a_tune_stopped_by_its_money_budget_is_stopped_not_finished(tmp_path: Path) -> None:
    from fleet.search.evaluation import Evaluation

    table = tmp_path / "t.csv"
    table.write_text("a,metric\n1,3\n2,2\n3,1\n")
    searched = tune.from_dict(
        {
            "replay": str(table),
            "objective": "metric",
            "trials": 3,
            "max_cost": 1.5,
            "params": {"a": {"kind": "int", "low": 1, "high": 3}},
        },
        "t.toml",
    )
    results = Results(tmp_path / "fleet.sqlite")
    run_id = tune.start(results, searched, "local", "us-east-1")
    outcome = tune.search(
        searched, lambda t, p: Evaluation("ok", loss=1.0, usd=1.0), results, run_id
    )
    assert outcome.trials == 1 and outcome.stopped.startswith("max cost $1.5")
    assert outcome.spent_usd == 1.0
    assert control.status(results, run_id)["state"] == "stopped"
