"""Where moto differs from AWS in a way amibake's (correct) requests run into, filled in moto's
backend so the request on the wire stays exactly what amibake sends to AWS (a rewritten request
would no longer match its signature, which moto checks once IAM enforcement is on)."""

from __future__ import annotations

import copy
import threading
from typing import Any

from amibake.service_models import service_model

# moto's backends are not thread-safe, and the daemon serves requests on threads: a subnet
# hands out addresses from one generator, and two CreateFleet calls at once failed one of them
# with "generator already executing" (a 500, seen once in a clean-clone test run). Every use of
# a backend, by a request or by the daemon's own threads (Batch hosts, the reconcile loop),
# holds this lock; slow work (booting or destroying a sandbox) is done outside it.
BACKENDS = threading.RLock()


def apply() -> None:
    _authorization_by_resource()
    _tags_of_one_resource()
    _create_image_snapshot_tags()
    _image_names_unique()
    _deregister_image_with_snapshots()
    _register_image_as_given()
    _image_imds_support()
    _terminate_once()
    _fleet_network()
    _created_subnets_are_not_default()
    _default_vpc_reaches_the_internet()
    _compute_environment_in_a_queue()
    _compute_environment_name_taken()
    _job_definition_by_revision()
    _batch_action_names()
    _s3_action_names()
    _bucket_policy_by_condition()
    _spot_prices()


def _spot_prices() -> None:
    """moto's spot price history is $0.00001 for every type, stamped 2006: the prices of the
    local cloud's price list instead (amibake/local/pricing.py)."""
    from amibake.local import pricing

    pricing.apply()


def _tags_of_one_resource() -> None:
    """moto finds one resource's tags by matching a pattern against every tag in the region.

    Every tagged object it describes or filters by tag asks for its own tags that way, so a
    DescribeInstances with a tag filter cost (instances x all tags): 82 ms with 92 instances and
    2,000 tags alive in the daemon, growing with every run, where AWS's cost does not grow with
    the account. A filter on one literal resource id is answered from that resource's own
    tags, in the same form and order; any other filter takes moto's way.
    """
    from moto.ec2.models.tags import TagBackend
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    original = TagBackend.describe_tags
    if getattr(original, "_amibake", False):
        return
    wildcard = set("*?[")  # moto's patterns are fnmatch's: a literal id matches only itself

    def describe_tags(self: Any, filters: dict[str, list[str]] | None = None) -> Any:
        ids = (filters or {}).get("resource-id", [])
        if list(filters or {}) != ["resource-id"] or len(ids) != 1 or wildcard & set(ids[0]):
            return original(self, filters)
        resource_id = ids[0]
        resource_type = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
        return [
            {"resource_id": resource_id, "key": k, "value": v, "resource_type": resource_type}
            for k, v in dict(self.tags.get(resource_id, {})).items()
        ]

    describe_tags._amibake = True  # type: ignore[attr-defined]
    describe_tags.__wrapped__ = original  # type: ignore[attr-defined]
    TagBackend.describe_tags = describe_tags  # type: ignore[method-assign]


def _create_image_snapshot_tags() -> None:
    """CreateImage accepts a "snapshot" TagSpecification on EC2; moto raises NotImplementedError.

    The image is created without it, and its tags are then put on the image's snapshot.
    """
    from moto.ec2.models.amis import AmiBackend

    original = AmiBackend.create_image
    if getattr(original, "_amibake", False):
        return

    def create_image(
        self: Any,
        instance_id: str,
        name: str,
        description: str,
        tag_specifications: list[dict[str, Any]],
    ) -> Any:
        snapshot = [s for s in tag_specifications if s.get("ResourceType") == "snapshot"]
        others = [s for s in tag_specifications if s.get("ResourceType") != "snapshot"]
        image = original(self, instance_id, name, description, others)
        for spec in snapshot:
            for tag in spec.get("Tags", []):
                image.ebs_snapshot.add_tag(tag["Key"], tag["Value"])
        return image

    create_image._amibake = True  # type: ignore[attr-defined]
    AmiBackend.create_image = create_image  # type: ignore[method-assign]


