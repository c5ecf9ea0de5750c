"""`fleet plan` projects a bench run's measurements onto a job: whole runs are not split across
instances, a type whose replicates failed in part is not put first, a type that did no work is
said so, and no deadline asks for more instances than any quota. Runs given as data."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake.errors import UserError
from fleet import plan
from fleet.bench import results_db
from fleet.results import ReplicateRow, Results
from fleet.spec import BenchSpec, Metric

RATE = Metric(kind="regex", pattern="x=([0-9.]+)", meaning="rate", unit="x/s")
RUNTIME = Metric()  # seconds per run


def _run(tmp_path: Path, rows: list[ReplicateRow], metric: Metric = RUNTIME) -> Results:
    results = results_db(tmp_path / "results")
    types = tuple(sorted({r.instance_type for r in rows}))
    spec = BenchSpec(types=types, command="app {args}", builds=("plain",), metric=metric)
    results.create_run("fb-0123456789", "bench", spec.to_json(), "aws", "us-east-1")
    results.record_many("fb-0123456789", rows)
    return results


def _ok(instance_type: str, replicate: int, value: float, price: float) -> ReplicateRow:
    return ReplicateRow(
        instance_type, "plain", replicate, False, "ok", metric=value, seconds=value,
        market="spot", price_usd_hour=price,
    )  # fmt: skip


def _failed(instance_type: str, replicate: int) -> ReplicateRow:
    return ReplicateRow(
        instance_type, "plain", replicate, False, "failed", error="timed out", market="spot",
        price_usd_hour=0.05,
    )  # fmt: skip


def test_a_type_whose_replicates_failed_in_part_comes_after_one_that_ran_them_all(
    tmp_path: Path,
) -> None:
    """The cheap type's one finished run is its fast one (the slow ones timed out): it was
    planned first, on that run alone, with no word of the two that failed."""
    cheap = [_ok("c5.large", 0, 100, 0.05), _failed("c5.large", 1), _failed("c5.large", 2)]
    steady = [_ok("c6i.large", i, 100 + i, 0.10) for i in range(3)]
    results = _run(tmp_path, cheap + steady)
    rows = plan.plan(results, "fb-0123456789", work=100)
    assert [r["type"] for r in rows] == ["c6i.large", "c5.large"]
    assert rows[0]["usd"] > rows[1]["usd"]  # dearer, and still first
    assert (rows[1]["n"], rows[1]["failed"]) == (1, 2)
    assert rows[1]["note"] == "2 of its 3 replicates failed"
    text = plan.plan_text(rows)
    assert "2 of its 3 replicates failed" in text and "spot" in text


def test_whole_runs_are_not_split_across_instances(tmp_path: Path) -> None:
    """A run (seconds per run: the unit of work is one run) takes its time on one instance:
    one 2-hour run on 4 instances was planned at 0.5 h, meeting a 1-hour deadline."""
    results = _run(tmp_path, [_ok("c5.large", i, 7200 + i, 0.10) for i in range(3)])
    setup_h = plan.SETUP_S / 3600  # every instance launches and stages first, and is billed
    (long,) = plan.plan(results, "fb-0123456789", work=1, instances=4, deadline_h=1.0)
    assert long["hours"] == pytest.approx(setup_h + 7201 / 3600)
    assert long["meets_deadline"] is False and long["instances_for_deadline"] is None
    assert long["note"] == "one run takes longer than the deadline"
    with pytest.raises(UserError, match="give a whole number of runs"):
        plan.plan(results, "fb-0123456789", work=2.5)
    with pytest.raises(UserError, match="more work than any plan can count hours for"):
        plan.plan(results, "fb-0123456789", work=1e308, deadline_h=1.0)  # inf hours
    # Nine half-hour runs on 4 instances: the busiest does 3 (1.5 h) after its setup; a 1-hour
    # deadline leaves an instance time for one run once it is set up, so 9 instances (5 when
    # the plan left setup out).
    results = _run(tmp_path / "b", [_ok("c5.large", i, 1800, 0.10) for i in range(3)])
    (short,) = plan.plan(results, "fb-0123456789", work=9, instances=4, deadline_h=1.0)
    assert short["hours"] == pytest.approx(setup_h + 1.5) and short["meets_deadline"] is False
    assert short["instances_for_deadline"] == 9
    # the hours of the runs and of each instance's setup, not idle ones
    assert short["usd"] == pytest.approx((9 * 0.5 + 4 * setup_h) * 0.10)
    (tight,) = plan.plan(results, "fb-0123456789", work=9, deadline_h=setup_h / 2)
    assert tight["note"] == "the deadline is shorter than an instance's setup"
    assert "include 3 min an instance to launch and stage" in plan.plan_text([short])


def test_a_type_that_did_no_work_is_said_so_and_a_deadline_past_any_quota_too(
    tmp_path: Path,
) -> None:
    idle = [
        ReplicateRow("c5.large", "plain", i, False, "ok", metric=0.0, seconds=10.0,
                     market="spot", price_usd_hour=0.05)
        for i in range(3)
    ]  # fmt: skip
    busy = [
        ReplicateRow("c6i.large", "plain", i, False, "ok", metric=10.0, seconds=10.0,
                     market="spot", price_usd_hour=0.10)
        for i in range(3)
    ]  # fmt: skip
    results = _run(tmp_path, idle + busy, RATE)
    rows = plan.plan(results, "fb-0123456789", work=10, deadline_h=1.0)  # OverflowError before
    assert [r["type"] for r in rows] == ["c6i.large", "c5.large"]
    assert rows[1]["hours"] is None and rows[1]["usd"] is None
    assert rows[1]["note"] == "measured no work done (a rate of 0): nothing to plan from"
    assert "nothing to plan from" in plan.plan_text(rows)
    # The report's answer: it was "cheapest: c5.large plain ($inf per 1 x)".
    from fleet import report

    frame = report.summarize(results.replicates("fb-0123456789"), RATE)
    said = report.answer(frame, RATE)
    assert "cheapest: c6i.large plain" in said and "inf" not in said, said
    assert said.endswith("measured no work done (a rate of 0): c5.large plain"), said
    (many, _) = plan.plan(
        results, "fb-0123456789", work=1e12, deadline_h=plan.SETUP_S / 3600 + 0.01
    )
    assert many["instances_for_deadline"] is None
    assert many["note"] == f"the deadline needs more than {plan.MAX_INSTANCES} instances"


def test_a_plan_or_report_of_a_run_still_going_says_it_reads_what_is_measured_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two of a run's eight replicates in, its plan and report read like a finished run's."""
    from fleet import control
    from fleet.cli import main

    results = _run(tmp_path, [_ok("c5.large", 0, 100, 0.05), _ok("c6i.large", 0, 90, 0.10)])
    results.event("fb-0123456789", "controller", **control.this_process(), amibake_run="ab-1")
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    for argv in (["plan", "last", "--work", "10"], ["report", "last", "--no-html"]):
        capsys.readouterr()
        assert main(argv) == 0
        said = capsys.readouterr().err
        assert "run fb-0123456789 is still running: this reads the replicates it has" in said
    results.event("fb-0123456789", "finished")
    assert main(["plan", "last", "--work", "10"]) == 0
    assert "still running" not in capsys.readouterr().err
