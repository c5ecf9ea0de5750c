"""``amibake batch``: AWS Batch compute environments, job queues and job definitions on the baked
images. Idempotent and tag-driven: ``up`` twice changes nothing the second time; a new image
means a new compute environment swapped into the queue (never an edit in place); ``down`` is safe
to re-run and tears down queues before compute environments.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import botocore.exceptions

from amibake import bake, catalog
from amibake.cloud import Cloud
from amibake.cloud.calls import (
    creating,
    describe_image,
    error_code,
    every,
    made_once,
    retry_on,
    wait_until,
)
from amibake.cloud.ec2 import NEW_RESOURCE_VISIBLE_S, delete_security_group
from amibake.cloud.network import Network
from amibake.cloud.network import find as find_network
from amibake.errors import CloudError, UserError
from amibake.progress import Progress

log = logging.getLogger("amibake")
T = TypeVar("T")
TAG = "amibake:batch"
# amibake's roles live under their own IAM path, so a policy can let amibake pass exactly these
# (arn:aws:iam::ACCOUNT:role/amibake/*) and no other role in the account.
ROLE_PATH = "/amibake/"
INSTANCE_ROLE = "amibake-batch-instance"
# What a job runs as: it reads its payload and writes its results in the job bucket with this
# role's own short-lived credentials (no URL or key travels in the job's environment).
JOB_ROLE = "amibake-batch-job"
SECURITY_GROUP = "amibake-batch"
# The instance role's only policy, on purpose: a Batch job on EC2 runs in the host's network
# ("Networking modes for AWS Batch jobs": host is the one mode of an ECS-on-EC2 job), so it
# reaches IMDS and this role. A launch template's hop limit of 1 does not stop it (that only
# holds bridge-mode containers back), nor does a docker0 firewall rule; whatever this role may
# do, any job may.
ECS_INSTANCE_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
CONTAINER_IMAGE = "public.ecr.aws/amazonlinux/amazonlinux:2023"
ACTIVE_JOBS = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
ENDED_JOBS = ("SUCCEEDED", "FAILED")
# A compute environment made seconds after its roles and instance profile can go INVALID while
# IAM propagates (terraform-provider-aws #37945, kops#35); AWS leaves it INVALID. It is deleted
# and made again, this many times at most, waiting a little longer each time.
ENVIRONMENT_TRIES = 3
REPLACE_WAIT_S = 5.0
# S3 refuses a bucket policy naming a role IAM made seconds ago ("MalformedPolicy: Invalid
# principal in policy") until the role has spread; Terraform retries it for a minute
# (hashicorp/terraform#4315), which was at times just enough (opstrace/opstrace#88): two here.
# A new bucket found by its settings' calls, a new role by S3 as a policy's principal: AWS says
# seconds, at times a minute (bucket_settled).
BUCKET_KNOWN_S = 120.0
# Jobs held RUNNABLE for one of these reasons are cancelled by the queue itself after
# RUNNABLE_LIMIT_S (jobStateTimeLimitActions; "Jobs stuck in RUNNABLE" in the Batch user guide
# lists them as the reasons that support it), so nothing waits on them for ever. AWS takes 600 s
# to 86,400 s.
TIME_LIMIT_REASONS = (
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE",
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
)
RUNNABLE_LIMIT_S = 1800
# A terminated job runs on until ECS has stopped its container (SIGTERM, SIGKILL 30 s later by
# default) and Batch has noticed, and may write its files meanwhile: how long a cleanup waits
# for terminated jobs to end before it removes what they write to.
JOBS_STOPPING_S = 120.0
# How long an environment taken out of its queues may still count as theirs (eventual
# consistency: seconds, terraform-provider-aws#46925; a minute to be sure).
QUEUE_RELEASED_S = 60.0
JOBS_POLL_S = 1.0


@dataclass(frozen=True)
class Image:
    image_id: str
    architecture: str
    families: tuple[str, ...]
    apps: tuple[str, ...]


@dataclass(frozen=True)
class FromBake:
    """What `batch up --from-bake` registers: one image per architecture (its queue takes one
    environment, on one image), and every family baked that those images leave out, with why."""

    images: list[Image]
    skipped: dict[str, str]  # family -> why it is not registered


def images_from_bake(amis_file: Path, cloud: Cloud | None = None) -> list[Image]:
    """The newest baked image of each architecture, from results/amis.json."""
    return from_bake(amis_file, cloud).images


def from_bake(amis_file: Path, cloud: Cloud | None = None) -> FromBake:
    """The newest image of each architecture baked (in this cloud and region when `cloud` is
    given, and not retired by `bake --keep`), and each family only an older, retired or
    elsewhere image holds, named with why: a family is never dropped without a word."""
    if not amis_file.exists():
        raise UserError(f"{amis_file} does not exist: run `amibake bake` first, or pass --ami")
    records = bake.baked(amis_file)  # oldest first
    newest: dict[str, Image] = {}
    for record in records:
        if not record.get("retired") and (cloud is None or bake.here(record, cloud)):
            newest[record["architecture"]] = _image(
                record["image_id"], record["architecture"], record["artifacts"].values()
            )
    registered = {f for image in newest.values() for f in image.families}
    skipped: dict[str, str] = {}
    for record in reversed(records):  # the newest word on each family
        image = _image(record["image_id"], record["architecture"], record["artifacts"].values())
        for family in image.families:
            if family in registered or family in skipped:
                continue
            if record.get("retired"):
                why = f"its image {image.image_id} was retired by `amibake bake --keep`"
            elif cloud is not None and not bake.here(record, cloud):
                why = (
                    f"its image {image.image_id} was baked in {record.get('cloud')} "
                    f"{record.get('region')}, not {cloud.config.cloud} {cloud.config.region}"
                )
            else:
                chosen = newest[image.architecture]
                why = (
                    f"only the older image {image.image_id} holds it, and the "
                    f"{names(chosen)[1]} queue takes the newest {image.architecture} image, "
                    f"{chosen.image_id} ({', '.join(chosen.families)}): bake the families "
                    f"together (amibake bake --family {','.join([*chosen.families, family])})"
                )
            skipped[family] = why
    return FromBake(list(newest.values()), skipped)


def check_alive(cloud: Cloud, images: list[Image], amis_file: Path) -> None:
    """Every image exists in the cloud: one deregistered, or gone with a local cloud that
    stopped, is refused before anything is made (an environment on it could start nothing)."""
    for image in images:
        if describe_image(cloud.ec2, image.image_id) is None:
            raise UserError(
                f"{amis_file} names {image.image_id} ({image.architecture}: "
                f"{', '.join(image.families)}), which does not exist in {cloud.config.region} "
                "any more (deregistered, or the local cloud stopped): bake again (amibake bake), "
                "or pass --ami with an image that exists"
            )


def _baked(amis_file: Path) -> list[Image]:
    """Every image results/amis.json records, oldest first."""
    return [
        _image(r["image_id"], r["architecture"], r["artifacts"].values())
        for r in bake.baked(amis_file)
    ]


def _image(image_id: str, architecture: str, manifests: Any) -> Image:
    manifests = list(manifests)
    return Image(
        image_id=image_id,
        architecture=architecture,
        families=tuple(sorted({m["family"] for m in manifests})),
        apps=tuple(sorted({m["app"] for m in manifests})),
    )


def image_by_id(cloud: Cloud, image_id: str, amis_file: Path) -> Image:
    if describe_image(cloud.ec2, image_id) is None:
        raise UserError(f"image {image_id} does not exist in {cloud.config.region}")
    for image in _baked(amis_file):
        if image.image_id == image_id:
            return image
    raise UserError(f"image {image_id} was not baked by amibake (not in {amis_file})")


# How long a role or instance profile just made may be NoSuchEntity to the IAM calls that name
# it (IAM is eventually consistent; terraform-provider-aws retries for two minutes, #6079).
NEW_IAM_VISIBLE_S = 120.0


def iam_settled(name: str, call: Callable[[], T]) -> T:
    """An IAM call naming a role or instance profile (`name`) made a moment ago: NoSuchEntity
    for it asked again until IAM knows it. Before, the first `batch up` of an account could
    fail there. Another entity's NoSuchEntity (a managed policy's) is raised at once."""
    return retry_on({"NoSuchEntity"}, call, within_s=NEW_IAM_VISIBLE_S, saying=name)


def _ensure_iam(cloud: Cloud) -> tuple[str, str]:
    """(service role ARN, instance profile ARN), created if missing."""
    iam = cloud.client("iam")
    service_path = "/aws-service-role/batch.amazonaws.com/"
    # Looked up by its path: clouds spell its name differently (AWSServiceRoleForBatch).
    # Every page: IAM "might return fewer results, even when there are more" (ListRoles).
    found = list(every(iam, "list_roles", "Roles", PathPrefix=service_path))
    if found:
        service = found[0]
    else:
        try:
            service = iam.create_service_linked_role(AWSServiceName="batch.amazonaws.com")["Role"]
        except botocore.exceptions.ClientError as exc:
            # Another `up` made it since the lookup: AWS says InvalidInput "has been taken in
            # this account", moto EntityAlreadyExists.
            if error_code(exc) not in ("InvalidInput", "EntityAlreadyExists"):
                raise
            found = list(every(iam, "list_roles", "Roles", PathPrefix=service_path))
            if not found:
                raise
            service = found[0]
    _ensure_role(iam, INSTANCE_ROLE, "ec2.amazonaws.com")
    iam_settled(  # idempotent
        INSTANCE_ROLE,
        lambda: iam.attach_role_policy(RoleName=INSTANCE_ROLE, PolicyArn=ECS_INSTANCE_POLICY),
    )
    try:
        iam.create_instance_profile(InstanceProfileName=INSTANCE_ROLE, Path=ROLE_PATH)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != "EntityAlreadyExists":
            raise
    profile = iam_settled(
        INSTANCE_ROLE,
        lambda: iam.get_instance_profile(InstanceProfileName=INSTANCE_ROLE)["InstanceProfile"],
    )
    if not any(r["RoleName"] == INSTANCE_ROLE for r in profile.get("Roles", [])):
        iam_settled(
            INSTANCE_ROLE,
            lambda: iam.add_role_to_instance_profile(
                InstanceProfileName=INSTANCE_ROLE, RoleName=INSTANCE_ROLE
            ),
        )
    return str(service["Arn"]), str(profile["Arn"])


def _ensure_role(iam: Any, name: str, service: str, condition: dict[str, Any] | None = None) -> str:
    """A role under amibake's path that `service` may assume (under `condition`, where given);
    its ARN. One of that name elsewhere (made by an older amibake, or by someone else) is
    refused, not taken over. One of amibake's whose trust says otherwise (an older amibake's,
    without the condition) is given this trust."""
    statement: dict[str, Any] = {
        "Effect": "Allow",
        "Principal": {"Service": service},
        "Action": "sts:AssumeRole",
    }
    if condition:
        statement["Condition"] = condition
    trust = {"Version": "2012-10-17", "Statement": [statement]}
    try:
        role = iam.create_role(
            RoleName=name,
            Path=ROLE_PATH,
            AssumeRolePolicyDocument=json.dumps(trust),
            Tags=[{"Key": TAG, "Value": "true"}],
        )["Role"]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != "EntityAlreadyExists":
            raise
        role = iam_settled(name, lambda: iam.get_role(RoleName=name)["Role"])
    if role.get("Path") != ROLE_PATH:
        raise UserError(
            f"IAM role {name} exists outside amibake's path {ROLE_PATH} (made by an older "
            f"amibake?): delete it (aws iam delete-role --role-name {name}, after detaching its "
            "policies), and `amibake batch up` makes it again"
        )
    # boto3 hands the document over decoded (botocore's json_decode_policies): data to compare.
    if role.get("AssumeRolePolicyDocument") != trust:
        iam_settled(
            name,
            lambda: iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(trust)),
        )
    return str(role["Arn"])


def _ensure_job_role(cloud: Cloud, bucket: str) -> str:
    """The role jobs run as, and the bucket policy that lets it read and write the run files
    there, nothing else. The grant is the bucket's, not the role's: a role amibake passes must
    not carry policies amibake writes (whoever may write them could give it anything)."""
    # ECS may assume the role for this account's tasks in this region only (aws:SourceAccount,
    # aws:SourceArn): the ECS guide's "Task IAM role" asks for them against the cross-service
    # confused deputy, and scanners (Security Hub, prowler) flag a service's trust without them.
    account = cloud.account
    only_ours = {
        "StringEquals": {"aws:SourceAccount": account},
        "ArnLike": {"aws:SourceArn": f"arn:aws:ecs:{cloud.config.region}:{account}:*"},
    }
    arn = _ensure_role(cloud.client("iam"), JOB_ROLE, "ecs-tasks.amazonaws.com", only_ours)
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AmibakeJobs",
                "Effect": "Allow",
                "Principal": {"AWS": arn},
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": f"arn:aws:s3:::{bucket}/fleet/*",
            },
            {
                # TLS or nothing, whoever asks (AWS Security Hub's S3.5): the payloads jobs run
                # are in it, and a plain-HTTP read or write of them could be seen or altered.
                "Sid": "TlsOnly",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }
    s3 = cloud.client("s3")
    bucket_settled(  # its principal, a role made seconds before, may not be known to S3 yet
        lambda: s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy)),
        also=frozenset({"MalformedPolicy"}),
    )
    return arn


def _network(cloud: Cloud) -> tuple[list[str], list[str]]:
    """The run's subnets (the default VPC's, or subnet_ids) and security groups: one of
    amibake's with no inbound rule (jobs need none), and the account's security_group_ids."""
    ec2 = cloud.ec2
    network = find_network(ec2, cloud.config)
    _check_way_out(ec2, network, cloud.config.region)
    vpc = network.vpc_id
    subnets = [str(s["SubnetId"]) for s in network.subnets]
    mine = [
        {"Name": "group-name", "Values": [SECURITY_GROUP]},
        {"Name": "vpc-id", "Values": [vpc]},
    ]
    groups = list(every(ec2, "describe_security_groups", "SecurityGroups", Filters=mine))
    if groups:
        group = groups[0]
        # Taken by its name alone, a group someone else made under it (open to 0.0.0.0/0, say)
        # went onto every Batch host.
        if TAG not in {t["Key"] for t in group.get("Tags", [])}:
            raise UserError(
                f"security group {group['GroupId']} in {vpc} is named {SECURITY_GROUP} but was "
                f"not made by amibake (no {TAG} tag): rename or delete it, and batch up makes "
                "its own"
            )
        if group.get("IpPermissions"):
            raise UserError(
                f"amibake's Batch security group {group['GroupId']} has inbound rules, which its "
                "hosts need none of: remove them (aws ec2 revoke-security-group-ingress)"
            )
        return subnets, [str(group["GroupId"]), *network.groups]

    def made() -> dict[str, Any] | None:
        ours = [*mine, {"Name": f"tag:{TAG}", "Values": ["true"]}]
        found = list(every(ec2, "describe_security_groups", "SecurityGroups", Filters=ours))
        return found[0] if found else None

    created = made_once(
        lambda: ec2.create_security_group(
            GroupName=SECURITY_GROUP,
            Description="amibake Batch instances: no inbound",
            VpcId=vpc,
            TagSpecifications=[
                {"ResourceType": "security-group", "Tags": [{"Key": TAG, "Value": "true"}]}
            ],
        ),
        "InvalidGroup.Duplicate",
        made,
        "the Batch security group",
        within_s=NEW_RESOURCE_VISIBLE_S,
    )
    return subnets, [str(created["GroupId"]), *network.groups]


def _check_way_out(ec2: Any, network: Network, region: str) -> None:
    """Batch's hosts register with ECS and pull their work over the network: from a subnet_ids
    subnet with no way out (no public IPv4 by default beside a route to an internet gateway, no
    0.0.0.0/0 route through a NAT gateway, transit gateway or NAT instance, no ECS endpoint in
    the VPC) they start, are billed, and never take a job (the Batch user guide, "Compute
    environments": "must have access to the Amazon ECS service endpoint"). The default VPC's
    subnets have one by construction."""
    if not network.configured:
        return
    where = [{"Name": "vpc-id", "Values": [network.vpc_id]}]
    endpoints = every(ec2, "describe_vpc_endpoints", "VpcEndpoints", Filters=where)
    if any(e.get("ServiceName") == f"com.amazonaws.{region}.ecs" for e in endpoints):
        return
    tables = list(every(ec2, "describe_route_tables", "RouteTables", Filters=where))
    main: dict[str, Any] = next(
        (t for t in tables if any(a.get("Main") for a in t.get("Associations", []))), {}
    )
    table_of = {
        a["SubnetId"]: t for t in tables for a in t.get("Associations", []) if a.get("SubnetId")
    }
    for subnet in network.subnets:
        routes = [
            r
            for r in table_of.get(subnet["SubnetId"], main).get("Routes", [])
            if r.get("DestinationCidrBlock") == "0.0.0.0/0" and r.get("State") != "blackhole"
        ]
        through = ("NatGatewayId", "TransitGatewayId", "NetworkInterfaceId", "InstanceId")
        if any(r.get(k) for r in routes for k in through):
            continue
        if subnet.get("MapPublicIpOnLaunch") and any(
            str(r.get("GatewayId", "")).startswith("igw-") for r in routes
        ):
            continue
        raise UserError(
            f"subnet {subnet['SubnetId']} (subnet_ids) gives Batch's hosts no way to ECS: no "
            "0.0.0.0/0 route through a NAT gateway, no public IPv4 by default with an internet "
            "gateway route, no ECS endpoint in its VPC; its hosts would be billed and never take "
            "a job: add a NAT gateway route, or name other subnets"
        )


# Where the job bucket's name is recorded in the account and region: its name has a random
# part (a predictable one, such as amibake-batch-ACCOUNT-REGION, can be created first by
# another account), so it must be found, not derived.
BUCKET_PARAMETER = "/amibake/batch/bucket"
NOT_FOUND = ("404", "NoSuchBucket", "NotFound")


def job_bucket(cloud: Cloud) -> str | None:
    """The job bucket (fleet's payloads and monitor CSVs) recorded for this account and region,
    or None when `amibake batch up` has not made one."""
    try:
        found = cloud.ssm.get_parameter(Name=BUCKET_PARAMETER)["Parameter"]["Value"]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == "ParameterNotFound":
            return None
        raise
    return str(found)


def check_owned(cloud: Cloud, name: str) -> bool:
    """True when the bucket exists and is this account's; False when it does not exist. A
    bucket of that name held by another account is an error naming it: nothing is sent to
    it, and nothing read from it."""
    try:
        cloud.client("s3").head_bucket(Bucket=name)  # ExpectedBucketOwner: this account
        return True
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) in NOT_FOUND:
            return False
        if error_code(exc) in ("403", "AccessDenied"):
            # S3 answers 403 alike for both: say both, the likelier first.
            raise UserError(
                f"the job bucket {name} (recorded in SSM {BUCKET_PARAMETER}) is not this "
                f"account's ({cloud.account}), or this identity is not authorized to perform: "
                "s3:ListBucket (see amibake iam-policy); if it is someone else's, delete the "
                "parameter and `amibake batch up` makes a new bucket"
            ) from None
        raise


def _ensure_bucket(cloud: Cloud) -> str:
    """The job bucket: the recorded one, else a new one recorded before it is made (a bucket
    made first and interrupted before its record was found by nothing: not ls, gc or `batch
    down`). Its settings are put on every `up`: one interrupted before them left a bucket used
    unencrypted, public access not blocked, its objects never expiring."""
    s3 = cloud.client("s3")
    name = job_bucket(cloud)
    if name is None:
        name = f"amibake-batch-{cloud.config.region}-{secrets.token_hex(8)}"
        try:
            # Only if none is recorded yet: two `up`s at once each recorded a bucket of their
            # own, the last record won, and the other bucket was found by nothing. The second
            # takes the first's.
            cloud.ssm.put_parameter(
                Name=BUCKET_PARAMETER, Value=name, Type="String", Overwrite=False, Tier="Standard"
            )
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "ParameterAlreadyExists":
                raise
            name = job_bucket(cloud) or name
    if not check_owned(cloud, name):
        # The recorded name is made, not replaced: not found, it is one an `up` recorded and
        # has not made yet (at once with this one, or interrupted), or one S3 does not find
        # yet; a new name here orphaned that `up`'s bucket.
        where = cloud.config.region
        try:
            s3.create_bucket(
                Bucket=name,
                **(
                    {}
                    if where == "us-east-1"
                    else {"CreateBucketConfiguration": {"LocationConstraint": where}}
                ),
            )
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "BucketAlreadyExists":  # another account's, since: a new one
                raise UserError(
                    f"the job bucket {name} recorded in SSM {BUCKET_PARAMETER} is now another "
                    f"account's: delete the parameter (aws ssm delete-parameter --name "
                    f"{BUCKET_PARAMETER}), and `amibake batch up` makes a new bucket"
                ) from None
            if error_code(exc) != "BucketAlreadyOwnedByYou":  # the other `up` made it first
                raise
    bucket_settled(
        lambda: s3.put_public_access_block(
            Bucket=name,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
    )
    bucket_settled(
        lambda: s3.put_bucket_encryption(
            Bucket=name,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
        )
    )
    # What a SIGKILLed run could not delete goes by itself within a week.
    expire = {
        "ID": "expire",
        "Status": "Enabled",
        "Filter": {"Prefix": ""},
        "Expiration": {"Days": 7},
    }
    bucket_settled(
        lambda: s3.put_bucket_lifecycle_configuration(
            Bucket=name, LifecycleConfiguration={"Rules": [expire]}
        )
    )
    bucket_settled(
        lambda: s3.put_bucket_tagging(
            Bucket=name, Tagging={"TagSet": [{"Key": TAG, "Value": "true"}]}
        )
    )
    return name


def bucket_settled(call: Callable[[], object], also: frozenset[str] = frozenset()) -> None:
    """A setting put on a bucket made seconds before: S3 may not find it yet (NoSuchBucket) or
    be busy making it (OperationAborted) for a while (terraform-provider-aws retries both for
    two minutes); `also`, other codes as passing. `up` stopped there, leaving the bucket
    unencrypted and its public access not blocked until the next `up`."""
    retry_on({"NoSuchBucket", "OperationAborted", *also}, call, within_s=BUCKET_KNOWN_S)


def delete_prefix(cloud: Cloud, bucket: str, prefix: str) -> int:
    """Delete every object under ``prefix`` (all of them for ""); how many there were.

    DeleteObjects answers 200 and lists the objects it could not delete under Errors
    (AccessDenied without s3:DeleteObject, InternalError): CloudError naming them, never a count
    of files said deleted that are still there."""
    s3 = cloud.client("s3")
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            refused = answer.get("Errors", [])
            if refused:
                first = refused[0]
                raise CloudError(
                    f"S3 did not delete {len(refused)} of {len(keys)} files under "
                    f"s3://{bucket}/{prefix} ({first.get('Key')}: {first.get('Code')}, "
                    f"{first.get('Message', '')}): delete them with aws s3 rm --recursive "
                    f"s3://{bucket}/{prefix}"
                )
            count += len(keys)
    return count


def _delete_bucket(cloud: Cloud) -> list[str]:
    name = job_bucket(cloud)
    if name is None:
        return []
    done = []
    if check_owned(cloud, name):
        delete_prefix(cloud, name, "")
        cloud.client("s3").delete_bucket(Bucket=name)
        done.append(f"deleted bucket {name}")
    cloud.ssm.delete_parameter(Name=BUCKET_PARAMETER)
    return done


def names(image: Image) -> tuple[str, str]:
    """(compute environment, queue) names: one environment per image, one queue per arch."""
    return f"amibake-{image.architecture}-{image.image_id}", f"amibake-{image.architecture}"


def up(cloud: Cloud, images: list[Image], spot: bool = True) -> dict[str, Any]:
    batch = cloud.client("batch")
    subnets, groups = _network(cloud)  # first: a wrong or missing network stops here
    service_role, profile = _ensure_iam(cloud)
    bucket = _ensure_bucket(cloud)
    job_role = _ensure_job_role(cloud, bucket)
    result: dict[str, Any] = {
        "queues": {},
        "job_definitions": [],
        "retired": [],
        "bucket": bucket,
    }
    for image in images:
        env_name, queue_name = names(image)
        types = sorted(
            {
                catalog.family(f).instance_type(s)
                for f in image.families
                for s in catalog.family(f).sizes[:3]
            }
        )
        resources: dict[str, Any] = {
            "type": "SPOT" if spot else "EC2",
            "allocationStrategy": "SPOT_PRICE_CAPACITY_OPTIMIZED"
            if spot
            else "BEST_FIT_PROGRESSIVE",
            "minvCpus": 0,
            "maxvCpus": 256,
            "instanceTypes": types,
            "subnets": subnets,
            "securityGroupIds": groups,
            "instanceRole": profile,
            "ec2Configuration": [{"imageType": "ECS_AL2023", "imageIdOverride": image.image_id}],
            "tags": {TAG: "true"},
        }
        env_arn = ensure_environment(
            batch,
            {
                "computeEnvironmentName": env_name,
                "type": "MANAGED",
                "state": "ENABLED",
                "computeResources": resources,
                "serviceRole": service_role,
                "tags": {TAG: "true"},
            },
        )
        result["retired"] += _swap_into_queue(batch, queue_name, env_arn)
        result["retired"] += _drained(batch, queue_name, image.architecture)
        result["queues"][queue_name] = env_name
        for app in image.apps:
            result["job_definitions"].append(
                _job_definition(batch, app, image.architecture, job_role)
            )
    return result


def pages(batch: Any, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
    """Every item a Batch Describe or List call has, page after page: AWS gives at most 100 a
    page and a nextToken, where moto gave all at once."""
    found: list[dict[str, Any]] = []
    for page in batch.get_paginator(operation).paginate(**params):
        found += page.get(key, [])
    return found


def environments(batch: Any, *names: str) -> list[dict[str, Any]]:
    """The compute environments named (by name or ARN), or every one when none is named. One
    deleted is described DELETED for a while after (as terraform-provider-aws's finders, it is
    not there: a wait for it to go waited that out, and failed)."""
    params = {"computeEnvironments": list(names)} if names else {}
    found = pages(batch, "describe_compute_environments", "computeEnvironments", **params)
    return [e for e in found if e.get("status") != "DELETED"]


def queues(batch: Any, *names: str) -> list[dict[str, Any]]:
    """The job queues named (by name or ARN), or every one; a deleted one is not there, as
    for environments."""
    params = {"jobQueues": list(names)} if names else {}
    found = pages(batch, "describe_job_queues", "jobQueues", **params)
    return [q for q in found if q.get("status") != "DELETED"]


def create_queue(batch: Any, **request: Any) -> None:
    _made_once(
        batch, "job queue", request["jobQueueName"], lambda: batch.create_job_queue(**request)
    )


def _made_once(batch: Any, kind: str, name: str, create: Callable[[], object]) -> None:
    """A compute environment's or queue's create, sent again by botocore after a lost answer:
    its "already exists" is the first attempt's (made_once)."""
    made_once(
        create,
        "ClientException",
        lambda: _described(batch, kind, name),
        f"the {kind}",
        within_s=NEW_RESOURCE_VISIBLE_S,
        saying="already exists",
    )


def _described(batch: Any, kind: str, name: str) -> dict[str, Any] | None:
    found = environments(batch, name) if kind == "compute environment" else queues(batch, name)
    return found[0] if found else None


def wait_settled(batch: Any, kind: str, name: str) -> dict[str, Any] | None:
    """The environment or queue once it is no longer CREATING or UPDATING (VALID or INVALID),
    or None when it does not exist."""
    seen: dict[str, Any] = {}

    def settled() -> bool:
        seen["it"] = _described(batch, kind, name)
        return seen["it"] is None or seen["it"].get("status") in ("VALID", "INVALID")

    wait_until(f"{kind} {name}", settled, timeout_s=600)
    found: dict[str, Any] | None = seen["it"]
    return found


def wait_valid(batch: Any, kind: str, name: str) -> None:
    found = wait_settled(batch, kind, name)
    if found is None:
        raise CloudError(f"{kind} {name} does not exist")
    if found.get("status") == "INVALID":
        raise CloudError(f"{kind} {name} is INVALID: {found.get('statusReason')}")


def time_limit_actions(seconds: float = RUNNABLE_LIMIT_S) -> list[dict[str, Any]]:
    """A queue's jobStateTimeLimitActions: cancel a job held RUNNABLE, for a reason Batch can
    act on, after `seconds` (within AWS's 600 to 86,400)."""
    limit = int(min(max(seconds, 600), 86400))
    return [
        {"reason": reason, "state": "RUNNABLE", "maxTimeSeconds": limit, "action": "CANCEL"}
        for reason in TIME_LIMIT_REASONS
    ]


def ensure_environment(
    batch: Any,
    create: dict[str, Any],
    on_created: Callable[[str], None] | None = None,
    wait_s: float = REPLACE_WAIT_S,
) -> str:
    """The VALID compute environment `create` describes (CreateComputeEnvironment's
    parameters), made if missing; its ARN. One that is or goes INVALID is said why, deleted
    and made again, ENVIRONMENT_TRIES times at most: AWS never brings it back to VALID."""
    name = create["computeEnvironmentName"]
    made = 0
    while True:
        found = wait_settled(batch, "compute environment", name)
        if found is None:
            if made:
                time.sleep(wait_s * made)  # IAM propagates in seconds, at times minutes
            with creating("the compute environment"):
                _made_once(
                    batch,
                    "compute environment",
                    name,
                    lambda: batch.create_compute_environment(**create),
                )
                made += 1
                if on_created is not None:
                    on_created(name)
            found = wait_settled(batch, "compute environment", name)
            if found is None:
                raise CloudError(f"compute environment {name} is gone right after it was made")
        if found.get("status") == "VALID":
            _check_unchanged(name, found, create)
            if found.get("state") != create.get("state", "ENABLED"):
                # Left DISABLED (retired while jobs drained, or by an interrupted down): a queue
                # pointed at it places nothing, and its jobs waited RUNNABLE for ever.
                log.info("compute environment %s was %s: enabling it", name, found.get("state"))
                batch.update_compute_environment(
                    computeEnvironment=name, state=create.get("state", "ENABLED")
                )
                wait_settled(batch, "compute environment", name)
            return str(found["computeEnvironmentArn"])
        reason = found.get("statusReason") or "no reason given"
        again = made < ENVIRONMENT_TRIES
        log.warning(
            "compute environment %s is INVALID: %s; deleting it%s",
            name,
            reason,
            " and making it again" if again else "",
        )
        delete_environment(batch, name)
        if not again:
            raise CloudError(
                f"compute environment {name} went INVALID {made} times, last: {reason} (deleted; "
                f"check the IAM roles {INSTANCE_ROLE} and AWSServiceRoleForBatch, then run "
                "`amibake batch up` again)"
            )


# What a compute environment is made with that Batch cannot change in place (a managed
# environment's type, and its subnets, groups and types only through an update policy amibake
# does not use), and how each is said.
_SETTLED = {
    "type": "the market (SPOT or EC2: on-demand)",
    "instanceTypes": "the instance types",
    "subnets": "the subnets",
    "securityGroupIds": "the security groups",
}


def _check_unchanged(name: str, found: dict[str, Any], create: dict[str, Any]) -> None:
    """An environment found under the name was made with other settings (batch up --on-demand
    after a spot up; new subnet_ids or security_group_ids): refused, naming them. It was taken
    as it was, and the change silently did nothing."""
    have, want = found.get("computeResources", {}), create.get("computeResources", {})
    differ = [
        what
        for key, what in _SETTLED.items()
        if key in want and _normal(have.get(key)) != _normal(want[key])
    ]
    if differ:
        raise UserError(
            f"compute environment {name} was made with other {', '.join(differ)} than this up "
            "asks, which Batch does not change in place: run amibake batch down, then batch up "
            "again with these settings (or up as before)"
        )


def _normal(value: Any) -> Any:
    return sorted(value) if isinstance(value, list) else value


def _swap_into_queue(batch: Any, queue: str, env_arn: str) -> list[str]:
    """Point the queue at the environment; retire the environments it replaced."""
    found = queues(batch, queue)
    order = [{"order": 1, "computeEnvironment": env_arn}]
    if not found:
        create_queue(
            batch,
            jobQueueName=queue,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=order,
            jobStateTimeLimitActions=time_limit_actions(),
            tags={TAG: "true"},
        )
        wait_valid(batch, "job queue", queue)
        return []
    current = [
        environment_arn(batch, e["computeEnvironment"]) for e in found[0]["computeEnvironmentOrder"]
    ]
    if current == [env_arn]:
        return []  # already pointing at this image's environment: nothing to do
    # A queue an older amibake made gets the time limits too.
    batch.update_job_queue(
        jobQueue=queue,
        computeEnvironmentOrder=order,
        jobStateTimeLimitActions=time_limit_actions(),
    )
    wait_valid(batch, "job queue", queue)
    retired = [c for c in current if c != env_arn]
    for old in retired:
        _retire(batch, queue, old)
    return retired


def environment_arn(batch: Any, environment: str) -> str:
    """An environment's ARN from its name or ARN (queues may report either)."""
    if environment.startswith("arn:"):
        return environment
    found = environments(batch, environment)
    return str(found[0]["computeEnvironmentArn"]) if found else environment


def _retire(batch: Any, queue: str, environment: str) -> None:
    """Disable an environment the queue no longer uses; delete it once no job is left on it."""
    batch.update_compute_environment(computeEnvironment=environment, state="DISABLED")
    if _busy(batch, queue):
        log.warning(
            "%s disabled; the next batch up deletes it once the queue's jobs drain", environment
        )
        return
    wait_settled(batch, "compute environment", environment.rsplit("/", 1)[-1])
    _delete_environment(batch, environment)


def _busy(batch: Any, queue: str) -> bool:
    """Whether the queue has a job not ended yet (one may run on a retired environment)."""
    return any(
        pages(batch, "list_jobs", "jobSummaryList", jobQueue=queue, jobStatus=s)
        for s in ACTIVE_JOBS
    )


def _drained(batch: Any, queue: str, architecture: str) -> list[str]:
    """The architecture's environments an earlier up retired while the queue's jobs drained
    (DISABLED, in no queue), deleted once none is active: they were kept until batch down, and
    the images they launch from with them (bake --keep leaves such an image)."""
    queued = {
        environment_arn(batch, e["computeEnvironment"])
        for q in queues(batch)
        for e in q.get("computeEnvironmentOrder", [])
    }
    left = [
        str(e["computeEnvironmentArn"])
        for e in environments(batch)
        if e["computeEnvironmentName"].startswith(f"amibake-{architecture}-")
        and e.get("state") == "DISABLED"
        and e["computeEnvironmentArn"] not in queued
    ]
    if not left or _busy(batch, queue):
        return []
    for environment in left:
        wait_settled(batch, "compute environment", environment.rsplit("/", 1)[-1])
        _delete_environment(batch, environment)
    return left


def _job_definition(batch: Any, app: str, architecture: str, job_role: str) -> str:
    name = f"amibake-{app}-{architecture}"
    container = {
        "image": CONTAINER_IMAGE,
        "jobRoleArn": job_role,
        "command": ["/bin/sh", "-c", f"ls /shared/{app} && cat /shared/{app}/manifest.json"],
        "resourceRequirements": [
            {"type": "VCPU", "value": "2"},
            {"type": "MEMORY", "value": "3072"},
        ],
        # The host's tmpfs /shared, with the staged build, seen by the container as /shared.
        "volumes": [{"name": "shared", "host": {"sourcePath": "/shared"}}],
        "mountPoints": [{"sourceVolume": "shared", "containerPath": "/shared", "readOnly": False}],
    }
    active = pages(
        batch, "describe_job_definitions", "jobDefinitions", jobDefinitionName=name, status="ACTIVE"
    )
    for definition in active:
        props = definition.get("containerProperties", {})
        if all(props.get(k) == v for k, v in container.items()):
            return str(definition["jobDefinitionArn"])  # unchanged: no new revision
    made = batch.register_job_definition(
        jobDefinitionName=name,
        type="container",
        containerProperties=container,
        tags={TAG: "true"},
    )
    return str(made["jobDefinitionArn"])


def status(cloud: Cloud) -> dict[str, Any]:
    batch = cloud.client("batch")
    envs = [e for e in environments(batch) if e["computeEnvironmentName"].startswith("amibake-")]
    mine = [q for q in queues(batch) if q["jobQueueName"].startswith("amibake-")]
    defs = [
        d
        for d in pages(batch, "describe_job_definitions", "jobDefinitions", status="ACTIVE")
        if d["jobDefinitionName"].startswith("amibake-")
    ]
    return {
        "compute_environments": {
            e["computeEnvironmentName"]: {
                "state": e.get("state"),
                "status": e.get("status"),
                "image": (e.get("computeResources", {}).get("ec2Configuration") or [{}])[0].get(
                    "imageIdOverride"
                ),
            }
            for e in envs
        },
        "queues": {
            q["jobQueueName"]: [c["computeEnvironment"] for c in q["computeEnvironmentOrder"]]
            for q in mine
        },
        "job_definitions": sorted(f"{d['jobDefinitionName']}:{d['revision']}" for d in defs),
    }


def images_launched(cloud: Cloud) -> dict[str, str]:
    """The images Batch's compute environments launch hosts from (`up`'s and fleet runs'):
    image id -> an environment's name."""
    found: dict[str, str] = {}
    for env in environments(cloud.client("batch")):
        for setting in env.get("computeResources", {}).get("ec2Configuration") or []:
            if setting.get("imageIdOverride"):
                found.setdefault(str(setting["imageIdOverride"]), env["computeEnvironmentName"])
    return found


def _name(arn: str) -> str:
    """A Batch resource by the name it was given (name:revision for a job definition)."""
    return arn.rsplit("/", 1)[-1]


def up_text(result: dict[str, Any]) -> str:
    """`amibake batch up` for a reader (--json keeps the ARNs)."""
    return "\n".join(
        [f"queue {q} -> {e}" for q, e in result["queues"].items()]
        + [f"job definition {_name(d)}" for d in result["job_definitions"]]
        + [f"retired {_name(e)}" for e in result["retired"]]
        + [f"skipped {f}: {why}" for f, why in result.get("skipped", {}).items()]
    )


def status_text(status: dict[str, Any]) -> str:
    """`amibake batch status` for a reader: one line per environment, queue and definition."""
    lines = [
        f"compute environment {name}: {env['state']}, {env['status']}, image {env['image']}"
        for name, env in status["compute_environments"].items()
    ]
    # An environment by its name, as above (Batch gives a queue's as ARNs).
    lines += [f"queue {q} -> {', '.join(map(_name, envs))}" for q, envs in status["queues"].items()]
    lines += [f"job definition {d}" for d in status["job_definitions"]]
    return "\n".join(lines) or "nothing registered (amibake batch up --from-bake registers it)"


def _queue_gone(batch: Any, queue: str) -> bool:
    return not queues(batch, queue)


def stop_jobs(batch: Any, queues: list[str]) -> list[str]:
    """Terminate every job these queues still hold and wait for them to have stopped; returns
    those still stopping. Deleting a queue terminates its jobs in time too, but a run's files
    are removed right after. All queues' jobs are terminated before the one wait: each stops
    in up to the stop timeout, and gc of several left runs waited that out a queue at a time."""
    ids = [job_id for queue in queues for job_id in _terminate_jobs(batch, queue)]
    what = f"job queue{'s' if len(queues) > 1 else ''} {', '.join(queues)}"
    return wait_stopped(batch, ids, what)


def _terminate_jobs(batch: Any, queue: str) -> list[str]:
    """Terminate the queue's jobs; returns their ids. An array's children are listed and
    terminated one by one: its parent cancels those still queued, never those STARTING or
    RUNNING."""
    ids: list[str] = []
    for status in ACTIVE_JOBS:
        for job in pages(batch, "list_jobs", "jobSummaryList", jobQueue=queue, jobStatus=status):
            ids.append(job["jobId"])
            if "size" in job.get("arrayProperties", {}):  # a parent (a child has an index)
                ids += [
                    child["jobId"]
                    for state in ACTIVE_JOBS
                    for child in pages(
                        batch,
                        "list_jobs",
                        "jobSummaryList",
                        arrayJobId=job["jobId"],
                        jobStatus=state,
                    )
                ]
    ids = list(dict.fromkeys(ids))
    for job_id in ids:
        batch.terminate_job(jobId=job_id, reason="amibake: its queue is deleted")
    return ids


def describe_jobs(batch: Any, ids: list[str]) -> list[dict[str, Any]]:
    """DescribeJobs of any number of jobs (it takes 100 ids at most a call); a job it no longer
    knows is left out."""
    found: list[dict[str, Any]] = []
    for start in range(0, len(ids), 100):
        found += batch.describe_jobs(jobs=ids[start : start + 100])["jobs"]
    return found


def wait_stopped(batch: Any, ids: list[str], what: str) -> list[str]:
    """Wait, JOBS_STOPPING_S at most, for these (terminated) jobs to end; returns those that
    have not, said in a warning."""
    waiting = Progress(f"{what}: waiting for terminated jobs to stop")
    while ids:
        ids = [j["jobId"] for j in describe_jobs(batch, ids) if j["status"] not in ENDED_JOBS]
        if not ids:
            break
        if waiting.elapsed > JOBS_STOPPING_S:
            log.warning(
                "%s: %d terminated jobs still not stopped after %.0fs: %s",
                what,
                len(ids),
                JOBS_STOPPING_S,
                ", ".join(ids[:5]),
            )
            break
        waiting.tick(f"{len(ids)} still stopping")
        time.sleep(JOBS_POLL_S)
    waiting.done("stopped")
    return ids


def delete_queue(batch: Any, queue: str) -> None:
    """Disable, then delete, then wait until it is gone (its environments can go after)."""
    batch.update_job_queue(jobQueue=queue, state="DISABLED")
    wait_settled(batch, "job queue", queue)
    batch.delete_job_queue(jobQueue=queue)
    wait_until(f"job queue {queue} to go", functools.partial(_queue_gone, batch, queue))


def _detach(batch: Any, environment: str) -> None:
    """Take the environment out of every queue that orders it (AWS deletes none still in a
    queue): out of the order where the queue has others, else the queue (amibake's or a fleet
    run's) is deleted, as it could take no job anyway."""
    found = environments(batch, environment)
    if not found:
        return
    arn, name = found[0]["computeEnvironmentArn"], found[0]["computeEnvironmentName"]
    for queue in queues(batch):
        order = queue.get("computeEnvironmentOrder", [])
        rest = [o for o in order if o["computeEnvironment"] not in (arn, name)]
        if len(rest) == len(order):
            continue
        if rest:
            batch.update_job_queue(jobQueue=queue["jobQueueName"], computeEnvironmentOrder=rest)
            wait_settled(batch, "job queue", queue["jobQueueName"])
        elif queue["jobQueueName"].startswith(("amibake-", "fleet-")):
            log.warning(
                "deleting job queue %s: its only environment %s goes", queue["jobQueueName"], name
            )
            delete_queue(batch, queue["jobQueueName"])


def _delete_environment(batch: Any, environment: str) -> None:
    """DeleteComputeEnvironment of one out of every queue: the queues' update may not have
    reached it yet, refused as though still in one (terraform-provider-aws#46925)."""
    retry_on(
        {"ClientException"},
        lambda: batch.delete_compute_environment(computeEnvironment=environment),
        within_s=QUEUE_RELEASED_S,
        saying="found existing JobQueue relationship",
    )


def delete_environment(batch: Any, environment: str) -> None:
    """Disable, take out of its queues, delete (AWS terminates its instances), and wait until
    it is gone. An INVALID environment stays INVALID when disabled (terraform-provider-aws
    #21281): only VALID was waited for, and such an environment could never be deleted."""
    batch.update_compute_environment(computeEnvironment=environment, state="DISABLED")
    wait_settled(batch, "compute environment", environment)
    _detach(batch, environment)
    _delete_environment(batch, environment)

    def gone() -> bool:
        return not environments(batch, environment)

    wait_until(f"compute environment {environment} to go", gone)


def down(cloud: Cloud) -> list[str]:
    """Disable and delete the queues, then the compute environments, then the job definitions,
    the hosts' security group and the bucket: nothing `up` made in the region is left. Its IAM
    roles stay: IAM is global, and every region's `up` uses the same ones (free)."""
    batch = cloud.client("batch")
    found = queues(batch)
    _refuse_while_fleet_runs(found)
    done = []
    mine = [q["jobQueueName"] for q in found if q["jobQueueName"].startswith("amibake-")]
    for queue in mine:
        delete_queue(batch, queue)
        done.append(f"deleted job queue {queue}")
    envs = [
        e["computeEnvironmentName"]
        for e in environments(batch)
        if e["computeEnvironmentName"].startswith("amibake-")
    ]
    for env in envs:
        delete_environment(batch, env)
        done.append(f"deleted compute environment {env}")
    for definition in pages(batch, "describe_job_definitions", "jobDefinitions", status="ACTIVE"):
        if definition["jobDefinitionName"].startswith("amibake-"):
            batch.deregister_job_definition(jobDefinition=definition["jobDefinitionArn"])
            done.append(f"deregistered {definition['jobDefinitionName']}:{definition['revision']}")
    return done + _delete_security_groups(cloud) + _delete_bucket(cloud)


def _refuse_while_fleet_runs(found: list[dict[str, Any]]) -> None:
    """A fleet run on Batch has a queue of its own (fleet-RUN-...) and uses what `up` made: its
    job definitions, the job bucket its payloads are in, the hosts' security group. `down`
    deregistered and emptied them under it, and its jobs failed while their hosts were billed."""
    runs = sorted(
        {
            m.group(1)
            for q in found
            if (m := re.fullmatch(r"fleet-(f[bt]-[0-9a-f]+)-.+", str(q["jobQueueName"])))
        }
    )
    if runs:
        raise UserError(
            f"batch down would pull amibake's Batch registration (job definitions, job bucket, "
            f"security group) from under fleet run(s) {', '.join(runs)}: stop each first "
            "(fleet kill RUN; what a dead one left, amibake gc removes), then batch down again"
        )


def _delete_security_groups(cloud: Cloud) -> list[str]:
    """The hosts' group up made (no inbound rule), in whichever VPC it was made: free, but
    something `amibake ls` would list for ever after a `down`."""
    ec2 = cloud.ec2
    done = []
    named = [
        {"Name": "group-name", "Values": [SECURITY_GROUP]},
        {"Name": "tag-key", "Values": [TAG]},
    ]
    for group in every(ec2, "describe_security_groups", "SecurityGroups", Filters=named):
        group_id = str(group["GroupId"])
        delete_security_group(ec2, group_id)
        done.append(f"deleted security group {group['GroupId']}")
    return done
