"""Issue 2's figures: how fast a sandbox is reachable, and what the remote layer costs; and what
a new connection to the cloud costs with botocore's data files read once a process
(amibake/service_models.py) against botocore's own loader, which reads them per session."""

from __future__ import annotations

import statistics
import time
from typing import Any

import boto3

from amibake.cloud import Cloud
from amibake.cloud.reach import reach
from amibake.cloud.session import open_cloud
from tests.helpers import base_ami

LAUNCHES = 20
COMMANDS = 100
CONNECTS = 10
SERVICES = ("ec2", "ssm", "sts", "batch", "s3")  # what a bake and a batch run talk to


def _connect_ms(cloud: Cloud, shared: bool) -> float:
    """A new connection and a client of each of SERVICES: through open_cloud (the shared
    loader), or a session with botocore's own."""
    started = time.perf_counter()
    if shared:
        fresh = open_cloud(cloud.config, cloud.endpoint_url)
    else:
        session = boto3.session.Session(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=cloud.config.region,
        )
        fresh = Cloud(config=cloud.config, session=session, endpoint_url=cloud.endpoint_url)
    for service in SERVICES:
        fresh.client(service)
    return (time.perf_counter() - started) * 1000


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
    shared: list[float] = []
    own: list[float] = []
    for _ in range(CONNECTS):  # alternated, as below; the first of each warms what it can
        shared.append(_connect_ms(cloud, True))
        own.append(_connect_ms(cloud, False))
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
        "connect_five_clients_median_ms": round(statistics.median(shared[1:]), 1),
        "connect_with_botocores_own_loader_median_ms": round(statistics.median(own[1:]), 1),
        "connect_own_loader_over_shared_ratio": round(
            statistics.median(own[1:]) / statistics.median(shared[1:]), 2
        ),
    }
