"""amibake.cloud.calls.creating: a Ctrl-C or SIGTERM during a create call waits until what the
call made is recorded; a second Ctrl-C does not."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from amibake.cloud.calls import creating
from amibake.runner import terminate_as_interrupt


def test_ctrl_c_in_a_create_is_raised_once_it_is_recorded() -> None:
    recorded = []
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), creating("the thing"):
        os.kill(os.getpid(), signal.SIGINT)  # as the call is in flight
        recorded.append("made")
    assert recorded == ["made"]
    assert signal.getsignal(signal.SIGINT) is before  # given back


def test_sigterm_in_a_create_is_raised_as_the_run_takes_it_once_recorded() -> None:
    recorded = []
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt), creating("the thing"):
        os.kill(os.getpid(), signal.SIGTERM)
        recorded.append("made")
    assert recorded == ["made"]


def test_a_second_ctrl_c_stops_the_create_at_once() -> None:
    recorded = []
    with pytest.raises(KeyboardInterrupt), creating("the thing"):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the call hangs: the user insists
        recorded.append("made")
    assert recorded == []


def test_off_the_main_thread_it_changes_nothing() -> None:
    seen: list[object] = []
    before = signal.getsignal(signal.SIGINT)

    def worker() -> None:
        with creating("the thing"):  # signal.signal would raise ValueError here
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [before]
