"""amibake.deadline: the shell an instance runs for its deadline parses (a quote in the message
once broke the user data, and with it the deadline), and a renewal that fails is said."""

from __future__ import annotations

import base64
import logging
import subprocess
from typing import Any, cast

import pytest

from amibake import deadline


@pytest.mark.parametrize(
    "script",
    [
        base64.b64decode(deadline.user_data(30)).decode(),
        deadline.renew_command(30),
    ],
    ids=["user-data", "renewal"],
)
def test_the_deadline_s_shell_parses_and_schedules_a_power_off(script: str) -> None:
    assert subprocess.run(["sh", "-n", "-c", script], capture_output=True).returncode == 0
    assert "shutdown -P --no-wall +30 " in script, script


def test_a_bake_s_boot_test_user_data_ends_with_the_deadline_and_still_parses() -> None:
    from amibake import bake

    own = bake.user_data(bake.BOOT_TEST_CLUSTER)
    script = deadline.appended(own, 30)
    assert subprocess.run(["bash", "-n", "-c", script], capture_output=True).returncode == 0
    assert script.startswith(own.rstrip("\n") + "\n"), script
    assert script.endswith(deadline.boot_line(30)), script


class Refusing:
    """A connection whose every command fails (sudo refused), counting them."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def quiet(self, command: str, timeout_s: float) -> int | None:
        self.asked.append(command)
        return 1


def test_a_renewal_that_fails_says_when_the_instance_powers_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="amibake")
    remote = Refusing()
    renewal = deadline.Renewal(cast(Any, remote), 30, "c7i").start()
    renewal.stop()
    assert remote.asked == [deadline.renew_command(30)]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("c7i: could not renew the instance's deadline"), (
        said
    )
    assert "(exit 1); it powers off at " in said[0]
