"""`fleet kill` tells the truth about a run: it stops a live one and records it killed, but a
run that had already ended keeps its outcome (issue 27: kill relabelled a finished run)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest

from amibake.cloud import Cloud
from amibake.journal import Journal
from fleet import bench, control, spec

BENCH = 'types = ["c5a.large"]\ncommand = "echo {args}"\n'  # a type as data: nothing runs


def _spec(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "bench.toml").write_text(BENCH)
    return spec.load(tmp_path / "bench.toml", {}).to_json()


@pytest.mark.parametrize("ended", ["finished", "failed", "stopped"])
def test_kill_after_a_run_ended_keeps_its_outcome(cloud: Cloud, tmp_path: Path, ended: str) -> None:
    results = bench.results_db(tmp_path / "results")
    results.create_run("fb-0000000001", "bench", _spec(tmp_path), "local", cloud.config.region)
    results.event("fb-0000000001", "controller", pid=os.getpid(), amibake_run="ab-000000000001")
    results.event("fb-0000000001", ended)
    outcome = control.kill(cloud, results, "fb-0000000001")
    assert outcome["state"] == ended and outcome["failures"] == []
    kinds = [k for _, k, _ in results.events("fb-0000000001")]
    assert kinds[-1] == "swept" and "killed" not in kinds, kinds


def test_kill_of_a_run_whose_controller_died_records_it_killed(
    cloud: Cloud, tmp_path: Path
) -> None:
    """A controller SIGKILLed mid-run never wrote its end: kill is what ended it."""
    results = bench.results_db(tmp_path / "results")
    results.create_run("fb-0000000002", "bench", _spec(tmp_path), "local", cloud.config.region)
    results.event("fb-0000000002", "controller", pid=2**22 + 7, amibake_run="ab-000000000002")
    outcome = control.kill(cloud, results, "fb-0000000002")
    assert outcome["state"] == "killed"
    assert [k for _, k, _ in results.events("fb-0000000002")][-1] == "killed"


@pytest.mark.parametrize("hours_ago", [0, 7], ids=["recent", "past-its-expiry"])
def test_a_run_another_machine_runs_is_not_resumed_or_killed_from_here(
    cloud: Cloud, tmp_path: Path, hours_ago: int
) -> None:
    """A results dir shared between machines: a resume, or fleet kill, here found no live
    controller (its pid is another machine's) and swept the run, taking the other machine's
    live instances and files, then ran the same replicates again. Refused, naming the machine,
    until the run's resources' amibake:expires says it is dead."""
    import sqlite3

    from amibake.errors import UserError

    results = bench.results_db(tmp_path / "results")
    run = "fb-0000000009"
    results.create_run(run, "bench", _spec(tmp_path), "local", cloud.config.region)
    results.event(
        run,
        "controller",
        pid=4242,
        pid_started="1",
        host="ci-runner-7",
        amibake_run="ab-000000000009",
    )
    with sqlite3.connect(tmp_path / "results" / "fleet.sqlite") as db:
        db.execute("UPDATE events SET at = at - ? WHERE run_id = ?", (hours_ago * 3600, run))
    if hours_ago:
        assert control.kill(cloud, results, run)["state"] == "killed"
        return
    for act in (lambda: control.take_over(cloud, results, run), lambda: control.kill(cloud, results, run)):  # fmt: skip
        with pytest.raises(UserError) as refused:
            act()
        said = str(refused.value)
        assert said.startswith(f"run {run} was started on ci-runner-7 (pid 4242, "), said
        assert "\n" not in said
    kinds = [k for _, k, _ in results.events(run)]
    assert kinds == ["controller"], kinds  # nothing claimed, swept or said killed


def test_kill_of_a_controller_that_does_not_exit_at_sigkill_says_so_and_sweeps_nothing(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller in uninterruptible sleep outlives SIGKILL until its call returns. gc keeps a
    live run's resources, so kill swept nothing and said "killed", exit 0: the run's instances
    ran on, unsaid. The process is given as one no signal ends (a D state cannot be made
    here)."""
    import subprocess

    results = bench.results_db(tmp_path / "results")
    run = "fb-0000000005"
    results.create_run(run, "bench", _spec(tmp_path), "local", cloud.config.region)
    stuck = subprocess.Popen(["sleep", "60"])
    signals: list[int] = []
    swept: list[str] = []
    try:
        from amibake import procs

        me = {"pid": stuck.pid, "pid_started": procs.started(stuck.pid), "host": socket.gethostname()}  # fmt: skip
        results.event(run, "controller", **me, amibake_run="ab-000000000005")
        monkeypatch.setattr(control, "process_alive", lambda pid: pid == stuck.pid)
        monkeypatch.setattr(control.os, "kill", lambda pid, sig: signals.append(sig))
        monkeypatch.setattr(control, "sweep", lambda *a: swept.append(a[2]) or ([], []))
        monkeypatch.setattr(control, "STOP_TIMEOUT_S", 0.3)
        monkeypatch.setattr(control, "KILL_WAIT_S", 0.3)
        outcome = control.kill(cloud, results, run)
        sent = list(signals)
    finally:
        monkeypatch.undo()
        stuck.kill()
        stuck.wait()
    assert sent == [signal.SIGTERM, signal.SIGKILL]
    assert outcome["state"] == "running" and swept == [], outcome
    (failure,) = outcome["failures"]
    assert f"pid {stuck.pid} did not exit" in failure and f"fleet kill {run} again" in failure
    assert "killed" not in [k for _, k, _ in results.events(run)]


def test_a_controller_s_pid_taken_by_another_process_is_not_the_controller(
    cloud: Cloud, tmp_path: Path
) -> None:
    """fleet kill signals the controller it finds, SIGKILL after 300 s: a pid reused since (by
    any process, root's in CI) was taken for it, as a resume was refused while it lived."""
    results = bench.results_db(tmp_path / "results")
    results.create_run("fb-0000000003", "bench", _spec(tmp_path), "local", cloud.config.region)
    me = control.this_process()
    results.event("fb-0000000003", "controller", **me, amibake_run="ab-000000000003")
    found = control.controller(results, "fb-0000000003")
    assert found is not None and found["pid"] == os.getpid()
    results.event("fb-0000000003", "stopped")
    results.event("fb-0000000003", "controller", **{**me, "pid_started": "1"})
    assert control.controller(results, "fb-0000000003") is None


def test_a_resume_claims_the_run_first_and_of_two_at_once_the_first_claim_wins(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume's controller was recorded only after its builds and preflight (minutes): a
    second resume, or fleet kill, found no controller meanwhile, swept the first one's live
    build and ran the same replicates. Two that check at once both claim; each reads back the
    first live claim, so one goes on, whichever order their steps interleave in."""
    import subprocess

    from amibake import procs
    from amibake.errors import UserError

    results = bench.results_db(tmp_path / "results")
    run = "fb-0000000004"
    results.create_run(run, "bench", _spec(tmp_path), "local", cloud.config.region)
    other = subprocess.Popen(["sleep", "60"])
    try:
        theirs = {"pid": other.pid, "pid_started": procs.started(other.pid), "host": socket.gethostname()}  # fmt: skip
        results.event(run, "claimed", **theirs)
        with pytest.raises(UserError, match=f"pid {other.pid}"):
            control.take_over(None, results, run)
        results.event(run, "stopped")
        control.take_over(None, results, run)
        found = control.controller(results, run)  # what fleet kill and a second resume see
        assert found is not None and found["pid"] == os.getpid()
        record = results.event
        for theirs_first in (False, True):
            results.event(run, "stopped")

            def at_once(
                run_id: str, kind: str, first: bool = theirs_first, **detail: object
            ) -> None:
                # the other resume found none too, and claims just before or after this one
                if kind == "claimed" and first:
                    record(run_id, "claimed", **theirs)
                record(run_id, kind, **detail)
                if kind == "claimed" and not first:
                    record(run_id, "claimed", **theirs)

            monkeypatch.setattr(results, "event", at_once)
            if theirs_first:
                with pytest.raises(UserError, match=f"pid {other.pid}"):
                    control.take_over(None, results, run)
            else:
                control.take_over(None, results, run)
                found = control.controller(results, run)
                assert found is not None and found["pid"] == os.getpid()
            monkeypatch.undo()
    finally:
        other.kill()
        other.wait()
        control.release_claims()  # as the command that claimed would, at its end
    # A claim whose process is gone ran nothing: the run stays as it ended.
    results.event(run, "finished")
    results.event(run, "claimed", **theirs)
    assert control.status(results, run)["state"] == "finished"
    assert control.kill(cloud, results, run)["state"] == "finished"


def _bench_of_a_fresh_recipe(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, name: str
) -> str:
    """A bench run of a recipe of the test's own (the trivial one with a bench command): built
    when it runs, not taken from an earlier test's artifact cache."""
    from tests.fleet.test_bench import results_of

    recipes = tmp_path / "recipes"
    shutil.copytree(Path(__file__).parents[1] / "recipes" / "trivial", recipes / name)
    text = (recipes / name / "recipe.toml").read_text()
    text = text.replace('name = "trivial"', f'name = "{name}"')
    (recipes / name / "recipe.toml").write_text(text + '\n[bench]\ncommand = "bin/hello"\n')
    monkeypatch.setenv("AMIBAKE_RECIPES_DIR", str(recipes))  # a controller process's
    monkeypatch.setattr(cloud, "config", dataclasses.replace(cloud.config, recipes_dir=recipes))
    wanted = {"types": [f"{family}.large"], "recipe": name, "builds": ["tuned"], "replicates": 1}
    wanted["warmups"] = 0
    return bench.create(cloud, spec.load(None, wanted, recipes), results_of(cloud))


def test_a_bench_s_spend_counts_its_builds_instances(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_family: str
) -> None:
    """The builds run first, on instances of their own: the cap counted from the first
    replicate's instance, as if they had been free."""
    from tests.fleet.test_bench import results_of

    run_id = _bench_of_a_fresh_recipe(cloud, tmp_path, monkeypatch, host_family, "costly")
    at_start: list[float] = []  # what the board had spent as the measuring began

    class Watched(bench.Board):
        def __post_init__(self) -> None:
            super().__post_init__()
            at_start.append(self.spent)

    monkeypatch.setattr(bench, "Board", Watched)
    bench.execute(cloud, run_id, results_of(cloud))
    (build,) = [d["amibake_run"] for _, k, d in results_of(cloud).events(run_id) if k == "build"]
    price = bench.prices.lookup(f"{host_family}.large").spot_median
    lived = Journal(cloud.config.results_dir / "journal.sqlite").instance_lifetimes(build)
    assert len(lived) == 1 and at_start == [pytest.approx(sum(lived.values()) * price / 3600)]
    assert at_start[0] > 0


def test_fleet_kill_removes_what_a_build_left_when_its_bench_was_sigkilled(
    cloud: Cloud,
    local_dir: Path,
    host_family: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bench builds its recipe first, in amibake runs of its own. SIGKILLed with a build's
    instance up, `fleet kill` swept only the controllers' runs: the build's instance, fleet,
    launch template, group and key ran on until `amibake gc`. Each build's run is recorded as
    it opens now, and swept with the rest."""
    from fleet.cli import main
    from tests.fleet.test_bench import fleet_process, results_of
    from tests.helpers import tagged_alive, wait_for, wait_until_clean

    run_id = _bench_of_a_fresh_recipe(cloud, tmp_path, monkeypatch, host_family, "killed")
    results = results_of(cloud)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")

    def builds() -> list[str]:
        return [d["amibake_run"] for _, k, d in results.events(run_id) if k == "build"]

    process = fleet_process("bench", "--resume", run_id, "--yes")
    try:
        wait_for(lambda: bool(builds()) and bool(journal.alive(builds()[0])), timeout_s=120)
        wait_for(lambda: any(r.kind == "instance" for r in journal.alive(builds()[0])))
        process.kill()  # SIGKILL: no cleanup of its own
        process.wait(30)
    finally:
        process.kill()
    (build,) = builds()
    assert tagged_alive(cloud, build)  # what kill has to remove
    assert main(["kill", run_id]) == 0
    assert tagged_alive(cloud, build) == [] and journal.alive(build) == []
    assert wait_until_clean(local_dir) == []


def test_status_of_a_running_bench_counts_each_planned_replicate_once_and_what_it_spent(
    cloud: Cloud, tmp_path: Path
) -> None:
    """After a spot rerun, its warm-up run again on the new instance read "5/4 replicates"; and
    while the controller runs (it records its spend as it ends) status said "$0.0000 spent"."""
    from fleet.results import ReplicateRow

    results = bench.results_db(tmp_path / "results")
    run_id = "fb-0000000003"
    results.create_run(run_id, "bench", _spec(tmp_path), "local", cloud.config.region)
    here = {"pid": os.getpid(), "host": socket.gethostname()}  # a live controller
    results.event(run_id, "controller", **here, amibake_run="ab-000000000003")

    def row(replicate: int, warmup: bool, state: str) -> ReplicateRow:
        return ReplicateRow("c5a.large", "plain", replicate, warmup, state, metric=1.0,
                            seconds=360.0, price_usd_hour=1.0)  # fmt: skip

    first = [row(0, True, "ok"), row(0, False, "ok"), row(1, False, "interrupted")]
    again = [row(0, True, "ok"), row(1, False, "ok"), row(2, False, "ok")]  # a new instance
    results.record_many(run_id, first + again)
    status = control.status(results, run_id)
    assert (status["state"], status["planned"], status["finished"]) == ("running", 4, 4)
    assert status["spent_usd"] == pytest.approx(0.6)  # six runs of 360 s at $1 an hour
    assert "at least $0.6000 spent so far" in control.status_text(status)
