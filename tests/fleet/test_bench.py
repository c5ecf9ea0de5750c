"""`fleet bench` on the local cloud: two builds across two types with a report that renders,
a spot interruption mid-replicate, resume after SIGKILL, `fleet kill`, and failing workloads."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from amibake import catalog, cost, cpu, flags
from amibake.cloud import Cloud
from amibake.errors import CloudError
from amibake.journal import Journal
from amibake.local import control as local_control
from amibake.runner import Interrupted
from fleet import bench, control, report, spec
from fleet.cli import main
from fleet.executor import BenchState, Replicate
from fleet.results import Results
from tests.helpers import other_architecture_family, tagged_alive, wait_for, wait_until_clean


def results_of(cloud: Cloud) -> Results:
    return bench.results_db(cloud.config.results_dir)


def amibake_runs(results: Results, run_id: str) -> list[str]:
    return [d["amibake_run"] for _, k, d in results.events(run_id) if k == "controller"]


def assert_nothing_left(cloud: Cloud, results: Results, run_id: str, local_dir: Path) -> None:
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    for amibake_run in amibake_runs(results, run_id):
        assert tagged_alive(cloud, amibake_run) == []
        assert journal.alive(amibake_run) == []
    assert wait_until_clean(local_dir) == []


# A plain command's type: no build runs on it, so its family is data (the local cloud runs any
# type on this machine). Tests that run a build take this machine's family (host_types).
ANY_TYPE = "c5a.large"


def new_run(cloud: Cloud, **overrides: Any) -> str:
    defaults: dict[str, Any] = {"types": [ANY_TYPE], "replicates": 3, "warmups": 0}
    bench_spec = spec.load(None, {**defaults, **overrides})
    return bench.create(cloud, bench_spec, results_of(cloud))


def blue_pixels(png: Path) -> int:
    """Pixels of matplotlib's first colour (the bars) in a screenshot."""
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[..., :3]
    target = (0x1F / 255, 0x77 / 255, 0xB4 / 255)
    close = (abs(image[..., 0] - target[0]) < 0.03) & (abs(image[..., 1] - target[1]) < 0.03)
    return int((close & (abs(image[..., 2] - target[2]) < 0.03)).sum())


