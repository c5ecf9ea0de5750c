#!/usr/bin/python3
"""``docker`` on a local-cloud instance: the container runtime the ECS-optimized AMI has, as far
as running one image goes (login, pull, run, version), with no Docker daemon.

The local cloud installs this file as ``/usr/bin/docker`` on instances of its ECS-optimized AMIs
(amibake.local.sandbox), so the product runs the same ``docker login / pull / run`` lines there
as on AWS. Self-contained on purpose (standard library only): it runs inside the sandbox, under
the host's python3.

- ``pull`` copies the image for one platform with skopeo into an OCI layout, then unpacks each
  layer into a directory of its own, OCI whiteouts turned into overlayfs ones, all on a tmpfs at
  /var/lib/docker: a 0/0 character device is a whiteout to the sandbox's own overlay, so a layer
  kept on the sandbox's filesystem would lose its whiteouts.
- ``run`` stacks the layers as overlay lower directories under a fresh upper one, in a mount
  namespace of the run's own, binds the ``-v`` directories, /proc, /dev and /sys, chroots and
  executes the entrypoint: the workload is this process (same pid), so whatever watches the
  ``docker run`` process tree watches the workload. It leaves its caller's session first: a
  container is dockerd's, not its client's, and killing the client's process group (a
  timeout's SIGKILL) leaves it running, as on a Docker host. ``--name`` records it, and
  ``rm -f NAME`` (or ``kill NAME``) ends it and all it started. An image of the other
  architecture runs its entrypoint under ``qemu-<arch>-static`` (said on stderr: emulated);
  without binfmt_misc, what that program executes in turn is not emulated, so a shell line of
  such an image fails.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path("/var/lib/docker")
AUTH = Path("/root/.docker/config.json")
CONTAINERS = ROOT / "containers"  # NAME -> "PID START" of a named run's workload
POLICY = '{"default": [{"type": "insecureAcceptAnything"}]}'
OCI_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
QEMU = {"amd64": "qemu-x86_64-static", "arm64": "qemu-aarch64-static"}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VERSION = "local-cloud-runtime 1 (amibake: skopeo, overlayfs, chroot; no daemon)"


def fail(message: str, code: int = 125) -> None:
    print(f"docker: {message}", file=sys.stderr)
    sys.exit(code)


def ensure_store() -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(ROOT)]).returncode != 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=700", "docker", str(ROOT)], check=True)
    (ROOT / "policy.json").write_text(POLICY)


def host_platform() -> str:
    return OCI_ARCH.get(platform.machine(), platform.machine())


def image_dir(reference: str, arch: str) -> Path:
    return ROOT / "images" / hashlib.sha256(f"{reference}|{arch}".encode()).hexdigest()[:24]


def login(args: list[str]) -> None:
    user, server, password = "", "", ""
    rest = list(args)
    while rest:
        word = rest.pop(0)
        if word in ("-u", "--username"):
            user = rest.pop(0)
        elif word == "--password-stdin":
            password = sys.stdin.read().strip()
        elif word in ("-p", "--password"):
            password = rest.pop(0)
        else:
            server = word
    host = server.split("://", 1)[-1].rstrip("/")
    AUTH.parent.mkdir(parents=True, exist_ok=True)
    auths = json.loads(AUTH.read_text()) if AUTH.exists() else {"auths": {}}
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    auths["auths"][host] = {"auth": token, "insecure": server.startswith("http://")}
    AUTH.write_text(json.dumps(auths))
    AUTH.chmod(0o600)
    print("Login Succeeded")


def credentials(reference: str) -> tuple[str, bool]:
    host = reference.split("/", 1)[0]
    auths = json.loads(AUTH.read_text())["auths"] if AUTH.exists() else {}
    entry = auths.get(host)
    if entry is None:
        return "", False
    return base64.b64decode(entry["auth"]).decode(), bool(entry.get("insecure"))


def options(args: list[str], takes: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    found: dict[str, list[str]] = {}
    rest = list(args)
    while rest and rest[0].startswith("-"):
        word = rest.pop(0)
        name, eq, value = word.partition("=")
        if name in takes:
            found.setdefault(name, []).append(value if eq else rest.pop(0))
        else:
            found.setdefault(name, []).append("")
    return found, rest


def platform_of(found: dict[str, list[str]]) -> str:
    wanted = found.get("--platform", [f"linux/{host_platform()}"])[-1]
    return wanted.split("/")[1] if "/" in wanted else wanted


def pull(args: list[str]) -> None:
    found, rest = options(args, {"--platform"})
    if not rest:
        fail("pull needs an image reference")
    reference, arch = rest[0], platform_of(found)
    ensure_store()
    target = image_dir(reference, arch)
    if (target / "image.json").exists():
        print(f"{reference}: up to date")
        return
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    creds, insecure = credentials(reference)
    copy = ["skopeo", "--policy", str(ROOT / "policy.json"), "--override-arch", arch]
    copy += ["--override-os", "linux", "copy", "--quiet"]
    copy += [f"--src-tls-verify={'false' if insecure else 'true'}"]
    if creds:
        copy += ["--src-creds", creds]
    copy += [f"docker://{reference}", f"oci:{target / 'oci'}:image"]
    done = subprocess.run(copy, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        fail(f"pull {reference} ({arch}): {done.stderr.strip()[-400:]}", 1)
    layout = target / "oci"
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(layout, index["manifests"][0]["digest"]))
    config = json.loads(blob(layout, manifest["config"]["digest"]))
    if config.get("architecture") != arch:
        shutil.rmtree(target, ignore_errors=True)
        fail(f"{reference} has no linux/{arch} variant", 1)
    layers = []
    for number, layer in enumerate(manifest["layers"]):
        directory = target / "layers" / str(number)
        directory.mkdir(parents=True)
        unpack(layout, layer, directory)
        layers.append(str(directory))
    shutil.rmtree(layout)  # the unpacked layers are all a run needs
    (target / "image.json").write_text(json.dumps({"layers": layers, "config": config}))
    print(f"{reference}: pulled ({arch}, {len(layers)} layers)")


def blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()


def unpack(layout: Path, layer: dict[str, Any], directory: Path) -> None:
    """A layer's tar into `directory`, its whiteouts as overlayfs expects them."""
    path = layout / "blobs" / "sha256" / layer["digest"].split(":", 1)[1]
    # tarfile's "r|*" reads gzip or plain from the stream alike.
    with path.open("rb") as stream, tarfile.open(fileobj=stream, mode="r|*") as archive:
        for member in members(archive):
            name = os.path.normpath(member.name.lstrip("/"))
            if name.startswith(".."):
                continue
            head, base = os.path.split(name)
            if base == ".wh..wh..opq":
                opaque = directory / head
                opaque.mkdir(parents=True, exist_ok=True)
                os.setxattr(opaque, "trusted.overlay.opaque", b"y")
            elif base.startswith(".wh."):
                gone = directory / head / base[4:]
                gone.parent.mkdir(parents=True, exist_ok=True)
                os.mknod(gone, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            else:
                member.name = name
                try:  # the layer's owners, modes and links as they are: it is a root fs
                    archive.extract(member, directory, filter="fully_trusted")
                except TypeError:  # a Python without extraction filters
                    archive.extract(member, directory)


def members(archive: tarfile.TarFile) -> Any:
    """The archive's entries; a stream that ends on an entry's boundary without the two zero
    blocks of a tar's end is complete (umoci 0.4 writes its layers so, and Go's archive/tar, which
    docker and containerd read layers with, takes them)."""
    while True:
        try:
            member = archive.next()
        except tarfile.ReadError as exc:
            if "unexpected end of data" in str(exc):
                return
            raise
        if member is None:
            return
        yield member


def run(args: list[str]) -> None:
    found, rest = options(
        args, {"--platform", "-v", "--volume", "-w", "--workdir", "-e", "--env", "--entrypoint",
               "--network", "--gpus", "--name"}
    )  # fmt: skip
    if not rest:
        fail("run needs an image reference")
    reference, command = rest[0], rest[1:]
    arch = platform_of(found)
    target = image_dir(reference, arch)
    if not (target / "image.json").exists():
        pull([f"--platform=linux/{arch}", reference])
    image = json.loads((target / "image.json").read_text())
    config = image["config"].get("config") or {}
    entry = found.get("--entrypoint", [""])[-1]
    argv = ([entry] if entry else list(config.get("Entrypoint") or [])) + (
        command or ([] if entry else list(config.get("Cmd") or []))
    )
    if not argv:
        fail("no command: the image has no entrypoint and none was given")
    env = {"PATH": PATH, "HOME": "/root"}
    for item in config.get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    for item in found.get("-e", []) + found.get("--env", []):
        key, eq, value = item.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    workdir = ([*found.get("-w", []), *found.get("--workdir", [])] or [""])[-1]
    plan = {
        "layers": image["layers"],
        "volumes": found.get("-v", []) + found.get("--volume", []),
        "workdir": workdir or str(config.get("WorkingDir") or "/"),
        "argv": argv,
        "env": env,
        "emulator": "" if arch == host_platform() else shutil.which(QEMU.get(arch, "")) or "",
    }
    if arch != host_platform():
        if not plan["emulator"]:
            fail(f"the image is linux/{arch} and this machine runs {host_platform()}, no QEMU")
        print(f"docker: linux/{arch} on {host_platform()}: emulated by {plan['emulator']}",
              file=sys.stderr)  # fmt: skip
    name = found.get("--name", [""])[-1]
    if name and alive(name):
        fail(f'Conflict. The container name "/{name}" is already in use by a running container.')
    with contextlib.suppress(OSError):  # PID 1 of a job's namespace may lead its group
        os.setsid()
    if name:
        CONTAINERS.mkdir(exist_ok=True)
        (CONTAINERS / name).write_text(f"{os.getpid()} {started(os.getpid())}")
    # A mount namespace of the run's own; this process becomes the workload (exec, same pid).
    os.execvp(
        "unshare",
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-I", __file__,
         "__inside", json.dumps(plan)],
    )  # fmt: skip


