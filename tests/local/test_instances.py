"""A local-cloud instance is a real machine to SSH into, isolated from the host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from amibake.cloud import Cloud
from amibake.cloud.reach import reach
from amibake.errors import HostKeyMismatch
from amibake.local import control as local_control
from amibake.remote import Remote, load_private_key, parse_fingerprints
from tests.helpers import BOOT_FINISHED, launch, launch_and_reach, wait_until_clean


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
        remote.run(BOOT_FINISHED)
        assert remote.run("cat /var/tmp/user-data-ran-as", stream=False).stdout.strip() == "0"
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_a_quiet_command_longer_than_the_keepalive_silence_limit_is_not_cut_short(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keepalives close a connection nobody answers on; sshd answers them while a command
    prints nothing, so a long quiet command (a build's link step) runs to its end."""
    from amibake import remote as ssh

    # A margin for a loaded 2-core CI host: an answer takes milliseconds, the limit is 2.5 s.
    monkeypatch.setattr(ssh, "KEEPALIVE_S", 0.5)
    monkeypatch.setattr(ssh, "SILENCE_S", 2.5)
    instance_id, remote = launch_and_reach(cloud)
    with remote:
        result = remote.run("sleep 6; echo done", stream=False)
        assert (result.exit_code, result.stdout, remote.silent) == (0, "done\n", "")
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_create_image_reboots_the_instance_unless_told_not_to(cloud: Cloud) -> None:
    """EC2 shuts an instance down for CreateImage and boots it again (NoReboot false): its
    processes and SSH sessions end, /run starts empty, and a scheduled power-off is forgotten.
    cloud-init's record of the instance survives on its disk, so the user data does not run
    again, and the host keys stay. The local cloud copied the disk live and rebooted nothing:
    whatever the product left running, or counted on from /run, went on as if no image was
    made. NoReboot true leaves it all as it was."""
    instance_id, pem = launch(cloud, user_data="#!/bin/sh\nshutdown -P --no-wall +30\n")

    def status() -> dict[str, Any]:
        found = local_control.status(cloud.config) or {}
        return dict(found["instances"][instance_id])

    remote = reach(cloud, instance_id, pem, timeout_s=30)
    with remote:
        remote.run(BOOT_FINISHED)
        remote.run("sudo -n touch /run/before-image; nohup sleep 600 >/dev/null 2>&1 &")
        assert status()["shutdown_at"] is not None  # the user data's power-off
        cloud.ec2.create_image(InstanceId=instance_id, Name="kept-running", NoReboot=True)
        alive = remote.run("test -e /run/before-image && pgrep -x sleep", check=False)
        assert alive.exit_code == 0, "NoReboot true: nothing of the instance should have ended"
        transport = remote.connection.transport
        assert transport is not None
        cloud.ec2.create_image(InstanceId=instance_id, Name="rebooted")
        deadline = time.monotonic() + 10
        while transport.is_active():  # the reboot ended the session under it
            assert time.monotonic() < deadline, "the connection outlived the reboot"
            time.sleep(0.1)
    console = cloud.ec2.get_console_output(InstanceId=instance_id)["Output"]
    assert console.count(f"booting {instance_id}") == 2, console
    assert console.count("cloud-init: running user data") == 1, console
    assert len(parse_fingerprints(console)) == 1  # the same host key, booted again
    assert status()["shutdown_at"] is None  # it lived in /run
    with reach(cloud, instance_id, pem, timeout_s=30) as again:
        gone = again.run("test -e /run/before-image || pgrep -x sleep", check=False)
        assert gone.exit_code == 1, "the reboot should have ended the process and emptied /run"
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    # An instance of that image is a new one: its user data runs, though the image carries the
    # finished boot of the instance it was made of.
    made = cloud.ec2.describe_images(Filters=[{"Name": "name", "Values": ["rebooted"]}])
    child, _ = launch(cloud, image_id=made["Images"][0]["ImageId"], user_data="#!/bin/sh\n")
    deadline = time.monotonic() + 30
    while "cloud-init: boot finished" not in (
        output := cloud.ec2.get_console_output(InstanceId=child).get("Output", "")
    ):
        assert time.monotonic() < deadline, output
        time.sleep(0.2)
    assert output.count("cloud-init: running user data") == 1, output
    cloud.ec2.terminate_instances(InstanceIds=[child])


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
