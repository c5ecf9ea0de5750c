"""Which authorization requests AWS makes for each call amibake sends, read from the call and
from moto's records (a resource's tags, a role's path), for amibake.local.iam to evaluate.

Sources: the Service Authorization Reference's tables for Amazon EC2, IAM, AWS Batch, Amazon S3,
Systems Manager, CloudWatch Logs, Amazon ECR and Amazon ECS (resource types per action,
condition keys); EC2's
"Grant permission to tag resources during creation" (ec2:CreateTags with ec2:CreateAction);
"Control access to EC2 Fleet" (the fleet's RunInstances is authorized as the caller's); IAM's
"Granting a user permissions to pass a role to an AWS service" (iam:PassedToService).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from amibake.local.iam import Check, Context

Params = dict[str, Any]
# EC2 id prefixes -> the resource type in an ARN.
_EC2_TYPES = {
    "i": "instance",
    "ami": "image",
    "snap": "snapshot",
    "vol": "volume",
    "sg": "security-group",
    "lt": "launch-template",
    "fleet": "fleet",
    "subnet": "subnet",
    "vpc": "vpc",
    "key": "key-pair",
    "eni": "network-interface",
}
# What each role-taking call hands a role to.
BATCH_SERVICE = "batch.amazonaws.com"


def _numbered(params: Params, prefix: str) -> list[str]:
    """EC2's list parameters: InstanceId.1, InstanceId.2, ..."""
    found = [(k, v) for k, v in params.items() if re.fullmatch(rf"{re.escape(prefix)}\.\d+", k)]
    return [str(v) for _, v in sorted(found, key=lambda kv: int(kv[0].rsplit(".", 1)[1]))]


def _tag_specs(params: Params, prefix: str = "TagSpecification") -> dict[str, dict[str, str]]:
    """EC2 TagSpecification.N.ResourceType / .Tag.M.Key/Value -> {type: {key: value}}."""
    specs: dict[str, dict[str, str]] = {}
    for key, value in params.items():
        match = re.fullmatch(rf"{prefix}\.(\d+)\.ResourceType", key)
        if match:
            n = match.group(1)
            tags = specs.setdefault(str(value), {})
            for tag_key, tag_value in params.items():
                found = re.fullmatch(rf"{prefix}\.{n}\.Tag\.(\d+)\.Key", tag_key)
                if found:
                    tags[str(tag_value)] = str(
                        params.get(f"{prefix}.{n}.Tag.{found.group(1)}.Value", "")
                    )
    return specs


def _request_tags(tags: dict[str, str]) -> Context:
    context: Context = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    if tags:
        context["aws:TagKeys"] = sorted(tags)
    return context


def _resource_tags(tags: dict[str, str], service: str = "ec2") -> Context:
    prefix = "ec2:ResourceTag" if service == "ec2" else "aws:ResourceTag"
    context: Context = {f"{prefix}/{k}": v for k, v in tags.items()}
    context.update({f"aws:ResourceTag/{k}": v for k, v in tags.items()})
    return context


