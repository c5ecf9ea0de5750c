"""Issue 2's figures: how fast a sandbox is reachable, and what the remote layer costs."""

from __future__ import annotations

import statistics
import time
from typing import Any

from amibake.cloud import Cloud
from amibake.cloud.reach import reach
from tests.helpers import base_ami

LAUNCHES = 20
COMMANDS = 100


def _launch_to_first_command(cloud: Cloud, image_id: str, key_name: str, pem: str) -> float:
    started = time.perf_counter()
    reservation = cloud.ec2.run_instances(
        ImageId=image_id, InstanceType="c7i.large", MinCount=1, MaxCount=1, KeyName=key_name
    )
    instance_id = reservation["Instances"][0]["InstanceId"]
    remote = reach(cloud, instance_id, pem, timeout_s=30)
    remote.run("true", stream=False)
    elapsed = time.perf_counter() - started
    remote.close()
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    return elapsed


def run(cloud: Cloud) -> dict[str, Any]:
    image_id = base_ami(cloud)
    key = cloud.ec2.create_key_pair(KeyName="bench", KeyType="ed25519")
    try:
        launches = [
            _launch_to_first_command(cloud, image_id, "bench", key["KeyMaterial"])
            for _ in range(LAUNCHES)
        ]
        reservation = cloud.ec2.run_instances(
            ImageId=image_id, InstanceType="c7i.large", MinCount=1, MaxCount=1, KeyName="bench"
        )
        instance_id = reservation["Instances"][0]["InstanceId"]
        remote = reach(cloud, instance_id, key["KeyMaterial"], timeout_s=30)
        client = remote.connection.client
        ours: list[float] = []
        raw: list[float] = []
        # Alternate the two so drift on the machine hits both alike.
        for _ in range(COMMANDS):
            started = time.perf_counter()
            remote.run("/bin/true", stream=False)
            ours.append(time.perf_counter() - started)
            started = time.perf_counter()
            _, stdout, _ = client.exec_command("/bin/true")
            stdout.channel.recv_exit_status()
            raw.append(time.perf_counter() - started)
        remote.close()
        cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    finally:
        cloud.ec2.delete_key_pair(KeyName="bench")
    launch_median = statistics.median(launches)
    ratio = statistics.median(ours) / statistics.median(raw)
    return {
        "launch_to_first_ssh_command_median_s": round(launch_median, 3),
        "launch_to_first_ssh_command_max_s": round(max(launches), 3),
        "launch_goal_s": 1.0,
        "launch_goal_met": launch_median < 1.0,
        "remote_command_median_ms": round(statistics.median(ours) * 1000, 2),
        "raw_paramiko_command_median_ms": round(statistics.median(raw) * 1000, 2),
        "remote_over_raw_ratio": round(ratio, 3),
        "remote_ratio_goal": 1.1,
        "remote_ratio_goal_met": ratio <= 1.1,
    }
