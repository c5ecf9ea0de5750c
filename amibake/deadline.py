"""An instance's deadline: it powers itself off unless its controller is alive to say otherwise.

A controller that died without its cleanup (SIGKILL, a crash, a laptop asleep, a network gone
quiet under a hung SSH read) left its instances running, billed, until someone ran
`amibake gc`. Each instance a launch template of amibake's starts now has a deadline: its user
data schedules a power-off (`shutdown -P +N`) at boot, and its controller, once connected,
pushes it back every third of N over the same SSH connection. The launch template says
InstanceInitiatedShutdownBehavior terminate, so the powered-off instance is terminated (its
encrypted root volume deleted with it), not stopped. A dead controller's instance costs at most
N minutes more (`instance_deadline_min`, 30 by default). An instance kept for debugging
(--keep-on-error) keeps its deadline: `sudo shutdown -c` on it cancels it. A bake's boot-test
instance (RunInstances, minutes long) has the same deadline from its user data, unrenewed, and
so has a bake's build host once CreateImage has rebooted it (cloud-init runs the user data again
on the boot after the hygiene removed its record of the instance).
"""

from __future__ import annotations

import base64
import logging
import shlex
import threading
import time

from amibake.remote import Remote

log = logging.getLogger("amibake")
MESSAGE = "amibake: no controller renewed the deadline of this instance"
# Both with --no-wall: every renewal broadcast "The system will power off" to whoever was logged
# in (someone debugging a kept instance, every ten minutes).


def boot_line(minutes: int) -> str:
    """The shell line a launch's user data ends with: the deadline from boot, before any
    connection (cloud-init runs user data as root)."""
    return f"shutdown -P --no-wall +{minutes} {shlex.quote(MESSAGE)}\n"


def appended(script: str, minutes: int) -> str:
    """A launch's own user data script with the deadline as its last line."""
    return f"{script.rstrip(chr(10))}\n{boot_line(minutes)}"


def user_data(minutes: int) -> str:
    """A launch template's UserData (base64) that is the deadline alone."""
    return base64.b64encode(f"#!/bin/sh\n{boot_line(minutes)}".encode()).decode()


def renew_command(minutes: int) -> str:
    """Push the deadline back to `minutes` from now (a later shutdown replaces the schedule)."""
    return f"sudo -n shutdown -P --no-wall +{minutes} {shlex.quote(MESSAGE)} >/dev/null 2>&1"


class Renewal:
    """While the controller is connected: the deadline pushed back every third of it."""

    def __init__(self, remote: Remote, minutes: int, label: str) -> None:
        self.remote = remote
        self.minutes = minutes
        self.label = label
        self.until = time.time() + 60 * minutes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"deadline-{label}", daemon=True)

    def start(self) -> Renewal:
        self._renew()  # the boot's deadline, replaced at once: a connection proves the controller
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(60 * self.minutes / 3):
            self._renew()

    def _renew(self) -> None:
        code = self.remote.quiet(renew_command(self.minutes), timeout_s=30)
        if code == 0:
            self.until = time.time() + 60 * self.minutes
        elif not self._stop.is_set():  # (stopping: the connection closes under it, as asked)
            # The instance's own deadline stands: it ends then if nothing renews it.
            log.warning(
                "%s: could not renew the instance's deadline (%s); it powers off at %s UTC",
                self.label,
                "no answer" if code is None else f"exit {code}",
                time.strftime("%H:%M", time.gmtime(self.until)),
            )
