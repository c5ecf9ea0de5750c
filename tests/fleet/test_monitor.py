"""The monitor samples a real workload and its children, and stops when the workload does."""

from __future__ import annotations

import csv
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fleet.agent import monitor

WORKLOAD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20); import time; time.sleep(1.2)'])\n"
    "end = time.monotonic() + 1.0\n"
    "while time.monotonic() < end: pass\n"
    "child.wait()\n"
)
BUSY_S = 1.0  # the busy loop's wall time above


def _reaped_cpu_s(pid: int) -> float:
    """Reap the workload; the CPU seconds it (and its reaped child) used. The busy loop gets a
    whole core on an idle machine and a quarter of one on a loaded CI host, so a sample's CPU %
    is judged against this, not against a fixed share."""
    _, status, usage = os.wait4(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_utime + usage.ru_stime


def test_samples_the_process_tree_until_the_workload_exits(tmp_path: Path) -> None:
    workload = subprocess.Popen([sys.executable, "-c", WORKLOAD])
    out = tmp_path / "run.csv"
    count = monitor.Monitor(workload.pid, out, interval_s=0.2).run()
    # It returned because the workload ended (a zombie until reaped), not on a timer.
    assert psutil.Process(workload.pid).status() == psutil.STATUS_ZOMBIE
    cpu_s = _reaped_cpu_s(workload.pid)
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == monitor.COLUMNS
    assert count == len(rows) >= 4
    assert max(int(r["tree_processes"]) for r in rows) == 2  # the workload and its child
    assert max(float(r["tree_rss_mb"]) for r in rows) > 60  # the child's 64 MiB
    # the busy loop: its samples near the share of a core it had
    assert max(float(r["tree_cpu_percent"]) for r in rows) > 40 * cpu_s / BUSY_S > 2
    times = [float(r["time_s"]) for r in rows]
    # On schedule, never in bursts (a late sample does not cause a catch-up flurry, whose rows
    # would be milliseconds apart). After a stall the next comes half an interval on (0.1 s),
    # less the sampling's own time, which a loaded host stretches: hence 0.05.
    assert all(b - a > 0.05 for a, b in itertools.pairwise(times))


def test_a_process_gone_before_the_first_sample_gives_an_empty_csv(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.agent.monitor",
            "--pid",
            "999999999",
            "--out",
            str(tmp_path / "x.csv"),
        ],
        capture_output=True,
        text=True,
    )
    # A workload done before the monitor starts is a run too short to sample: an empty CSV.
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "x.csv").read_text().startswith("time_s,cpu_percent,")


def test_started_first_it_is_ready_before_the_workload_and_then_samples_it(
    tmp_path: Path,
) -> None:
    out, pid_file = tmp_path / "run.csv", tmp_path / "run.pid"
    command = [sys.executable, "-m", "fleet.agent.monitor", "--pid-file", str(pid_file)]
    watcher = subprocess.Popen([*command, "--out", str(out), "--interval", "0.2"])
    try:
        # Ready (header written) with no workload yet: its start-up is over before the run.
        deadline = time.monotonic() + 30
        while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.read_text().strip() == ",".join(monitor.COLUMNS)
        assert watcher.poll() is None  # waiting for the pid, not gone
        workload = subprocess.Popen([sys.executable, "-c", WORKLOAD])
        pid_file.write_text(str(workload.pid))
        assert watcher.wait(timeout=30) == 0
        cpu_s = _reaped_cpu_s(workload.pid)
    finally:
        watcher.kill()
    rows = list(csv.DictReader(out.open()))
    assert len(rows) >= 4  # one header, then the samples of the workload
    assert max(int(r["tree_processes"]) for r in rows) == 2
    assert max(float(r["tree_cpu_percent"]) for r in rows) > 40 * cpu_s / BUSY_S > 2


def test_started_first_with_no_workload_coming_it_gives_up(tmp_path: Path) -> None:
    out = tmp_path / "run.csv"
    done = subprocess.run(
        [sys.executable, "-m", "fleet.agent.monitor", "--pid-file", str(tmp_path / "none.pid"),
         "--out", str(out), "--wait", "0.3"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text().strip() == ",".join(monitor.COLUMNS)


def test_sigterm_stops_it_at_once_not_after_the_interval(tmp_path: Path) -> None:
    # The agent stops the monitor when the workload ends; a monitor that slept out its interval
    # first would add that interval to every replicate.
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    out = tmp_path / "run.csv"
    watcher = subprocess.Popen(
        [sys.executable, "-m", "fleet.agent.monitor", "--pid", str(workload.pid),
         "--out", str(out), "--interval", "30"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # into its first 30 s wait
        asked = time.monotonic()
        watcher.terminate()
        assert watcher.wait(timeout=20) == 0
        assert time.monotonic() - asked < 5
    finally:
        watcher.kill()
        workload.kill()
        workload.wait()


def test_a_process_born_between_samples_counts_its_cpu_in_its_first_sample() -> None:
    # A shell starting the real work (sudo, sh -c, docker run): the busy process appears after
    # the monitor has primed its counters. psutil's first reading of a process is 0.0, so a run
    # shorter than two samples once showed an idle tree (CI: tree_cpu_percent [0.0]).
    starter = (
        "import subprocess, sys, time\n"
        "time.sleep(0.3)\n"
        "subprocess.run([sys.executable, '-c', "
        "'import time\\nend = time.monotonic() + 3\\nwhile time.monotonic() < end: pass'])\n"
    )
    workload = subprocess.Popen([sys.executable, "-c", starter])
    try:
        watcher = monitor.Monitor(workload.pid, Path("unused.csv"))
        assert watcher._tree_sample()[0] == 1  # primed: the starter alone, its child not born
        deadline = time.monotonic() + 30
        while not (born := monitor._descendants(workload.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the child busy for most of a second
        processes, _, cpu = watcher._tree_sample()
        # What the child really had of a CPU since its birth: on a loaded machine (CI beside
        # other work) a busy loop gets a quarter of a core, so the figure is compared with this
        # and not with a fixed share.
        child = psutil.Process(born[0])
        used = sum(child.cpu_times()[:2])
        had = 100 * used / (time.time() - child.create_time())
    finally:
        workload.kill()
        workload.wait()
    assert processes == 2
    assert had > 1, had  # the child ran at all, so 0.0 is wrong
    assert 0.5 * had < cpu < 2 * had + 5, (cpu, had)


@pytest.mark.parametrize(
    "text",
    ["", "time_s,cpu_percent\n1,5\n2", "time_s\n1\n", "garbage\x00\n\x01,\n", "a,b\n1,2,3,4\n"],
)
def test_a_damaged_monitor_file_draws_no_timeline_and_fails_no_report(
    tmp_path: Path, text: str
) -> None:
    """Empty, cut short or not the monitor's: the page's timeline leaves it out. A pandas
    EmptyDataError or ParserError failed the whole HTML report."""
    from fleet.report import timeline

    path = tmp_path / "m.csv"
    path.write_text(text)
    drawn = timeline(path)
    assert drawn is None or (len(drawn) == 1 and list(drawn.time_s) == [1])
    assert timeline(tmp_path / "gone.csv") is None
    path.write_text("time_s,cpu_percent,rss_mb\n0.5,80,10\n1.0,95,11\n")
    good = timeline(path)
    assert good is not None and list(good.cpu_percent) == [80, 95]