def started(pid: int) -> str:
    """A process's start time (clock ticks since boot): with its pid, it names one process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def alive(name: str) -> int:
    """The pid of the named run's workload while it runs, else 0."""
    try:
        pid, start = (CONTAINERS / name).read_text().split()
    except (OSError, ValueError):
        return 0
    return int(pid) if started(int(pid)) == start else 0


def remove(args: list[str]) -> None:
    """``rm -f NAME...`` / ``kill NAME...``: SIGKILL to each running one's session (it and
    what it started), waited for, as dockerd's docker rm -f is."""
    names = [a for a in args if not a.startswith("-")]
    if not names:
        fail("rm needs a container name", 1)
    missing = False
    for name in names:
        pid = alive(name)
        if not pid:
            print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
            missing = True
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        for _ in range(200):
            if not started(pid):
                break
            time.sleep(0.05)
        (CONTAINERS / name).unlink(missing_ok=True)
        print(name)
    if missing:
        sys.exit(1)


def sweep_scratch() -> None:
    """Remove the scratch directories of runs that have ended: a run becomes its workload
    (exec), so nothing is left to remove its own when it exits (--rm), and each one's writes
    stayed in the tmpfs, in memory, for the instance's life. A run's own mount namespace went
    with it, so what is left is plain files."""
    for scratch in ROOT.glob("tmp.*"):
        try:
            pid = int((scratch / "pid").read_text())
            os.kill(pid, 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue  # being made, or not ours
        shutil.rmtree(scratch, ignore_errors=True)


def inside(plan: dict[str, Any]) -> None:
    sweep_scratch()
    scratch = Path(
        subprocess.run(
            ["mktemp", "-d", "-p", str(ROOT)], capture_output=True, text=True
        ).stdout.strip()
    )
    (scratch / "pid").write_text(str(os.getpid()))  # this process becomes the workload
    merged, upper, work = scratch / "merged", scratch / "upper", scratch / "work"
    for path in (merged, upper, work):
        path.mkdir()
    lower = ":".join(reversed(plan["layers"]))  # the last layer is on top
    mount("overlay", str(merged), "overlay", f"lowerdir={lower},upperdir={upper},workdir={work}")
    for source, target in (("/proc", "proc"), ("/dev", "dev"), ("/sys", "sys")):
        (merged / target).mkdir(exist_ok=True)
        mount(source, str(merged / target), "none", "rbind")
    for volume in plan["volumes"]:
        source, _, target = volume.partition(":")
        target = target.split(":")[0] or source
        (merged / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
        mount(source, str(merged / target.lstrip("/")), "none", "rbind")
    emulator = ""
    if plan["emulator"]:
        shutil.copy(plan["emulator"], merged / ".amibake-qemu")
        emulator = "/.amibake-qemu"
    os.chroot(merged)
    os.chdir(plan["workdir"])
    argv = list(plan["argv"])
    program = argv[0] if "/" in argv[0] else find(argv[0], plan["env"]["PATH"])
    if emulator:
        argv, program = [emulator, program, *argv[1:]], emulator
    try:
        os.execve(program, argv, plan["env"])
    except OSError as exc:
        print(f"docker: cannot run {plan['argv'][0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127)


def find(program: str, path: str) -> str:
    for directory in path.split(":"):
        candidate = os.path.join(directory, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return program


def mount(source: str, target: str, kind: str, opts: str) -> None:
    command = ["mount", "-t", kind, "-o", opts, source, target]
    if kind == "none":
        command = ["mount", f"--{opts}", source, target]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"mount {source} on {target}: {done.stderr.strip()}")


def main(argv: list[str]) -> None:
    if not argv:
        fail("a command: login, pull, run, rm, kill, version")
    action, rest = argv[0], argv[1:]
    if os.geteuid() != 0 and action != "version":
        fail("permission denied: run docker with sudo", 1)
    if action == "login":
        login(rest)
    elif action == "pull":
        pull(rest)
    elif action == "run":
        run(rest)
    elif action in ("rm", "kill"):
        remove(rest)
    elif action == "__inside":
        inside(json.loads(rest[0]))
    elif action == "version":
        print(VERSION)
    else:
        fail(
            f"{action} is not served by the local cloud's runtime "
            "(login, pull, run, rm, kill, version)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
