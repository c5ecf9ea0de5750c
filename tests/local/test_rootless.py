"""The local cloud as a plain user (issue 28).

CI runs as root, so this module makes a plain user (``tester``, created with its subordinate ids
when the machine has none) and runs the local cloud's lifecycle, and one build through bake, as
that user: ``local up``, an instance launched and reached over SSH (host key from its console,
user data run, sudo, its IMDS), terminated, ``local down``, and nothing left behind. Run by a
plain user, the suite is already rootless throughout; this module then runs the same as itself.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from amibake.errors import EnvironmentProblem
from amibake.local import rootless
from tests.helpers import BOOT_FINISHED, free_port_and_range, leftovers

REPO = Path(__file__).resolve().parents[2]
PLAIN_USER = "tester"


@dataclass
class PlainUser:
    name: str
    home: Path
    # Shell lines run as root before switching to the user (in a private mount namespace).
    prepare: str
    switch: list[str]
    env: dict[str, str]
    local_dir: Path

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        if not self.switch:  # the suite is run by a plain user already
            return subprocess.run(
                argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        script = f'{self.prepare}\nexec "$@"'
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "-",
             *self.switch, "env", "-i", *(f"{k}={v}" for k, v in self.env.items()), *argv],
            cwd=REPO, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def python(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-c", code, timeout=timeout)


def _ensure_user() -> tuple[pwd.struct_passwd, list[list[str]]]:
    """The plain user, made if absent, with subordinate ids if it has none; and the commands
    that undo what was made."""
    undo: list[list[str]] = []
    try:
        user = pwd.getpwnam(PLAIN_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", PLAIN_USER], check=True)
        undo.append(["userdel", "-r", PLAIN_USER])
        user = pwd.getpwnam(PLAIN_USER)
    for kind in ("uid", "gid"):
        path = Path(f"/etc/sub{kind}")
        lines = path.read_text().splitlines() if path.exists() else []
        if any(line.split(":")[0] in (PLAIN_USER, str(user.pw_uid)) for line in lines):
            continue
        # The first range above every range already given: no two users share ids.
        start = max([100000, *(int(x.split(":")[1]) + int(x.split(":")[2]) for x in lines)])
        span = f"{start}-{start + 65535}"
        subprocess.run(["usermod", f"--add-sub{kind}s", span, PLAIN_USER], check=True)
        if not undo:  # a user we made goes with its ranges
            undo.append(["usermod", f"--del-sub{kind}s", span, PLAIN_USER])
    return user, undo


def _reach_interpreter(stage: Path) -> str:
    """This Python may live where the plain user cannot reach (pyenv under root's /root, mode
    700): in the plain user's mount namespace, the interpreter's own tree is put back in place
    over an empty tmpfs on the directory that bars the way. Nothing else of it shows."""
    prefix = Path(sys.base_prefix).resolve()
    barrier = next(
        (p for p in [*reversed(prefix.parents), prefix] if not p.stat().st_mode & stat.S_IXOTH),
        None,
    )
    if barrier is None:
        return ""
    return (
        f"mount --bind {prefix} {stage} && mount -t tmpfs -o mode=755 tmpfs {barrier} && "
        f"mkdir -p {prefix} && mount --bind {stage} {prefix} && umount {stage} || exit 97"
    )


def make_plain_user(top: Path) -> tuple[PlainUser, list[list[str]]]:
    """The plain user (this process's user when that is not root), with a local cloud of its
    own under `top`; and the commands that undo what was made for it."""
    undo: list[list[str]] = []
    if os.geteuid() == 0:
        user, undo = _ensure_user()
        name, home = user.pw_name, Path(user.pw_dir)
        os.chown(top, user.pw_uid, user.pw_gid)
        (top / "stage").mkdir()
        prepare = _reach_interpreter(top / "stage")
        switch = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
    else:
        name, home, prepare, switch = pwd.getpwuid(os.getuid()).pw_name, Path.home(), "", []
    port, subnet = free_port_and_range()
    local_dir = top / "cloud"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
        "HOME": str(home),
        "AMIBAKE_CLOUD": "local",
        "AMIBAKE_LOCAL_DIR": str(local_dir),
        "AMIBAKE_LOCAL_PORT": str(port),
        "AMIBAKE_LOCAL_SUBNET": subnet,
        "AMIBAKE_RESULTS_DIR": str(top / "results"),
    }
    return PlainUser(name, home, prepare, switch, env, local_dir), undo


def release_plain_user(user: PlainUser, top: Path, undo: list[list[str]]) -> None:
    """Stop the user's local cloud, and remove what was made for the user."""
    try:
        user.run(sys.executable, "-m", "amibake", "local", "down")
    finally:
        # What the user's sandboxes wrote went with `local down`; the rest is the user's.
        shutil.rmtree(top, ignore_errors=True)
        for command in undo:
            subprocess.run(command, capture_output=True)


@pytest.fixture(scope="module")
def plain_user() -> Iterator[PlainUser]:
    top = Path(tempfile.mkdtemp(prefix="amibake-plain-user-"))
    user, undo = make_plain_user(top)
    yield user
    release_plain_user(user, top, undo)


def lifecycle() -> dict[str, Any]:
    """Run as the plain user: one instance from launch to terminate; what it saw, as JSON."""
    from amibake import config
    from amibake.cloud.reach import reach
    from amibake.connect import connect
    from tests.helpers import launch

    cloud = connect(config.load())
    started = time.perf_counter()
    instance_id, pem = launch(cloud, user_data="#!/bin/sh\nid -u > /var/tmp/user-data-ran\n")
    seen: dict[str, Any] = {"instance_id": instance_id}
    with reach(cloud, instance_id, pem, timeout_s=30) as remote:  # host key from the console
        seen["first_ssh_s"] = time.perf_counter() - started
        imds = (
            "t=$(curl -s -X PUT http://instance-data/latest/api/token "
            "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60'); curl -s -H "
            '"X-aws-ec2-metadata-token: $t" http://instance-data/latest/meta-data/instance-id'
        )
        for key, command in (
            ("id", "id -un"),
            ("sudo", "sudo -n id -u"),
            # sshd is up before cloud-init runs the user data: wait for its boot to finish
            ("user_data", f"{BOOT_FINISHED}; cat /var/tmp/user-data-ran"),
            ("imds", imds),
            ("write", "sudo sh -c 'echo x >> /etc/passwd && touch /usr/local/rootless' && echo ok"),
            ("shared", "sudo mkdir -p /shared && sudo mount -t tmpfs tmpfs /shared && echo ok"),
        ):
            seen[key] = remote.run(command, stream=False).stdout.strip()
    endpoint = [
        t["Value"]
        for r in cloud.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        for i in r["Instances"]
        for t in i.get("Tags", [])
        if t["Key"] == "amibake-local:ssh"
    ]
    seen["endpoint"] = endpoint[0] if endpoint else ""
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    return seen


def build_and_bake() -> dict[str, Any]:
    """Run as the plain user: the trivial recipe built for c5a, then baked with a boot test."""
    from amibake import config, pipelines
    from amibake.connect import connect
    from tests.test_build import FIXTURES

    cloud = connect(config.load())
    built = pipelines.build(
        cloud, pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    )[0]
    if not built.ok:
        return {"build": built.error}
    baked = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    report = baked.state.boot_report if baked.ok and baked.state else {}  # type: ignore[attr-defined]
    return {"build": "ok", "bake": "ok" if baked.ok else baked.error, "report": report}


def pull_and_run() -> dict[str, Any]:
    """Run as the plain user: the test image pushed to the local ECR, then pulled and run on an
    instance, whose sandbox reaches the registry through its network namespace's relay."""
    import shlex
    import tempfile

    from amibake import config
    from amibake.connect import connect
    from fleet import container
    from tests.container import image as test_image
    from tests.helpers import launch_and_reach

    cloud = connect(config.load())
    with tempfile.TemporaryDirectory() as scratch:
        ref = test_image.push_to_ecr(cloud, Path(scratch), "rootless/app")
    instance_id, remote = launch_and_reach(cloud)
    try:
        host = test_image.host_architecture()
        pull = test_image.login_and_pull(cloud, remote, ref, host)
        line = container.run_line(pull, container.EC2_ARCHITECTURE[host], "work --n 1000", True, 0)
        ran = remote.run(f"mkdir -p /tmp/run && cd /tmp/run && bash -c {shlex.quote(line)}",
                         stream=False).stdout  # fmt: skip
    finally:
        remote.close()
        cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    return {"ran": ran.strip()}


def _as_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _call(user: PlainUser, function: str) -> dict[str, Any]:
    code = f"import json, tests.local.test_rootless as t; print(json.dumps(t.{function}()))"
    return _as_json(user.python(code))


def test_a_plain_user_runs_the_local_cloud_and_leaves_nothing(plain_user: PlainUser) -> None:
    up = plain_user.run(sys.executable, "-m", "amibake", "local", "up")
    assert up.returncode == 0, up.stderr
    seen = _call(plain_user, "lifecycle")
    assert seen["id"] == "ec2-user"
    assert seen["sudo"] == "0"
    assert seen["user_data"] == "0"  # run as root at boot
    assert seen["imds"] == seen["instance_id"]  # on port 80 of instance-data, as on EC2
    assert seen["write"] == "ok" and seen["shared"] == "ok"
    # sshd on a port the user may bind (22 where the system lets users bind it), carried in
    # the address the SSH step looks up
    assert seen["endpoint"].endswith(f":{rootless.ssh_port(22)}"), seen["endpoint"]
    down = plain_user.run(sys.executable, "-m", "amibake", "local", "down")
    assert down.returncode == 0, down.stderr
    assert leftovers(plain_user.local_dir) == []
    left = [p.name for p in plain_user.local_dir.iterdir()]
    assert not {"sandboxes", "images"} & set(left), left
    assert _processes_of(plain_user) == []


def test_a_plain_user_builds_and_bakes(plain_user: PlainUser) -> None:
    result = _call(plain_user, "build_and_bake")
    assert result["build"] == "ok"
    assert result["bake"] == "ok"
    assert result["report"]["fstype"] == "tmpfs"  # the baked units ran at boot
    assert result["report"]["ecs_cluster"] == "amibake-boot-test"  # and its user data
    down = plain_user.run(sys.executable, "-m", "amibake", "local", "down")
    assert down.returncode == 0, down.stderr
    assert leftovers(plain_user.local_dir) == []
    assert _processes_of(plain_user) == []


def test_a_plain_user_pulls_and_runs_an_image_from_the_local_ecr(plain_user: PlainUser) -> None:
    # Its sandboxes sit in network namespaces of their own: the registry's port is relayed into
    # each, as the endpoint's is (make demo's container bench failed as a plain user without).
    result = _call(plain_user, "pull_and_run")
    assert "iterations=1000" in result["ran"], result
    down = plain_user.run(sys.executable, "-m", "amibake", "local", "down")
    assert down.returncode == 0, down.stderr
    assert leftovers(plain_user.local_dir) == []
    assert _processes_of(plain_user) == []


def _processes_of(user: PlainUser) -> list[str]:
    """Processes that name the plain user's local cloud directory (its daemon, sandboxes)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(user.local_dir) in cmdline:
            found.append(f"{proc.name}: {cmdline[:100]}")
    return found


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("/proc/sys/kernel/unprivileged_userns_clone", "0",
         "sudo sysctl -w kernel.unprivileged_userns_clone=1"),
        ("/proc/sys/user/max_user_namespaces", "0", "sudo sysctl -w user.max_user_namespaces="),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
         "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
    ],
)  # fmt: skip
def test_a_switched_off_user_namespace_is_named_with_how_to_turn_it_on(
    monkeypatch: pytest.MonkeyPatch, setting: str, value: str, said: str
) -> None:
    real = rootless._read
    monkeypatch.setattr(rootless, "_read", lambda path: value if path == setting else real(path))
    with pytest.raises(EnvironmentProblem) as refused:
        rootless.check_host()
    message = str(refused.value)
    assert said in message and "\n" not in message


def test_no_newuidmap_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EnvironmentProblem, match=r"newuidmap not found.*apt-get install uidmap"):
        rootless.check_host()


def test_no_subordinate_ids_names_a_free_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An /etc/subuid where the range 100000-165535 is someone else's: the usermod line offered
    # starts above it.
    table = tmp_path / "sub"
    table.write_text("someone:100000:65536\n")
    real = Path.read_text
    monkeypatch.setattr(
        Path,
        "read_text",
        lambda self, *a, **k: real(table) if str(self).startswith("/etc/sub") else real(self),
    )
    with pytest.raises(EnvironmentProblem) as refused:
        rootless.namespace_command()
    assert "usermod --add-subuids 165536-231071 --add-subgids 165536-231071" in str(refused.value)


def test_sshd_takes_a_port_the_user_may_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    real = rootless._read
    start = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
    monkeypatch.setattr(rootless, "_read", lambda p: "1024" if p == start else real(p))
    assert (rootless.ssh_port(22), rootless.ssh_port(2022)) == (2222, 2022)
    monkeypatch.setattr(rootless, "_read", lambda p: "0" if p == start else real(p))
    assert rootless.ssh_port(22) == 22  # where the system lets users bind 22, it is 22
