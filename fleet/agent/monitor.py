"""The run monitor: psutil samples at a fixed rate (1 Hz by default) into a CSV beside the run.

Self-contained on purpose (standard library and psutil only), so it can be uploaded and started
next to a workload on an instance: ``python3 monitor.py --pid PID --out run.csv``. It samples
the whole machine (CPU total and per core, memory, disk and network I/O) and the workload's
process tree (RSS, CPU), and stops by itself when the workload exits or on SIGTERM.

Cheap by construction: per sample, one pass over the workload's tree and a few system counters;
the sleep is aligned to the schedule, so sampling never drifts or piles up.
"""

from __future__ import annotations

import argparse
import csv
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

COLUMNS = [
    "time_s",
    "cpu_percent",
    "cpu_per_core",
    "mem_used_mb",
    "mem_available_mb",
    "disk_read_mb",
    "disk_write_mb",
    "net_sent_mb",
    "net_recv_mb",
    "tree_processes",
    "tree_rss_mb",
    "tree_cpu_percent",
]
MB = 1024 * 1024


class Monitor:
    def __init__(self, pid: int, out: Path, interval_s: float = 1.0) -> None:
        self.root = psutil.Process(pid)
        self.out = out
        self.interval_s = interval_s
        self.stopped = False
        self._tree: dict[int, psutil.Process] = {}

    def _tree_sample(self) -> tuple[int, float, float]:
        """(processes, RSS MiB, CPU %) of the workload and all its descendants."""
        try:
            pids = _descendants(self.root.pid)
            current = [self.root, *(self._tree.get(p) or psutil.Process(p) for p in pids)]
        except psutil.NoSuchProcess:
            return 0, 0.0, 0.0
        # Keep Process objects between samples: cpu_percent() measures since the previous call.
        alive = {p.pid: self._tree.get(p.pid, p) for p in current}
        self._tree = alive
        rss = cpu = 0.0
        for process in alive.values():
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    cpu += process.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return len(alive), rss / MB, cpu

    def _row(self, started: float) -> dict[str, Any]:
        memory = psutil.virtual_memory()
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        processes, rss, cpu = self._tree_sample()
        per_core = psutil.cpu_percent(None, percpu=True)
        return {
            "time_s": round(time.monotonic() - started, 3),
            "cpu_percent": round(sum(per_core) / max(len(per_core), 1), 1),
            "cpu_per_core": ";".join(f"{c:.0f}" for c in per_core),
            "mem_used_mb": round((memory.total - memory.available) / MB, 1),
            "mem_available_mb": round(memory.available / MB, 1),
            "disk_read_mb": round(disk.read_bytes / MB, 3) if disk else 0.0,
            "disk_write_mb": round(disk.write_bytes / MB, 3) if disk else 0.0,
            "net_sent_mb": round(net.bytes_sent / MB, 3),
            "net_recv_mb": round(net.bytes_recv / MB, 3),
            "tree_processes": processes,
            "tree_rss_mb": round(rss, 1),
            "tree_cpu_percent": round(cpu, 1),
        }

    def run(self) -> int:
        """Sample until the workload is gone; return the number of samples written."""
        psutil.cpu_percent(None, percpu=True)  # prime the counters: the first reading is empty
        self._tree_sample()
        started = time.monotonic()
        count = 0
        with self.out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            next_at = started + self.interval_s
            while not self.stopped and self.root.is_running() and self.root.status() != "zombie":
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                # Missed slots (a stalled machine) are skipped, not caught up in a burst.
                next_at = max(next_at + self.interval_s, time.monotonic() + self.interval_s / 2)
                writer.writerow(self._row(started))
                handle.flush()
                count += 1
        return count


def _descendants(pid: int) -> list[int]:
    """The process tree under pid, from /proc/PID/task/TID/children: a few reads, where psutil's
    children(recursive=True) reads /proc/*/stat for every process on the machine."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        tasks = Path(f"/proc/{parent}/task")
        try:
            listing = list(tasks.iterdir())
        except FileNotFoundError:
            continue
        for task in listing:
            try:
                children = (task / "children").read_text().split()
            except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN, or a gone task
                if not (task / "children").parent.exists():
                    continue
                return [p.pid for p in psutil.Process(pid).children(recursive=True)]
            for child in children:
                found.append(int(child))
                pending.append(int(child))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monitor", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the workload's process id")
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        print("monitor: --interval must be positive", file=sys.stderr)
        return 2
    try:
        monitor = Monitor(args.pid, args.out, args.interval)
    except psutil.NoSuchProcess:
        # The workload was done before the monitor started: a run too short to sample.
        with args.out.open("w", newline="") as handle:
            csv.DictWriter(handle, fieldnames=COLUMNS).writeheader()
        return 0

    def stop(*_: object) -> None:
        monitor.stopped = True

    signal.signal(signal.SIGTERM, stop)
    monitor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
