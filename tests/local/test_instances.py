"""A local-cloud instance is a real machine to SSH into, isolated from the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake.cloud import Cloud
from amibake.cloud.reach import reach
from amibake.errors import HostKeyMismatch
from amibake.remote import Remote, load_private_key, parse_fingerprints
from tests.helpers import launch, launch_and_reach, wait_until_clean


def test_ssh_with_a_host_key_verified_from_console_output(cloud: Cloud) -> None:
    instance_id, remote = launch_and_reach(cloud)
    with remote:
        result = remote.run("id -un; hostname", stream=False)
    assert result.stdout.split() == [
        "ec2-user",
        "ip-" + remote.connection.host.replace(".", "-") + ".ec2.internal",
    ]
    console = cloud.ec2.get_console_output(InstanceId=instance_id)["Output"]
    assert len(parse_fingerprints(console)) == 1
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_writes_inside_do_not_reach_the_host_and_tmpfs_mounts_work(cloud: Cloud) -> None:
    instance_id, remote = launch_and_reach(cloud)
    marker = f"written-by-{instance_id}"
    with remote:
        remote.script(
            f"""
            mkdir -p /shared /usr/local/data
            mount -t tmpfs -o size=16m tmpfs /shared
            echo {marker} > /shared/probe
            echo {marker} > /usr/local/data/probe
            findmnt -n -o FSTYPE /shared
            cat /usr/local/data/probe
            """
        )
        fstype, content = remote.run(
            "findmnt -n -o FSTYPE /shared; cat /usr/local/data/probe", stream=False
        ).stdout.split()
    assert (fstype, content) == ("tmpfs", marker)
    host_probe = Path("/usr/local/data/probe")
    assert not host_probe.exists() or marker not in host_probe.read_text()
    assert not Path("/shared/probe").exists()
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_a_host_key_not_in_the_console_output_is_refused(cloud: Cloud) -> None:
    instance_id, pem = launch(cloud)
    remote_ok = reach(cloud, instance_id, pem, timeout_s=30)
    host, port = remote_ok.connection.host, remote_ok.connection.port
    remote_ok.close()
    forged = {"SHA256:" + "A" * 43}
    impostor = Remote(host, port, "ec2-user", load_private_key(pem), forged)
    with pytest.raises(HostKeyMismatch, match="not among the fingerprints"):
        impostor.open()
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_user_data_runs_as_root_at_boot(cloud: Cloud) -> None:
    instance_id, remote = launch_and_reach(
        cloud, user_data="#!/bin/bash\nid -u > /var/tmp/user-data-ran-as\n"
    )
    with remote:
        remote.run("while [ ! -e /var/lib/cloud/instance/boot-finished ]; do sleep 0.05; done")
        assert remote.run("cat /var/tmp/user-data-ran-as", stream=False).stdout.strip() == "0"
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_a_quiet_command_longer_than_the_keepalive_silence_limit_is_not_cut_short(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keepalives close a connection nobody answers on; sshd answers them while a command
    prints nothing, so a long quiet command (a build's link step) runs to its end."""
    from amibake import remote as ssh

    monkeypatch.setattr(ssh, "KEEPALIVE_S", 0.2)
    monkeypatch.setattr(ssh, "SILENCE_S", 1.0)
    instance_id, remote = launch_and_reach(cloud)
    with remote:
        result = remote.run("sleep 4; echo done", stream=False)
        assert (result.exit_code, result.stdout, remote.silent) == (0, "done\n", "")
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_terminate_leaves_no_process_mount_or_directory(cloud: Cloud, local_dir: Path) -> None:
    instance_id, remote = launch_and_reach(cloud)
    with remote:
        # A process started over SSH that would outlive a naive teardown.
        remote.run("nohup sleep 600 >/dev/null 2>&1 &")
    sandbox = local_dir / "sandboxes" / instance_id
    assert sandbox.exists()
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    assert not sandbox.exists()
    assert wait_until_clean(local_dir) == []


def test_instances_die_with_their_fleet_or_stop(cloud: Cloud, local_dir: Path) -> None:
    """Terminate is not the only way to lose an instance; the reconcile loop catches the rest."""
    instance_id, _ = launch(cloud)
    cloud.ec2.stop_instances(InstanceIds=[instance_id])
    assert wait_until_clean(local_dir) == []
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_a_sandbox_mount_table_keeps_paths_with_spaces(tmp_path: Path) -> None:
    # The instance's mounts go through one `mount --all --fstab`, whose fields are split on
    # whitespace: a local cloud directory with a space must still mount where it says.
    import os
    import subprocess

    from amibake.local.sandbox import _fstab_field

    target = tmp_path / "a dir\twith\\odd names"
    target.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"tmpfs {_fstab_field(str(target))} tmpfs {_fstab_field('mode=1777')} 0 0\n")
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    shown = subprocess.run(
        [*unshare, "sh", "-c", 'mount --all --fstab "$1" && findmnt -no FSTYPE "$2"', "-",
         str(fstab), str(target)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "tmpfs"


def test_the_base_image_has_no_compiler_until_dnf_installs_it(cloud: Cloud) -> None:
    # As the ECS-optimized AMI: no gcc, OpenMP runtime or psutil, and dnf to install them.
    instance_id, remote = launch_and_reach(cloud)
    probe = (
        "command -v gcc >/dev/null && echo gcc || echo no-gcc; "
        "python3 -c 'import ctypes; ctypes.CDLL(\"libgomp.so.1\")' 2>/dev/null "
        "&& echo libgomp || echo no-libgomp; "
        "python3 -c 'import psutil' 2>/dev/null && echo psutil || echo no-psutil"
    )
    with remote:
        before = remote.run(probe, stream=False).stdout.split()
        said = remote.script("dnf install -y -q libgomp", stream=False).stdout.strip()
        middle = remote.run(probe, stream=False).stdout.split()
        remote.script("dnf install -y -q gcc python3-psutil", stream=False)
        after = remote.run(probe, stream=False).stdout.split()
        compiled = remote.run(
            "printf 'int main(void){return 0;}' | gcc -fopenmp -x c -o /tmp/t - && /tmp/t && echo ok",
            stream=False,
        ).stdout.strip()
    assert before == ["no-gcc", "no-libgomp", "no-psutil"]
    assert said == "Installed: libgomp"
    assert middle == ["no-gcc", "libgomp", "no-psutil"]
    assert after == ["gcc", "libgomp", "psutil"]
    assert compiled == "ok"
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
