"""The run monitor: psutil samples at a fixed rate (1 Hz by default) into a CSV beside the run.

Self-contained on purpose (standard library and psutil only), so it can be uploaded and started
next to a workload on an instance: ``python3 monitor.py --pid PID --out run.csv``. It samples
the whole machine (CPU total and per core, memory, disk and network I/O) and the workload's
process tree (RSS, CPU), and stops by itself when the workload exits or on SIGTERM.

Cheap by construction: per sample, one pass over the workload's tree and a few system counters;
the sleep is aligned to the schedule, so sampling never drifts or piles up. Started with
``--pid-file`` it is ready before the workload exists (interpreter and psutil loaded, CSV header
written), so its own start-up never competes with the run being timed; the agent then writes
the workload's pid to that file.
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
        seen, self._tree = self._tree, alive
        rss = cpu = 0.0
        for process in alive.values():
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    known = process.pid in seen
                    cpu += process.cpu_percent(None) if known else _since_birth(process)
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

    def run(self, header: bool = True) -> int:
        """Sample until the workload is gone; return the number of samples written. Without
        header, the rows go after the header that was written as the ready signal."""
        psutil.cpu_percent(None, percpu=True)  # prime the counters: the first reading is empty
        self._tree_sample()
        started = time.monotonic()
        count = 0
        with self.out.open("w" if header else "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            if header:
                writer.writeheader()
                handle.flush()  # visible at once: the CSV's existence says sampling has begun
            next_at = started + self.interval_s
            while self.root.is_running() and self.root.status() != "zombie":
                delay = next_at - time.monotonic()
                if delay > 0 and _stop_requested(delay):
                    break
                # Missed slots (a stalled machine) are skipped, not caught up in a burst.
                next_at = max(next_at + self.interval_s, time.monotonic() + self.interval_s / 2)
                writer.writerow(self._row(started))
                handle.flush()
                count += 1
        return count


def _since_birth(process: psutil.Process) -> float:
    """CPU % of a process seen for the first time, over its life so far. psutil's first
    cpu_percent() of a process is always 0.0 (it only sets the baseline), so without this a
    workload started by a shell (sudo, sh -c, docker) counted as idle in its first sample: a run
    shorter than two samples showed no CPU at all."""
    process.cpu_percent(None)  # the baseline for the next sample
    times = process.cpu_times()
    alive_s = time.time() - process.create_time()
    if alive_s <= 0:
        return 0.0
    # create_time() has the kernel's clock-tick resolution: bound a just-born process's figure.
    return min(100.0 * (times.user + times.system) / alive_s, 100.0 * (psutil.cpu_count() or 1))


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


def _write_header(out: Path) -> None:
    with out.open("w", newline="") as handle:
        csv.DictWriter(handle, fieldnames=COLUMNS).writeheader()


def _stop_requested(wait_s: float) -> bool:
    """Wait up to wait_s; True at once if SIGTERM came. main() blocks SIGTERM so that it waits
    here to be taken: a handler would only run after the whole sleep (PEP 475 resumes it), and
    the agent waiting for the monitor would wait out the interval."""
    return signal.sigtimedwait([signal.SIGTERM], wait_s) is not None


def _await_pid(pid_file: Path, timeout_s: float) -> int | None:
    """The workload's pid once the agent has written it (atomically, by rename); None when told
    to stop or when no workload came within timeout_s (the agent died before starting it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(pid_file.read_text())
        except (FileNotFoundError, ValueError):
            # Not there yet, or caught as it is written (empty: a writer that does not rename,
            # such as the test's, failed the monitor in a clean-clone run). A few hundred checks
            # at most: the agent starts the workload at once.
            if _stop_requested(0.005):
                return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monitor", description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="the workload's process id")
    target.add_argument(
        "--pid-file",
        type=Path,
        help="get ready first (the CSV header written), then wait for the workload's pid here",
    )
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for --pid-file (default 60)"
    )
    args = parser.parse_args(argv)
    if args.interval <= 0:
        print("monitor: --interval must be positive", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by _stop_requested
    pid = args.pid
    if args.pid_file is not None:
        _write_header(args.out)
        pid = _await_pid(args.pid_file, args.wait)
        if pid is None:
            return 0
    try:
        monitor = Monitor(pid, args.out, args.interval)
    except psutil.NoSuchProcess:
        # The workload was done before the monitor started: a run too short to sample.
        if args.pid_file is None:
            _write_header(args.out)
        return 0
    monitor.run(header=args.pid_file is None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
