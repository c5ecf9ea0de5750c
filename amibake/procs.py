"""Processes seen from outside: a leaf both the product and the local cloud import (a run's
controller, the local cloud's daemon), so neither imports the other for it."""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def process_alive(pid: int) -> bool:
    """Whether a process (a run's controller, the local cloud's daemon) is still running. A
    zombie has exited: only its parent has not collected it yet. Another user's process that
    /proc hides (mounted hidepid) is alive as far as a signal can tell."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def started(pid: int) -> str:
    """When the process started, in clock ticks since boot (/proc/PID/stat's 22nd field): a
    pid taken by another process since has another; a wall-clock time (psutil's create_time)
    moved with the clock, and a live run's file was taken for a dead one. "" if it is gone (or
    where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def same_process(pid: int, when: str | None) -> bool:
    """Whether `pid` is still the process that recorded `when` (its `started`): alive, and not
    a later process given the same pid. A record without a start time (an older record, or a
    system without /proc) is judged by the pid alone."""
    now = started(pid)  # "" where /proc does not show it (another user's, under hidepid)
    if when and now and now != when:
        return False
    return process_alive(pid)