def _image_names_unique() -> None:
    """An account's image names are its own in a region: CreateImage or RegisterImage of a name
    one of its images has answers InvalidAMIName.Duplicate (EC2 API reference, CreateImage's
    errors). moto made a second image of that name: a CreateImage sent again after its answer
    was lost made two images, where EC2 makes one and refuses the second."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.amis import AmiBackend

    def refusing(original: Any, name_at: int) -> Any:
        if getattr(original, "_amibake_names", False):
            return original

        def made(self: Any, *args: Any, **kwargs: Any) -> Any:
            name = kwargs.get("name", args[name_at] if len(args) > name_at else None)
            for image in self.amis.values():
                if name and image.name == name and image.owner_id == self.account_id:
                    raise EC2ClientError(
                        "InvalidAMIName.Duplicate",
                        f"AMI name {name} is already in use by AMI {image.id}",
                    )
            return original(self, *args, **kwargs)

        made._amibake_names = True  # type: ignore[attr-defined]
        # The wrapper it wraps may be marked too (the snapshot tags'): kept, or a second
        # apply() took it for unwrapped and stacked both again.
        made._amibake = getattr(original, "_amibake", False)  # type: ignore[attr-defined]
        return made

    AmiBackend.create_image = refusing(AmiBackend.create_image, 1)  # type: ignore[method-assign]
    AmiBackend.register_image = refusing(AmiBackend.register_image, 0)  # type: ignore[method-assign]


def _deregister_image_with_snapshots() -> None:
    """DeregisterImage's DeleteAssociatedSnapshots (EC2, 2025) deletes the image's snapshots
    with it; moto ignores the parameter and leaves them. Done here after moto deregisters."""
    from moto.ec2.responses.amis import AmisResponse

    original = AmisResponse.deregister_image
    if getattr(original, "_amibake", False):
        return

    def deregister_image(self: Any) -> Any:
        image = self.ec2_backend.amis.get(self._get_param("ImageId"))
        snapshot = getattr(image, "ebs_snapshot", None)
        result = original(self)
        if snapshot is not None and self._get_bool_param("DeleteAssociatedSnapshots", False):
            self.ec2_backend.snapshots.pop(snapshot.id, None)
        return result

    deregister_image._amibake = True  # type: ignore[attr-defined]
    AmisResponse.deregister_image = deregister_image  # type: ignore[method-assign]


def _register_image_as_given() -> None:
    """RegisterImage keeps the architecture, root device and root snapshot it is given (EC2
    API reference: Architecture defaults to i386; the root is the mapping at RootDeviceName).
    moto kept the name alone: every registered image was of no architecture, rooted at
    /dev/sda1, on a snapshot moto made of its own, which nothing deleted."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.amis import AmisResponse

    original = AmisResponse.register_image
    if getattr(original, "_amibake", False):
        return

    def register_image(self: Any) -> Any:
        self.error_on_dryrun()
        image = self.ec2_backend.register_image(
            self._get_param("Name"), self._get_param("Description", "")
        )
        image.architecture = self._get_param("Architecture") or "i386"
        image.root_device_name = self._get_param("RootDeviceName") or image.root_device_name
        for mapping in self._get_param("BlockDeviceMappings", []):
            given = (mapping.get("Ebs") or {}).get("SnapshotId")
            snapshot = self.ec2_backend.snapshots.get(given) if given else None
            if mapping.get("DeviceName") == image.root_device_name and snapshot is not None:
                self.ec2_backend.snapshots.pop(image.ebs_snapshot.id, None)  # moto's own
                image.ebs_snapshot, image.root_device_type = snapshot, "ebs"
        return ActionResult({"ImageId": image.id})

    register_image._amibake = True  # type: ignore[attr-defined]
    AmisResponse.register_image = register_image  # type: ignore[method-assign]


