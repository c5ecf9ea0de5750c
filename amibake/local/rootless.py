"""The local cloud without root: what a plain user's sandboxes need that root's do not.

As root, a sandbox is an overlay over "/" in a private mount namespace (amibake.local.sandbox).
A plain user gets there through a user namespace, where the kernel draws three lines:

- **No overlay over "/"**: "/" carries submounts (/proc, /dev, ...) locked to the namespace the
  user came from, and overlayfs will not clone such a lower layer ("failed to clone lowerpath").
  So the instance's tree is one overlay per top-level directory (``userxattr``: trusted.* xattrs
  are root's), under a root overlay that catches writes at the top (a new ``/shared``).
- **The host's files belong to nobody**: real root is not mapped in the namespace, so its files
  show as the overflow id, and root inside may neither write into root's directories nor run
  root's setuid ``sudo`` as root. So a *skeleton* layer sits right above the host in every
  stack: every host directory again (owned by root inside, same mode), a copy of ``/etc`` and
  ``/var/log`` (``/etc/shadow`` and ``/etc/sudoers``, unreadable to the user, written afresh;
  other files the user cannot read left empty), and ``sudo`` with its plugins. A directory the
  user cannot read is opaque there: the instance sees it empty, as it would see nothing of it
  anyway. Elsewhere, a host file can be read, replaced or removed inside, not written in place.
- **Ports below net.ipv4.ip_unprivileged_port_start are root's** on the host's network. So each
  sandbox has a network namespace of its own, where its IMDS answers on port 80 as on EC2 (the
  daemon binds it from a thread that joined the namespace); sshd runs per connection
  (``sshd -i``) from a loop inside the sandbox holding a listening socket the daemon opened on the
  host, on the configured port or, where that is root's, on a high one (the address the SSH step
  looks up carries it); and the daemon relays the local cloud's own endpoint into the namespace
  (Batch jobs reach S3 there).

More than one id is needed inside (sshd's privilege separation user, ``ec2-user``, root), so the
daemon's user namespace maps root to the user and 1..65536 to the user's subordinate range
(``/etc/subuid``, set up through the setuid ``newuidmap`` of Debian's ``uidmap``), as rootless
container runtimes do. Files the sandboxes write are then owned by those ids on disk, which the
user can only remove from inside such a namespace (:func:`remove_as_owner`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import pwd
import queue
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from amibake.errors import EnvironmentProblem, LocalCloudError

T = TypeVar("T")

ID_COUNT = 65536  # ids 1..65535 inside: every system user and ec2-user (1000)
# The kernel's view of the initial user namespace; anything else means a namespace of our own.
_INITIAL_MAP = ["0", "0", "4294967295"]
# Directories a sandbox never takes from the host's disk: provided as root's sandboxes have them.
SPECIAL = frozenset({"proc", "sys", "dev", "run", "tmp"})
OPAQUE_XATTR = "user.overlay.opaque"
# Host directories whose files an instance changes in place (accounts, sudoers; a bake's hygiene
# truncates every log): copied whole, a few MiB, so root inside owns them. Elsewhere the host's
# files can be read, replaced and removed, not written.
COPIED = ("etc", "var/log")
# Where sudo keeps its plugins: `sudo` refuses a sudoers.so not owned by root.
SUDO_DIRS = ("usr/libexec/sudo", "usr/lib/sudo")
# Setuid programs live here; scanning all of /usr for them would stat 200,000 files a start.
SETUID_DIRS = ("usr/bin", "usr/sbin", "usr/libexec", "usr/lib/openssh")
SUDOERS = """\
Defaults env_reset
Defaults secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
root ALL=(ALL:ALL) ALL
%sudo ALL=(ALL:ALL) ALL
@includedir /etc/sudoers.d
"""


def active() -> bool:
    """Whether this process runs in a user namespace (the daemon of a plain user's cloud)."""
    try:
        return Path("/proc/self/uid_map").read_text().split() != _INITIAL_MAP
    except OSError:
        return False


@dataclass(frozen=True)
class IdRange:
    start: int
    count: int


def subordinate(kind: str, name: str, number: int) -> IdRange | None:
    """The first range in /etc/sub{kind} of the user (by name or number) of ID_COUNT ids."""
    try:
        lines = Path(f"/etc/sub{kind}").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        owner, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        numeric = start.isdigit() and count.isdigit()
        if owner in (name, str(number)) and numeric and int(count) >= ID_COUNT:
            return IdRange(int(start), ID_COUNT)
    return None


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _id_ranges() -> tuple[IdRange, IdRange]:
    user = _user()
    uids, gids = subordinate("uid", user, os.getuid()), subordinate("gid", user, os.getgid())
    if uids is None or gids is None:
        kind = "uid" if uids is None else "gid"
        span = f"{_free_start()}-{_free_start() + ID_COUNT - 1}"
        raise EnvironmentProblem(
            f"without a subordinate id range the local cloud needs root: {user} has no "
            f"{ID_COUNT} ids in /etc/sub{kind} (sshd's privilege separation and ec2-user need "
            f"more than one id); add them: sudo usermod --add-subuids {span} "
            f"--add-subgids {span} {user}"
        )
    return uids, gids


def _free_start() -> int:
    """Where a new range would start: above every range given out (useradd's default 100000)."""
    ends = [100000]
    for kind in ("uid", "gid"):
        try:
            lines = Path(f"/etc/sub{kind}").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                ends.append(int(fields[1]) + int(fields[2]))
    return max(ends)


def namespace_command() -> list[str]:
    """``unshare`` arguments for a process that is root in a user namespace of this user's own,
    with the subordinate ranges mapped to 1..65535 (newuidmap does that part)."""
    uids, gids = _id_ranges()
    return [
        "unshare",
        "--user",
        "--map-root-user",
        f"--map-users={uids.start},1,{uids.count - 1}",
        f"--map-groups={gids.start},1,{gids.count - 1}",
    ]


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def check_host() -> None:
    """Fail in one line naming the setting that stops a plain user's sandboxes, and how to
    turn it on; checked before the daemon starts."""
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        raise EnvironmentProblem(
            "the local cloud needs root here: unprivileged user namespaces are off "
            "(kernel.unprivileged_userns_clone=0); turn them on: "
            "sudo sysctl -w kernel.unprivileged_userns_clone=1"
        )
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        raise EnvironmentProblem(
            "the local cloud needs root here: user namespaces are off "
            "(user.max_user_namespaces=0); turn them on: "
            "sudo sysctl -w user.max_user_namespaces=15000"
        )
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        raise EnvironmentProblem(
            "the local cloud needs root here: AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns=1); allow them: "
            "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
        )
    for tool in ("newuidmap", "newgidmap"):
        if shutil.which(tool) is None:
            raise EnvironmentProblem(
                f"{tool} not found: the local cloud needs it without root; run `make install` "
                "(apt-get install uidmap)"
            )
    _id_ranges()
    with tempfile.TemporaryDirectory(prefix="amibake-probe-") as tmp:
        # The mount every sandbox makes: an overlay of one host directory, in a user namespace.
        script = (
            f"mkdir {tmp}/u {tmp}/w {tmp}/m && mount -t overlay overlay "
            f"-o userxattr,lowerdir=/usr,upperdir={tmp}/u,workdir={tmp}/w {tmp}/m && "
            f"mount -t tmpfs tmpfs {tmp}/m/local && unshare --net --pid --fork true"
        )
        probe = subprocess.run(
            [*namespace_command(), "--mount", "sh", "-c", script],
            capture_output=True,
            text=True,
        )
        subprocess.run([*namespace_command(), "rm", "-rf", tmp], capture_output=True)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        raise EnvironmentProblem(
            "the local cloud needs root here: a plain user's sandbox needs overlayfs in a user "
            f"namespace (Linux 5.11 or later) and newuidmap, and this system refused ({reason})"
        )


def ssh_port(port: int) -> int:
    """The port sshd listens on as a plain user: the configured one unless it is root's
    (below net.ipv4.ip_unprivileged_port_start), then 2200 above it (22 -> 2222)."""
    try:
        first_unprivileged = int(_read("/proc/sys/net/ipv4/ip_unprivileged_port_start") or 1024)
    except ValueError:
        first_unprivileged = 1024
    if port >= first_unprivileged:
        return port
    return port + 2200 if port + 2200 >= first_unprivileged else port + 10000


def remove_as_owner(path: Path) -> None:
    """Remove a tree the sandboxes wrote, from a namespace where their ids map back: outside
    it, a directory of ec2-user's (mode 700, owned by a subordinate id) cannot even be read."""
    subprocess.run([*namespace_command(), "rm", "-rf", str(path)], capture_output=True)


# --- the skeleton layer ---------------------------------------------------------------------


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        points.append(point)
    return points


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _opaque(path: Path) -> None:
    os.setxattr(path, OPAQUE_XATTR, b"y")


def _readable(path: str) -> bool:
    return os.access(path, os.R_OK | os.X_OK)


@dataclass
class Skeleton:
    """The layer between an instance's image layers and the host's directories (see above)."""

    root: Path
    # Top-level host directories stacked under the skeleton's; those with submounts (locked,
    # so overlayfs refuses them) or that the user cannot read are the skeleton's alone.
    host_lowers: frozenset[str] = frozenset()

    @classmethod
    def build(cls, root: Path, hidden: Path) -> Skeleton:
        root.mkdir(parents=True, exist_ok=True)
        points = _mount_points()
        lowers = set()
        for entry in os.scandir("/"):
            target = root / entry.name
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir(follow_symlinks=False):
                _mkdir_like(entry.path, target)
                if entry.name in SPECIAL:
                    continue
                # The local cloud's own mounts (the image store) are the daemon's, not locked.
                below = [
                    p
                    for p in points
                    if p.startswith(entry.path + "/") and not _within(p, str(hidden))
                ]
                if below:
                    continue  # a locked submount: the instance gets an empty directory
                if not _readable(entry.path):
                    continue
                lowers.add(entry.name)
                _mirror_directories(Path(entry.path), target, hidden, set(points))
        skeleton = cls(root, frozenset(lowers))
        skeleton._copy_mutable()
        skeleton._copy_setuid()
        return skeleton

    def _copy_mutable(self) -> None:
        for top in COPIED:
            into_top = self.root / top
            for directory, _, files in os.walk("/" + top):
                into = into_top / os.path.relpath(directory, "/" + top)
                if not into.is_dir():
                    continue  # unreadable: left opaque
                for name in files:
                    _copy(os.path.join(directory, name), into / name)
        etc = self.root / "etc"
        _synthesize_shadow(etc)
        (etc / "sudoers").unlink(missing_ok=True)
        (etc / "sudoers").write_text(SUDOERS)
        (etc / "sudoers").chmod(0o440)

    def _copy_setuid(self) -> None:
        for top in SUDO_DIRS:
            if os.path.isdir("/" + top):
                for directory, _, files in os.walk("/" + top):
                    for name in files:
                        source = os.path.join(directory, name)
                        _copy(source, self.root / source.lstrip("/"))
        for top in SETUID_DIRS:
            for directory, _, files in os.walk("/" + top):
                for name in files:
                    source = os.path.join(directory, name)
                    try:
                        mode = os.lstat(source).st_mode
                    except OSError:
                        continue
                    if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                        _copy(source, self.root / source.lstrip("/"))

    def top_directories(self) -> list[str]:
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.is_symlink() and p.name not in SPECIAL
        )


