"""Client side of the local cloud: start, find, stop and poke the daemon.

The daemon's whereabouts live in ``<local_dir>/daemon.json``; a stale file (daemon gone) is
treated as "not running", and whatever the dead daemon left is cleaned before a new one starts.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from ipaddress import ip_network
from pathlib import Path
from typing import Any

from amibake.config import Config
from amibake.errors import AmibakeError, EnvironmentProblem, LocalCloudError, UserError
from amibake.local import faults, rootless
from amibake.local.daemon import ERROR_FILE, INFO_FILE, REGISTRY_DIR
from amibake.local.engine import LocalSettings
from amibake.local.images import LAUNCHER_NS_ENV
from amibake.local.sandbox import check_host, port_free, remove_tree
from amibake.procs import process_alive, same_process, started
from amibake.saved import locked, write_whole

# A daemon that exits is seen at once; this bounds one that hangs. A plain user's first start
# on a loaded 2-core CI host took over 60 s (3.8 s on an idle one), where 60 was the limit.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0  # a daemon asked to stop shuts its sandboxes down first
LEFTOVER_WAIT_S = 10.0  # for killed sandbox and registry processes to be gone
# A file per process using the cloud (its pid, start and command line), in the cloud's own
# directory: `local down` finds them wherever the commands keep their results.
HOLDS_DIR = "runs"
# Admin calls go straight to loopback, never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Daemon:
    pid: int
    endpoint: str
    faults: tuple[str, ...] = ()
    faults_seed: int = 0
    # The addresses it was started with (port, subnet, ssh_port, imds_port), where it says.
    started_with: dict[str, Any] = field(default_factory=dict)


def settings_for(config: Config) -> LocalSettings:
    return LocalSettings(
        directory=config.local_dir.resolve(),
        port=config.local_port,
        subnet=config.local_subnet,
        ssh_port=config.local_ssh_port,
        imds_port=config.local_imds_port,
        faults=config.local_faults,
        faults_seed=config.local_faults_seed,
    )


def _call(endpoint: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(endpoint + path, data=data, method="POST" if data else "GET")
    try:
        with _OPENER.open(request, timeout=30) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        detail = json.loads(exc.read() or b"{}").get("error", exc.reason)
        if exc.code == 400:  # the request was wrong (an unknown instance): the caller's to fix
            raise UserError(str(detail)) from None
        raise LocalCloudError(str(detail)) from None


def find(config: Config) -> Daemon | None:
    """The running daemon for this config, or None."""
    info_path = config.local_dir / INFO_FILE
    try:
        info = json.loads(info_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    except PermissionError:
        raise EnvironmentProblem(
            f"cannot read {info_path}: permission denied; set AMIBAKE_LOCAL_DIR to a directory "
            "you own"
        ) from None
    daemon = Daemon(
        pid=int(info["pid"]),
        endpoint=str(info["endpoint"]),
        faults=tuple(info.get("faults", ())),
        faults_seed=int(info.get("faults_seed", 0)),
        started_with={k: info[k] for k in ADDRESSES if k in info},
    )
    if not process_alive(daemon.pid):
        return None
    try:
        _call(daemon.endpoint, "/_amibake/status")
    except (OSError, LocalCloudError):
        return None
    return daemon


def up(config: Config) -> Daemon:
    """Start the daemon unless it is already running; wait until it answers. Two commands that
    start it at once: one starts it, the other waits for it and takes it (under a lock: the
    second found none, failed on the port, and removed the first one's registry directory as
    a leftover)."""
    settings = settings_for(config)
    wanted = faults.parse(settings.faults, settings.faults_seed)  # a wrong name stops here
    running = find(config)
    if running is not None:
        return _as_asked(running, settings, wanted)
    check_host()
    try:
        settings.directory.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        raise EnvironmentProblem(
            f"cannot create {settings.directory}: permission denied; set AMIBAKE_LOCAL_DIR to a "
            "directory you own"
        ) from None
    with locked(settings.directory / "daemon"):
        running = find(config)
        if running is not None:
            return _as_asked(running, settings, wanted)
        return _start(config, settings)


def _as_asked(running: Daemon, settings: LocalSettings, wanted: faults.Faults) -> Daemon:
    """The running daemon, if it runs as this config asks."""
    differs = _differs(running, settings, wanted)
    if differs:
        raise UserError(
            f"the local cloud runs with {differs}: `amibake local down` first, or use its settings"
        )
    return running


def _start(config: Config, settings: LocalSettings) -> Daemon:
    """Start the daemon (none runs) and wait until it answers."""
    _clean_leftovers(settings.directory)
    if not port_free("127.0.0.1", settings.port):
        raise EnvironmentProblem(
            f"port {settings.port} on 127.0.0.1 is already in use; stop what uses it or set "
            f"AMIBAKE_LOCAL_PORT to a free port"
        )
    log_path = settings.directory / "daemon.log"
    raw = {**asdict(settings), "directory": str(settings.directory)}
    # The daemon gets a mount namespace of its own: the image store is a tmpfs mounted there,
    # invisible to the host and gone with the daemon (see amibake.local.images).
    isolate = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        # Root in a user namespace of the user's own, its subordinate ids mapped for the
        # sandboxes' users (amibake.local.rootless).
        isolate = [*rootless.namespace_command(), *isolate[1:]]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*isolate, sys.executable, "-m", "amibake.local.daemon", "--settings", json.dumps(raw)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal must not reach the cloud
            env={**os.environ, LAUNCHER_NS_ENV: os.readlink("/proc/self/ns/mnt")},
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                _raise_startup_error(settings.directory, log_path, process.returncode)
            daemon = find(config)
            if daemon is not None and daemon.pid == process.pid:
                return daemon
            time.sleep(0.05)
    except BaseException:
        # Ctrl-C while it started: the daemon, in a session of its own, came up seconds later
        # and kept running, unseen by `status` meanwhile (two at once on one port, interrupted
        # again)
        _stop_starting(process)
        raise
    _stop_starting(process)
    # what it was doing when given up on, said here: a test's log directory is gone after it
    try:
        last = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
    except OSError:
        last = ["(no log)"]
    raise LocalCloudError(
        f"the local cloud did not start within {START_TIMEOUT_S:g}s (its log's last line: "
        f"{last[0]}); see {log_path}"
    )


ADDRESSES = ("port", "subnet", "ssh_port", "imds_port")  # LocalSettings' and daemon.json's names


def _differs(running: Daemon, settings: LocalSettings, wanted: faults.Faults) -> str:
    """The first setting the running daemon was started with that this config asks otherwise
    ("" if none): it served its own, unsaid (a port given for a second cloud reached the
    first), where only different faults were refused."""
    if (running.faults, running.faults_seed) != (tuple(wanted.names), wanted.seed):
        now = ",".join(running.faults) or "none"
        return (
            f"faults {now} (seed {running.faults_seed}), not {settings.faults} "
            f"(seed {settings.faults_seed})"
        )
    for name, have in running.started_with.items():
        want = getattr(settings, name)
        same = (
            ip_network(str(have)) == ip_network(str(want))  # 127.77.0.0/255.255.0.0 is /16
            if name == "subnet"
            else str(have) == str(want)
        )
        if not same:
            return f"local_{name} {have}, not {want} (AMIBAKE_LOCAL_{name.upper()} or amibake.toml)"
    return ""


def _stop_starting(process: subprocess.Popen[bytes]) -> None:
    """Stop a daemon that has not finished starting, with what it started (its session's
    group): asked first (once up, it shuts its sandboxes down), then killed."""
    for signum, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _raise_startup_error(directory: Path, log_path: Path, code: int) -> None:
    try:
        error = json.loads((directory / ERROR_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
        raise LocalCloudError(f"the local cloud exited with code {code}: {tail[0]}") from None
    failure: AmibakeError = (
        EnvironmentProblem(error["message"])
        if error["exit_code"] == 2
        else LocalCloudError(error["message"])
    )
    raise failure


def status(config: Config) -> dict[str, Any] | None:
    daemon = find(config)
    if daemon is None:
        return None
    return {
        "pid": daemon.pid,
        "endpoint": daemon.endpoint,
        **_call(daemon.endpoint, "/_amibake/status"),
    }


def interrupt(config: Config, instance_id: str) -> dict[str, Any]:
    daemon = find(config)
    if daemon is None:
        raise LocalCloudError("the local cloud is not running; start it with `amibake local up`")
    return _call(daemon.endpoint, "/_amibake/interrupt", {"instance_id": instance_id})


def down(config: Config, timeout_s: float = 60.0) -> list[str]:
    """Stop the daemon and remove everything it or a crashed predecessor left; say what."""
    done: list[str] = []
    directory = config.local_dir
    daemon = find(config)
    if daemon is not None:
        _call(daemon.endpoint, "/_amibake/shutdown", {})
        deadline = time.monotonic() + timeout_s
        while process_alive(daemon.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if process_alive(daemon.pid):
            os.kill(daemon.pid, signal.SIGKILL)
            done.append(f"killed unresponsive daemon {daemon.pid}")
        _reap(daemon.pid)
        done.append(f"stopped daemon {daemon.pid}")
    if directory.exists():
        done += _clean_leftovers(directory)
    return done


_HELD: set[Path] = set()  # this process's hold files


def hold(config: Config) -> None:
    """This process uses the cloud until it exits: a file in the cloud's `runs/` names it (its
    pid, its start and its command line), so that `local down` refuses meanwhile; removed at
    exit, and found dead and removed by `holders` after a SIGKILL. Best effort: a cloud whose
    directory cannot take it is used all the same."""
    path = config.local_dir / HOLDS_DIR / str(os.getpid())
    if path in _HELD:
        return
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "python"
    try:  # whole or absent, never half-written
        write_whole(
            path,
            json.dumps({"pid": os.getpid(), "started": started(os.getpid()), "command": command}),
        )
    except OSError:
        return
    _HELD.add(path)
    atexit.register(path.unlink, missing_ok=True)


def holders(config: Config) -> list[tuple[str, int]]:
    """The other processes using the cloud now, (command, pid). The file of one that is gone (a
    SIGKILL), or whose pid another process took since, is removed."""
    directory = config.local_dir / HOLDS_DIR
    found = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if path.name.startswith(".") or path.name == str(os.getpid()):
            continue
        try:
            info = json.loads(path.read_text())
            pid, when = int(info["pid"]), str(info["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge
        if when and same_process(pid, when):
            found.append((str(info.get("command", "")), pid))
        else:
            path.unlink(missing_ok=True)
    return found


def _clean_leftovers(directory: Path) -> list[str]:
    """Remove what a daemon that died without shutting down left behind."""
    done: list[str] = []
    info = directory / INFO_FILE
    if info.exists():
        try:
            pid = int(json.loads(info.read_text())["pid"])
        except (ValueError, KeyError, json.JSONDecodeError):
            pid = 0
        if pid and process_alive(pid) and "amibake.local.daemon" in _cmdline(pid):
            os.kill(pid, signal.SIGKILL)
            done.append(f"killed stale daemon {pid}")
        info.unlink(missing_ok=True)
    # Killed, and waited for: a SIGKILLed process lingers a moment (longer on a loaded host)
    # while it exits and may still hold the sandbox's mounts, and `local down` says nothing is
    # left only when nothing is (a sandbox's init may also fork while being killed).
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    killed: set[int] = set()
    while time.monotonic() < deadline:
        found = [
            *((pid, "sandbox") for pid in sandbox_processes(directory)),
            *((pid, "registry") for pid in registry_processes(directory)),
        ]
        if not any(process_alive(pid) for pid, _ in found):
            break
        for pid, what in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            if pid not in killed:
                killed.add(pid)
                done.append(f"killed leftover {what} process {pid}")
        time.sleep(0.05)
    for sub in ("sandboxes", "images", REGISTRY_DIR):
        path = directory / sub
        if path.exists() and any(path.iterdir()):
            done.append(f"removed {path}")
        remove_tree(path)
    return done


def sandbox_processes(directory: Path) -> list[int]:
    """Processes of sandboxes under a local cloud directory, whoever started them.

    A sandbox's init and ``unshare`` name its directory on their command line; everything it runs
    is chrooted into its ``merged`` directory, which ``/proc/PID/root`` shows.
    """
    marker = str(directory.resolve() / "sandboxes")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            root = os.readlink(proc / "root")
        except OSError:
            continue
        if root.startswith(marker) or marker in _cmdline(int(proc.name)):
            found.append(int(proc.name))
    return found


def registry_processes(directory: Path) -> list[int]:
    """The ECR's docker-registry of a local cloud directory, left by a daemon killed so fast its
    child outlived it: it names its config (in the directory) on its command line."""
    marker = str(directory.resolve() / REGISTRY_DIR) + "/"
    return [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit()
        and "docker-registry" in (line := _cmdline(int(proc.name)))
        and marker in line
    ]


def _reap(pid: int) -> None:
    """Collect the daemon's exit status when this process started it (no zombie left)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0 if not process_alive(pid) else os.WNOHANG)


def _cmdline(pid: int) -> str:
    """The process's command line, or "" once it is gone: a process that exits while it is read
    answers ESRCH (ProcessLookupError), not ENOENT (a teardown in CI failed so)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""