def _image_imds_support() -> None:
    """ModifyImageAttribute's ImdsSupport v2.0 (moto accepts and ignores it) is kept on the
    image, and an instance launched from it without MetadataOptions gets EC2's defaults for
    such an image: IMDSv2 required and a PUT response hop limit of 2 (EC2 User Guide,
    "Configure the AMI": two hops, so that containers on the instance reach IMDS). Without an
    image that says so, moto's (and EC2's) defaults stand: tokens optional, one hop."""
    from moto.ec2.models.instances import Instance
    from moto.ec2.responses.amis import AmisResponse

    original_modify = AmisResponse.modify_image_attribute
    if getattr(original_modify, "_amibake", False):
        return

    def modify_image_attribute(self: Any) -> Any:
        support = (self._get_param("ImdsSupport") or {}).get("Value")
        result = original_modify(self)
        image = self.ec2_backend.amis.get(self._get_param("ImageId"))
        if image is not None and support == "v2.0":
            image.imds_support = "v2.0"  # once set, EC2 allows no way back
        return result

    original_init = Instance.__init__

    def init(self: Any, ec2_backend: Any, image_id: str, *args: Any, **kwargs: Any) -> None:
        image = ec2_backend.amis.get(image_id)
        if not kwargs.get("metadata_options") and getattr(image, "imds_support", "") == "v2.0":
            kwargs["metadata_options"] = {"HttpTokens": "required", "HttpPutResponseHopLimit": 2}
        original_init(self, ec2_backend, image_id, *args, **kwargs)

    modify_image_attribute._amibake = True  # type: ignore[attr-defined]
    AmisResponse.modify_image_attribute = modify_image_attribute  # type: ignore[method-assign]
    Instance.__init__ = init  # type: ignore[method-assign]


def _terminate_once() -> None:
    """Terminating a terminated instance changes nothing on EC2: its state reason stays
    (Server.SpotInstanceTermination after a spot reclaim). moto rewrote it to a user's shutdown,
    hiding why the instance went."""
    from moto.ec2.models.instances import Instance

    original = Instance.terminate
    if getattr(original, "_amibake", False):
        return

    def terminate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._state.name == "terminated":
            return copy.copy(self._state)  # what TerminateInstances reports as its previous state
        return original(self, *args, **kwargs)

    terminate._amibake = True  # type: ignore[attr-defined]
    Instance.terminate = terminate  # type: ignore[method-assign]


def _fleet_network() -> None:
    """EC2 Fleet launches with the launch template's network settings: its security groups
    (SecurityGroupIds, or the primary interface's Groups), and AssociatePublicIpAddress true
    gives the instance a public IPv4 in any subnet, false none even in a default one (EC2 user
    guide, "Assign a public IPv4 address during instance launch"); a template that says nothing
    leaves it to the subnet's MapPublicIpOnLaunch. moto's fleets ignored all three: instances
    joined the VPC's default group, not amibake's SSH group, and got no public address, asked
    for or given by a default subnet. So with its InstanceInitiatedShutdownBehavior: moto's
    instances all stopped on a power-off from inside."""
    from moto.ec2.models.fleets import Fleet
    from moto.ec2.utils import random_public_ip

    original = Fleet.__init__
    if getattr(original, "_amibake", False):
        return

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made = [(i["instance"], i.get("launch_spec")) for i in self.on_demand_instances]
        made += [(r.instance, r.launch_spec) for r in self.spot_requests]
        for instance, spec in made:
            data = _template_data(self.ec2_backend, spec)
            wanted, group_ids = _template_network(data)
            if wanted is None and instance.subnet_id:  # the template says nothing: the subnet
                wanted = bool(
                    self.ec2_backend.get_subnet(instance.subnet_id).map_public_ip_on_launch
                )
            if wanted is True and not instance.nics[0].public_ip:
                instance.nics[0].public_ip = random_public_ip()
            elif wanted is False:
                instance.nics[0].public_ip = None
            if group_ids:
                groups = [self.ec2_backend.get_security_group_from_id(g) for g in group_ids]
                instance.security_groups = [g for g in groups if g is not None]
                instance.nics[0]._group_set = list(instance.security_groups)
            behaviour = data.get("InstanceInitiatedShutdownBehavior")
            if behaviour:  # what a power-off from inside does to it: stop (default) or terminate
                instance.instance_initiated_shutdown_behavior = behaviour

    init._amibake = True  # type: ignore[attr-defined]
    Fleet.__init__ = init  # type: ignore[method-assign]


