"""amibake.runner's process check, which fleet status/kill and the local cloud's control use to
tell a live controller or daemon from a dead one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest

from amibake.procs import process_alive
from amibake.runner import RunContext, Runner, terminate_as_interrupt


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


def test_a_process_proc_hides_is_alive_as_far_as_a_signal_tells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under /proc mounted hidepid, another user's process is not there to psutil and has no
    start time: a colleague's live run was judged dead, and gc took its resources."""
    import psutil

    from amibake import procs

    def hidden(pid: int) -> Any:
        raise psutil.NoSuchProcess(pid)

    def signal_refused(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(procs.psutil, "Process", hidden)
    monkeypatch.setattr(procs, "started", lambda pid: "")
    monkeypatch.setattr(procs.os, "kill", signal_refused)
    assert procs.process_alive(4242) and procs.same_process(4242, "12345")

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(procs.os, "kill", gone)
    assert not procs.process_alive(4242) and not procs.same_process(4242, "12345")


def test_a_sigterm_during_cleanup_is_held_until_the_cleanup_is_done(tmp_path: Path) -> None:
    """`kill` during a step's cleanup raised inside it (terminate_as_interrupt): the step stopped
    half-way, between deleting a fleet and terminating its instance. It is held until every
    cleanup is done, then delivered: the run still stops."""
    done: list[str] = []

    class Step:
        name = "launch"

        def run(self, state: object) -> None:
            raise RuntimeError("the step after it failed")

        def cleanup(self, state: object) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would, mid-cleanup
            time.sleep(0.2)  # the signal lands here, between the two halves
            done.append("instance terminated")

    context = RunContext("r-test", cast(Any, None), cast(Any, None), {}, tmp_path)
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
        Runner(context, [Step()]).run(object())
    assert done == ["instance terminated"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_closed_terminal_stops_a_run_as_ctrl_c_does_unless_nohup_ignores_it(
    tmp_path: Path,
) -> None:
    """SIGHUP (the terminal closed, the ssh session to the controller dropped) ended the
    process at once: no cleanup ran, and its instances ran on, billed. It unwinds the run as
    Ctrl-C does, held through a cleanup; under nohup it stays ignored."""
    done: list[str] = []

    class Step:
        name = "launch"

        def run(self, state: object) -> None:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1)
            done.append("ran on")

        def cleanup(self, state: object) -> None:
            os.kill(os.getpid(), signal.SIGHUP)  # the terminal's last word, mid-cleanup
            time.sleep(0.2)
            done.append("instance terminated")

    context = RunContext("r-test", cast(Any, None), cast(Any, None), {}, tmp_path)
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
        Runner(context, [Step()]).run(object())
    assert done == ["instance terminated"]
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
    try:
        with terminate_as_interrupt():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_run_opened_after_cancel_all_starts_cancelled_until_runs_are_allowed(
    tmp_path: Path,
) -> None:
    """Ctrl-C reached the runs open at that moment only: a tune trial between its build's run
    and its measurement's opened the next one uncancelled, and launched after the interrupt."""
    from amibake import runner

    def context(run_id: str) -> RunContext:
        return RunContext(run_id, cast(Any, None), cast(Any, None), {}, tmp_path)

    open_now, later = context("r-open"), context("r-later")
    runner.opened(open_now)
    try:
        assert runner.cancel_all() == 1 and open_now.cancel.is_set()
        runner.opened(later)
        assert later.cancel.is_set()  # its first step stops it, before anything is made
    finally:
        runner.allow_runs()
        runner.closed(open_now)
        runner.closed(later)
    after = context("r-after")
    runner.opened(after)
    runner.closed(after)
    assert not after.cancel.is_set()