class Calls:
    """The checks for one call, with moto's backends to read tags and roles from."""

    def __init__(self, account: str, region: str, principal: str) -> None:
        self.account = account
        self.region = region
        self.principal = principal

    # --- moto's records ----------------------------------------------------------------------

    def _ec2(self) -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[self.account][self.region]

    def ec2_tags(self, resource_id: str) -> dict[str, str]:
        backend = self._ec2()
        if resource_id in backend.key_pairs:  # key pairs are named, tagged by their id
            resource_id = backend.key_pairs[resource_id].id
        return dict(backend.tags.get(resource_id, {}))

    def ec2_arn(self, resource_id: str, kind: str | None = None) -> str:
        kind = kind or _EC2_TYPES.get(resource_id.split("-", 1)[0], "")
        owner = "" if kind in ("image", "snapshot") else self.account
        return f"arn:aws:ec2:{self.region}:{owner}:{kind}/{resource_id}"

    def existing(self, resource_id: str, kind: str | None = None) -> Check:
        return Check(
            "", self.ec2_arn(resource_id, kind), _resource_tags(self.ec2_tags(resource_id))
        )

    def role_arn(self, name: str) -> str:
        from moto.iam.models import iam_backends

        try:
            role = iam_backends[self.account]["global"].get_role(name)
            return str(role.arn)
        except Exception:  # not made yet: its ARN as AWS would write it, path unknown
            return f"arn:aws:iam::{self.account}:role/{name}"

    def profile_roles(self, profile_arn: str) -> list[str]:
        from moto.iam.models import iam_backends

        name = profile_arn.rsplit("/", 1)[1]
        try:
            profile = iam_backends[self.account]["global"].get_instance_profile(name)
        except Exception:
            return []
        return [str(r.arn) for r in profile.roles]

    def template(self, template_id: str) -> dict[str, Any]:
        """A launch template's latest version's data (moto keeps the request's fields)."""
        try:
            return dict(self._ec2().get_launch_template(template_id).latest_version().data)
        except Exception:
            return {}

    # --- the checks --------------------------------------------------------------------------

    def checks(self, service: str, action: str, params: Params) -> list[Check]:
        handler = HANDLERS.get(f"{service}:{action}")
        checks = handler(self, params) if handler else [Check("", "*")]
        for check in checks:
            check.action = check.action or f"{service}:{action}"
            check.context.setdefault("aws:PrincipalArn", self.principal)
        return checks


def _created_with_tags(
    calls: Calls, action: str, kind: str, params: Params, extra: list[Check] | None = None
) -> list[Check]:
    """A create that tags what it makes: the create, and ec2:CreateTags with ec2:CreateAction."""
    tags = _tag_specs(params).get(kind, {})
    arn = calls.ec2_arn("*", kind)
    checks = [Check("", arn, _request_tags(tags))]
    if tags:
        checks.append(
            Check("ec2:CreateTags", arn, {**_request_tags(tags), "ec2:CreateAction": action})
        )
    return checks + (extra or [])


def _ids(kind: str, prefix: str) -> Callable[[Calls, Params], list[Check]]:
    def handler(calls: Calls, params: Params) -> list[Check]:
        ids = _numbered(params, prefix) or [str(params.get(prefix, ""))]
        return [calls.existing(i, kind) for i in ids if i]

    return handler


def _create_fleet(calls: Calls, params: Params) -> list[Check]:
    """The fleet, and what it launches from its template, authorized for CreateFleet and, as
    the caller's own RunInstances, for the launch (EC2 Fleet's documented permissions)."""
    checks = _created_with_tags(calls, "CreateFleet", "fleet", params)
    launched = _fleet_launch(calls, params)
    return (
        checks
        + launched
        + [
            Check("ec2:CreateFleet", c.resource, dict(c.context))
            for c in launched
            if c.action == "ec2:RunInstances"
        ]
    )