def _created_subnets_are_not_default() -> None:
    """Only a default VPC's subnets are default for their zone and give public addresses; a
    subnet made by CreateSubnet is neither (EC2 user guide, "Default subnets"; its
    MapPublicIpOnLaunch is false until changed). moto took the first subnet of a zone as its
    default, so in an account whose default VPC was deleted, an organisation's private subnet
    handed out public addresses unasked."""
    from moto.ec2.models.subnets import SubnetBackend

    original = SubnetBackend.create_subnet
    if getattr(original, "_amibake", False):
        return

    def create_subnet(self: Any, vpc_id: str, *args: Any, **kwargs: Any) -> Any:
        subnet = original(self, vpc_id, *args, **kwargs)
        if not self.get_vpc(vpc_id).is_default:
            subnet.default_for_az = False
            subnet.map_public_ip_on_launch = False
        return subnet

    create_subnet._amibake = True  # type: ignore[attr-defined]
    SubnetBackend.create_subnet = create_subnet  # type: ignore[method-assign]


def _default_vpc_reaches_the_internet() -> None:
    """AWS's default VPC has an internet gateway attached and a route 0.0.0.0/0 to it in its main
    route table ("Default VPCs", VPC user guide); moto's had neither, so a subnet's way out could
    not be told from a private subnet's."""
    from moto.ec2.models.vpcs import VPCBackend

    original = VPCBackend.create_default_vpc
    if getattr(original, "_amibake", False):
        return

    def create_default_vpc(self: Any) -> Any:
        vpc = original(self)
        gateway = self.create_internet_gateway()
        self.attach_internet_gateway(gateway.id, vpc.id)
        main = next(
            t for t in self.route_tables.values() if t.vpc_id == vpc.id and t.main_association_id
        )
        self.create_route(main.id, "0.0.0.0/0", gateway_id=gateway.id)
        return vpc

    create_default_vpc._amibake = True  # type: ignore[attr-defined]
    VPCBackend.create_default_vpc = create_default_vpc  # type: ignore[method-assign]


def _compute_environment_in_a_queue() -> None:
    """Batch refuses to delete a compute environment a job queue still orders: ClientException
    "Cannot delete, found existing JobQueue relationship" (terraform-provider-aws #2044,
    #13221, #46925). moto deleted it and left the queue pointing at nothing, so a teardown
    that forgot to detach the environment first passed here and failed on AWS."""
    from moto.batch.exceptions import ClientException
    from moto.batch.models import BatchBackend

    original = BatchBackend.delete_compute_environment
    if getattr(original, "_amibake", False):
        return

    def delete(self: Any, compute_environment_name: str) -> None:
        found = self.get_compute_environment(compute_environment_name)
        if found is not None and any(
            found.arn in {e["computeEnvironment"] for e in queue.env_order_json}
            or found in queue.environments
            for queue in self._job_queues.values()
        ):
            raise ClientException("Cannot delete, found existing JobQueue relationship")
        original(self, compute_environment_name)

    delete._amibake = True  # type: ignore[attr-defined]
    BatchBackend.delete_compute_environment = delete  # type: ignore[method-assign]


