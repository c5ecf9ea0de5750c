"""CreateImage captures an instance's filesystem; an instance of the image boots it."""

from __future__ import annotations

import uuid

from amibake.cloud import Cloud
from tests.helpers import launch_and_reach

UNIT = """[Unit]
Description=write a marker at boot
After={after}

[Service]
Type=oneshot
Environment=WHO={name}
ExecStart=/bin/sh -c 'echo $WHO >> /var/tmp/boot-order'
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""


def test_image_round_trip_keeps_files_and_runs_enabled_units_in_order(cloud: Cloud) -> None:
    builder_id, remote = launch_and_reach(cloud)
    token = uuid.uuid4().hex
    with remote:
        # "b" is written first but must run second: it is ordered After=a.
        remote.script(
            f"""
            mkdir -p /usr/local/data
            echo {token} > /usr/local/data/baked
            cat > /etc/systemd/system/amibake-test-b.service <<'UNIT'
{UNIT.format(after="amibake-test-a.service", name="b")}
UNIT
            cat > /etc/systemd/system/amibake-test-a.service <<'UNIT'
{UNIT.format(after="network.target", name="a")}
UNIT
            mkdir -p /etc/systemd/system/multi-user.target.wants
            ln -sf /etc/systemd/system/amibake-test-a.service /etc/systemd/system/multi-user.target.wants/
            ln -sf /etc/systemd/system/amibake-test-b.service /etc/systemd/system/multi-user.target.wants/
            """
        )
    image_id = cloud.ec2.create_image(InstanceId=builder_id, Name=f"test-{token}")["ImageId"]
    cloud.ec2.terminate_instances(InstanceIds=[builder_id])

    instance_id, booted = launch_and_reach(cloud, image_id=image_id)
    with booted:
        baked = booted.run("cat /usr/local/data/baked", stream=False).stdout.strip()
        order = booted.run("cat /var/tmp/boot-order", stream=False).stdout.split()
    assert baked == token
    assert order == ["a", "b"]
    console = cloud.ec2.get_console_output(InstanceId=instance_id)["Output"]
    assert "Finished amibake-test-b.service" in console
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    cloud.ec2.deregister_image(ImageId=image_id)
