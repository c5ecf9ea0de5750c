"""The least-privilege policy: every call the commands make is in it; build, bake and batch pass
under IAM enforcement with exactly it; and each action, removed alone, makes the run fail naming
it. (moto denied every Batch call under enforcement until amibake.local.moto_gaps named Batch's
actions as AWS does.)
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import botocore.session
import pytest

from amibake import batch, config, gc, iam_policy, pipelines, runner
from amibake.cloud import Cloud
from amibake.cloud.session import name_denied_action
from amibake.cloud.tags import RUN_ID
from amibake.connect import connect
from amibake.journal import Journal
from amibake.local import control
from tests.container import image as container_image
from tests.helpers import left_queue, own_local_cloud
from tests.test_build import FIXTURES

SERVICES = ("ec2", "ssm", "sts", "iam", "batch", "s3", "logs", "ecr", "ecs")


class Recorder:
    """The IAM actions a client makes, from botocore's before-call events."""

    def __init__(self, cloud: Cloud) -> None:
        self.calls: set[str] = set()
        self.cloud = cloud
        for service in SERVICES:
            cloud.client(service).meta.events.register("before-call.*.*", self.record)

    def record(self, event_name: str, **_: Any) -> None:
        _, service, operation = event_name.split(".")
        self.calls.add(iam_policy.action_of(service, operation))

    def take(self) -> set[str]:
        calls, self.calls = self.calls, set()
        return calls

    def close(self) -> None:
        for service in SERVICES:
            self.cloud.client(service).meta.events.unregister("before-call.*.*", self.record)


@pytest.mark.parametrize(
    ("service", "operation", "error", "named"),
    [
        ("s3", "CreateBucket", {"Code": "AccessDenied", "Message": "Access Denied"},
         "Access Denied (not authorized to perform: s3:CreateBucket; see amibake iam-policy)"),
        ("s3", "HeadBucket", {"Code": "403", "Message": "Forbidden"},
         "Forbidden (not authorized to perform: s3:ListBucket; see amibake iam-policy)"),
        ("ec2", "RunInstances",
         {"Code": "UnauthorizedOperation", "Message": "not authorized to perform: ec2:X"},
         "not authorized to perform: ec2:X"),  # AWS's own naming is kept
        ("ec2", "RunInstances", {"Code": "InvalidAMIID.NotFound", "Message": "no such image"},
         "no such image"),  # not a denial
    ],
)  # fmt: skip
def test_a_denial_names_the_iam_action_it_needs(
    service: str, operation: str, error: dict[str, str], named: str
) -> None:
    model = botocore.session.get_session().get_service_model(service).operation_model(operation)
    parsed = {"Error": dict(error)}
    name_denied_action(parsed, model)
    assert parsed["Error"]["Message"] == named


def _fresh(cloud: Cloud) -> None:
    shutil.rmtree(cloud.config.results_dir / "artifacts", ignore_errors=True)