def _compute_environment_name_taken() -> None:
    """CreateComputeEnvironment of a name the account has: Batch answers ClientException
    "Object already exists", as for a queue's; moto answered InvalidParameterValue."""
    from moto.batch.exceptions import ClientException
    from moto.batch.models import BatchBackend

    original = BatchBackend.create_compute_environment
    if getattr(original, "_amibake", False):
        return

    def create(self: Any, compute_environment_name: str, *args: Any, **kwargs: Any) -> Any:
        if self.get_compute_environment_by_name(compute_environment_name) is not None:
            raise ClientException(f"Object already exists: {compute_environment_name}")
        return original(self, compute_environment_name, *args, **kwargs)

    create._amibake = True  # type: ignore[attr-defined]
    BatchBackend.create_compute_environment = create  # type: ignore[method-assign]


def _job_definition_by_revision() -> None:
    """DescribeJobDefinitions takes each of its `jobDefinitions` as an ARN, a name (every
    revision) or `name:revision` (AWS Batch API reference); moto found nothing by the last, so a
    revision gc had deregistered, or one still active, looked gone."""
    from moto.batch.models import BatchBackend

    original = BatchBackend.get_job_definitions
    if getattr(original, "_amibake", False):
        return

    def get_job_definitions(self: Any, identifier: str) -> list[Any]:
        found: list[Any] = original(self, identifier)
        name, _, revision = identifier.rpartition(":")
        if found or not name or not revision.isdigit() or identifier.startswith("arn:"):
            return found
        return [
            d
            for d in self._job_definitions.values()
            if (d.name, str(d.revision)) == (name, revision)
        ]

    get_job_definitions._amibake = True  # type: ignore[attr-defined]
    BatchBackend.get_job_definitions = get_job_definitions  # type: ignore[method-assign]


def _template_data(backend: Any, spec: Any) -> dict[str, Any]:
    """The LaunchTemplateData of the template version behind a fleet's launch spec ({} if none)."""
    template = getattr(spec, "launch_template_spec", None) or {}
    if "LaunchTemplateId" not in template:
        return {}
    found = backend.get_launch_template(template["LaunchTemplateId"])
    return dict(found.get_version(template.get("Version", found.latest_version_number)).data)


def _template_network(data: dict[str, Any]) -> tuple[bool | None, list[str]]:
    """What a fleet's launch template data says of the primary interface's public address
    (True, False, or None: the subnet decides) and of security groups."""
    public, groups = None, [str(g) for g in data.get("SecurityGroupIds") or []]
    for interface in data.get("NetworkInterfaces") or []:
        if int(interface.get("DeviceIndex", 0)) != 0:
            continue
        if "AssociatePublicIpAddress" in interface:
            public = str(interface["AssociatePublicIpAddress"]).lower() == "true"
        groups += [str(g) for g in interface.get("Groups") or []]
    return public, groups


def _batch_action_names() -> None:
    """Under IAM enforcement moto denied every Batch call, even allowed ones.

    Its Batch responses name the action by the request path's lowercase segment
    ("createcomputeenvironment"), and its policy matching is case-sensitive, so
    batch:CreateComputeEnvironment never matched. AWS matches action names regardless of case.
    The action being authorized gets the operation's own name (from botocore's model), so a
    policy matches as on AWS and a denial names the action as AWS would.
    """
    from moto.iam.access_control import IAMRequest

    original = IAMRequest.__init__
    if getattr(original, "_amibake", False):
        return
    model = service_model("batch")
    names = {name.lower(): name for name in model.operation_names}

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        service, _, action = self._action.partition(":")
        if service == "batch":
            self._action = f"batch:{names.get(action.lower(), action)}"

    init._amibake = True  # type: ignore[attr-defined]
    IAMRequest.__init__ = init  # type: ignore[method-assign]


