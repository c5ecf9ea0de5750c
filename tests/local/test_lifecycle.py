"""`amibake local up | status | down`, including after a crash, and its one-line errors."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amibake import config
from amibake.cli import main
from amibake.connect import connect
from amibake.local import control, sandbox
from tests.helpers import free_port_and_range, launch_and_reach, leftovers, own_local_cloud


@pytest.fixture
def own_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A second, throw-away local cloud, for tests that stop or crash it."""
    yield own_local_cloud(tmp_path, monkeypatch).local_dir
    control.down(config.load())  # as the test left the settings (a port it moved)


def test_up_status_down(own_cloud: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "status"]) == 3
    assert capsys.readouterr().out.strip() == "local cloud is not running"
    assert main(["local", "up", "--json"]) == 0
    up = json.loads(capsys.readouterr().out)
    assert main(["local", "up", "--json"]) == 0  # already running: the same daemon
    assert json.loads(capsys.readouterr().out) == up
    instance_id, remote = launch_and_reach(connect(config.load()))
    remote.close()
    assert main(["local", "status", "--json"]) == 0
    assert instance_id in json.loads(capsys.readouterr().out)["instances"]
    assert main(["local", "down"]) == 0
    assert leftovers(own_cloud) == []
    assert not (own_cloud / "daemon.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(up["pid"], 0)


def test_two_ups_at_once_start_one_cloud_and_both_take_it(own_cloud: Path) -> None:
    """The second found none running, failed on the port, and as it went removed the first
    one's registry directory as a leftover."""
    up = [sys.executable, "-m", "amibake", "local", "up", "--json"]
    both = [subprocess.Popen(up, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    said = [process.communicate(timeout=120) for process in both]
    assert [p.returncode for p in both] == [0, 0], said
    pids = {json.loads(out)["pid"] for out, _ in said}
    assert len(pids) == 1, said
    assert (own_cloud / "registry").is_dir()
    assert main(["local", "down"]) == 0
    assert leftovers(own_cloud) == []


def test_up_refuses_settings_other_than_the_running_clouds(
    own_cloud: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port (or faults) other than the running daemon's: refused, naming both; the port was
    ignored, and the commands reached the daemon already running."""
    assert main(["local", "up", "--json"]) == 0
    running = json.loads(capsys.readouterr().out)
    port = config.load().local_port
    other, _ = free_port_and_range()
    with monkeypatch.context() as patch:
        patch.setenv("AMIBAKE_LOCAL_PORT", str(other))
        assert main(["local", "up"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"runs with local_port {port}, not {other} (AMIBAKE_LOCAL_PORT or " in err, err
        assert "`amibake local down` first" in err
    assert main(["local", "up", "--faults", "aws"]) == 2
    assert "runs with faults none (seed 0), not aws (seed 0)" in capsys.readouterr().err
    assert main(["local", "up", "--json"]) == 0  # its own settings: the same daemon
    assert json.loads(capsys.readouterr().out) == running


def test_down_while_a_process_uses_the_cloud_names_it_and_stops_only_with_force(
    own_cloud: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping the cloud under a run fails it midway, unsaid: a process connected to it (any
    command: a build, a fleet controller between trials, gc) is named, nothing stops, and
    --force stops it anyway. One SIGKILLed holds nothing up, and it is found wherever runs keep
    their results (`local down` run from another directory)."""
    assert main(["local", "up"]) == 0
    daemon = control.find(config.load())
    assert daemon is not None
    capsys.readouterr()
    uses = (
        "import sys, time; from amibake import config; from amibake.connect import connect; "
        "connect(config.load()); print('in', flush=True); time.sleep(120)"
    )

    def using() -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", uses, "fleet-like"], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline() == "in\n"
        return process

    first = using()
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(own_cloud.parent / "elsewhere"))
    try:
        assert main(["local", "down"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        said = f"1 process still uses the local cloud: -c fleet-like (pid {first.pid})"
        assert said in err, err
        assert "--force" in err
        assert control.find(config.load()) == daemon  # nothing stopped
    finally:
        first.kill()  # SIGKILL: its file stays, and is found dead
        first.wait()
    assert main(["local", "down"]) == 0  # its process is gone: nothing holds the cloud
    assert control.find(config.load()) is None
    assert main(["local", "up"]) == 0
    second = using()
    try:
        assert main(["local", "down", "--force"]) == 0
        assert control.find(config.load()) is None
    finally:
        second.kill()
        second.wait()
    assert leftovers(own_cloud) == []


def test_a_process_holds_the_cloud_until_it_exits(own_cloud: Path) -> None:
    """connect() names the process in the cloud's runs/ until it exits; `down` run by the same
    process is not held up by itself."""
    config.load()
    script = (
        "import sys; from amibake import config; from amibake.connect import connect; "
        "from amibake.local import control; connect(config.load()); "
        "print(control.HOLDS_DIR, flush=True); sys.stdin.readline()"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdin is not None
    assert process.stdout.readline() == "runs\n"
    assert [pid for _, pid in control.holders(config.load())] == [process.pid]
    process.stdin.write("\n")
    process.stdin.flush()
    assert process.wait(30) == 0
    assert control.holders(config.load()) == []
    assert not (own_cloud / "runs" / str(process.pid)).exists()  # removed at its exit
    connect(config.load())  # this process holds it too, and is not its own obstacle
    assert control.holders(config.load()) == []
    assert (own_cloud / "runs" / str(os.getpid())).exists()


def test_down_after_the_daemon_was_killed_leaves_nothing(own_cloud: Path) -> None:
    cloud = connect(config.load())
    _instance_id, remote = launch_and_reach(cloud)
    with remote:
        remote.run("nohup sleep 600 >/dev/null 2>&1 &")
    daemon = control.find(cloud.config)
    assert daemon is not None
    os.kill(daemon.pid, signal.SIGKILL)
    time.sleep(0.2)
    assert main(["local", "down"]) == 0
    assert leftovers(own_cloud) == []
    assert not (own_cloud / "sandboxes").exists()


def _daemon_importing() -> bool:
    """The daemon this process started is running Python (past unshare's exec), so importing:
    it answers only after moto is in, hundreds of milliseconds on any host."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if command[:1] == [sys.executable] and "amibake.local.daemon" in command:
            return True
    return False


class StartClock:
    """amibake.local.control's clock for one `local up`: at its first wait once the daemon is
    `when` ("starting": at once; "importing": see _daemon_importing), Ctrl-C (`then`
    "interrupt") or the start's time running out ("time out"). What the daemon is doing, not a
    time, decides: at 1 s it was importing on some hosts and had answered on others (1.1 s on a
    2026-12-04 Intel guest), whose up then succeeded."""

    def __init__(self, when: str, then: str) -> None:
        self.when, self.then, self.reached = when, then, False

    def monotonic(self) -> float:
        return time.monotonic() + (3600.0 if self.reached and self.then == "time out" else 0.0)

    def sleep(self, seconds: float) -> None:
        if not self.reached and (self.when == "starting" or _daemon_importing()):
            self.reached = True
            if self.then == "interrupt":
                raise KeyboardInterrupt
        time.sleep(seconds)


def _up_with(clock: StartClock) -> int:
    # Patched for the up alone: undoing every patch took the fixture's settings back too, and
    # the find after it looked at the session's own cloud.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(control, "time", clock)
        code = main(["local", "up"])
    assert clock.reached, f"the up returned {code} before the daemon was {clock.when}"
    return code


@pytest.mark.parametrize("when", ["starting", "importing"])
def test_an_interrupted_up_stops_the_daemon_it_started(
    own_cloud: Path, capsys: pytest.CaptureFixture[str], when: str
) -> None:
    """Ctrl-C while `local up` waits: the daemon (a session of its own) came up seconds later
    and ran on, unseen by `status` meanwhile. Interrupted as it starts and while it imports."""
    assert _up_with(StartClock(when, "interrupt")) == 130
    time.sleep(8)  # longer than the daemon takes to come up
    assert control.find(config.load()) is None
    assert _daemons_of(own_cloud) == []
    assert main(["local", "up"]) == 0  # and the next up starts one
    capsys.readouterr()


def test_an_up_given_up_on_says_what_the_daemon_was_doing_and_stops_it(
    own_cloud: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon that does not come up in time: the error names its log's last line (a test's
    log is gone once it fails, and CI said only "see daemon.log"), and the daemon is stopped."""
    monkeypatch.setattr(control, "START_TIMEOUT_S", 60.0)  # run out while it imports
    assert _up_with(StartClock("importing", "time out")) == 1
    err = _one_line_error(capsys)
    assert "the local cloud did not start within 60s (its log's last line: " in err, err
    time.sleep(8)  # longer than the daemon takes to come up
    assert control.find(config.load()) is None
    assert _daemons_of(own_cloud) == []


def _daemons_of(local_dir: Path) -> list[str]:
    """The pids of local-cloud daemons serving `local_dir`."""
    return [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and str(local_dir).encode() in _cmdline(pid)
        and b"amibake.local.daemon" in _cmdline(pid)
    ]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def test_unknown_cloud_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "status", "--cloud", "azure"]) == 2
    assert "cloud must be one of aws, local, got 'azure'" in _one_line_error(capsys)


def test_config_problems_are_reported_together(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AMIBAKE_LOCAL_PORT", "seventy")
    monkeypatch.setenv("AMIBAKE_LOCAL_SUBNET", "10.0.0.0/8")
    assert main(["local", "up", "--cloud", "moon"]) == 2
    err = _one_line_error(capsys)
    assert "AMIBAKE_LOCAL_PORT: local_port must be int" in err
    assert "--cloud" not in err or "moon" in err


def test_missing_sshd_is_a_one_line_error(
    own_cloud: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sandbox, "SSHD_CANDIDATES", ("/nonexistent/sshd",))
    assert main(["local", "up"]) == 2
    assert "sshd not found" in _one_line_error(capsys)
    assert not (own_cloud / "daemon.json").exists()


def test_control_port_in_use_is_a_one_line_error(
    own_cloud: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The squatter takes a port the kernel picks, so nothing else can hold it: a fixed port
    # failed CI once, already taken before the test bound it.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setenv("AMIBAKE_LOCAL_PORT", str(port))
        assert main(["local", "up"]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in _one_line_error(capsys)
    assert not (own_cloud / "daemon.json").exists()


def test_sandbox_ssh_port_in_use_is_a_one_line_error(
    own_cloud: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    network = ipaddress.ip_network(os.environ["AMIBAKE_LOCAL_SUBNET"])
    first = str(next(network.hosts()))  # the first sandbox's
    with socket.socket() as squatter:
        squatter.bind((first, 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setenv("AMIBAKE_LOCAL_SSH_PORT", str(port))
        assert main(["local", "up"]) == 2
    err = _one_line_error(capsys)
    assert f"ssh port {port} on {first} is already in use" in err
    assert "AMIBAKE_LOCAL_SSH_PORT" in err


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="switching to nobody takes root; a plain user's suite runs without root throughout",
)
def test_without_root_local_up_says_what_is_missing() -> None:
    """As nobody: either rootless sandboxes work here, or `local up` says why, in one line."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run this test as an unprivileged user")
    # pytest's own temporary tree is root's alone; nobody needs a directory it can write.
    tmp_path = Path(tempfile.mkdtemp(prefix="amibake-rootless-"))
    tmp_path.chmod(0o777)
    port, subnet = free_port_and_range()
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "AMIBAKE_LOCAL_DIR": str(tmp_path / "cloud"),
        "AMIBAKE_LOCAL_PORT": str(port),
        "AMIBAKE_LOCAL_SUBNET": subnet,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }

    def as_nobody(*argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        return subprocess.run(
            [*command, sys.executable, "-m", "amibake", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    done = as_nobody("local", "up")
    if done.returncode == 0:  # this kernel allows rootless sandboxes: then down must work too
        as_nobody("local", "down", check=True)
        return
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "needs root" in lines[0] or "unshare" in lines[0]


def test_a_process_that_exits_while_its_command_line_is_read_matches_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """/proc/PID/cmdline of a process exiting as it is read answers ESRCH: `local down`'s sweep
    for leftover registries raised ProcessLookupError (a CI teardown failed so)."""

    def exiting(self: Path) -> bytes:
        if self.name == "cmdline":
            raise ProcessLookupError(3, "No such process")
        return b""

    with monkeypatch.context() as patch:
        patch.setattr(Path, "read_bytes", exiting)
        assert control._cmdline(os.getpid()) == ""
        assert control.registry_processes(tmp_path) == []
