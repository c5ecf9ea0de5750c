"""Batch with an image (issue 23): one job definition per architecture on the user's image, each
pinned to that architecture's own manifest, GPUs requested when the run asks; the job runs the
command through the image's own POSIX shell (IMAGE_WRAPPER), which times it and reads the metric
file with no agent beside it."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from amibake import batch as amibake_batch
from amibake import catalog
from amibake.cloud import Cloud
from fleet import batch, bench, container, spec
from tests.container import image as test_image
from tests.fleet.test_any_type import own_results
from tests.fleet.test_bench import assert_nothing_left
from tests.fleet.test_container_bench import image_run
from tests.helpers import BASE_AMI_PARAMETER, launch_and_reach


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


GRAVITON_AMI = "/aws/service/ecs/optimized-ami/amazon-linux-2023/arm64/recommended/image_id"


@pytest.fixture
def registered_for_host(cloud: Cloud) -> Iterator[str]:
    """`amibake batch up` for this machine's architecture on the ECS-optimized AMI (an image
    run needs the queue, roles and job bucket, not a baked image); the type to bench."""
    native = test_image.host_architecture() == "amd64"
    instance_type = "c5a.large" if native else "c7g.large"
    parameter = BASE_AMI_PARAMETER if native else GRAVITON_AMI
    ami = cloud.ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
    family = instance_type.split(".")[0]
    architecture = catalog.family(family).architecture
    amibake_batch.up(cloud, [amibake_batch.Image(ami, architecture, (family,), ())])
    yield instance_type
    amibake_batch.down(cloud)


@pytest.mark.e2e
def test_a_batch_bench_runs_the_image_on_the_local_cloud(
    cloud: Cloud, ref: container.ImageRef, registered_for_host: str, local_dir: Path, tmp_path: Path
) -> None:
    """The job definition names the image in the local ECR: the job runs in it (`work` is in
    the image only, so a job run on the host's files fails), its metric file read by the image's
    own shell, and nothing is left."""
    mine = own_results(cloud, tmp_path / "results")
    results, run_id = image_run(
        mine,
        types=[registered_for_host],
        executor="batch",
        image=str(ref),
        command="work {args} && echo 7.25 > $FLEET_METRIC_FILE",
        args={"n": 1000},
        metric={"kind": "file", "meaning": "rate", "unit": "iterations/s"},
        replicates=2,
    )
    submitted: list[dict[str, Any]] = []
    client = mine.client("batch")

    def record(params: dict[str, Any], **_: Any) -> None:
        submitted.append(params)

    client.meta.events.register("provide-client-params.batch.SubmitJob", record)
    try:
        summary = bench.execute(mine, run_id, results)
    finally:
        client.meta.events.unregister("provide-client-params.batch.SubmitJob", record)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    # Under --faults aws a spot reclaim records a replicate interrupted and runs it again.
    assert set(rows.state) <= {"ok", "interrupted"}, rows[["state", "error"]]
    ok = rows[rows.state == "ok"]
    assert len(ok) == 2 and set(ok.instance_type) == {registered_for_host}
    assert (ok.metric == 7.25).all(), ok.metric
    assert submitted and all(
        s["jobDefinition"].startswith("amibake-image-")
        or ":job-definition/amibake-image-" in s["jobDefinition"]
        for s in submitted
    ), submitted
    image = results.environments(run_id)[0]["image"]
    assert image["digest"] == container.lookup(mine, ref).digest and not image["emulated"]
    assert_nothing_left(mine, results, run_id, local_dir)
    assert [n for n in _definitions(mine) if n.startswith("amibake-image-")] == []


def _definitions(cloud: Cloud) -> list[str]:
    found = cloud.client("batch").describe_job_definitions(status="ACTIVE")["jobDefinitions"]
    return [str(d["jobDefinitionName"]) for d in found]
