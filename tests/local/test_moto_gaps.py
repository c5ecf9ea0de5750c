"""amibake.local.moto_gaps: what it changes in moto answers as moto did, only sooner."""

from __future__ import annotations

import json
from typing import Any

import pytest
from moto.ec2.models import EC2Backend
from moto.ec2.models.tags import TagBackend

from amibake.local import moto_gaps


def test_the_tags_of_one_resource_are_moto_s_own_answer() -> None:
    moto_gaps.apply()
    patched = TagBackend.describe_tags
    original: Any = getattr(patched, "__wrapped__", None)
    assert original is not None, "moto_gaps.apply did not replace TagBackend.describe_tags"
    backend = EC2Backend("us-east-1", "123456789012")
    # i-1 is a prefix of i-12: an id must match exactly, as moto's anchored patterns do.
    backend.create_tags(["i-1"], {"Name": "one", "amibake:run-id": "r1"})
    backend.create_tags(["i-12"], {"Name": "twelve"})
    backend.create_tags(["sg-1"], {"amibake:run-id": "r1"})
    backend.create_tags(["i-1"], {"later": "added"})
    filters: list[dict[str, list[str]] | None] = [
        {"resource-id": ["i-1"]},
        {"resource-id": ["i-12"]},
        {"resource-id": ["sg-1"]},
        {"resource-id": ["i-404"]},
        {"resource-id": ["i-1*"]},
        {"resource-id": ["i-1", "sg-1"]},
        {"resource-id": ["i-1"], "key": ["Name"]},
        {"key": ["amibake:run-id"]},
        None,
    ]
    for f in filters:
        assert patched(backend, f) == original(backend, f), f
    assert [t["key"] for t in patched(backend, {"resource-id": ["i-1"]})] == [
        "Name",
        "amibake:run-id",
        "later",
    ]


def test_one_resource_s_tags_are_not_found_by_scanning_every_tag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the change: moto scanned the region's whole tag table for each resource."""
    moto_gaps.apply()
    backend = EC2Backend("us-east-1", "123456789012")
    backend.create_tags(["i-1"], {"Name": "one"})

    class Unscannable(dict[str, dict[str, str]]):
        def copy(self) -> Any:
            raise AssertionError("the whole tag table was scanned")

        def items(self) -> Any:
            raise AssertionError("the whole tag table was scanned")

    monkeypatch.setattr(backend, "tags", Unscannable(backend.tags))
    assert backend.describe_tags(filters={"resource-id": ["i-1"]})[0]["value"] == "one"


def test_the_gateway_lets_one_request_into_moto_at_a_time() -> None:
    """moto's backends are not thread-safe (two launches at once raced in a subnet's address
    generator: a 500). Requests of every kind reach moto one at a time, under the lock the
    daemon's own threads take for theirs."""
    import io
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from amibake.local.gateway import Gateway

    inside = 0
    most = 0
    count = threading.Lock()

    def moto(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        nonlocal inside, most
        with count:
            inside += 1
            most = max(most, inside)
        time.sleep(0.05)  # long enough for every other thread to arrive
        with count:
            inside -= 1
        start_response("200 OK", [])
        return [b"<ok/>"]

    gateway = Gateway(moto, cloud=None, stop=threading.Event())  # type: ignore[arg-type]
    ec2 = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261123/us-east-1/ec2/aws4_request, x"
    body = b"Action=DescribeInstances&Version=2016-11-15"
    kinds = [
        {"HTTP_AUTHORIZATION": ec2, "CONTENT_LENGTH": str(len(body)), "body": body},
        {"HTTP_AUTHORIZATION": ec2.replace("/ec2/", "/batch/"), "CONTENT_LENGTH": "0"},
    ]

    def call(index: int) -> bytes:
        kind = dict(kinds[index % 2])
        environ = {"PATH_INFO": "/", "wsgi.input": io.BytesIO(kind.pop("body", b"")), **kind}
        return b"".join(gateway(environ, lambda *_: None))

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(call, range(6))) == [b"<ok/>"] * 6
    assert most == 1
    acquired = moto_gaps.BACKENDS.acquire(blocking=False)  # released after each request
    assert acquired
    moto_gaps.BACKENDS.release()


def test_a_compute_environment_a_queue_orders_cannot_be_deleted(cloud: Any) -> None:
    """As Batch answers (terraform-provider-aws #2044): detach, or delete the queue, first."""
    import json

    import botocore.exceptions

    iam, batch = cloud.client("iam"), cloud.client("batch")
    role = iam.create_role(
        RoleName="gap-test-batch",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]
    env = batch.create_compute_environment(
        computeEnvironmentName="gap-test", type="UNMANAGED", serviceRole=role
    )["computeEnvironmentArn"]
    batch.create_job_queue(
        jobQueueName="gap-test",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env}],
    )
    batch.update_compute_environment(computeEnvironment="gap-test", state="DISABLED")
    with pytest.raises(botocore.exceptions.ClientError, match="found existing JobQueue"):
        batch.delete_compute_environment(computeEnvironment="gap-test")
    batch.update_job_queue(jobQueue="gap-test", state="DISABLED")
    batch.delete_job_queue(jobQueue="gap-test")
    batch.delete_compute_environment(computeEnvironment="gap-test")
    assert (
        batch.describe_compute_environments(computeEnvironments=["gap-test"])["computeEnvironments"]
        == []
    )
    iam.delete_role(RoleName="gap-test-batch")


