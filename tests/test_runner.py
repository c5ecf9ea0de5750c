"""amibake.runner's process check, which fleet status/kill and the local cloud's control use to
tell a live controller or daemon from a dead one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from amibake.procs import process_alive


def test_a_process_is_alive_until_it_exits_even_before_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    assert process_alive(child.pid)
    assert child.stdin is not None
    child.stdin.close()  # it exits; not waited for, it stays a zombie of this process
    deadline = time.monotonic() + 10
    while process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(child.pid)
    assert os.waitpid(child.pid, os.WNOHANG)[0] == child.pid  # it was a zombie until now
    assert not process_alive(child.pid)
    assert process_alive(os.getpid())
