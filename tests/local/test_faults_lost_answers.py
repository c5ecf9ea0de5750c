"""A create EC2 made whose answer was lost (`--faults lost-answers`): botocore sends it again, and
the run must end with the resource its first attempt made known to its cleanup, and nothing
left. Each test runs at a seed where exactly the create it is about loses its first answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import botocore.exceptions
import pytest

from amibake import pipelines
from amibake.cloud import Cloud
from amibake.cloud.calls import made_once
from amibake.journal import Journal
from amibake.local.faults import Faults, lost_answers
from tests.helpers import tagged_alive, tagged_images_alive
from tests.local.test_faults import faulty, met, seed_where
from tests.test_build import FIXTURES

__all__ = ["faulty"]  # the fixture, used by name


def only_first_lost(action: str, n: int = 1) -> Callable[[Faults], bool]:
    """Seeds where the n-th answer of `action` is lost, and no other of the first three of
    any create."""
    return lambda f: (
        lost_answers.lost(f, action, n, 1)
        and not any(
            lost_answers.lost(f, other, m, 1)
            for other in lost_answers.CREATES
            for m in (1, 2, 3)
            if (other, m) != (action, n)
        )
    )


def _build(cloud: Cloud) -> pipelines.Outcome:
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    return pipelines.build(cloud, request)[0]


def _last_run(cloud: Cloud) -> str:
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert run_id is not None
    return run_id


@pytest.mark.parametrize(
    "action", ["ImportKeyPair", "CreateSecurityGroup", "CreateLaunchTemplate", "CreateFleet"]
)
def test_a_build_whose_create_answer_was_lost_uses_what_it_made(
    faulty: Callable[[str, int], Cloud], action: str
) -> None:
    """Before: a key pair's or security group's create sent again was refused Duplicate and the
    build failed, the first one left to gc's tag scan; a launch template or fleet sent again
    with its ClientToken was made twice by moto (EC2 answers the first)."""
    cloud = faulty("lost-answers", seed_where(only_first_lost(action)))
    outcome = _build(cloud)
    assert outcome.ok, outcome.error
    assert tagged_alive(cloud, _last_run(cloud)) == []
    counts = met(cloud)["lost-answers"]
    assert counts.get(f"{action} made, its answer lost") == 1, counts
    if action in lost_answers.IDEMPOTENT:
        assert counts.get(f"{action} answered again for its client token") == 1, counts


@pytest.mark.parametrize("action", ["CreateImage", "RunInstances"])
def test_a_bake_whose_image_or_boot_test_answer_was_lost_leaves_nothing(
    faulty: Callable[[str, int], Cloud], action: str
) -> None:
    """Before: CreateImage sent again made a second image (moto), where EC2 refuses it
    InvalidAMIName.Duplicate and the bake failed with its image left. The boot test's
    RunInstances carries botocore's own ClientToken (the model's idempotency token): sent
    again, it is the same launch, as EC2 (and now the local cloud) answers it."""
    cloud = faulty("lost-answers", seed_where(only_first_lost(action)))
    assert _build(cloud).ok
    outcome = pipelines.bake(cloud, pipelines.BakeRequest(families=["c5a"]))[0]
    assert outcome.ok, outcome.error
    run_id = _last_run(cloud)
    assert tagged_alive(cloud, run_id) == []
    # The one image it made, and its snapshot: kept, its product.
    image_id = outcome.summary()["image_id"]
    kept = tagged_images_alive(cloud, run_id)
    assert len(kept) == 2 and f"image {image_id}" in kept, kept
    counts = met(cloud)["lost-answers"]
    assert counts.get(f"{action} made, its answer lost") == 1, counts
    # One boot-test instance paid for, terminated or not: moto launched a second for the
    # retry, which the step's tag-based cleanup then found, after both had run.
    boot_tests = [
        i["InstanceId"]
        for r in cloud.ec2.describe_instances(
            Filters=[
                {"Name": "tag:amibake:run-id", "Values": [run_id]},
                {"Name": "tag:amibake:step", "Values": ["boot-test"]},
            ]
        )["Reservations"]
        for i in r["Instances"]
    ]
    assert len(boot_tests) == 1, boot_tests


def test_a_client_token_answers_its_first_request_and_refuses_other_parameters(
    faulty: Callable[[str, int], Cloud],
) -> None:
    """EC2's idempotency, which the retries above rely on: moto launched anew for each."""
    cloud = faulty(
        "lost-answers", seed_where(lambda f: not lost_answers.lost(f, "RunInstances", 1, 1))
    )
    image = cloud.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    asked = {"ImageId": image, "InstanceType": "t3.micro", "MinCount": 1, "MaxCount": 1}
    first = cloud.ec2.run_instances(ClientToken="same-launch", **asked)["Instances"][0]
    try:
        again = cloud.ec2.run_instances(ClientToken="same-launch", **asked)["Instances"][0]
        assert again["InstanceId"] == first["InstanceId"]
        with pytest.raises(botocore.exceptions.ClientError, match="IdempotentParameterMismatch"):
            cloud.ec2.run_instances(
                ClientToken="same-launch", **{**asked, "InstanceType": "t3.small"}
            )
        running = cloud.ec2.describe_instances(
            Filters=[
                {"Name": "image-id", "Values": [image]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )["Reservations"]
        assert [i["InstanceId"] for r in running for i in r["Instances"]] == [first["InstanceId"]]
    finally:
        cloud.ec2.terminate_instances(InstanceIds=[first["InstanceId"]])


def test_a_duplicate_on_a_first_attempt_is_someone_elses_and_is_raised(
    faulty: Callable[[str, int], Cloud],
) -> None:
    """Only a retry's Duplicate is the first attempt's resource: a name taken before the run
    sent anything is refused as it was, and nothing is looked up or adopted."""
    cloud = faulty("none", 0)
    vpc = cloud.ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    taken = cloud.ec2.create_security_group(GroupName="taken", Description="a user's", VpcId=vpc)

    def create() -> dict[str, str]:
        made: dict[str, str] = cloud.ec2.create_security_group(
            GroupName="taken", Description="the run's", VpcId=vpc
        )
        return made

    looked: list[bool] = []

    def find() -> None:
        looked.append(True)

    try:
        with pytest.raises(botocore.exceptions.ClientError, match=r"InvalidGroup\.Duplicate"):
            made_once(
                create,
                "InvalidGroup.Duplicate",
                find,
                "the group",
                within_s=1.0,
            )
        assert looked == []
    finally:
        cloud.ec2.delete_security_group(GroupId=taken["GroupId"])


@pytest.mark.parametrize(
    ("action", "n"),
    # batch up's environment and queue, then the bench run's own queue
    [("CreateComputeEnvironment", 1), ("CreateJobQueue", 1), ("CreateJobQueue", 2)],
)
def test_batch_creates_whose_answer_was_lost_are_taken_as_made(
    faulty: Callable[[str, int], Cloud], action: str, n: int
) -> None:
    """Batch refuses a compute environment's or queue's create sent again "already exists"
    (ClientException): `batch up` and a bench on Batch failed there, the first one left."""
    from tests.local.test_faults_batch import _bench, _clean

    cloud = faulty("lost-answers", seed_where(only_first_lost(action, n)))
    run_id, summary = _bench(cloud)  # batch up, then a one-job bench on Batch
    assert all(t["ok"] for t in summary["types"].values()), summary
    counts = met(cloud)["lost-answers"]
    assert counts.get(f"{action} made, its answer lost") == 1, counts
    _clean(cloud, run_id)  # nothing left of the run, then batch down leaves nothing


@pytest.mark.parametrize(
    ("action", "n"),
    # the service-linked role, the instances' role and profile, the jobs' role, the bucket and
    # the image's job definition
    [("CreateServiceLinkedRole", 1), ("CreateRole", 1), ("CreateInstanceProfile", 1),
     ("CreateRole", 2), ("CreateBucket", 1), ("RegisterJobDefinition", 1)],
)  # fmt: skip
def test_batch_up_s_creates_whose_answer_was_lost_are_taken_as_made(
    faulty: Callable[[str, int], Cloud], action: str, n: int
) -> None:
    """IAM answers a role's or profile's create sent again EntityAlreadyExists, S3 a bucket's
    200 in us-east-1 (BucketAlreadyOwnedByYou elsewhere), Batch a job definition's with one
    revision more: `batch up` takes each for what the first attempt made, and `batch down`
    leaves nothing registered."""
    from amibake import batch
    from tests.local.test_faults_batch import _image, _nothing_registered

    cloud = faulty("lost-answers", seed_where(only_first_lost(action, n)))
    batch.up(cloud, [_image(cloud)])
    counts = met(cloud)["lost-answers"]
    assert counts.get(f"{action} made, its answer lost") == 1, counts
    iam = cloud.client("iam")
    roles = [r["RoleName"] for r in iam.list_roles()["Roles"]]
    assert len(roles) == len(set(roles)), roles  # none made twice
    batch.down(cloud)
    _nothing_registered(cloud)


def test_a_run_s_image_definition_registered_twice_is_left_once_then_not_at_all(
    faulty: Callable[[str, int], Cloud], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job definition has no client token: a registration sent again is a second revision.
    The run's image definition, named for the run alone, deregisters the twin at once; its
    cleanup deregisters the one it ran on."""
    from amibake import batch as amibake_batch
    from amibake.runner import RunContext
    from fleet import batch as fleet_batch

    cloud = faulty("lost-answers", seed_where(only_first_lost("RegisterJobDefinition")))

    def request(cloud: Cloud, state: Any, name: str, tags: dict[str, str]) -> dict[str, Any]:
        # The image's request needs an image in ECR; what is registered is beside the point.
        resources = [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}]
        container = {"image": "busybox", "command": ["true"], "resourceRequirements": resources}
        return {
            "jobDefinitionName": name,
            "type": "container",
            "tags": tags,
            "containerProperties": container,
        }

    monkeypatch.setattr(fleet_batch, "image_job_definition", request)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    context = RunContext(
        "ab-0123456789", cloud, journal, {"amibake:run-id": "ab-0123456789"}, tmp_path
    )
    state: Any = SimpleNamespace(
        spec=SimpleNamespace(image="registry/work:1"),
        family=SimpleNamespace(architecture="x86_64"),
        fleet_run="fb-0123456789",
        slot=0,
        job_definition="",
    )
    client = cloud.client("batch")

    def active() -> list[str]:
        return [
            d["jobDefinitionArn"]
            for d in amibake_batch.pages(
                client, "describe_job_definitions", "jobDefinitions", status="ACTIVE"
            )
            if d["jobDefinitionName"].startswith("amibake-image-")
        ]

    step = fleet_batch.ImageDefinition(context)
    step.run(state)
    counts = met(cloud)["lost-answers"]
    assert counts.get("RegisterJobDefinition made, its answer lost") == 1, counts
    assert active() == [state.job_definition]
    step.cleanup(state)
    assert active() == []


def _retried_duplicate() -> botocore.exceptions.ClientError:
    """A Duplicate as botocore raises it after it sent the create again (RetryAttempts 1)."""
    return botocore.exceptions.ClientError(
        {
            "Error": {"Code": "InvalidGroup.Duplicate", "Message": "already exists"},
            "ResponseMetadata": {"RetryAttempts": 1},
        },
        "CreateSecurityGroup",
    )


def test_a_retried_duplicate_that_names_nothing_of_the_run_is_a_one_line_error() -> None:
    """The first attempt's resource not found within its window: said so, naming gc, not taken
    for made (and not waited on for ever)."""
    from amibake.errors import CloudError

    def create() -> dict[str, str]:
        raise _retried_duplicate()

    with pytest.raises(CloudError, match=r"refused InvalidGroup\.Duplicate.*amibake gc"):
        made_once(create, "InvalidGroup.Duplicate", lambda: None, "the group", within_s=0.0)
    found = made_once(
        create, "InvalidGroup.Duplicate", lambda: {"GroupId": "sg-1"}, "the group", within_s=0.0
    )
    assert found == {"GroupId": "sg-1"}
