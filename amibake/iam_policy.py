"""``amibake iam-policy``: the least-privilege IAM policy amibake needs, one statement a command.

Every action here is one amibake calls, or one AWS checks on its behalf: ``ec2:CreateTags`` for
tags applied at creation, ``ec2:RunInstances`` for what an EC2 Fleet launches, ``iam:PassRole``
for the Batch instance role, ``batch:TagResource`` for tags on Batch resources. A test runs the
real commands and checks every call they make is listed here.
"""

from __future__ import annotations

import json
from typing import Any

from amibake.errors import UserError

_LAUNCH = [
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:CreateFleet",
    "ec2:CreateKeyPair",
    "ec2:CreateLaunchTemplate",
    "ec2:CreateSecurityGroup",
    "ec2:CreateTags",
    "ec2:DeleteFleets",
    "ec2:DeleteKeyPair",
    "ec2:DeleteLaunchTemplate",
    "ec2:DeleteSecurityGroup",
    "ec2:DescribeFleets",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances",
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcs",
    "ec2:GetConsoleOutput",
    "ec2:RunInstances",
    "ec2:TerminateInstances",
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
        "ec2:DescribeImages",
        "ec2:ModifyImageAttribute",
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
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSubnets",
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
        "iam:PutRolePolicy",
        # The job bucket's name (random, so nobody can take it first) is recorded here.
        "ssm:DeleteParameter",
        "ssm:GetParameter",
        "ssm:PutParameter",
        # The job bucket: created, locked down and emptied with the environments.
        "s3:CreateBucket",
        "s3:DeleteBucket",
        "s3:DeleteObject",
        "s3:ListBucket",
        "s3:PutBucketPublicAccessBlock",
        "s3:PutBucketTagging",
        "s3:PutEncryptionConfiguration",
        "s3:PutLifecycleConfiguration",
    ],
    "gc": [
        "batch:DeleteComputeEnvironment",
        "batch:DeleteJobQueue",
        "batch:DescribeComputeEnvironments",
        "batch:DescribeJobQueues",
        "batch:UpdateComputeEnvironment",
        "batch:UpdateJobQueue",
        "ec2:DeleteFleets",
        "ec2:DeleteKeyPair",
        "ec2:DeleteLaunchTemplate",
        "ec2:DeleteSecurityGroup",
        "ec2:DeleteSnapshot",
        "ec2:DeleteVolume",
        "ec2:DeregisterImage",
        "ec2:DescribeFleets",
        "ec2:DescribeImages",
        "ec2:DescribeInstances",
        "ec2:DescribeKeyPairs",
        "ec2:DescribeLaunchTemplates",
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSnapshots",
        "ec2:DescribeVolumes",
        "ec2:TerminateInstances",
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
        "Statement": [
            {
                "Sid": f"Amibake{command.capitalize()}",
                "Effect": "Allow",
                "Action": sorted(set(ACTIONS[command])),
                "Resource": "*",
            }
            for command in chosen
        ],
    }


def actions(commands: list[str] | None = None) -> set[str]:
    return {a for s in document(commands)["Statement"] for a in s["Action"]}


def render(commands: list[str] | None = None) -> str:
    return json.dumps(document(commands), indent=2)