@pytest.mark.e2e
def test_two_builds_on_two_types_measured_reported_and_rendered(
    cloud: Cloud,
    local_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    host_types: tuple[str, str],
) -> None:
    caplog.set_level(logging.INFO, logger="amibake")
    run_id = new_run(
        cloud,
        types=list(host_types),
        recipe="kernels",
        builds=["tuned", "generic"],
        args="--size 2",
    )
    results = results_of(cloud)
    summary = bench.execute(cloud, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    # Every planned replicate measured once; only a spot reclaim (under --faults aws) adds a
    # row, an interrupted attempt, which is rerun, never scored.
    assert set(rows.state) <= {"ok", "interrupted"}
    rows = rows[rows.state == "ok"]
    assert len(rows) == 12
    assert set(rows.build) == {"tuned", "generic"}
    assert (rows.metric > 0).all() and (rows.price_usd_hour > 0).all()
    # The progress counts the money: both instances' time from launch at their price, at least
    # what their replicates ran for.
    spent = float(re.findall(r"\$([0-9.]+) spent", caplog.text)[-1])
    assert spent >= round((rows.seconds * rows.price_usd_hour).sum() / 3600, 4) > 0
    # The run's own log under results/logs/: its progress and its builds' and instances' lines.
    logged = results.log_path(run_id).read_text()
    assert f"[{run_id}] 12/12 replicates" in logged and "succeeded; nothing left" in logged
    environments = results.environments(run_id)
    assert {e["instance_type"] for e in environments} == set(host_types)
    builds = environments[0]["builds"]
    family = catalog.family(host_types[0].split(".")[0])
    compiler = flags.Compiler.parse(builds["tuned"]["compiler"])
    assert flags.for_build(family, compiler, generic=True).cflags in builds["generic"]["cflags"]
    assert flags.for_family(family, compiler).cflags in builds["tuned"]["cflags"]
    assert builds["tuned"]["runs"] in ("native", "emulated")
    assert environments[0]["microarchitecture"] and environments[0]["kernel"]
    assert_nothing_left(cloud, results, run_id, local_dir)

    assert main(["report", run_id]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("Local cloud: every instance type ran on this machine")
    assert host_types[1] in out and "generic" in out
    reports = cloud.config.results_dir / "reports" / run_id
    summary_csv = (reports / "summary.csv").read_text().splitlines()
    assert len(summary_csv) == 1 + 4 and summary_csv[0].startswith("type,build,n,median")
    everything = len(results.replicates(run_id))  # interrupted attempts too
    assert len((reports / "replicates.csv").read_text().splitlines()) == 1 + everything
    page = reports / "index.html"
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1000,2600",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    # The bars were drawn: many pixels of the throughput plot's colour on the rendered page.
    assert blue_pixels(shot) > 5000
    # At a laptop's width the page needs no sideways scrolling, and the answer comes first.
    probe = tmp_path / "probe.html"
    measure = "<script>document.body.dataset.width=document.documentElement.scrollWidth</script>"
    probe.write_text(page.read_text().replace("</body>", measure + "</body>"))
    dom = subprocess.run(
        [
            *("chromium", "--headless", "--no-sandbox", "--disable-gpu"),
            *("--window-size=1366,900", "--dump-dom", probe.as_uri()),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    width = re.search(r'data-width="(\d+)"', dom)
    assert width is not None and int(width.group(1)) <= 1366, width
    assert dom.index('class="answer">Recommended: ') < dom.index("<table")

    # Named as the type run today, the other type's saving is said (or that it is the pick).
    assert main(["report", run_id, "--no-html", "--current", host_types[1].upper()]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith("Recommended: ") and ("Against " in said or host_types[1] in said)
    assert main(["report", run_id, "--current", "c5a.huge"]) == 2
    assert "--current c5a.huge is not one of run" in capsys.readouterr().err
    assert main(["plan", run_id, "--work", "1e6", "--deadline", "10m", "--budget", "100"]) == 0
    planned = capsys.readouterr().out
    assert "NO" in planned and "yes" in planned  # a ten-minute deadline needs several instances


def test_a_spot_notice_mid_replicate_reruns_it_on_a_new_instance_after_a_warm_up(
    cloud: Cloud, local_dir: Path
) -> None:
    run_id = new_run(
        cloud,
        # 4 s: the notice comes 0.5 s in and the agent's watcher polls at 1 Hz, so the replicate
        # must outlive both on a loaded host (2 s left half a second to spare)
        command="sleep 4; echo value=7",
        metric={"kind": "regex", "pattern": "value=(\\d+)"},
        warmups=1,
    )
    results = results_of(cloud)
    interrupted: list[str] = []

    def interrupt_second(state: BenchState, replicate: Replicate) -> None:
        if replicate.index == 1 and not replicate.warmup and not interrupted:
            interrupted.append(state.instance_id)
            timer = threading.Timer(0.5, local_control.interrupt, (cloud.config, state.instance_id))
            timer.start()

    summary = bench.execute(cloud, run_id, results, before_replicate=interrupt_second)
    assert summary["types"][ANY_TYPE]["ok"], summary
    assert summary["types"][ANY_TYPE]["instances"] == 2
    rows = results.replicates(run_id)
    assert list(rows.state) == ["ok", "ok", "interrupted", "ok", "ok", "ok"]
    # The new instance is as cold as the first was: it warms up before measuring again.
    assert list(rows.warmup) == [1, 0, 0, 1, 0, 0]
    assert rows.instance_id[2] == interrupted[0] != rows.instance_id[3]
    assert len(set(rows.instance_id[3:])) == 1
    measured = rows[(rows.state == "ok") & (rows.warmup == 0)]
    assert sorted(measured.replicate) == [0, 1, 2]
    assert (measured.metric == 7).all()
    # The monitor, ready before each 4 s workload started, sampled it (1 Hz) all along.
    assert (measured.monitor_samples >= 1).all(), rows.monitor_samples
    made = report.make(results, run_id, cloud.config.results_dir / "reports", html_page=False)
    assert int(made.summary.n[0]) == 3  # the interrupted attempt and warm-ups are never scored
    assert_nothing_left(cloud, results, run_id, local_dir)


def fleet_process(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_resume_after_sigkill_redoes_nothing_and_leaves_nothing(
    cloud: Cloud, local_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1.5 s a replicate: killed once two are done, the third must not be (0.5 s was one stalled
    # poll away from all four done on a loaded host)
    run_id = new_run(cloud, command="sleep 1.5; echo value=1", replicates=4, metric="value=(\\d+)")
    results = results_of(cloud)
    process = fleet_process("bench", "--resume", run_id)
    try:
        wait_for(lambda: len(results.finished(run_id)) >= 2)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        process.kill()
    before = results.replicates(run_id)
    assert 2 <= len(before) < 4
    assert control.status(results, run_id)["state"] == "stopped"

    assert main(["bench", "--resume", run_id]) == 0
    # It ends with what it found, then where the report is (issue 27).
    last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert last[0].startswith("answer: cheapest: ") and " per 1" in last[0], last
    assert last[1] == f"report: fleet report {run_id}", last
    rows = results.replicates(run_id)
    assert list(rows.id[: len(before)]) == list(before.id)  # the first rows stand as they were
    assert sorted(rows.replicate) == [0, 1, 2, 3]  # each replicate exactly once
    assert control.status(results, run_id)["state"] == "finished"
    # The SIGKILLed controller's instance was swept by the resume.
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_fleet_kill_stops_the_run_and_removes_everything(
    cloud: Cloud, local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run(cloud, command="sleep 30; echo value=1", metric="value=(\\d+)")
    results = results_of(cloud)
    process = fleet_process("bench", "--resume", run_id)
    try:
        wait_for(lambda: local_control.status(cloud.config)["instances"] != {})  # type: ignore[index]
        wait_for(lambda: control.controller(results, run_id) is not None)
        time.sleep(1.0)  # inside the first replicate
        # No --cloud and none configured: the run is killed on the cloud it ran on.
        monkeypatch.delenv("AMIBAKE_CLOUD")
        assert main(["kill", run_id]) == 0
        process.wait(30)
    finally:
        process.kill()
    assert process.returncode == 130, process.stdout.read() if process.stdout else ""
    assert control.status(results, run_id)["state"] == "killed"
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_failing_workloads_fail_their_replicates_with_the_last_lines(
    cloud: Cloud, local_dir: Path
) -> None:
    results = results_of(cloud)
    no_match = new_run(
        cloud, command="echo line one; echo no number here", replicates=1, metric="value=(\\d+)"
    )
    exits = new_run(cloud, command="echo about to fail; exit 3", replicates=1)
    for run_id in (no_match, exits):
        # the type measured nothing: it failed, naming why (it was "done", and the run exited 0)
        outcome = bench.execute(cloud, run_id, results)["types"][ANY_TYPE]
        assert not outcome["ok"] and "every replicate failed (1): " in outcome["error"], outcome
    error = results.replicates(no_match).error[0]
    assert "never matched" in error and "no number here" in error
    row = results.replicates(exits).iloc[0]
    assert row.state == "failed" and row.exit_code == 3 and "about to fail" in row.error
    for run_id in (no_match, exits):
        assert_nothing_left(cloud, results, run_id, local_dir)


def test_a_long_replicate_says_it_is_running_while_it_runs(
    cloud: Cloud,
    local_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replicate's line comes when it ends: while one runs, the board says what runs, for how
    long, and what was spent, whenever it was quiet (a `sleep 40` was 40 s of silence)."""
    caplog.set_level(logging.INFO, logger="amibake")
    monkeypatch.setattr(bench, "HEARTBEAT_S", 0.5)
    results = results_of(cloud)
    run_id = new_run(cloud, command="sleep 3", replicates=1)
    assert bench.execute(cloud, run_id, results)["types"][ANY_TYPE]["ok"]
    beats = [r.getMessage() for r in caplog.records if " running for " in r.getMessage()]
    assert beats, caplog.text
    assert f"{ANY_TYPE} plain-r0 running for " in beats[0], beats
    assert "0/1 replicates" in beats[0] and " spent" in beats[0], beats
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_the_board_is_quiet_while_it_speaks_and_when_nothing_runs() -> None:
    board = bench.Board("fb-1", total=2)
    state: Any = type("State", (), {"label": "a.large", "launched_at": 0.0, "price": None})()
    assert board.beat(0.0) == ""  # nothing runs
    board.update(state, "running x-r0")
    assert board.beat(3600.0) == ""  # it spoke just now
    line = board.beat(0.0)
    assert line.startswith("a.large x-r0 running for 0s; 0/2 replicates"), line
    board.update(state, "replicate done")
    assert board.beat(0.0) == ""  # done: nothing runs
    # Batch: jobs wait and run for minutes with no line until their states change.
    board.update(state, "submitted 2 jobs")
    assert board.beat(0.0).startswith("a.large submitted 2 jobs for 0s; 1/2 replicates")
    board.update(state, "jobs 1 running, 1 runnable")
    board.update(state, "replicate done")  # the other job runs on
    assert board.beat(0.0).startswith("a.large jobs 1 running, 1 runnable for 0s; 2/2")
    board.update(state, "jobs 2 succeeded")  # the last poll: every job has ended
    assert board.beat(0.0) == ""
    board.update(state, "running x-r3")
    board.update(state, bench.IDLE)  # its replicate failed midway: nothing runs on it now
    assert board.beat(0.0) == ""
    board.close()


def test_a_build_run_under_qemu_is_marked_emulated_and_ranked_apart(
    cloud: Cloud, local_dir: Path, host: cpu.Cpu, host_family: str
) -> None:
    """On the local cloud the other architecture's type runs on this machine too, its build
    under QEMU: measured, recorded as emulated, and never ranked against native runs."""
    other = other_architecture_family(host)
    types = [f"{host_family}.large", f"{other}.large"]
    results = results_of(cloud)
    run_id = new_run(cloud, types=types, recipe="kernels", replicates=2, args="--size 1")
    summary = bench.execute(cloud, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    expected = {}
    for instance_type in types:
        family = catalog.family(instance_type.split(".")[0])
        manifest = bench.ensure_builds(
            cloud, spec.load(None, {"types": [instance_type], "recipe": "kernels"})
        )
        verdict = cpu.verdict(
            family.architecture,
            set(manifest[(family.name, "tuned")].manifest["isa_features"]),
            host,
        )
        expected[instance_type] = {"tuned": verdict.emulator} if verdict.how == "emulated" else {}
    recorded = {e["instance_type"]: e["emulated"] for e in results.environments(run_id)}
    assert recorded == expected and recorded[f"{other}.large"]["tuned"].startswith("qemu-")
    made = report.make(results, run_id, cloud.config.results_dir / "reports", html_page=False)
    frame = made.summary
    assert set(frame[frame.emulated].type) == {t for t, e in expected.items() if e}
    for group in (frame[frame.emulated], frame[~frame.emulated]):  # each ranked on its own
        assert group.empty or group.speed_rank.min() == 1
    assert "emulated" in made.text
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_a_run_stopped_at_stage_leaves_nothing(cloud: Cloud, local_dir: Path) -> None:
    run_id = new_run(cloud, command="echo value=1", replicates=1, metric="value=(\\d+)")
    results = results_of(cloud)

    def stop(step: str) -> None:
        if step == "stage":
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        bench.execute(cloud, run_id, results, on_boundary=stop)
    assert control.status(results, run_id)["state"] == "stopped"
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_bad_input_is_one_line_and_creates_nothing(
    cloud: Cloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = results_of(cloud)
    runs_before = results.run_ids()
    bad = tmp_path / "bench.toml"
    bad.write_text('types = ["c5a.large"]\ncommand = "true"\nreplicates = "three"\n')
    cases = {
        ("bench", "--types", "c5x.large", "--command", "true"): "unknown instance type 'c5x.large'",
        ("bench", "--types", "c5a.huge", "--command", "true"): "c5a comes in large, xlarge",
        ("bench", str(bad)): f"{bad}:3: replicates: must be an integer",
        ("bench", "--types", "c5a.large"): "give exactly one of recipe",
        ("bench", "--types", "c5a.large", "--command", "true", "--sizes", "xlarge"): (
            "sizes: sizes are of families: add families"
        ),
        (
            "bench",
            "--types",
            "c5a.large",
            "--command",
            "true",
            "--metric-regex",
            "(",
        ): "does not compile",
        # Arguments a command has no {args} for would be dropped, and the run measure else.
        ("bench", "--types", "c5a.large", "--recipe", "zstd", "--args=-T2"): (
            "args: the command (bin/zstd -b{level} -i{seconds}) has no {args} to take them"
        ),
        ("report", "fb-nope"): "no fleet run 'fb-nope'",
        ("report", "last", "--prefer", "speed"): "--prefer 'speed' is not one of time, cost",
        ("bench", "--resume", "fb-nope", "--replicates", "5", "--on-demand"): (
            "--resume RUN takes the run's own plan: drop --replicates, --on-demand"
        ),
        ("bench", "--resume", "fb-nope"): "no fleet run 'fb-nope'",
        ("tune", "--resume", "ft-nope"): "no fleet run 'ft-nope'",
    }
    for argv, expected in cases.items():
        assert main(list(argv)) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("fleet: error:") and expected in err, (argv, err)
        assert "\n" not in err
    assert results.run_ids() == runs_before
    bad.write_text('types = ["c5a.large"]\ncommand = "true"\n[metric\n')
    assert main(["bench", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fleet: error: {bad}: ") and "line 3" in err, err


def test_a_type_without_price_is_refused_unless_allowed(
    cloud: Cloud,
    local_dir: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fleet import prices

    table = prices.saved(cloud.config.results_dir, "us-east-1")
    document = dict(prices.snapshot())
    document["prices"] = {"c5a.xlarge": document["prices"]["c5a.xlarge"]}
    table.write_text(json.dumps(document))
    try:
        argv = ["bench", "--types", "c5a.large", "--command", "echo 1", "--replicates", "1"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "no price for c5a.large" in err and "--allow-missing-price" in err
        allowed = [*argv, "--warmups", "0", "--allow-missing-price", "--json"]
        # Allowed, its dollars are unknown, not none: without a terminal to ask, --yes says so
        assert main(allowed) == 2
        err = capsys.readouterr().err
        assert "the estimate has no price for c5a.large" in err and "--yes" in err, err
        assert main([*allowed, "--yes"]) == 0
        run_id = json.loads(capsys.readouterr().out)["run_id"]
    finally:
        table.unlink()
    results = results_of(cloud)
    made = report.make(results, run_id, cloud.config.results_dir / "reports", html_page=False)
    assert made.summary.usd_per_unit.isna().all()  # measured, but no cost claimed
    assert "$0.0000 spent (without c5a.large: no price)" in caplog.text  # not "free"
    assert_nothing_left(cloud, results, run_id, local_dir)


def test_the_example_bench_file_loads() -> None:
    # The README's first fleet command runs it.
    path = Path(__file__).resolve().parents[2] / "examples" / "kernels.bench.toml"
    example = spec.load(path, {})
    assert example.types == ("c5a.large", "c5a.xlarge")
    assert example.builds == ("tuned", "generic")
    assert example.command_line() == "bin/kernels --size 4"


def test_a_type_whose_build_this_machine_cannot_run_is_refused_before_anything_is_made(
    cloud: Cloud,
    host: cpu.Cpu,
    host_family: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every local instance runs on this machine's CPU. Without QEMU, the other architecture's
    # builds cannot run here at all: fleet says so before it records or launches anything,
    # naming the families whose builds do run (this machine's own among them).
    other = other_architecture_family(host)
    monkeypatch.setattr(cpu, "installed_emulators", frozenset)
    results = results_of(cloud)
    runs_before = results.run_ids()
    argv = ["bench", "--types", f"{other}.large", "--recipe", "kernels", "--replicates", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"fleet: error: {other}.large cannot run here"), err
    assert f"is {host.architecture}, not " in err and "install qemu-user-static" in err
    assert f"families whose builds run here: {host_family}" in err
    assert results.run_ids() == runs_before
    tune = tmp_path / "tune.toml"
    tune.write_text(
        f'recipe = "kernels"\ntypes = ["{other}.large"]\ntrials = 1\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(tune)]) == 2
    assert f"{other}.large cannot run here" in capsys.readouterr().err
    assert results.run_ids() == runs_before


def test_a_type_that_failed_entirely_is_named_first_in_the_report(
    cloud: Cloud, local_dir: Path
) -> None:
    # One of two types fails while staging (before any replicate): the report said "0 failed",
    # its failures.csv was empty and the page never named the type.
    other = "c5a.xlarge"
    run_id = new_run(
        cloud, types=[ANY_TYPE, other], command="echo value=1", metric="value=(\\d+)", replicates=1
    )
    results = results_of(cloud)
    failed_once = threading.Lock()

    def break_one_stage(step: str) -> None:
        if step == "stage" and failed_once.acquire(blocking=False):
            raise CloudError("injected: the instance could not be staged")

    summary = bench.execute(cloud, run_id, results, on_boundary=break_one_stage)
    broken = [t for t, s in summary["types"].items() if not s["ok"]]
    assert len(broken) == 1
    made = report.make(results, run_id, cloud.config.results_dir / "reports", html_page=True)
    assert made.text.splitlines()[1].startswith(f"FAILED: {broken[0]}: ")  # after the note
    assert "1 of 2 types failed entirely" in made.text
    assert list(made.failures.instance_type) == broken
    csv_text = (cloud.config.results_dir / "reports" / run_id / "failures.csv").read_text()
    assert broken[0] in csv_text and "could not be staged" in csv_text
    assert broken[0] in (cloud.config.results_dir / "reports" / run_id / "index.html").read_text()
    # And in status and its --json, first, with why: status listed only the other type.
    state = control.status(results, run_id)
    assert next(iter(state["types"])) == broken[0], state["types"]
    assert "could not be staged" in state["type_errors"][broken[0]]
    assert control.status_text(state).splitlines()[2].startswith(f"  {broken[0]}: 0 ok")
    # When it ran and what it cost (issue 27: status showed neither): the instance that ran
    # was paid for, the one that failed staging too, until it was torn down.
    assert state["created"] <= state["ended"] <= time.time() and state["spent_usd"] > 0
    day = time.strftime("%Y-%m-%d", time.localtime(state["created"]))
    assert control.status_text(state).splitlines()[1].startswith(f"  started {day} ")
    line = control.status_line(state)
    assert f"  failed       {day} " in line and cost.dollars(state["spent_usd"]) in line, line
    assert "(FAILED: injected: the instance could not be staged)" in control.status_text(state)
    assert_nothing_left(cloud, results, run_id, local_dir)