def test_a_job_definition_is_described_by_name_and_revision(cloud: Any) -> None:
    """AWS takes `name:revision` in DescribeJobDefinitions' list, inactive revisions included."""
    batch = cloud.client("batch")
    properties = {"image": "busybox", "command": ["true"], "vcpus": 1, "memory": 128}
    first, second = (
        batch.register_job_definition(
            jobDefinitionName="gap-test-definition",
            type="container",
            containerProperties=properties,
        )["revision"]
        for _ in range(2)
    )

    def statuses(*wanted: str) -> list[tuple[int, str]]:
        found = batch.describe_job_definitions(jobDefinitions=list(wanted))["jobDefinitions"]
        return sorted((d["revision"], d["status"]) for d in found)

    assert statuses(f"gap-test-definition:{first}") == [(first, "ACTIVE")]
    batch.deregister_job_definition(jobDefinition=f"gap-test-definition:{first}")
    assert statuses(f"gap-test-definition:{first}") == [(first, "INACTIVE")]
    assert statuses("gap-test-definition") == [(first, "INACTIVE"), (second, "ACTIVE")]
    batch.deregister_job_definition(jobDefinition=f"gap-test-definition:{second}")


def _bucket_denying(s3: Any, bucket: str, condition: Any, principal: Any = "*") -> None:
    statement: dict[str, Any] = {"Effect": "Deny", "Principal": principal, "Action": "s3:*",
                                 "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}  # fmt: skip
    if condition:
        statement["Condition"] = condition
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": [statement]}))


def test_a_bucket_policy_applies_to_the_requests_its_conditions_and_principals_name(
    cloud: Any,
) -> None:
    """moto applied every statement of a bucket's policy to every object request, whatever its
    Condition and Principal: the TLS-only Deny refused the job bucket's every PutObject. A
    request to the local cloud stands for one over TLS (iam.TRANSPORT)."""
    import botocore.exceptions

    s3 = cloud.client("s3")
    bucket = "moto-gaps-conditions"
    s3.create_bucket(Bucket=bucket)
    try:
        plain_http = {"Bool": {"aws:SecureTransport": "false"}}
        other = {"AWS": f"arn:aws:iam::{cloud.account}:role/someone-else"}
        for condition, principal in ((plain_http, "*"), (None, other)):
            _bucket_denying(s3, bucket, condition, principal)
            s3.put_object(Bucket=bucket, Key="k", Body=b"1")
            assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"1"
        # the same statement where its condition holds: denied, so the policy is judged
        _bucket_denying(s3, bucket, {"Bool": {"aws:SecureTransport": "true"}})
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            s3.put_object(Bucket=bucket, Key="k", Body=b"2")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    finally:
        s3.delete_bucket_policy(Bucket=bucket)
        s3.delete_object(Bucket=bucket, Key="k")
        s3.delete_bucket(Bucket=bucket)


def test_an_image_that_says_imds_v2_launches_with_two_hops_unless_asked_otherwise(
    cloud: Any,
) -> None:
    """EC2's defaults for an image with ImdsSupport v2.0: tokens required, two hops (so that
    containers reach IMDS). moto ignored the attribute and launched at its own defaults
    (optional, one hop): a container looked shut out where on EC2 it was not."""
    ec2 = cloud.ec2
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    made = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.micro")
    plain = made["Instances"][0]
    registered = ec2.create_image(InstanceId=plain["InstanceId"], Name="gap-imds")["ImageId"]
    ec2.modify_image_attribute(ImageId=registered, ImdsSupport={"Value": "v2.0"})
    launched = []
    for options in (
        {},
        {"MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}},
    ):
        instance = ec2.run_instances(
            ImageId=registered, MinCount=1, MaxCount=1, InstanceType="t3.micro", **options
        )["Instances"][0]
        launched.append(instance["InstanceId"])
        got = instance["MetadataOptions"]
        launched_with = (got["HttpTokens"], got["HttpPutResponseHopLimit"])
        assert launched_with == (("required", 2) if not options else ("required", 1)), got
    assert (
        plain["MetadataOptions"]["HttpTokens"],
        plain["MetadataOptions"]["HttpPutResponseHopLimit"],
    ) == ("optional", 1)
    ec2.terminate_instances(InstanceIds=[plain["InstanceId"], *launched])
    ec2.deregister_image(ImageId=registered)


def test_a_registered_image_is_what_registerimage_was_given(cloud: Any) -> None:
    """Its architecture, root device and root snapshot: moto kept none of them (no architecture,
    /dev/sda1, and a snapshot of its own that nothing deleted)."""
    ec2 = cloud.ec2
    volume = ec2.create_volume(AvailabilityZone=f"{cloud.config.region}a", Size=8)["VolumeId"]
    snapshot = ec2.create_snapshot(VolumeId=volume)["SnapshotId"]
    before = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    images = [
        ec2.register_image(
            Name=f"gap-register-{arch}",
            Architecture=arch,
            RootDeviceName="/dev/xvda",
            BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"SnapshotId": snapshot}}],
        )["ImageId"]
        for arch in ("arm64", "x86_64")
    ]
    try:
        described = ec2.describe_images(ImageIds=images)["Images"]
        assert sorted(i["Architecture"] for i in described) == ["arm64", "x86_64"]
        for image in described:
            assert image["RootDeviceName"] == "/dev/xvda" and image["RootDeviceType"] == "ebs"
            (root,) = image["BlockDeviceMappings"]
            assert (root["DeviceName"], root["Ebs"]["SnapshotId"]) == ("/dev/xvda", snapshot)
        after = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
        assert after == before  # none made beside the one given
    finally:
        for image in images:
            ec2.deregister_image(ImageId=image)
        ec2.delete_snapshot(SnapshotId=snapshot)
        ec2.delete_volume(VolumeId=volume)
