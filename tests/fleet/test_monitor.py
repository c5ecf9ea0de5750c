"""The monitor samples a real workload and its children, and stops when the workload does."""

from __future__ import annotations

import csv
import itertools
import subprocess
import sys
from pathlib import Path

from fleet.agent import monitor

WORKLOAD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20); import time; time.sleep(1.2)'])\n"
    "end = time.monotonic() + 1.0\n"
    "while time.monotonic() < end: pass\n"
    "child.wait()\n"
)


def test_samples_the_process_tree_until_the_workload_exits(tmp_path: Path) -> None:
    workload = subprocess.Popen([sys.executable, "-c", WORKLOAD])
    out = tmp_path / "run.csv"
    count = monitor.Monitor(workload.pid, out, interval_s=0.2).run()
    # It returned because the workload ended (a zombie until reaped), not on a timer.
    assert workload.poll() is not None
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == monitor.COLUMNS
    assert count == len(rows) >= 4
    assert max(int(r["tree_processes"]) for r in rows) == 2  # the workload and its child
    assert max(float(r["tree_rss_mb"]) for r in rows) > 60  # the child's 64 MiB
    assert max(float(r["tree_cpu_percent"]) for r in rows) > 50  # the busy loop
    times = [float(r["time_s"]) for r in rows]
    # On schedule, never in bursts (a late sample does not cause a catch-up flurry).
    assert all(b - a > 0.1 for a, b in itertools.pairwise(times))


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