def _fleet_launch(calls: Calls, params: Params) -> list[Check]:
    checks: list[Check] = []
    template_id = str(
        params.get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateId", "")
    )
    if not template_id:
        return checks
    checks.append(calls.existing(template_id, "launch-template"))
    data = calls.template(template_id)
    # The instances the fleet launches are the caller's RunInstances, from the template.
    run = "ec2:RunInstances"
    specs = {
        s.get("ResourceType", ""): {t["Key"]: t["Value"] for t in s.get("Tags", [])}
        for s in data.get("TagSpecifications", [])
    }
    for kind in ("instance", "volume"):
        tags = specs.get(kind, {})
        arn = calls.ec2_arn("*", kind)
        checks.append(Check(run, arn, _request_tags(tags)))
        if tags:
            checks.append(
                Check(
                    "ec2:CreateTags",
                    arn,
                    {**_request_tags(tags), "ec2:CreateAction": "RunInstances"},
                )
            )
    checks.append(Check(run, calls.ec2_arn("*", "network-interface")))
    checks.append(
        Check(
            run, calls.ec2_arn(template_id, "launch-template"), calls.existing(template_id).context
        )
    )
    if data.get("ImageId"):
        checks.append(Check(run, calls.ec2_arn(str(data["ImageId"]), "image")))
    named = [calls.existing(str(data["KeyName"]), "key-pair")] if data.get("KeyName") else []
    named += [calls.existing(str(group)) for group in data.get("SecurityGroupIds", [])]
    checks += [Check(run, found.resource, found.context) for found in named]
    for name, value in params.items():
        if name.endswith(".SubnetId"):
            checks.append(Check(run, calls.ec2_arn(str(value), "subnet")))
    profile = (data.get("IamInstanceProfile") or {}).get("Arn")
    for role in calls.profile_roles(str(profile)) if profile else []:
        checks.append(Check("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}))
    return checks


def _run_instances(calls: Calls, params: Params) -> list[Check]:
    checks: list[Check] = []
    for kind in ("instance", "volume"):
        checks += _created_with_tags(calls, "RunInstances", kind, params)
    checks.append(Check("", calls.ec2_arn("*", "network-interface")))
    if params.get("ImageId"):
        checks.append(Check("", calls.ec2_arn(str(params["ImageId"]), "image")))
    if params.get("KeyName"):
        checks.append(calls.existing(str(params["KeyName"]), "key-pair"))
    for group in _numbered(params, "SecurityGroupId"):
        checks.append(calls.existing(group))
    profile = params.get("IamInstanceProfile.Arn") or params.get("IamInstanceProfile.Name")
    if profile:
        name = str(profile).rsplit("/", 1)[-1]
        for role in calls.profile_roles(f"instance-profile/{name}"):
            checks.append(Check("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}))
    return checks


def _create_image(calls: Calls, params: Params) -> list[Check]:
    return [
        *_created_with_tags(calls, "CreateImage", "image", params),
        *_created_with_tags(calls, "CreateImage", "snapshot", params)[1:],
        calls.existing(str(params.get("InstanceId", "")), "instance"),
    ]


def _create_tags(calls: Calls, params: Params) -> list[Check]:
    tags = {
        str(params[k]): str(params.get(k[:-3] + "Value", ""))
        for k in params
        if re.fullmatch(r"Tag\.\d+\.Key", k)
    }
    return [
        Check("", c.resource, {**c.context, **_request_tags(tags)})
        for c in (calls.existing(i) for i in _numbered(params, "ResourceId"))
    ]


def _iam_role(field_name: str) -> Callable[[Calls, Params], list[Check]]:
    def handler(calls: Calls, params: Params) -> list[Check]:
        name = str(params.get(field_name, ""))
        if field_name == "RoleName" and params.get("Path"):  # CreateRole: where it will be
            arn = f"arn:aws:iam::{calls.account}:role{params['Path']}{name}"
        else:
            arn = calls.role_arn(name)
        context: Context = {}
        if params.get("PolicyArn"):
            context["iam:PolicyARN"] = str(params["PolicyArn"])
        return [Check("", arn, context)]

    return handler


def _instance_profile(calls: Calls, params: Params) -> list[Check]:
    name = str(params.get("InstanceProfileName", ""))
    path = str(params.get("Path", "")) or _profile_path(calls, name)
    return [Check("", f"arn:aws:iam::{calls.account}:instance-profile{path}{name}")]


def _profile_path(calls: Calls, name: str) -> str:
    from moto.iam.models import iam_backends

    try:
        return str(iam_backends[calls.account]["global"].get_instance_profile(name).path)
    except Exception:
        return "/"


def _service_linked_role(calls: Calls, params: Params) -> list[Check]:
    service = str(params.get("AWSServiceName", ""))
    arn = f"arn:aws:iam::{calls.account}:role/aws-service-role/{service}/*"
    return [Check("", arn, {"iam:AWSServiceName": service})]


def _batch_arn(calls: Calls, kind: str, name: str) -> str:
    if name.startswith("arn:"):
        return name
    return f"arn:aws:batch:{calls.region}:{calls.account}:{kind}/{name}"


def _batch(
    kind: str, field_name: str, roles: tuple[tuple[str, str], ...] = ()
) -> Callable[[Calls, Params], list[Check]]:
    def handler(calls: Calls, params: Params) -> list[Check]:
        checks = [
            Check(
                "",
                _batch_arn(calls, kind, str(params.get(field_name, ""))),
                _request_tags(dict(params.get("tags") or {})),
            )
        ]
        for path, service in roles:
            value: Any = params
            for part in path.split("."):
                value = value.get(part, {}) if isinstance(value, dict) else {}
            if isinstance(value, str) and value:
                arns = calls.profile_roles(value) if ":instance-profile/" in value else [value]
                if ":role/" not in value and ":instance-profile/" not in value:
                    arns = [calls.role_arn(value)]
                for arn in arns:
                    checks.append(Check("iam:PassRole", arn, {"iam:PassedToService": service}))
        return checks

    return handler


def _submit_job(calls: Calls, params: Params) -> list[Check]:
    tags = _request_tags(dict(params.get("tags") or {}))
    return [
        Check("", _batch_arn(calls, "job-queue", str(params.get("jobQueue", ""))), tags),
        Check("", _batch_arn(calls, "job-definition", str(params.get("jobDefinition", ""))), tags),
    ]


def _ssm(calls: Calls, params: Params) -> list[Check]:
    names = [str(n) for n in params.get("Names", [])] or [str(params.get("Name", ""))]
    checks = []
    for name in names:
        public = name.startswith("/aws/service/")
        owner = "" if public else calls.account
        checks.append(Check("", f"arn:aws:ssm:{calls.region}:{owner}:parameter/{name.lstrip('/')}"))
    return checks


def _repository(calls: Calls, params: Params) -> list[Check]:
    """ECR's image reads act on the repository, in the registry (account) the call names."""
    registry = str(params.get("registryId") or calls.account)
    name = str(params.get("repositoryName", ""))
    return [Check("", f"arn:aws:ecr:{calls.region}:{registry}:repository/{name}")]


def _container_instances(calls: Calls, params: Params) -> list[Check]:
    """ECS's container instances, by ARN (…:container-instance/CLUSTER/ID), with ecs:cluster."""
    cluster = str(params.get("cluster") or "default")
    if not cluster.startswith("arn:"):
        cluster = f"arn:aws:ecs:{calls.region}:{calls.account}:cluster/{cluster}"
    name = cluster.rsplit("/", 1)[-1]
    return [
        Check(
            "",
            str(arn)
            if str(arn).startswith("arn:")
            else f"arn:aws:ecs:{calls.region}:{calls.account}:container-instance/{name}/{arn}",
            {"ecs:cluster": cluster},
        )
        for arn in params.get("containerInstances") or []
    ] or [Check("", "*")]


def _log_events(calls: Calls, params: Params) -> list[Check]:
    group, stream = params.get("logGroupName", ""), params.get("logStreamName", "")
    return [
        Check(
            "", f"arn:aws:logs:{calls.region}:{calls.account}:log-group:{group}:log-stream:{stream}"
        )
    ]


HANDLERS: dict[str, Callable[[Calls, Params], list[Check]]] = {
    "ec2:RunInstances": _run_instances,
    "ec2:CreateFleet": _create_fleet,
    "ec2:CreateImage": _create_image,
    "ec2:CreateTags": _create_tags,
    "ec2:CreateKeyPair": lambda c, p: _created_with_tags(c, "CreateKeyPair", "key-pair", p),
    "ec2:ImportKeyPair": lambda c, p: _created_with_tags(c, "ImportKeyPair", "key-pair", p),
    "ec2:CreateLaunchTemplate": lambda c, p: _created_with_tags(
        c, "CreateLaunchTemplate", "launch-template", p
    ),
    "ec2:CreateSecurityGroup": lambda c, p: _created_with_tags(
        c,
        "CreateSecurityGroup",
        "security-group",
        p,
        [Check("", c.ec2_arn(str(p.get("VpcId", "*")), "vpc"))],
    ),
    "ec2:AuthorizeSecurityGroupIngress": _ids("security-group", "GroupId"),
    "ec2:TerminateInstances": _ids("instance", "InstanceId"),
    "ec2:GetConsoleOutput": _ids("instance", "InstanceId"),
    "ec2:DeleteFleets": _ids("fleet", "FleetId"),
    "ec2:DeleteLaunchTemplate": _ids("launch-template", "LaunchTemplateId"),
    "ec2:DeleteSecurityGroup": _ids("security-group", "GroupId"),
    "ec2:DeleteKeyPair": _ids("key-pair", "KeyName"),
    "ec2:DeregisterImage": _ids("image", "ImageId"),
    "ec2:ModifyImageAttribute": _ids("image", "ImageId"),
    "ec2:DeleteSnapshot": _ids("snapshot", "SnapshotId"),
    "ec2:DeleteVolume": _ids("volume", "VolumeId"),
    "iam:CreateRole": _iam_role("RoleName"),
    "iam:GetRole": _iam_role("RoleName"),
    "iam:PutRolePolicy": _iam_role("RoleName"),
    "iam:AttachRolePolicy": _iam_role("RoleName"),
    "iam:DetachRolePolicy": _iam_role("RoleName"),
    "iam:DeleteRole": _iam_role("RoleName"),
    "iam:UpdateAssumeRolePolicy": _iam_role("RoleName"),
    "iam:CreateInstanceProfile": _instance_profile,
    "iam:GetInstanceProfile": _instance_profile,
    "iam:AddRoleToInstanceProfile": _instance_profile,
    "iam:CreateServiceLinkedRole": _service_linked_role,
    "batch:CreateComputeEnvironment": _batch(
        "compute-environment",
        "computeEnvironmentName",
        (("computeResources.instanceRole", "ec2.amazonaws.com"), ("serviceRole", BATCH_SERVICE)),
    ),
    "batch:UpdateComputeEnvironment": _batch("compute-environment", "computeEnvironment"),
    "batch:DeleteComputeEnvironment": _batch("compute-environment", "computeEnvironment"),
    "batch:CreateJobQueue": _batch("job-queue", "jobQueueName"),
    "batch:UpdateJobQueue": _batch("job-queue", "jobQueue"),
    "batch:DeleteJobQueue": _batch("job-queue", "jobQueue"),
    "batch:RegisterJobDefinition": _batch(
        "job-definition",
        "jobDefinitionName",
        (("containerProperties.jobRoleArn", "ecs-tasks.amazonaws.com"),),
    ),
    "batch:DeregisterJobDefinition": _batch("job-definition", "jobDefinition"),
    "batch:SubmitJob": _submit_job,
    "batch:TerminateJob": _batch("job", "jobId"),
    "ssm:GetParameter": _ssm,
    "ssm:GetParameters": _ssm,
    "ssm:PutParameter": _ssm,
    "ssm:DeleteParameter": _ssm,
    "logs:GetLogEvents": _log_events,
    # ecr:GetAuthorizationToken takes no resource ("*", the default).
    "ecr:BatchGetImage": _repository,
    "ecr:DescribeImages": _repository,
    "ecr:GetDownloadUrlForLayer": _repository,
    "ecs:DescribeContainerInstances": _container_instances,
}


def bucket_policy(bucket: str) -> dict[str, Any] | None:
    """An S3 bucket's own policy (a resource-based policy, evaluated beside the caller's)."""
    from moto.s3.models import s3_backends

    held = s3_backends.bucket_accounts.get(bucket)
    if held is None:
        return None
    partition, account = held
    found = s3_backends[account][partition].buckets.get(bucket)
    raw = getattr(found, "policy", None)
    if not raw:
        return None
    return dict(json.loads(raw if isinstance(raw, str) else raw.decode()))
