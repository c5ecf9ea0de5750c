"""Processes seen from outside: a leaf both the product and the local cloud import (a run's
controller, the local cloud's daemon), so neither imports the other for it."""

from __future__ import annotations

import psutil


def process_alive(pid: int) -> bool:
    """Whether a process (a run's controller, the local cloud's daemon) is still running. A
    zombie has exited: only its parent has not collected it yet."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
