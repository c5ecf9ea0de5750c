"""One local-cloud instance: a real sandbox with its own root filesystem and sshd.

Shape of a sandbox (all under ``<local_dir>/sandboxes/<instance-id>/``)::

    unshare --mount --uts --pid --fork --kill-child  <- the one process the daemon holds
      └── sh init.sh                               <- PID 1 of the sandbox's PID namespace
            ├── overlay: lower = image layers + host "/", upper = ./upper
            ├── chroot: /proc, /dev, /sys, fresh tmpfs /run and /tmp
            ├── boot: first-boot (cloud-init's user and host keys), oneshot units, user data
            └── sshd -D on <address>:<port>

As a plain user the daemon is root in a user namespace of its own, and each sandbox differs in
three ways (amibake.local.rootless): an overlay a top-level directory over a skeleton layer
instead of one over "/", a network namespace of its own (``nsenter --net`` before ``unshare``),
and sshd started per connection (``sshd -i``) by a loop on a socket the daemon opened.

Why a PID namespace: killing the ``unshare`` process makes the kernel kill every process in the
sandbox (``--kill-child`` sends SIGKILL to PID 1, and the death of PID 1 takes the whole
namespace), and with the last process gone the mount namespace and its mounts disappear. So
teardown cannot leave a stray process or mount behind, even if the daemon itself is SIGKILLed
(``PR_SET_PDEATHSIG`` on ``unshare`` covers that case).
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from amibake.errors import EnvironmentProblem, LocalCloudError
from amibake.local import rootless
from amibake.local.boot import BootPlan
from amibake.ssh_keys import ed25519

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd", "/sbin/sshd")
# An instance boots with root's PATH, whoever started the local cloud: a plain user's PATH on
# Debian has no sbin, where chroot, useradd and usermod live.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_USER = "ec2-user"
# `docker` on instances of the ECS-optimized AMIs (see Sandbox._install_container_runtime).
CONTAINER_RUNTIME = Path(__file__).with_name("container_runtime.py")
# `shutdown` on every instance (see Sandbox._install_power).
POWER = Path(__file__).with_name("power.py")
_PR_SET_PDEATHSIG = 1


def find_sshd() -> str:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    raise EnvironmentProblem(
        "sshd not found: the local cloud needs OpenSSH's server; run `make install` "
        "(apt-get install openssh-server)"
    )


def check_host() -> None:
    """Fail early, in one line, when the machine cannot run sandboxes."""
    find_sshd()
    for tool, package in (("unshare", "util-linux"), ("useradd", "passwd"), ("sudo", "sudo")):
        if shutil.which(tool, path=SYSTEM_PATH) is None:
            raise EnvironmentProblem(
                f"{tool} not found: the local cloud needs it; run `make install` "
                f"(apt-get install {package})"
            )
    if os.geteuid() != 0:
        rootless.check_host()


def port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def _set_pdeathsig() -> None:
    # Runs in the child between fork and exec: if the daemon dies, unshare gets SIGKILL, and
    # --kill-child passes that on to the whole sandbox.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def existing_host_key(etc_ssh: Path) -> tuple[str, str] | None:
    """The ed25519 host key an earlier boot wrote (public key line, SHA256 fingerprint), or
    None when there is none (a first boot, or a reboot after a bake's hygiene removed it)."""
    private, pub = etc_ssh / "ssh_host_ed25519_key", etc_ssh / "ssh_host_ed25519_key.pub"
    # Regular files: a removed one is an overlay whiteout (a character device) in this layer.
    if not (private.is_file() and pub.is_file()):
        return None
    try:
        public = pub.read_text().strip()
        return public, _fingerprint(public)
    except (OSError, IndexError, ValueError):
        return None


def _fingerprint(public: str) -> str:
    # As amibake.remote.fingerprint computes it; not imported: paramiko would add 0.4 s to the
    # daemon's start.
    blob = base64.b64decode(public.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def host_key(etc_ssh: Path) -> tuple[str, str]:
    """Write a fresh ed25519 host key into `etc_ssh`; return (public key line, SHA256
    fingerprint). Generated in process: ssh-keygen was a fork of the daemon and 9 ms of CPU a
    boot, eight boots at once on two cores."""
    private, public = ed25519()
    etc_ssh.mkdir(parents=True, exist_ok=True)
    path = etc_ssh / "ssh_host_ed25519_key"
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(private)
    pub = path.with_name(path.name + ".pub")
    pub.unlink(missing_ok=True)  # a whiteout once a bake's hygiene removed the host's own key
    pub.write_text(public + "\n")
    return public, _fingerprint(public)


@dataclass
class SandboxSpec:
    instance_id: str
    address: str
    ssh_port: int
    imds_port: int
    layers: list[str]  # image layer directories, top first; the host "/" is always last
    authorized_key: str
    user_data: bytes | None = None
    units: BootPlan = field(default_factory=BootPlan)


@dataclass
class Isolation:
    """What a plain user's sandbox has that root's does not (see amibake.local.rootless): the
    skeleton under its layers, a network namespace, and the host socket its sshd accepts on."""

    skeleton: rootless.Skeleton
    netns: rootless.Netns
    listener: socket.socket


class Sandbox:
    """A running sandbox, owned by the daemon."""

    def __init__(
        self, root: Path, spec: SandboxSpec, hidden: Path, isolation: Isolation | None = None
    ) -> None:
        self.root = root
        self.spec = spec
        self.hidden = hidden  # the local cloud's own state: mounted over with an empty tmpfs
        self.isolation = isolation
        self.process: subprocess.Popen[bytes] | None = None
        self.fingerprint = ""
        self.public_host_key = ""

    @property
    def console_log(self) -> Path:
        return self.root / "console.log"

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    def start(self, spawn: SpawnFn, wait_s: float = 10.0) -> None:
        """Boot: the first, or again on the same disk (a reboot, after halt)."""
        spec = self.spec
        for sub in ("upper", "work", "merged"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # cloud-init writes fresh host keys on an instance's first boot; so do we, straight into
        # the instance's own layer, where a bake's hygiene step will find and remove them. A
        # reboot keeps the keys it finds; one after the hygiene finds none and writes new ones,
        # as sshd-keygen does.
        etc_ssh = self.upper / "etc" / "ssh"
        kept = existing_host_key(etc_ssh)
        self.public_host_key, self.fingerprint = kept or host_key(etc_ssh)
        self._install_container_runtime()
        self._install_power()

        (self.root / "hosts").write_text(
            f"127.0.0.1 localhost\n{spec.address} {self.hostname}\n"
            f"{spec.address} instance-data instance-data.ec2.internal\n"
        )
        (self.root / "fstab").write_text(self._fstab())
        (self.root / "sshd_config").write_text(self._sshd_config())
        (self.root / "firstboot.sh").write_text(self._firstboot_script())
        (self.root / "units.sh").write_text(spec.units.script())
        if spec.user_data is not None:
            (self.root / "user-data").write_bytes(spec.user_data)
        (self.root / "spec.json").write_text(json.dumps(self._record(), indent=1))
        init = self.root / "init.sh"
        command = [
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            "--propagation",
            "private",
            "/bin/sh",
            str(init),
        ]
        if self.isolation is not None:
            self._start_isolated(spawn, command, wait_s)
            return
        # sshd says READY=1 on NOTIFY_SOCKET once it listens (Debian's sd_notify patch): an
        # abstract socket (the kernel picks its name) reaches it through the chroot and spares
        # the daemon polling the port while eight sandboxes boot on two cores.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ready:
            ready.bind("")
            name = ready.getsockname()
            name = name.decode() if isinstance(name, bytes) else name
            notify = shlex.quote("@" + name.lstrip("\0"))
            init.write_text(
                self._init_script(
                    f'NOTIFY_SOCKET={notify} chroot "$M" {find_sshd()} -D -e '
                    "-f /run/amibake/sshd_config &"
                )
            )
            self._spawn(spawn, command)
            self._wait_for_sshd(wait_s, ready)

    def _install_container_runtime(self) -> None:
        """The ECS-optimized AMI has docker; an instance of one here gets the local cloud's
        runtime (amibake.local.container_runtime) in its own layer, as /usr/bin/docker and over
        /usr/local/bin/docker: a docker CLI of this host's would talk to this host's daemon,
        which no instance may reach."""
        ecs = any((Path(layer) / "etc/ecs/ecs.config").exists() for layer in self.spec.layers)
        if not ecs:
            return
        for place in ("usr/bin/docker", "usr/local/bin/docker"):
            target = self.upper / place
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(CONTAINER_RUNTIME, target)
            target.chmod(0o755)

    def _install_power(self) -> None:
        """`shutdown` in the instance's own layer, telling its IMDS server (amibake.local.power):
        the host's would ask this machine's systemd to power it off."""
        placeholder = 'ENDPOINT = "http://instance-data:80"'
        source = POWER.read_text()
        assert placeholder in source, "power.py's ENDPOINT line is what the install replaces"
        text = source.replace(
            placeholder, f'ENDPOINT = "http://{self.spec.address}:{self.spec.imds_port}"'
        )
        target = self.upper / "usr/sbin/shutdown"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755)

    def _start_isolated(self, spawn: SpawnFn, command: list[str], wait_s: float) -> None:
        """A plain user's sandbox: in its network namespace, sshd run per connection by a loop
        on the host socket that says READY=1 on a pipe (see amibake.local.rootless)."""
        assert self.isolation is not None
        (self.root / "sshd-loop.py").write_text(rootless.SSHD_LOOP)
        read_end, write_end = os.pipe()
        listener = self.isolation.listener.fileno()
        loop = f"/usr/bin/python3 -I /run/amibake/sshd-loop.py {listener} {write_end} {find_sshd()}"
        self.root.joinpath("init.sh").write_text(
            self._init_script(f'chroot "$M" {loop} -i -e -f /run/amibake/sshd_config &')
        )
        try:
            self._spawn(
                spawn,
                ["nsenter", f"--net={self.isolation.netns.path}", *command],
                (listener, write_end),
            )
        finally:
            os.close(write_end)
            # The sandbox holds it now: the port is free again once the sandbox is gone.
            self.isolation.listener.close()
        try:
            self._wait_for_ready(wait_s, read_end)
        finally:
            os.close(read_end)

    def _spawn(self, spawn: SpawnFn, command: list[str], keep: tuple[int, ...] = ()) -> None:
        with self.console_log.open("ab") as console:
            console.write(self._console_header().encode())
            console.flush()
            self.process = spawn(command, console, keep)
        (self.root / "pid").write_text(str(self.process.pid))

    def _wait_for_ready(self, wait_s: float, ready: int) -> None:
        deadline = time.monotonic() + wait_s
        said = b""
        while time.monotonic() < deadline:
            readable, _, _ = select.select([ready], [], [], 0.05)
            if readable:
                chunk = os.read(ready, 64)
                said += chunk
                if b"READY=1" in said:
                    return
                if not chunk:  # every writer gone without a word: the boot failed
                    break
            assert self.process is not None
            if self.process.poll() is not None:
                break
        assert self.process is not None
        if self.process.poll() is not None or time.monotonic() < deadline:
            raise LocalCloudError(
                f"sandbox {self.spec.instance_id} exited during boot: {self.console_tail()}"
            )
        raise LocalCloudError(
            f"sandbox {self.spec.instance_id}: sshd did not start within {wait_s:.0f}s: "
            f"{self.console_tail()}"
        )

    @property
    def hostname(self) -> str:
        return "ip-" + self.spec.address.replace(".", "-") + ".ec2.internal"

    def _record(self) -> dict[str, object]:
        record = asdict(self.spec)
        record.pop("user_data")
        record["units"] = self.spec.units.names
        return record

    def _wait_for_sshd(self, wait_s: float, ready: socket.socket) -> None:
        deadline = time.monotonic() + wait_s
        ready.settimeout(0.05)
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise LocalCloudError(
                    f"sandbox {self.spec.instance_id} exited during boot: {self.console_tail()}"
                )
            try:
                if b"READY=1" in ready.recv(4096):
                    return
            except TimeoutError:
                pass
            # An sshd without the notify patch never says so: then the port tells, checked at
            # the pace of the notify wait.
            try:
                with socket.create_connection((self.spec.address, self.spec.ssh_port), 0.2):
                    return
            except OSError:
                continue
        raise LocalCloudError(
            f"sandbox {self.spec.instance_id}: sshd did not listen on "
            f"{self.spec.address}:{self.spec.ssh_port} within {wait_s:.0f}s: {self.console_tail()}"
        )

    def console_tail(self, lines: int = 3) -> str:
        try:
            text = self.console_log.read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return "(no console output)"
        return " | ".join(text[-lines:])

    def console_output(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _console_header(self) -> str:
        # The exact block cloud-init prints, which amibake's remote layer parses on AWS too.
        return (
            f"[    0.000000] amibake local cloud: booting {self.spec.instance_id}\n"
            "-----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"256 {self.fingerprint} root@{self.hostname} (ED25519)\n"
            "-----END SSH HOST KEY FINGERPRINTS-----\n"
            "-----BEGIN SSH HOST KEY KEYS-----\n"
            f"{self.public_host_key} root@{self.hostname}\n"
            "-----END SSH HOST KEY KEYS-----\n"
        )

    def _sshd_config(self) -> str:
        return (
            f"ListenAddress {self.spec.address}:{self.spec.ssh_port}\n"
            "HostKey /etc/ssh/ssh_host_ed25519_key\n"
            "PidFile /run/sshd.pid\n"
            "PermitRootLogin no\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "UseDNS no\n"
            "AuthorizedKeysFile .ssh/authorized_keys\n"
            "AcceptEnv LANG LC_*\n"
            "Subsystem sftp internal-sftp\n"
            "MaxSessions 64\n"
            "MaxStartups 64:30:128\n"
        )

    def _firstboot_script(self) -> str:
        # What cloud-init does on Amazon Linux: the default user with passwordless sudo and the
        # launch key pair in its authorized_keys.
        key = shlex.quote(self.spec.authorized_key)
        user = DEFAULT_USER
        return f"""set -e
# '*' = no password but not locked: sshd refuses key logins to a locked ('!') account. One
# useradd, not useradd then usermod: each rewrites the account files (14 ms a boot).
if id {user} >/dev/null 2>&1; then
  usermod -p '*' {user}
else
  useradd -m -p '*' -s /bin/bash {user}
fi
install -d -m 700 -o {user} -g {user} /home/{user}/.ssh
printf '%s\\n' {key} > /home/{user}/.ssh/authorized_keys
chown {user}:{user} /home/{user}/.ssh/authorized_keys
chmod 600 /home/{user}/.ssh/authorized_keys
install -d -m 750 /etc/sudoers.d
printf '{user} ALL=(ALL) NOPASSWD:ALL\\n' > /etc/sudoers.d/90-cloud-init-users
chmod 440 /etc/sudoers.d/90-cloud-init-users
echo {self.hostname} > /etc/hostname
"""

    def _fstab(self) -> str:
        """The instance's mounts, in order, for one ``mount --all``: one process where nine
        ``mount`` commands cost 3 ms of CPU each, a boot's largest share after useradd."""
        merged = self.root / "merged"
        entries: list[tuple[str, Path, str, str]]
        if self.isolation is None:
            lowers = ":".join([*self.spec.layers, "/"])
            overlay = f"lowerdir={lowers},upperdir={self.root}/upper,workdir={self.root}/work"
            entries = [("overlay", merged, "overlay", overlay)]
        else:  # no overlay over "/" in a user namespace: one a top-level directory
            layers = [Path(p) for p in self.spec.layers]
            skeleton = self.isolation.skeleton
            entries = list(
                rootless.overlays(skeleton, layers, self.upper, self.root / "work", merged)
            )
        entries += [
            ("proc", merged / "proc", "proc", "defaults"),
            ("/dev", merged / "dev", "none", "rbind"),
            ("tmpfs", merged / "dev/shm", "tmpfs", "mode=1777"),
            ("/sys", merged / "sys", "none", "rbind"),
            ("tmpfs", merged / "run", "tmpfs", "mode=755"),
            ("tmpfs", merged / "tmp", "tmpfs", "mode=1777"),
            (str(self.root / "hosts"), merged / "etc/hosts", "none", "bind"),
        ]
        return "".join(
            " ".join([_fstab_field(source), _fstab_field(str(target)), kind, _fstab_field(options)])
            + " 0 0\n"
            for source, target, kind, options in entries
        )

    def _init_script(self, sshd: str) -> str:
        spec = self.spec
        q = shlex.quote
        merged = self.root / "merged"
        user_data = ""
        if spec.user_data is not None:
            user_data = f"""
if [ "$FIRST" = 1 ]; then
install -D -m 700 {q(str(self.root / "user-data"))} "$M/var/lib/cloud/instance/user-data"
echo "cloud-init: running user data"
if chroot "$M" /var/lib/cloud/instance/user-data; then
  echo "cloud-init: user data finished"
else
  echo "cloud-init: user data failed with exit code $?"
fi
fi"""
        return f"""#!/bin/sh
# PID 1 of sandbox {spec.instance_id}; generated by amibake.local.sandbox.
set -eu
PATH={SYSTEM_PATH}; export PATH
M={q(str(merged))}
hostname {q(self.hostname)}
mount --all --fstab {q(str(self.root / "fstab"))}
# Hide the local cloud's own state from the instance (already hidden if it lives in /tmp).
H="$M"{q(str(self.hidden))}
if [ -d "$H" ]; then mount -t tmpfs -o mode=700,size=1m tmpfs "$H"; fi
# cloud-init runs user data once per instance: on its first boot, and on a boot that finds its
# record of the instance gone (a bake's hygiene removes it before CreateImage reboots the host).
FIRST={0 if self._booted_before() else 1}
mkdir -p "$M/run/sshd" "$M/run/amibake" "$M/var/lib/cloud/instance"
rm -f "$M/var/lib/cloud/instance/boot-finished"
cp {" ".join(q(str(f)) for f in self._boot_files())} "$M/run/amibake/"
chroot "$M" /bin/sh /run/amibake/firstboot.sh
set +e
echo "systemd: starting enabled oneshot units"
chroot "$M" /bin/sh -s < {q(str(self.root / "units.sh"))}
{sshd}
{user_data}
date -u +%s > "$M/var/lib/cloud/instance/boot-finished"
echo "cloud-init: boot finished"
wait
"""

    def _booted_before(self) -> bool:
        """Whether this instance's own layer records a finished boot: its image's layers, or the
        host's "/" (a machine running cloud-init), would show one of their own through the
        merged view, and a new instance's user data would not run."""
        return (self.upper / "var/lib/cloud/instance/boot-finished").is_file()

    def _boot_files(self) -> list[Path]:
        names = ["sshd_config", "firstboot.sh"]
        if self.isolation is not None:
            names.append("sshd-loop.py")
        return [self.root / name for name in names]

    def container(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Run ``argv`` inside the sandbox the way ECS runs a container on its host: its own PID
        namespace (killing the returned process kills the whole job) and its own /proc, the
        host's filesystem with its mounts (``/shared``), as root, with only ``env``.

        The daemon is outside the sandbox, so it first joins the sandbox's namespaces (those of
        its PID 1, the child of ``unshare``). Output (stdout and stderr) comes on a pipe."""
        assert self.process is not None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            init = children.read_text().split()[0]
        except (OSError, IndexError):
            raise LocalCloudError(f"sandbox {self.spec.instance_id} is not running") from None
        merged = str(self.root / "merged")
        command = ["nsenter", "--target", init, "--mount", "--uts", "--pid"]
        if self.isolation is not None:
            command.append("--net")  # its IMDS, and the relayed endpoint, are there
        command += [
            "--",
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            f"--mount-proc={merged}/proc",
            "chroot",
            merged,
            *argv,
        ]
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,  # one process group: see jobs._kill
            preexec_fn=_set_pdeathsig,
            close_fds=True,
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Kill the sandbox and remove its directory; confirm nothing is left."""
        self.halt(timeout_s)
        remove_tree(self.root)

    def halt(self, timeout_s: float = 10.0) -> None:
        """Kill every process of the sandbox (its mounts go with them); its disk, the upper
        layer, stays for a boot again."""
        if self.isolation is not None:
            self.isolation.listener.close()  # if the sandbox never took it over
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                raise LocalCloudError(
                    f"sandbox {self.spec.instance_id} (pid {self.process.pid}) did not exit; "
                    f"kill it by hand: kill -9 {self.process.pid}"
                ) from None


def _fstab_field(text: str) -> str:
    """fstab separates fields by whitespace: a space in a path is written as \\040 (fstab(5))."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in text)


def remove_tree(path: Path) -> None:
    """rm -rf that also copes with overlay work directories (mode 000) and busy mounts."""
    if not path.exists():
        return
    mounted = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(str(path))
    ]
    for mount_point in sorted(mounted, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True)
    if path.exists() and os.geteuid() != 0:
        # What a plain user's sandboxes wrote is owned by subordinate ids: removable from a
        # namespace where they map back (a daemon that died left it).
        rootless.remove_as_owner(path)
    if path.exists():
        by_hand = f"rm -rf {path}"
        if os.geteuid() != 0:
            by_hand = " ".join([*rootless.namespace_command(), by_hand])
        raise LocalCloudError(f"could not remove {path}; remove it by hand: {by_hand}")


class SpawnFn:
    """Starts sandbox processes from one long-lived thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so spawning from a
    short-lived request thread would kill the sandbox as soon as the request ended.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")

    def __call__(
        self, command: list[str], console: IO[bytes], keep: tuple[int, ...] = ()
    ) -> subprocess.Popen[bytes]:
        """`keep`: descriptors of this process the child gets, under the same numbers."""

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                preexec_fn=_set_pdeathsig,
                close_fds=True,
                pass_fds=keep,
            )

        return self._thread.submit(spawn).result()

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False)