def _s3_action_names() -> None:
    """moto authorizes some S3 bucket requests under names IAM does not have.

    HeadBucket is s3:ListBucket on AWS; the public access block and default encryption
    sub-resources (query keys publicAccessBlock and encryption) fell through to CreateBucket.
    Named here as in AWS's service authorization reference.
    """
    from moto.s3.responses import ACTION_MAP

    bucket = ACTION_MAP["BUCKET"]
    bucket["HEAD"]["DEFAULT"] = "ListBucket"
    for method, names in {
        "GET": {
            "publicAccessBlock": "GetBucketPublicAccessBlock",
            "encryption": "GetEncryptionConfiguration",
        },
        "PUT": {
            "publicAccessBlock": "PutBucketPublicAccessBlock",
            "encryption": "PutEncryptionConfiguration",
        },
        "DELETE": {
            "publicAccessBlock": "PutBucketPublicAccessBlock",
            "encryption": "PutEncryptionConfiguration",
        },
    }.items():
        bucket[method].update(names)


def _bucket_policy_by_condition() -> None:
    """moto judges a bucket's policy on every object request by action and resource alone,
    blind to Principal and Condition: a statement AWS applies to some requests applied to all.
    The TLS-only Deny (aws:SecureTransport "false") refused every PutObject to the job bucket,
    however it was sent. Judged by the local cloud's evaluator instead, with the context every
    request carries (iam.TRANSPORT); moto passes on nothing of the caller here, so a statement
    naming principals is judged where the caller is known (IAM enforcement's check above)."""
    import json

    from moto.iam.access_control import PermissionResult
    from moto.s3.models import FakeBucket

    from amibake.local import iam

    original = FakeBucket.get_permission
    if getattr(original, "_amibake", False):
        return

    def get_permission(self: Any, action: str, resource: str) -> Any:
        if self.policy is None:
            return PermissionResult.NEUTRAL
        raw = self.policy if isinstance(self.policy, str) else self.policy.decode()
        verdict = iam.decide([json.loads(raw)], iam.Check(action, resource, dict(iam.TRANSPORT)))
        return {"deny": PermissionResult.DENIED, "allow": PermissionResult.PERMITTED}.get(
            verdict, PermissionResult.NEUTRAL
        )

    get_permission._amibake = True  # type: ignore[attr-defined]
    FakeBucket.get_permission = get_permission  # type: ignore[method-assign]


def _authorization_by_resource() -> None:
    """Under IAM enforcement, decide as AWS does: by resource ARN and condition, for the
    authorization requests AWS makes for the call (amibake.local.authorization), where moto
    checks the action alone and denies whatever has a Condition."""
    import json

    from moto.iam.access_control import IAMRequestBase, S3IAMRequest

    from amibake.local import authorization, iam

    original = IAMRequestBase.check_action_permitted
    if getattr(original, "_amibake", False):
        return

    def check_action_permitted(self: Any, resource: str) -> None:
        if self._action == "sts:GetCallerIdentity":  # AWS checks no permission for it
            return
        service, _, action = self._action.partition(":")
        principal = self._access_key.arn
        body = self._body.decode(errors="replace") if isinstance(self._body, bytes) else ""
        if body.lstrip().startswith("{"):
            params = json.loads(body)
        else:
            params = {k: v[0] if isinstance(v, list) and v else v for k, v in self._data.items()}
        if isinstance(self, S3IAMRequest):
            checks = [iam.Check(self._action, resource, {"aws:PrincipalArn": principal})]
        else:
            calls = authorization.Calls(self.account_id, self._region, principal)
            checks = calls.checks(service, action, params)
        policies = list(iam.documents(self._access_key.collect_policies()))
        for one in checks:
            one.context.update(iam.TRANSPORT)
            verdict = iam.decide(policies, one)
            if isinstance(self, S3IAMRequest):
                # the bucket's policy beside the caller's: its explicit Deny wins over the
                # caller's Allow, and its Allow grants what the caller's policies do not
                bucket = resource.split(":::", 1)[-1].split("/", 1)[0]
                held = authorization.bucket_policy(bucket)
                own = iam.decide([held], one) if held else "implicit"
                verdict = next(v for v in ("deny", "allow", "implicit") if v in (verdict, own))
            if verdict != "allow":
                self._action = one.action  # the denial names what was missing
                self._raise_access_denied()

    check_action_permitted._amibake = True  # type: ignore[attr-defined]
    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]