def test_every_call_each_command_makes_is_in_its_statement(cloud: Cloud) -> None:
    recorder = Recorder(cloud)
    try:
        _fresh(cloud)
        request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
        assert pipelines.build(cloud, request)[0].ok
        used = {"build": recorder.take()}
        assert pipelines.bake(cloud, pipelines.BakeRequest())[0].ok
        used["bake"] = recorder.take()
        amis = cloud.config.results_dir / "amis.json"
        batch.up(cloud, batch.images_from_bake(amis))
        environment = next(iter(batch.status(cloud)["compute_environments"]))
        used["batch"] = recorder.take()
        # A fleet run's queue left with a job in it (its controller SIGKILLed): gc stops the job
        # before it deletes the queue.
        journal = Journal(cloud.config.results_dir / "journal.sqlite")
        left_run = runner.new_run_id()
        left = left_queue(cloud, environment, left_run)
        client = cloud.client("batch")
        client.submit_job(  # still there when gc lists it (the trivial job ends in a second)
            jobName="left",
            jobQueue=left,
            jobDefinition="amibake-trivial-x86_64",
            containerOverrides={
                "command": ["/bin/sh", "-c", "trap 'exit 143' TERM; sleep 300 & wait"]
            },
        )
        # and the job definition of its own an image run registers
        client.register_job_definition(
            jobDefinitionName=f"amibake-image-x86_64-{left_run.removeprefix('ab-')}-0",
            type="container",
            containerProperties={"image": "busybox", "vcpus": 1, "memory": 128},
            tags={RUN_ID: left_run},
        )
        recorder.take()  # the test's own calls
        from amibake import inventory

        inventory.discover(cloud, journal, everything=True)  # amibake ls, gc --dry-run
        used["ls"] = recorder.take()
        gc.delete(cloud, journal, gc.find(cloud, journal))
        used["gc"] = recorder.take()
        assert {"batch:TerminateJob", "batch:DeregisterJobDefinition"} <= used["gc"], used["gc"]
        batch.down(cloud)
        used["batch"] |= recorder.take()
        from fleet import bench, spec

        results = bench.results_db(cloud.config.results_dir)
        plan = {"types": ["c5a.large"], "command": "echo value=1", "replicates": 1, "warmups": 0}
        run_id = bench.create(cloud, spec.load(None, plan), results)
        bench.execute(cloud, run_id, results)
        used["fleet"] = recorder.take()
    finally:
        recorder.close()
    for command, calls in used.items():
        missing = sorted(calls - iam_policy.actions([command]) - iam_policy.NEEDS_NO_PERMISSION)
        assert not missing, f"{command} calls {missing}, which its policy statement lacks"
        assert calls, f"{command} made no call: the recording is broken"


