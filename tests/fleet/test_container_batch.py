"""Batch with an image (issue 23): one job definition per architecture on the user's image, each
pinned to that architecture's own manifest, GPUs requested when the run asks; the job runs the
command through the image's own POSIX shell (IMAGE_WRAPPER), which times it and reads the metric
file with no agent beside it."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from amibake import catalog
from amibake.cloud import Cloud
from fleet import batch, container, spec
from tests.container import image as test_image
from tests.helpers import launch_and_reach


@pytest.fixture(scope="module")
def ref(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> container.ImageRef:
    found: container.ImageRef = test_image.push_to_ecr(
        cloud, tmp_path_factory.mktemp("image"), "batch/work"
    )
    return found


def state_for(ref: container.ImageRef, family: str, gpus: int = 0) -> SimpleNamespace:
    run_spec = spec.BenchSpec(types=(f"{family}.large",), command="work {args}", image=str(ref))
    run_spec = spec.BenchSpec(**{**run_spec.to_json(), "metric": run_spec.metric, "gpus": gpus})
    return SimpleNamespace(spec=run_spec, family=catalog.family(family))


def test_one_definition_per_architecture_pins_that_architecture_s_manifest(
    cloud: Cloud, ref: container.ImageRef
) -> None:
    image = container.lookup(cloud, ref)
    assert set(image.variants) == {"x86_64", "arm64"}
    assert image.variants["x86_64"] != image.variants["arm64"] != image.digest
    client = cloud.client("batch")
    images = {}
    for family, architecture in (("c5a", "x86_64"), ("c7g", "arm64")):
        state = state_for(ref, family)
        name = f"amibake-image-{architecture}-fb-test-{family}"
        request = batch.image_job_definition(cloud, state, name, {"amibake:run-id": "ab-test"})  # type: ignore[arg-type]
        made = client.register_job_definition(**request)
        described = client.describe_job_definitions(jobDefinitions=[made["jobDefinitionArn"]])
        properties = described["jobDefinitions"][0]["containerProperties"]
        images[architecture] = properties["image"]
        assert properties["command"][:2] == ["/bin/sh", "-c"]
        assert {r["type"] for r in properties["resourceRequirements"]} == {"VCPU", "MEMORY"}
        client.deregister_job_definition(jobDefinition=made["jobDefinitionArn"])
    for architecture, pulled in images.items():
        assert pulled.endswith("@" + image.variants[architecture])
        assert pulled.startswith(container.login(cloud, ref).host + "/batch/work@")


def test_a_gpu_run_asks_batch_for_its_gpus(cloud: Cloud, ref: container.ImageRef) -> None:
    request = batch.image_job_definition(cloud, state_for(ref, "c5a", gpus=2), "x", {})  # type: ignore[arg-type]
    resources = request["containerProperties"]["resourceRequirements"]
    assert {"type": "GPU", "value": "2"} in resources


def test_the_job_wrapper_times_the_command_and_reads_the_metric_file_in_the_image(
    cloud: Cloud, ref: container.ImageRef, tmp_path: Path
) -> None:
    """What a Batch job of the image runs, run here in the image by the instance's docker."""
    image = container.lookup(cloud, ref)
    where = container.login(cloud, ref)
    host = test_image.host_architecture()  # the variant with a shell
    instance_id, remote = launch_and_reach(cloud)
    try:
        remote.run(
            f"sudo -n docker login -u {where.username} --password-stdin http://{where.host}",
            stdin=where.password.encode(),
            stream=False,
        )
        pull = where.pull_name(ref, image.variants[container.EC2_ARCHITECTURE[host]])
        done = remote.run(
            f"sudo -n docker run --rm --platform linux/{host} -e FLEET_COMMAND="
            + shlex.quote("work --n 1000 && echo 42.5 > $FLEET_METRIC_FILE")
            + f" --entrypoint /bin/sh {pull} -c {shlex.quote(batch.IMAGE_WRAPPER)}",
            stream=False,
        )
    finally:
        remote.close()
        cloud.ec2.terminate_instances(InstanceIds=[instance_id])
    assert "iterations=1000" in done.stdout
    result = done.stdout.rstrip("\n").splitlines()[-1]
    assert result.startswith("FLEET-RESULT exit=0 ") and result.rstrip().endswith(
        "metric_file=42.5"
    )
    fields = dict(part.split("=", 1) for part in result.split()[1:4])
    # Timed to the hundredth (busybox's date has no %N; /proc/uptime does).
    assert float(fields["end"]) >= float(fields["start"]) > 0 and "." in fields["start"]
