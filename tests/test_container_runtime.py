"""`docker` on a local-cloud instance of the ECS-optimized AMI: the local cloud's runtime pulls an
image from its ECR and runs it from its layers (overlay lower directories), natively, and the
other architecture's variant under QEMU, said so."""

from __future__ import annotations

import shlex

import pytest

from amibake.cloud import Cloud
from fleet import container
from tests.container import image as test_image
from tests.helpers import launch_and_reach


@pytest.fixture(scope="module")
def ref(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> container.ImageRef:
    return test_image.push_to_ecr(cloud, tmp_path_factory.mktemp("image"), "runtime/app")  # type: ignore[no-any-return]


def test_an_instance_pulls_and_runs_both_variants_of_an_image(
    cloud: Cloud, ref: container.ImageRef
) -> None:
    instance_id, remote = launch_and_reach(cloud)
    try:
        host = test_image.host_architecture()
        other = "arm64" if host == "amd64" else "amd64"
        pull = test_image.login_and_pull(cloud, remote, ref, host)
        test_image.login_and_pull(cloud, remote, ref, other)
        remote.run("mkdir -p /tmp/run", stream=False)
        native = container.run_line(
            pull, container.EC2_ARCHITECTURE[host], "work --n 1000 && echo shell-ran", True, 0
        )
        done = remote.run(
            f"cd /tmp/run && FLEET_METRIC_FILE=/tmp/run/m bash -c {shlex.quote(native)}; cat /tmp/run/m",
            stream=False,
        )
        assert "iterations=1000" in done.stdout and "shell-ran" in done.stdout
        assert float(done.stdout.split()[-1]) > 0  # the metric file, written in the container
        emulated = container.run_line(
            pull, container.EC2_ARCHITECTURE[other], "work --n 500", False, 0
        )
        done = remote.run(f"cd /tmp/run && bash -c {shlex.quote(emulated)}", stream=False)
        assert "iterations=500" in done.stdout
        assert "emulated by" in done.stderr
        # The image's files are its own, not the host's: no shell in the other variant.
        missing = container.run_line(pull, container.EC2_ARCHITECTURE[other], "true", True, 0)
        assert (
            remote.run(f"bash -c {shlex.quote(missing)}", check=False, stream=False).exit_code != 0
        )
        # Each run's scratch (its writes, in the tmpfs) is gone once it has ended: three runs
        # left one, the last's, which the next run sweeps (review: all stayed in memory).
        left = remote.run("sudo -n ls /var/lib/docker", stream=False).stdout.split()
        assert len([name for name in left if name.startswith("tmp.")]) == 1, left
    finally:
        remote.close()
        cloud.ec2.terminate_instances(InstanceIds=[instance_id])