@pytest.fixture
def enforcing_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A local cloud of its own, with an IAM user holding exactly the build+bake policy."""
    admin = connect(own_local_cloud(tmp_path, monkeypatch))  # never AWS, whatever else is set
    iam = admin.client("iam")
    iam.create_user(UserName="amibake")
    key = iam.create_access_key(UserName="amibake")["AccessKey"]
    endpoint = admin.endpoint_url
    assert endpoint is not None

    def allow(document: dict[str, Any]) -> None:
        # Enforcement off while the policy changes (the admin has no IAM identity).
        _auth(endpoint, "inf")
        iam.put_user_policy(
            UserName="amibake", PolicyName="amibake", PolicyDocument=json.dumps(document)
        )
        _auth(endpoint, "0")

    monkeypatch.setenv(
        "AMIBAKE_LOCAL_CREDENTIALS", f"{key['AccessKeyId']}:{key['SecretAccessKey']}"
    )
    yield {"allow": allow, "user": lambda: connect(config.load()), "admin": admin}
    _auth(endpoint, "inf")
    control.down(config.load())


def _auth(endpoint: str, after: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=after.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _build_and_bake(user: Cloud) -> str:
    """Run build then bake; return '' on success, else the first error."""
    _fresh(user)
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    try:
        built = pipelines.build(user, request)[0]
        if not built.ok:
            return built.error
        baked = pipelines.bake(user, pipelines.BakeRequest())[0]
        return "" if baked.ok else baked.error
    except Exception as exc:  # an AccessDenied in preflight is raised, not an outcome
        return str(exc)


def without(document: dict[str, Any], action: str) -> dict[str, Any]:
    """The policy with one action taken out of every statement."""
    statements = []
    for statement in document["Statement"]:
        kept = [a for a in statement["Action"] if a != action]
        if kept:
            statements.append({**statement, "Action": kept})
    return {**document, "Statement": statements}


def test_build_and_bake_under_enforcement_need_exactly_the_policy(
    enforcing_cloud: dict[str, Any],
) -> None:
    # The generated policy itself, scoped by ARN and tag: the local cloud authorizes as AWS
    # does (by resource and condition), so a scope that does not fit a call fails here.
    policy = iam_policy.document(["build", "bake"])
    enforcing_cloud["allow"](policy)
    user = enforcing_cloud["user"]()
    # The first run also makes the spot service-linked role, once per account, under exactly
    # the policy; the removals below are judged against a later run's calls.
    assert _build_and_bake(user) == ""
    recorder = Recorder(user)
    try:
        assert _build_and_bake(user) == ""
        called = recorder.take()
    finally:
        recorder.close()
    # Every action the run called, removed alone, must break it with an error naming it.
    for action in sorted(called - iam_policy.NEEDS_NO_PERMISSION):
        enforcing_cloud["allow"](without(policy, action))
        error = _build_and_bake(enforcing_cloud["user"]())
        assert f"not authorized to perform: {action}" in error, (action, error)


def _batch_cycle(user: Cloud, images: Any) -> str:
    """batch up, status and down; return '' on success, else the first error."""
    try:
        batch.up(user, images)
        batch.status(user)
        batch.down(user)
        return ""
    except Exception as exc:
        return str(exc)


def test_batch_under_enforcement_needs_exactly_the_policy(
    enforcing_cloud: dict[str, Any],
) -> None:
    policy = iam_policy.document(["build", "bake", "batch"])
    enforcing_cloud["allow"](policy)
    user = enforcing_cloud["user"]()
    assert _build_and_bake(user) == ""
    images = batch.images_from_bake(user.config.results_dir / "amis.json")
    # The first cycle creates the IAM pieces batch needs, under exactly the policy; they are
    # kept (found, not created, from then on), so the removals below are judged against the
    # calls of a later cycle.
    assert _batch_cycle(user, images) == ""
    recorder = Recorder(user)
    try:
        assert _batch_cycle(user, images) == ""
        called = recorder.take()
    finally:
        recorder.close()
    assert any(action.startswith("batch:Create") for action in called), called
    for action in sorted(called - iam_policy.NEEDS_NO_PERMISSION):
        enforcing_cloud["allow"](without(policy, action))
        error = _batch_cycle(enforcing_cloud["user"](), images)
        assert f"not authorized to perform: {action}" in error, (action, error)
        enforcing_cloud["allow"](policy)
        assert _batch_cycle(enforcing_cloud["user"](), images) == ""  # nothing left half up


def test_each_command_works_holding_only_its_own_statements(
    enforcing_cloud: dict[str, Any],
) -> None:
    """A user grants what they run: build, bake, batch and gc each pass holding only the
    statements `amibake iam-policy --for COMMAND` prints."""
    allow, user_of = enforcing_cloud["allow"], enforcing_cloud["user"]
    allow(iam_policy.document(["build"]))
    user = user_of()
    _fresh(user)
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    assert pipelines.build(user, request)[0].ok
    allow(iam_policy.document(["bake"]))
    baked = pipelines.bake(user_of(), pipelines.BakeRequest())[0]
    assert baked.ok, baked.error
    allow(iam_policy.document(["batch"]))
    images = batch.images_from_bake(user.config.results_dir / "amis.json")
    assert _batch_cycle(user_of(), images) == ""
    allow(iam_policy.document(["gc"]))
    journal = Journal(user.config.results_dir / "journal.sqlite")
    cleaner = user_of()
    found = gc.find(cleaner, journal)
    assert gc.delete(cleaner, journal, found) == (found, [])


# What a container bench (issue 23) adds to the fleet statement: ECR's reads of the image.
IMAGE_READS = ("ecr:BatchGetImage", "ecr:GetAuthorizationToken", "ecr:GetDownloadUrlForLayer")


def _container_bench(user: Cloud, image: str) -> str:
    """A one-replicate bench of `image` on this machine's architecture (ssh executor); '' on
    success, else the first error."""
    from fleet import bench, container, spec

    container._seen.clear()  # each run reads the image again, as a new process does
    architecture = container.EC2_ARCHITECTURE[container_image.host_architecture()]
    plan = {
        "types": ["c5a.large" if architecture == "x86_64" else "c7g.large"],
        "image": image,
        "command": "work {args}",
        "args": {"n": 1000},
        "metric": {"kind": "file", "meaning": "rate", "unit": "iterations/s"},
        "replicates": 1,
        "warmups": 0,
    }
    try:
        results = bench.results_db(user.config.results_dir)
        run_id = bench.create(user, spec.load(None, plan), results)
        summary = bench.execute(user, run_id, results)
    except Exception as exc:  # an AccessDenied in preflight is raised, not an outcome
        return str(exc)
    failed = [str(t.get("error") or t) for t in summary["types"].values() if not t["ok"]]
    return failed[0] if failed else ""


@pytest.fixture
def pushed_image(enforcing_cloud: dict[str, Any], tmp_path: Path) -> str:
    """The test image, this machine's architecture only (its config blob is then read through
    GetDownloadUrlForLayer), pushed by the admin before enforcement starts."""
    from fleet import container

    admin: Cloud = enforcing_cloud["admin"]
    ref = container_image.push_to_ecr(admin, tmp_path / "image", "fleet/work")
    layout = container_image.build(tmp_path / "one", (container_image.host_architecture(),))
    single = container.ImageRef(ref.account, ref.region, ref.repository, "one-arch")
    container.push(admin, f"oci:{layout}:{container_image.host_architecture()}", single)
    return str(single)


def test_a_container_bench_under_enforcement_needs_the_fleet_policy(
    enforcing_cloud: dict[str, Any], pushed_image: str
) -> None:
    policy = iam_policy.document(["fleet"])
    enforcing_cloud["allow"](policy)
    user = enforcing_cloud["user"]()
    recorder = Recorder(user)
    try:
        assert _container_bench(user, pushed_image) == ""
        called = recorder.take()
    finally:
        recorder.close()
    assert set(IMAGE_READS) <= called, called  # the recording saw the image read
    missing = sorted(called - iam_policy.actions(["fleet"]) - iam_policy.NEEDS_NO_PERMISSION)
    assert not missing, f"a container bench calls {missing}, which the fleet statement lacks"


def test_a_container_bench_without_an_image_read_fails_naming_it(
    enforcing_cloud: dict[str, Any], pushed_image: str
) -> None:
    policy = iam_policy.document(["fleet"])
    for action in IMAGE_READS:
        enforcing_cloud["allow"](without(policy, action))
        error = _container_bench(enforcing_cloud["user"](), pushed_image)
        assert f"not authorized to perform: {action}" in error, (action, error)


def test_the_policy_denies_the_escalation_and_everything_not_amibakes(
    enforcing_cloud: dict[str, Any],
) -> None:
    """A user holding the whole policy cannot become admin (create a role, attach
    AdministratorAccess, wrap it in an instance profile, pass it to an instance), nor touch
    what amibake did not make."""
    admin = connect(
        config.load().__class__(**{**config.load().__dict__, "local_credentials": None})
    )
    iam, ec2, s3 = admin.client("iam"), admin.ec2, admin.client("s3")
    trust = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
    )
    # Someone else's things, made by the admin: an instance, an image, a bucket, a role.
    base = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    theirs = ec2.run_instances(ImageId=base, InstanceType="c7i.large", MinCount=1, MaxCount=1)
    instance = theirs["Instances"][0]["InstanceId"]
    image = ec2.create_image(InstanceId=instance, Name="someone-elses")["ImageId"]
    s3.create_bucket(Bucket="someone-elses-bucket")
    iam.create_role(RoleName="admin-role", AssumeRolePolicyDocument=trust)
    iam.create_instance_profile(InstanceProfileName="admin-profile")
    iam.add_role_to_instance_profile(InstanceProfileName="admin-profile", RoleName="admin-role")
    enforcing_cloud["allow"](iam_policy.document())
    user = enforcing_cloud["user"]()
    uiam, uec2, us3 = user.client("iam"), user.ec2, user.client("s3")

    def denied(action: str, call: Any) -> None:
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            call()
        assert f"not authorized to perform: {action}" in str(refused.value), refused.value

    # The escalation: a role outside amibake's path, AdministratorAccess, an inline policy.
    denied(
        "iam:CreateRole",
        lambda: uiam.create_role(RoleName="escalate", AssumeRolePolicyDocument=trust),
    )
    uiam.create_role(RoleName="escalate", Path="/amibake/", AssumeRolePolicyDocument=trust)
    admin_policy = "arn:aws:iam::aws:policy/AdministratorAccess"
    denied(
        "iam:AttachRolePolicy",
        lambda: uiam.attach_role_policy(RoleName="escalate", PolicyArn=admin_policy),
    )
    denied(
        "iam:PutRolePolicy",
        lambda: uiam.put_role_policy(
            RoleName="escalate",
            PolicyName="all",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
                }
            ),
        ),
    )
    denied("iam:CreateUser", lambda: uiam.create_user(UserName="another"))
    # Passing someone else's role to an instance, even a tagged one.
    run_tag = [
        {"ResourceType": k, "Tags": [{"Key": "amibake:run-id", "Value": "ab-x"}]}
        for k in ("instance", "volume")
    ]
    denied(
        "iam:PassRole",
        lambda: uec2.run_instances(
            ImageId=base,
            InstanceType="c7i.large",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=run_tag,
            IamInstanceProfile={"Name": "admin-profile"},
        ),
    )
    # What amibake did not make: publish or delete an image, stop an instance, claim it by
    # tagging it with a run id, empty a bucket.
    denied(
        "ec2:ModifyImageAttribute",
        lambda: uec2.modify_image_attribute(
            ImageId=image, LaunchPermission={"Add": [{"Group": "all"}]}
        ),
    )
    denied("ec2:DeregisterImage", lambda: uec2.deregister_image(ImageId=image))
    denied("ec2:TerminateInstances", lambda: uec2.terminate_instances(InstanceIds=[instance]))
    denied(
        "ec2:CreateTags",
        lambda: uec2.create_tags(
            Resources=[instance], Tags=[{"Key": "amibake:run-id", "Value": "ab-x"}]
        ),
    )
    denied("s3:DeleteBucket", lambda: us3.delete_bucket(Bucket="someone-elses-bucket"))
    enforcing_cloud["allow"](
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
    )
    enforcing_cloud["user"]().ec2.terminate_instances(InstanceIds=[instance])


def test_iam_analysers_find_no_escalation_or_exposure() -> None:
    from cloudsplaining.scan.policy_document import PolicyDocument
    from parliament import analyze_policy_string

    for commands in [[c] for c in iam_policy.ACTIONS] + [list(iam_policy.ACTIONS)]:
        document = iam_policy.document(commands)
        scanned = PolicyDocument(document)
        assert scanned.allows_privilege_escalation == [], commands
        assert scanned.permissions_management_without_constraints == [], commands
        # ECR's registry token is what every image pull needs (AWS's own
        # AmazonEC2ContainerRegistryReadOnly grants it on "*"); the images it reaches are the
        # repository-scoped reads beside it.
        exposed = set(scanned.credentials_exposure) - {"ecr:GetAuthorizationToken"}
        assert exposed == set(), commands
        assert scanned.allows_data_exfiltration_actions == [], commands
        assert scanned.write_actions_without_constraints == [], commands
        findings = analyze_policy_string(json.dumps(document)).findings
        # parliament wants every resource type an action requires in each statement naming it;
        # these actions are split across statements by condition on purpose (created resources
        # must carry the run's tag, what they launch from must be amibake's, the AMI and subnet
        # are nobody's to tag), as AWS's own examples for tag-on-create policies are.
        split = {
            "ec2:RunInstances",
            "ec2:CreateFleet",
            "ec2:CreateImage",
            "ec2:CreateSecurityGroup",
        }
        others = [
            f
            for f in findings
            if f.issue != "RESOURCE_MISMATCH" or {d["action"] for d in f.detail} - split
        ]
        assert others == [], [(f.issue, f.detail) for f in others]
    assert iam_policy.unscoped() == []  # every action listed says where it may act


def test_under_enforcement_a_bucket_policy_s_deny_wins_over_the_caller_s_allow(
    enforcing_cloud: dict[str, Any],
) -> None:
    """AWS evaluates the bucket's policy beside the caller's, and an explicit Deny in either
    wins; the local cloud read the bucket's only where the caller's said nothing."""
    anything = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    enforcing_cloud["allow"]({"Version": "2012-10-17", "Statement": [anything]})
    s3 = enforcing_cloud["user"]().client("s3")
    bucket = "enforced-deny"
    s3.create_bucket(Bucket=bucket)
    for transport, denied in (("true", True), ("false", False)):
        deny = {"Effect": "Deny", "Principal": "*", "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"Bool": {"aws:SecureTransport": transport}}}  # fmt: skip
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": [deny]}))
        if denied:
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                s3.list_objects_v2(Bucket=bucket)
            assert "s3:ListBucket" in str(refused.value), refused.value
        else:
            assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    s3.delete_bucket_policy(Bucket=bucket)
    s3.delete_bucket(Bucket=bucket)
