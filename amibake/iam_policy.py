"""``amibake iam-policy``: the least-privilege IAM policy amibake needs, by command.

Every action here is one amibake calls, or one AWS checks on its behalf: ``ec2:CreateTags`` for
tags applied at creation, ``ec2:RunInstances`` for what an EC2 Fleet launches, ``iam:PassRole``
for the roles Batch is given, ``batch:TagResource`` for tags on Batch resources. A test runs the
real commands and checks every call they make is listed here (ACTIONS).

Each action acts only where SCOPES says: on resources amibake tags at creation
(``aws:RequestTag/amibake:run-id``) and later only on resources bearing that tag
(``ec2:ResourceTag/amibake:run-id``); on Batch resources and roles by amibake's names and IAM
path; passing only amibake's roles, and only to the services that use them; attaching only the
managed policy ECS needs. Actions AWS cannot scope (describes, lists) are on "*". The statements
are grouped by command (build, bake, batch, fleet, gc), so a user grants what they run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from amibake.errors import UserError

# What finding amibake's resources reads (gc and ls alike): its describes, by tag and by id.
_FIND = [
    "batch:DescribeComputeEnvironments",
    "batch:DescribeJobDefinitions",
    "batch:DescribeJobQueues",
    "ec2:DescribeFleets",
    "ec2:DescribeImages",
    "ec2:DescribeInstances",
    "ec2:DescribeKeyPairs",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSnapshots",
    "ec2:DescribeVolumes",
]
_LAUNCH = [
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:CreateFleet",
    "ec2:CreateLaunchTemplate",
    "ec2:CreateSecurityGroup",
    "ec2:CreateTags",
    "ec2:DeleteFleets",
    "ec2:DeleteKeyPair",
    "ec2:DeleteLaunchTemplate",
    "ec2:DeleteSecurityGroup",
    "ec2:DescribeFleets",
    "ec2:DescribeImages",  # the base image's root device, whose volume the launch encrypts
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances",
    # A key pair's cleanup within a minute of its creation: found first, as a delete by name
    # of a key EC2 does not know yet succeeds and deletes nothing.
    "ec2:DescribeKeyPairs",
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcs",
    "ec2:GetConsoleOutput",
    # The run's key pair is made here and imported: its private half never leaves this machine.
    "ec2:ImportKeyPair",
    "ec2:RunInstances",
    "ec2:TerminateInstances",
    # Spot's service-linked role: looked up before a spot launch, made once if missing.
    "iam:CreateServiceLinkedRole",
    "iam:ListRoles",
    "ssm:GetParameter",  # bake: the base image of one architecture
    "ssm:GetParameters",  # build: every family's base image at once
]

ACTIONS: dict[str, list[str]] = {
    "build": _LAUNCH,
    "bake": [
        *_LAUNCH,
        "ec2:CreateImage",
        "ec2:DeleteSnapshot",
        "ec2:DeregisterImage",
        "ec2:ModifyImageAttribute",
        "batch:DescribeComputeEnvironments",  # bake --keep: not an image Batch launches from
    ],
    "batch": [
        "batch:CreateComputeEnvironment",
        "batch:CreateJobQueue",
        "batch:DeleteComputeEnvironment",
        "batch:DeleteJobQueue",
        "batch:DeregisterJobDefinition",
        "batch:DescribeComputeEnvironments",
        "batch:DescribeJobDefinitions",
        "batch:DescribeJobQueues",
        "batch:ListJobs",
        "batch:RegisterJobDefinition",
        "batch:TagResource",
        "batch:UpdateComputeEnvironment",
        "batch:UpdateJobQueue",
        "ec2:CreateSecurityGroup",
        "ec2:CreateTags",
        "ec2:DescribeImages",
        "ec2:DeleteSecurityGroup",
        "ec2:DescribeRouteTables",  # subnet_ids' way out to ECS (batch._check_way_out)
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSubnets",
        "ec2:DescribeVpcEndpoints",
        "ec2:DescribeVpcs",
        "iam:AddRoleToInstanceProfile",
        "iam:AttachRolePolicy",
        "iam:CreateInstanceProfile",
        "iam:CreateRole",
        "iam:CreateServiceLinkedRole",
        "iam:GetInstanceProfile",
        "iam:GetRole",
        "iam:ListRoles",
        "iam:PassRole",
        # An older amibake's job role gets the trust that names this account's ECS tasks only.
        "iam:UpdateAssumeRolePolicy",
        # The job bucket's name (random, so nobody can take it first) is recorded here.
        "ssm:DeleteParameter",
        "ssm:GetParameter",
        "ssm:PutParameter",
        # The job bucket: created, locked down and emptied with the environments.
        "s3:CreateBucket",
        "s3:DeleteBucket",
        "s3:DeleteObject",
        "s3:ListBucket",
        # The job role reads and writes the run files by the bucket's own policy, so no role
        # amibake may pass needs a policy amibake writes (iam:PutRolePolicy would let its
        # holder give that role anything, then pass it).
        "s3:PutBucketPolicy",
        # Not called by batch, but whoever may write the bucket's policy could grant them to
        # itself there: granted outright, nothing is gained by rewriting it (parliament's
        # resource-policy escalation check).
        "s3:GetObject",
        "s3:PutObject",
        "s3:PutBucketPublicAccessBlock",
        "s3:PutBucketTagging",
        "s3:PutEncryptionConfiguration",
        "s3:PutLifecycleConfiguration",
    ],
    # fleet bench and tune: builds (amibake build's), instances per type (the same launch),
    # prices, and with executor = "batch" a run's own environment, queue and array jobs.
    "fleet": [
        *_LAUNCH,
        "ec2:DescribeAvailabilityZones",
        "ec2:DescribeSpotPriceHistory",
        "pricing:GetProducts",
        "batch:CreateComputeEnvironment",
        "batch:CreateJobQueue",
        "batch:DeleteComputeEnvironment",
        "batch:DeleteJobQueue",
        "batch:DescribeComputeEnvironments",
        "batch:DescribeJobDefinitions",
        "batch:DescribeJobQueues",
        "batch:DescribeJobs",
        "batch:ListJobs",
        "batch:SubmitJob",
        "batch:TagResource",
        "batch:TerminateJob",
        "batch:UpdateComputeEnvironment",
        "batch:UpdateJobQueue",
        "iam:PassRole",
        "logs:GetLogEvents",
        "s3:DeleteObject",
        # image = an ECR image (issue 23). Preflight reads its manifest (BatchGetImage; the
        # config blob of a single-architecture image through GetDownloadUrlForLayer; the tags
        # it has when the one named is missing, DescribeImages) and logs in (GetAuthorizationToken).
        # The ssh executor's instances have no instance profile: they pull with the token this
        # caller got, which ECR authorizes as this caller, by the same two read actions.
        # Batch's hosts pull with their instance role, whose AmazonEC2ContainerServiceforEC2Role
        # already grants ECR reads.
        "ecr:BatchGetImage",
        "ecr:DescribeImages",
        "ecr:GetAuthorizationToken",
        "ecr:GetDownloadUrlForLayer",
        # executor = "batch" with an image: the run's own job definition (amibake-image-*),
        # and where a job ran, which on AWS only ECS names (its container instance).
        "batch:DeregisterJobDefinition",
        "batch:RegisterJobDefinition",
        "ecs:DescribeContainerInstances",
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
    ],
    # amibake ls and gc --dry-run: what amibake owns, read only (its sizes and ages included).
    "ls": [
        *_FIND,
        "s3:ListBucket",  # the job bucket's objects: their count and bytes
        "ssm:GetParameter",  # where the job bucket's name is recorded
    ],
    "gc": [
        "batch:DeleteComputeEnvironment",
        "batch:DeleteJobQueue",
        "batch:DeregisterJobDefinition",  # a run's, an image run's own (fleet kill)
        # a run's queue's jobs, stopped before the queue goes (gc.delete)
        "batch:DescribeJobs",
        "batch:ListJobs",
        "batch:TerminateJob",
        "batch:UpdateComputeEnvironment",
        "batch:UpdateJobQueue",
        "ec2:DeleteFleets",
        "ec2:DeleteKeyPair",
        "ec2:DeleteLaunchTemplate",
        "ec2:DeleteSecurityGroup",
        "ec2:DeleteSnapshot",
        "ec2:DeleteVolume",
        "ec2:DeregisterImage",
        "ec2:TerminateInstances",
        *_FIND,
        # A SIGKILLed fleet run's files in the job bucket (its payload, results, monitor CSVs).
        "s3:DeleteObject",
        "s3:ListBucket",
        "ssm:GetParameter",  # where the job bucket's name is recorded
    ],
}
# Called, but AWS checks no permission for them (and ignores a Deny): not in the policy.
NEEDS_NO_PERMISSION = {"sts:GetCallerIdentity"}
# S3 operations whose IAM action has another name.
S3_ACTION = {
    "HeadBucket": "ListBucket",
    "ListObjectsV2": "ListBucket",
    "DeleteObjects": "DeleteObject",
    "PutPublicAccessBlock": "PutBucketPublicAccessBlock",
    "PutBucketEncryption": "PutEncryptionConfiguration",
    "PutBucketLifecycleConfiguration": "PutLifecycleConfiguration",
    "HeadObject": "GetObject",
}


def action_of(service: str, operation: str) -> str:
    """The IAM action AWS checks for an API operation."""
    if service == "s3":
        operation = S3_ACTION.get(operation, operation)
    return f"{service}:{operation}"


@dataclass(frozen=True)
class Scope:
    resources: tuple[str, ...]
    condition: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (operator, key, values)

    def as_json(self) -> dict[str, dict[str, str | list[str]]]:
        out: dict[str, dict[str, str | list[str]]] = {}
        for operator, key, values in self.condition:
            out.setdefault(operator, {})[key] = values[0] if len(values) == 1 else list(values)
        return out


RUN_TAG = "amibake:run-id"
EC2 = "arn:aws:ec2:*:*:"


def _ec2(*kinds: str) -> tuple[str, ...]:
    """EC2 ARN patterns; images and snapshots have no account in their ARNs."""
    return tuple(f"arn:aws:ec2:*:{'' if k in ('image', 'snapshot') else '*'}:{k}/*" for k in kinds)


ANYWHERE = Scope(("*",))  # actions AWS cannot scope to a resource (describes, lists)
# Made by amibake: the create call carries its run-id tag.
CREATED = (("Null", f"aws:RequestTag/{RUN_TAG}", ("false",)),)
# amibake's own: the resource bears its run-id tag.
OURS = (("Null", f"ec2:ResourceTag/{RUN_TAG}", ("false",)),)
TAGGED_AT_CREATION = (
    (
        "StringEquals",
        "ec2:CreateAction",
        (
            "CreateFleet",
            "CreateImage",
            "CreateLaunchTemplate",
            "CreateSecurityGroup",
            "ImportKeyPair",
            "RunInstances",
        ),
    ),
)
ROLES = ("arn:aws:iam::*:role/amibake/*",)
PROFILES = ("arn:aws:iam::*:instance-profile/amibake/*",)
BATCH_SERVICE_ROLE = "arn:aws:iam::*:role/aws-service-role/batch.amazonaws.com/*"
BUCKETS = ("arn:aws:s3:::amibake-batch-*",)
# Batch resources by amibake's names: `amibake batch up`'s (amibake-*) and fleet runs' (fleet-*).
BATCH_NAMES = tuple(
    f"arn:aws:batch:*:*:{kind}/{prefix}-*"
    for kind in ("compute-environment", "job-queue")
    for prefix in ("amibake", "fleet")
)
JOB_DEFINITIONS = ("arn:aws:batch:*:*:job-definition/amibake-*",)
# The user's image repositories. Not narrowed to the caller's account: an image may be another
# account's, shared by its repository policy (the reference names the registry). The region is
# the run's, which is any the user runs in.
REPOSITORIES = ("arn:aws:ecr:*:*:repository/*",)
# A Batch environment's ECS cluster is named after it (NAME_Batch_UUID): fleet runs' are fleet-*.
CONTAINER_INSTANCES = ("arn:aws:ecs:*:*:container-instance/fleet-*",)

SCOPES: dict[str, tuple[Scope, ...]] = {
    **{
        a: (ANYWHERE,)
        for a in (
            "ec2:DescribeAvailabilityZones",
            "ec2:DescribeFleets",
            "ec2:DescribeImages",
            "ec2:DescribeInstanceTypeOfferings",
            "ec2:DescribeInstanceTypes",
            "ec2:DescribeInstances",
            "ec2:DescribeKeyPairs",
            "ec2:DescribeLaunchTemplates",
            "ec2:DescribeRouteTables",
            "ec2:DescribeSecurityGroups",
            "ec2:DescribeSnapshots",
            "ec2:DescribeSpotPriceHistory",
            "ec2:DescribeSubnets",
            "ec2:DescribeVolumes",
            "ec2:DescribeVpcEndpoints",
            "ec2:DescribeVpcs",
            "batch:DescribeComputeEnvironments",
            "batch:DescribeJobDefinitions",
            "batch:DescribeJobQueues",
            "batch:DescribeJobs",
            "batch:ListJobs",
            "iam:ListRoles",
            "pricing:GetProducts",
            # ECR's token is the registry's, not a repository's: AWS takes no resource for it.
            "ecr:GetAuthorizationToken",
        )
    },
    **{
        a: (Scope(REPOSITORIES),)
        for a in ("ecr:BatchGetImage", "ecr:DescribeImages", "ecr:GetDownloadUrlForLayer")
    },
    "ecs:DescribeContainerInstances": (Scope(CONTAINER_INSTANCES),),
    # AWS's public parameters (the base AMIs) have no account in their ARNs: "*" matches none.
    "ssm:GetParameter": (
        Scope(("arn:aws:ssm:*:*:parameter/aws/service/*", "arn:aws:ssm:*:*:parameter/amibake/*")),
    ),
    "ssm:GetParameters": (Scope(("arn:aws:ssm:*:*:parameter/aws/service/*",)),),
    "ssm:PutParameter": (Scope(("arn:aws:ssm:*:*:parameter/amibake/*",)),),
    "ssm:DeleteParameter": (Scope(("arn:aws:ssm:*:*:parameter/amibake/*",)),),
    # What a launch makes, tagged at creation; and what it launches from.
    "ec2:ImportKeyPair": (Scope(_ec2("key-pair"), CREATED),),
    "ec2:CreateLaunchTemplate": (Scope(_ec2("launch-template"), CREATED),),
    "ec2:CreateSecurityGroup": (
        Scope(_ec2("security-group"), CREATED),
        Scope(_ec2("security-group"), (("Null", "aws:RequestTag/amibake:batch", ("false",)),)),
        Scope(_ec2("vpc")),
    ),
    # An instant EC2 Fleet is authorized for its fleet and, as RunInstances is, for what it
    # launches: created resources must carry the run's tag, what it launches from must be ours
    # (the AMI, subnet and network interface are not amibake's to tag).
    "ec2:CreateFleet": (
        Scope(_ec2("fleet", "instance", "volume"), CREATED),
        Scope(_ec2("security-group", "key-pair", "launch-template"), OURS),
        Scope(_ec2("image", "subnet", "network-interface")),
    ),
    "ec2:RunInstances": (
        Scope(_ec2("instance", "volume"), CREATED),
        Scope(_ec2("security-group", "key-pair", "launch-template"), OURS),
        Scope(_ec2("image", "subnet", "network-interface")),
    ),
    "ec2:CreateTags": (
        Scope(
            _ec2(
                "fleet",
                "image",
                "instance",
                "key-pair",
                "launch-template",
                "security-group",
                "snapshot",
                "volume",
            ),
            TAGGED_AT_CREATION,
        ),
        # After creation, only amibake:kept (a baked image is a product, not a leftover), and
        # only on what is amibake's: tagging someone else's resource with amibake's run id
        # would put it in reach of every action scoped to that tag.
        Scope(
            _ec2("image", "snapshot"),
            (*OURS, ("ForAllValues:StringEquals", "aws:TagKeys", ("amibake:kept",))),
        ),
    ),
    # A run's groups carry its run id; Batch's hosts' group (batch up's, deleted by batch down)
    # carries amibake:batch, as it was made with.
    "ec2:DeleteSecurityGroup": (
        Scope(_ec2("security-group"), OURS),
        Scope(_ec2("security-group"), (("Null", "ec2:ResourceTag/amibake:batch", ("false",)),)),
    ),
    "ec2:CreateImage": (
        Scope(_ec2("image", "snapshot"), CREATED),
        Scope(_ec2("instance"), OURS),
    ),
    **{
        a: (Scope(_ec2(*kinds), OURS),)
        for a, kinds in {
            "ec2:AuthorizeSecurityGroupIngress": ("security-group",),
            "ec2:DeleteKeyPair": ("key-pair",),
            "ec2:DeleteLaunchTemplate": ("launch-template",),
            "ec2:DeleteFleets": ("fleet",),
            "ec2:TerminateInstances": ("instance",),
            "ec2:GetConsoleOutput": ("instance",),
            "ec2:DeregisterImage": ("image",),
            "ec2:ModifyImageAttribute": ("image",),
            "ec2:DeleteSnapshot": ("snapshot",),
            "ec2:DeleteVolume": ("volume",),
        }.items()
    },
    # Batch: amibake's names only; its roles, passed only to the services that use them.
    **{
        a: (Scope(BATCH_NAMES),)
        for a in (
            "batch:CreateComputeEnvironment",
            "batch:UpdateComputeEnvironment",
            "batch:DeleteComputeEnvironment",
            "batch:CreateJobQueue",
            "batch:UpdateJobQueue",
            "batch:DeleteJobQueue",
        )
    },
    "batch:RegisterJobDefinition": (Scope(JOB_DEFINITIONS),),
    "batch:DeregisterJobDefinition": (Scope(JOB_DEFINITIONS),),
    "batch:TagResource": (Scope(BATCH_NAMES + JOB_DEFINITIONS),),
    "batch:SubmitJob": (Scope((*BATCH_NAMES, *JOB_DEFINITIONS, "arn:aws:batch:*:*:job/*")),),
    "batch:TerminateJob": (Scope(("arn:aws:batch:*:*:job/*",)),),
    "iam:CreateRole": (Scope(ROLES),),
    "iam:GetRole": (Scope(ROLES),),
    "iam:UpdateAssumeRolePolicy": (Scope(ROLES),),
    "iam:AttachRolePolicy": (
        Scope(
            ROLES,
            (
                (
                    "ArnEquals",
                    "iam:PolicyARN",
                    ("arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role",),
                ),
            ),
        ),
    ),
    "iam:CreateInstanceProfile": (Scope(PROFILES),),
    "iam:GetInstanceProfile": (Scope(PROFILES),),
    "iam:AddRoleToInstanceProfile": (Scope(PROFILES),),
    "iam:PassRole": (
        Scope(
            ROLES,
            (
                (
                    "StringEquals",
                    "iam:PassedToService",
                    ("batch.amazonaws.com", "ec2.amazonaws.com", "ecs-tasks.amazonaws.com"),
                ),
            ),
        ),
        Scope(
            (BATCH_SERVICE_ROLE,),
            (("StringEquals", "iam:PassedToService", ("batch.amazonaws.com",)),),
        ),
    ),
    # The roles Batch and spot need once per account (what their consoles make on first use).
    "iam:CreateServiceLinkedRole": (
        Scope(
            (BATCH_SERVICE_ROLE,),
            (("StringEquals", "iam:AWSServiceName", ("batch.amazonaws.com",)),),
        ),
        Scope(
            ("arn:aws:iam::*:role/aws-service-role/spot.amazonaws.com/*",),
            (("StringEquals", "iam:AWSServiceName", ("spot.amazonaws.com",)),),
        ),
    ),
    # The job bucket, by amibake's name; its objects.
    **{
        a: (Scope(BUCKETS),)
        for a in (
            "s3:CreateBucket",
            "s3:DeleteBucket",
            "s3:ListBucket",
            "s3:PutBucketPolicy",
            "s3:PutBucketPublicAccessBlock",
            "s3:PutBucketTagging",
            "s3:PutEncryptionConfiguration",
            "s3:PutLifecycleConfiguration",
        )
    },
    **{
        a: (Scope(tuple(f"{b}/*" for b in BUCKETS)),)
        for a in ("s3:DeleteObject", "s3:GetObject", "s3:PutObject")
    },
    "logs:GetLogEvents": (Scope(("arn:aws:logs:*:*:log-group:/aws/batch/job:*",)),),
}


def statements(command: str) -> list[dict[str, Any]]:
    """The command's statements: its actions grouped by where they may act."""
    grouped: dict[Scope, list[str]] = {}
    for action in sorted(set(ACTIONS[command])):
        for scope in SCOPES.get(action, ()):
            grouped.setdefault(scope, []).append(action)
    out = []
    for n, (scope, acts) in enumerate(grouped.items(), start=1):
        statement: dict[str, Any] = {
            "Sid": f"Amibake{command.capitalize()}{n}",
            "Effect": "Allow",
            "Action": acts,
            "Resource": list(scope.resources) if len(scope.resources) > 1 else scope.resources[0],
        }
        if scope.condition:
            statement["Condition"] = scope.as_json()
        out.append(statement)
    return out


def document(commands: list[str] | None = None) -> dict[str, Any]:
    """The policy document for the commands (all by default)."""
    chosen = commands or list(ACTIONS)
    unknown = [c for c in chosen if c not in ACTIONS]
    if unknown:
        raise UserError(
            f"iam-policy: unknown command {unknown[0]!r}; choose from {', '.join(ACTIONS)}"
        )
    return {
        "Version": "2012-10-17",
        "Statement": [s for command in chosen for s in statements(command)],
    }


def actions(commands: list[str] | None = None) -> set[str]:
    return {a for c in (commands or list(ACTIONS)) for a in ACTIONS[c]}


def unscoped() -> list[str]:
    """Actions listed for a command with no scope saying where they may act (a test keeps this
    empty: an action without one would not be in the policy at all)."""
    return sorted({a for acts in ACTIONS.values() for a in acts} - set(SCOPES))


def render(commands: list[str] | None = None) -> str:
    return json.dumps(document(commands), indent=2)
