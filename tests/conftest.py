"""Shared fixtures. The tests run against a local cloud of their own (own directory, port and
loopback range), so they never touch a developer's running local cloud."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from amibake import config, cpu
from amibake.cloud import Cloud
from amibake.connect import connect
from amibake.local import control
from tests.helpers import free_port_and_range, leftovers, pick_family

# The Ctrl-C tests send this process SIGINT, as a terminal would. A shell starts a background
# job (`make test &`, nohup in a script) with SIGINT ignored, and Python then installs no
# KeyboardInterrupt handler: those tests would fail for the way the suite was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# A developer's shell set for AWS (AWS_REGION=eu-west-1) would move the suite's local cloud to
# that region, which the shipped price table does not price: the suite runs in amibake's
# default region, as CI does. (Subprocesses the tests start inherit this.)
for _name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
    os.environ.pop(_name, None)

# The session's own daemon port and loopback range, not fixed ones: a fixed port made a suite
# fail every local-cloud test (89 errors, "port 5178 is already in use") while a suite in
# another checkout was running. Each pytest-xdist worker is a session of its own.
TEST_PORT, TEST_SUBNET = free_port_and_range()


@pytest.fixture(scope="session")
def local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local-cloud")


# autouse: set before any module's fixture patches the same variables for a local cloud of its
# own (tests/helpers.own_local_cloud). Set inside one, the session's values were undone with it:
# test_inventory run before test_bake left the session with no AMIBAKE_CLOUD, so gc went to AWS
# ("no AWS credentials found").
@pytest.fixture(scope="session", autouse=True)
def local_env(
    local_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    env = {
        # Results and journal of the session's own, never the repo's. The source cache is
        # shared: it is addressed by sha256, so nothing in it can be wrong for a test.
        "AMIBAKE_RESULTS_DIR": str(tmp_path_factory.mktemp("results")),
        "AMIBAKE_CLOUD": "local",
        "AMIBAKE_LOCAL_DIR": str(local_dir),
        "AMIBAKE_LOCAL_PORT": str(TEST_PORT),
        "AMIBAKE_LOCAL_SUBNET": TEST_SUBNET,
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        yield env


@pytest.fixture(scope="session")
def cloud(local_env: dict[str, str], local_dir: Path) -> Iterator[Cloud]:
    # Loaded from the session's own variables, not whatever a module's fixture set for a cloud
    # of its own: first asked for inside one, the session's cloud was that module's, and dead
    # once the module took it down (test_inventory, then test_bake: connection refused).
    with pytest.MonkeyPatch.context() as patch:
        for key, value in local_env.items():
            patch.setenv(key, value)
        cfg = config.load()
    yield connect(cfg)
    control.down(cfg)
    left = leftovers(local_dir)
    assert not left, f"the test session's local cloud left: {left}"


@pytest.fixture(scope="session")
def host() -> cpu.Cpu:
    """This machine's CPU, read at run time: it changes between sessions (AMD or Intel, any
    generation, or arm64), so no test writes a family, vendor or feature of it down."""
    return cpu.this_machine()


@pytest.fixture(scope="session")
def host_family(host: cpu.Cpu) -> str:
    """The family whose tuned builds this machine runs best: natively where one does (as
    `amibake families --host --first` picks), for tests that run a build's code."""
    return pick_family(host)


@pytest.fixture(scope="session")
def host_types(host_family: str) -> tuple[str, str]:
    """Two sizes of the host family, for tests that rank types."""
    return f"{host_family}.large", f"{host_family}.xlarge"