def _mkdir_like(source: str, target: Path) -> None:
    try:
        mode = os.lstat(source).st_mode
    except OSError:
        mode = 0o755
    target.mkdir(exist_ok=True)
    os.chmod(target, stat.S_IMODE(mode))  # umask-free, and keeps /tmp-like sticky bits


def _mirror_directories(source: Path, target: Path, hidden: Path, points: set[str]) -> None:
    """Every directory under `source` again under `target`, owned by root inside, same mode;
    one the user cannot read is left empty and opaque. The local cloud's own directory is not
    mirrored: the instance sees it as an empty tmpfs, as root's do. One lstat, access, mkdir
    and chmod a directory (os.walk with os.path.ismount took 6 s for 27,000 of them)."""
    stack = [(str(source), str(target))]
    while stack:
        here, there = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.path == str(hidden) or entry.path in points:
                continue
            into = os.path.join(there, entry.name)
            os.mkdir(into)
            os.chmod(into, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
            if _readable(entry.path):
                stack.append((entry.path, into))
            else:
                _opaque(Path(into))


def _copy(source: str, target: Path) -> None:
    try:
        st = os.lstat(source)
    except OSError:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target):
        return
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISREG(st.st_mode):
        try:
            shutil.copy2(source, target, follow_symlinks=False)
        except PermissionError:  # unreadable to the user: the instance's is empty
            target.touch()
            os.chmod(target, stat.S_IMODE(st.st_mode))


