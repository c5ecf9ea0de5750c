#!/usr/bin/python3
"""``shutdown`` on a local-cloud instance: what the OS's would do to an EC2 instance, told to its
IMDS server (the local cloud's stand-in for the hypervisor seeing the guest power off).

The local cloud installs this file as ``/usr/sbin/shutdown`` in every sandbox's own layer: the
host's would ask this machine's systemd to power it off. As systemd's: root only; ``-P``/``-h``
(power off, the default), ``-r`` (reboot: not modelled, refused), a time of ``now``, ``+M``
(minutes) or ``HH:MM`` (UTC), a later call replacing the schedule, ``-c`` cancelling it. At
the time the instance powers off: EC2 then stops or terminates it as its
InstanceInitiatedShutdownBehavior says (amibake.local.gateway). Standard library only: it runs
inside the sandbox, under the host's python3.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import urllib.request

ENDPOINT = "http://instance-data:80"  # replaced at install with the instance's IMDS
PATH = "/amibake-local/shutdown"


def when(spec: str) -> float:
    """The epoch time `spec` (now, +M, HH:MM) names; ValueError if none."""
    now = time.time()
    if spec == "now":
        return now
    if spec.startswith("+"):
        return now + 60 * int(spec[1:])
    hours, minutes = (int(x) for x in spec.split(":"))
    today = datetime.datetime.now(datetime.UTC).replace(
        hour=hours, minute=minutes, second=0, microsecond=0
    )
    at = today.timestamp()
    return at if at > now else at + 86400


def tell(body: str) -> None:
    request = urllib.request.Request(ENDPOINT + PATH, data=body.encode(), method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=5):
            pass
    except OSError as exc:  # the local cloud is going away with this instance
        print(f"Failed to talk to the local cloud's power control: {exc}", file=sys.stderr)
        sys.exit(1)


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        print("Failed to set wall message, ignoring: Interactive authentication required.\n"
              "Must be root.", file=sys.stderr)  # fmt: skip
        return 1
    words = [a for a in argv if not a.startswith("-")]
    flags = {a for a in argv if a.startswith("-")}
    if "-c" in flags:
        tell("cancel")
        return 0
    if "-r" in flags or "--reboot" in flags:
        print("shutdown: reboot is not modelled by the local cloud", file=sys.stderr)
        return 1
    try:
        at = when(words[0] if words else "+1")  # systemd's default: a minute from now
    except ValueError:
        print(f"Failed to parse time specification: {words[0]}", file=sys.stderr)
        return 1
    tell(f"at={at:.3f}")
    stamp = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    print(f"Shutdown scheduled for {stamp}, use 'shutdown -c' to cancel.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