def _synthesize_shadow(etc: Path) -> None:
    """/etc/shadow and /etc/gshadow are root's to read: written from passwd and group, every
    account without a password (useradd and sudo need the files, nothing needs the hashes)."""
    passwd = (etc / "passwd").read_text().splitlines()
    group = (etc / "group").read_text().splitlines()
    shadow = "".join(f"{line.split(':')[0]}:*:19000:0:99999:7:::\n" for line in passwd if line)
    gshadow = "".join(
        f"{fields[0]}:!::{fields[3] if len(fields) > 3 else ''}\n"
        for fields in (line.split(":") for line in group if line)
    )
    for name, text in (("shadow", shadow), ("gshadow", gshadow)):
        path = etc / name
        path.unlink(missing_ok=True)
        path.write_text(text)
        path.chmod(0o640)


def _is_whiteout(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def overlays(
    skeleton: Skeleton, layers: list[Path], upper: Path, work: Path, merged: Path
) -> Iterator[tuple[str, Path, str, str]]:
    """The instance's file system as fstab entries: the root overlay, then one a top-level
    directory. Its upper directories are created here, with the modes the instance will see
    (an overlay directory takes the upper one's)."""
    roots = ":".join([*map(str, layers), str(skeleton.root)])
    (work / ".root").mkdir(parents=True, exist_ok=True)
    yield (
        "overlay",
        merged,
        "overlay",
        f"userxattr,lowerdir={roots},upperdir={upper},workdir={work / '.root'}",
    )
    for name in skeleton.top_directories():
        lowers: list[str] = []
        below = True  # whether the skeleton's and the host's directories show through
        for layer in layers:
            path = layer / name
            if _is_whiteout(path):  # an image that removed the whole directory
                below = False
                break
            if path.is_dir():
                lowers.append(str(path))
                if _is_opaque(path):
                    below = False
                    break
        if below:
            lowers.append(str(skeleton.root / name))
            if name in skeleton.host_lowers:
                lowers.append("/" + name)
        if not lowers:
            continue
        own = upper / name
        if not own.exists():
            own.mkdir()
            os.chmod(own, stat.S_IMODE(os.stat(lowers[0]).st_mode))
        (work / name).mkdir(exist_ok=True)
        options = f"userxattr,lowerdir={':'.join(lowers)},upperdir={own},workdir={work / name}"
        yield ("overlay", merged / name, "overlay", options)


# --- networking -----------------------------------------------------------------------------

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _in_thread(work: Callable[[], T]) -> T:
    """Run `work` in a thread of its own and return what it returns: a thread that changed its
    network namespace cannot change back (the host's is not the user's), so it must end."""
    results: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            results.append(work())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body, name="netns", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


class Netns:
    """A network namespace of one sandbox, held by a file descriptor of the daemon."""

    def __init__(self) -> None:
        def create() -> int:
            if _libc.unshare(_CLONE_NEWNET) != 0:
                raise LocalCloudError(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                # A new namespace's loopback is down; every 127/8 address is local once it is up.
                name = struct.pack("16sH14s", b"lo", 0, b"")
                flags = struct.unpack("16sH14s", fcntl.ioctl(probe, _SIOCGIFFLAGS, name))[1]
                up = struct.pack("16sH14s", b"lo", flags | _IFF_UP, b"")
                fcntl.ioctl(probe, _SIOCSIFFLAGS, up)
            return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

        self.fd = _in_thread(create)

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def run(self, work: Callable[[], T]) -> T:
        """Run `work` inside the namespace: sockets it makes, and threads it starts, are there."""

        def inside() -> T:
            if _libc.setns(self.fd, _CLONE_NEWNET) != 0:
                raise LocalCloudError(f"setns: {os.strerror(ctypes.get_errno())}")
            return work()

        return _in_thread(inside)

    def close(self) -> None:
        os.close(self.fd)


def listen(address: str, port: int) -> socket.socket:
    """A listening socket on the host's network, for a sandbox to accept SSH connections on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise LocalCloudError(f"ssh port {port} on {address}: {exc.strerror}") from None
    sock.listen(128)
    return sock


class Relay:
    """Connections to 127.0.0.1:`port` inside a sandbox's namespace, carried to the same port on
    the host: the local cloud's own endpoint (a Batch job's S3 calls) and its ECR registry
    (image pulls)."""

    def __init__(self, netns: Netns, port: int, connector: Connector) -> None:
        self.port = port
        self._connector = connector

        def bind() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(64)
            return sock

        self._listener = netns.run(bind)
        threading.Thread(target=self._accept, name=f"relay-{port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inner, _ = self._listener.accept()
            except OSError:
                return  # closed: the sandbox is gone
            self._connector.submit(inner, self.port)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # shutdown wakes the accept; close alone does not
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


class Connector:
    """Opens the host side of relayed connections: one thread started on the host's network
    (threads take the namespace of the thread that starts them), pumping from threads of its
    own."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[socket.socket, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="relay-connector", daemon=True)
        self._thread.start()

    def submit(self, inner: socket.socket, port: int) -> None:
        self._queue.put((inner, port))

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            inner, port = item
            try:
                outer = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                inner.close()
                continue
            outer.settimeout(None)
            for source, sink in ((inner, outer), (outer, inner)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def shutdown(self) -> None:
        self._queue.put(None)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            sink.close()
            source.close()


# The sandbox's sshd as inetd would run it: a loop, inside the sandbox (its namespaces, its
# root), accepting on the socket the daemon opened on the host's network (argv[1]), telling the
# daemon it is ready on a pipe (argv[2]), and starting `sshd -i` on each connection. sshd
# re-executes itself per connection in any case, so this costs no more than `sshd -D`.
SSHD_LOOP = """\
import os, signal, socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the sshd of each connection
os.write(int(sys.argv[2]), b"READY=1")
os.close(int(sys.argv[2]))
argv = sys.argv[3:]
while True:
    connection, _ = listener.accept()
    os.posix_spawn(argv[0], argv, os.environ, setsigdef=(signal.SIGCHLD,), file_actions=[
        (os.POSIX_SPAWN_DUP2, connection.fileno(), 0),
        (os.POSIX_SPAWN_DUP2, connection.fileno(), 1),
        (os.POSIX_SPAWN_CLOSE, listener.fileno()),
    ])
    connection.close()
"""
