"""Any account shape (issue 26, finding 12): an account without a default VPC builds in the
subnets it names, instances get the public address SSH dials because amibake asks for it, and
an instance SSH can never reach is named at once instead of after the SSH timeout.

Each test runs a local cloud of its own, whose default VPC it deletes as organisations do: the
local cloud then refuses a launch without a subnet (VPCIdNotSpecified), as AWS does."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from amibake import pipelines
from amibake.cli import main
from amibake.cloud import Cloud, reach
from amibake.cloud.ec2 import zones_offering
from amibake.connect import connect
from amibake.errors import CloudError, UserError
from amibake.journal import Journal
from amibake.local import control
from tests.helpers import base_ami, own_local_cloud, tagged_alive, wait_until_clean
from tests.test_build import FIXTURES

FAMILY = "c5a"  # data: the trivial recipe's hello runs on any x86-64 machine (arm64: QEMU)
TYPE = f"{FAMILY}.large"


@pytest.fixture
def own_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    cfg = own_local_cloud(tmp_path, monkeypatch)
    yield connect(cfg)
    control.down(cfg)
    assert wait_until_clean(tmp_path / "cloud") == []


def _without_default_vpc(cloud: Cloud) -> None:
    ec2 = cloud.ec2
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    where = [{"Name": "vpc-id", "Values": [vpc["VpcId"]]}]
    for subnet in ec2.describe_subnets(Filters=where)["Subnets"]:
        ec2.delete_subnet(SubnetId=subnet["SubnetId"])
    for gateway in ec2.describe_internet_gateways(
        Filters=[{"Name": "attachment.vpc-id", "Values": [vpc["VpcId"]]}]
    )["InternetGateways"]:
        ec2.detach_internet_gateway(
            InternetGatewayId=gateway["InternetGatewayId"], VpcId=vpc["VpcId"]
        )
        ec2.delete_internet_gateway(InternetGatewayId=gateway["InternetGatewayId"])
    ec2.delete_vpc(VpcId=vpc["VpcId"])


def _organisation_network(cloud: Cloud, cidr: str = "10.20.0.0/16") -> dict[str, Any]:
    """A VPC of the organisation's: two subnets (in zones offering the type) that give no
    public address by default, a route to an internet gateway, and a group it requires."""
    ec2 = cloud.ec2
    vpc = ec2.create_vpc(CidrBlock=cidr)["Vpc"]["VpcId"]
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    zones = sorted(zones_offering(ec2, [TYPE])[TYPE])[:2]
    prefix = cidr.rsplit(".", 2)[0]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"{prefix}.{n + 1}.0/24", AvailabilityZone=zone)[
            "Subnet"
        ]
        for n, zone in enumerate(zones)
    ]
    assert not any(s["MapPublicIpOnLaunch"] for s in subnets)
    group = ec2.create_security_group(GroupName="org-required", Description="x", VpcId=vpc)
    return {
        "vpc": vpc,
        "subnets": tuple(s["SubnetId"] for s in subnets),
        "group": group["GroupId"],
    }


def _with(cloud: Cloud, **settings: Any) -> Cloud:
    return connect(replace(cloud.config, **settings))


def _request() -> pipelines.BuildRequest:
    return pipelines.BuildRequest(
        families=[FAMILY], recipe="trivial", size="large", recipes_dir=FIXTURES
    )


def _nothing_left(cloud: Cloud) -> None:
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert run_id is not None
    assert tagged_alive(cloud, run_id) == []
    assert Journal(cloud.config.results_dir / "journal.sqlite").alive(run_id) == []


def _run_instance(cloud: Cloud) -> dict[str, Any]:
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    found = cloud.ec2.describe_instances(
        Filters=[
            {"Name": "tag:amibake:run-id", "Values": [run_id]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )
    instances = [i for r in found["Reservations"] for i in r["Instances"]]
    assert len(instances) == 1, instances
    return dict(instances[0])


@pytest.mark.e2e
def test_an_account_without_a_default_vpc_builds_in_the_subnets_it_names(
    own_cloud: Cloud,
) -> None:
    _without_default_vpc(own_cloud)
    # Without subnets named, the error says both ways out, before anything is made.
    outcome = pipelines.build(own_cloud, _request())[0]
    assert not outcome.ok
    assert "no default VPC in us-east-1: name the subnets to launch in" in outcome.error
    _nothing_left(own_cloud)

    network = _organisation_network(own_cloud)
    cloud = _with(own_cloud, subnet_ids=network["subnets"], security_group_ids=(network["group"],))
    seen: list[dict[str, Any]] = []

    def look(step: str) -> None:
        if step == "connect":  # the instance SSH reached
            seen.append(_run_instance(cloud))

    outcome = pipelines.build(cloud, _request(), on_boundary=look)[0]
    assert outcome.ok, outcome.error
    instance = seen[0]
    assert instance["SubnetId"] in network["subnets"]
    assert instance["VpcId"] == network["vpc"]
    # Asked for: the subnet gives none by default, and SSH dials the public address.
    assert instance.get("PublicIpAddress"), instance
    groups = {g["GroupId"] for g in instance["SecurityGroups"]}
    assert network["group"] in groups and len(groups) == 2, groups
    _nothing_left(cloud)


@pytest.mark.e2e
def test_ssh_from_inside_the_vpc_dials_the_private_address(own_cloud: Cloud) -> None:
    cloud = _with(own_cloud, ssh_address="private")
    seen: list[dict[str, Any]] = []

    def look(step: str) -> None:
        if step == "connect":
            seen.append(_run_instance(cloud))

    outcome = pipelines.build(cloud, _request(), on_boundary=look)[0]
    assert outcome.ok, outcome.error
    # No public address asked for: none given, and none needed.
    assert "PublicIpAddress" not in seen[0] and seen[0]["PrivateIpAddress"]
    _nothing_left(cloud)


@pytest.mark.e2e
def test_an_instance_ssh_can_never_reach_is_named_at_once_with_the_fix(
    own_cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An account that strips public addresses (a service control policy, say): the instance
    runs without one. The run says so once the describe has had time to catch up, not after
    the whole SSH timeout, and leaves nothing."""
    monkeypatch.setattr(reach, "ADDRESS_GRACE_S", 1.0)
    cloud = _with(own_cloud, ssh_timeout_s=120.0)

    def strip(parsed: dict[str, Any], **_: Any) -> None:
        for reservation in parsed.get("Reservations", []):
            for instance in reservation["Instances"]:
                instance.pop("PublicIpAddress", None)

    cloud.ec2.meta.events.register("after-call.ec2.DescribeInstances", strip)
    started = time.monotonic()
    with pytest.raises(UserError) as refused:  # the account's setting: exit 2, with the fix
        pipelines.build(cloud, _request())
    took = time.monotonic() - started
    error = str(refused.value)
    assert "is running without a public IPv4 address, so SSH cannot reach it" in error
    assert 'ssh_address = "private"' in error and "\n" not in error
    assert took < cloud.config.ssh_timeout_s, took  # named, not waited out
    _nothing_left(cloud)


@pytest.mark.parametrize(
    "settings, words",
    [
        (lambda n, o: {"AMIBAKE_SUBNET_IDS": "subnet-0123456789abcdef0"}, "subnet_ids: "),
        (
            lambda n, o: {"AMIBAKE_SUBNET_IDS": f"{n['subnets'][0]},{o['subnets'][0]}"},
            "subnet_ids span VPCs",
        ),
        (
            lambda n, o: {
                "AMIBAKE_SUBNET_IDS": n["subnets"][0],
                "AMIBAKE_SECURITY_GROUP_IDS": o["group"],
            },
            "security_group_ids: ",
        ),
    ],
    ids=["no-such-subnet", "two-vpcs", "group-of-another-vpc"],
)
def test_a_wrong_subnet_or_group_is_one_line_and_creates_nothing(
    own_cloud: Cloud,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    settings: Callable[[dict[str, Any], dict[str, Any]], dict[str, str]],
    words: str,
) -> None:
    ours = _organisation_network(own_cloud)
    other = _organisation_network(own_cloud, "10.30.0.0/16")
    for name, value in settings(ours, other).items():
        monkeypatch.setenv(name, value)
    keys = len(own_cloud.ec2.describe_key_pairs()["KeyPairs"])
    groups = len(own_cloud.ec2.describe_security_groups()["SecurityGroups"])
    assert main(["build", "--family", FAMILY, "--recipe", "kernels"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"amibake: error: {words}") and err.count("\n") == 1, err
    assert len(own_cloud.ec2.describe_key_pairs()["KeyPairs"]) == keys
    assert len(own_cloud.ec2.describe_security_groups()["SecurityGroups"]) == groups


def test_batch_takes_subnets_with_a_way_to_ecs_and_refuses_the_rest(own_cloud: Cloud) -> None:
    """A subnet_ids subnet must let Batch's hosts reach ECS: a public address by default and a
    route to the internet gateway, or a NAT route (the test above), or an ECS endpoint."""
    from amibake import batch
    from amibake.cloud.network import find

    network = _organisation_network(own_cloud)
    ec2 = own_cloud.ec2
    cloud = _with(own_cloud, subnet_ids=network["subnets"][:1])
    subnet = network["subnets"][0]
    with pytest.raises(UserError, match=f"subnet {subnet} .* no way to ECS"):
        batch._check_way_out(ec2, find(ec2, cloud.config), cloud.config.region)
    ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": True})
    with pytest.raises(UserError, match="no way to ECS"):  # a public address, no route out
        batch._check_way_out(ec2, find(ec2, cloud.config), cloud.config.region)
    table = ec2.create_route_table(VpcId=network["vpc"])["RouteTable"]["RouteTableId"]
    ec2.associate_route_table(RouteTableId=table, SubnetId=subnet)
    gateway = ec2.describe_internet_gateways(
        Filters=[{"Name": "attachment.vpc-id", "Values": [network["vpc"]]}]
    )["InternetGateways"][0]["InternetGatewayId"]
    ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    batch._check_way_out(ec2, find(ec2, cloud.config), cloud.config.region)  # public: taken
    ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": False})
    with pytest.raises(UserError, match="no way to ECS"):
        batch._check_way_out(ec2, find(ec2, cloud.config), cloud.config.region)
    ec2.create_vpc_endpoint(
        VpcId=network["vpc"],
        ServiceName=f"com.amazonaws.{cloud.config.region}.ecs",
        VpcEndpointType="Interface",
        SubnetIds=[subnet],
    )
    batch._check_way_out(ec2, find(ec2, cloud.config), cloud.config.region)  # private: taken


@pytest.mark.e2e
def test_batch_registers_in_the_subnets_and_groups_named_without_a_default_vpc(
    own_cloud: Cloud,
) -> None:
    from amibake import batch

    _without_default_vpc(own_cloud)
    image = batch.Image(base_ami(own_cloud), "x86_64", (FAMILY,), ())
    with pytest.raises(CloudError, match="no default VPC in us-east-1: name the subnets"):
        batch.up(own_cloud, [image])
    network = _organisation_network(own_cloud)
    cloud = _with(own_cloud, subnet_ids=network["subnets"], security_group_ids=(network["group"],))
    # Its subnets give no public address and route nowhere out: Batch's hosts would start, be
    # billed, and never reach ECS to take a job. Refused before anything is made.
    with pytest.raises(UserError, match=f"subnet {network['subnets'][0]} .* no way to ECS"):
        batch.up(cloud, [image])
    groups = cloud.ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [batch.SECURITY_GROUP]}]
    )["SecurityGroups"]
    assert groups == [] and batch.job_bucket(cloud) is None
    ec2 = cloud.ec2  # a NAT gateway in the VPC, the way out of its main route table
    address = ec2.allocate_address(Domain="vpc")["AllocationId"]
    nat = ec2.create_nat_gateway(SubnetId=network["subnets"][0], AllocationId=address)
    main = ec2.describe_route_tables(
        Filters=[
            {"Name": "vpc-id", "Values": [network["vpc"]]},
            {"Name": "association.main", "Values": ["true"]},
        ]
    )["RouteTables"][0]
    ec2.create_route(
        RouteTableId=main["RouteTableId"],
        DestinationCidrBlock="0.0.0.0/0",
        NatGatewayId=nat["NatGateway"]["NatGatewayId"],
    )
    batch.up(cloud, [image])
    client = cloud.client("batch")
    resources = [e["computeResources"] for e in batch.environments(client)]
    assert [sorted(r["subnets"]) for r in resources] == [sorted(network["subnets"])]
    assert network["group"] in resources[0]["securityGroupIds"]
    assert len(resources[0]["securityGroupIds"]) == 2  # and amibake's, without inbound rules
    batch.down(cloud)
    assert batch.queues(client) == []


def test_preflight_tries_its_launch_in_a_named_subnet_whose_zone_offers_the_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EC2 refuses a launch in an AZ without the type (Unsupported, DryRun too). Preflight's
    dry run went to the first of subnet_ids whatever its zone, and refused a build whose launch
    would have gone ahead in the second; with no named subnet in such a zone it now says so."""
    cfg = own_local_cloud(tmp_path, monkeypatch, "fleet-errors", 0)
    cloud = connect(cfg)
    try:
        ec2 = cloud.ec2
        # The build's sizes: the one asked for, and the next one.
        sizes = zones_offering(ec2, [TYPE, f"{FAMILY}.xlarge"])
        offering = sizes[TYPE]
        zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]]
        # moto's us-east-1e has no c5a at all
        lacking = next(z for z in zones if not any(z in offered for offered in sizes.values()))
        vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
        subnets = [
            ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{n}.0/24", AvailabilityZone=zone)[
                "Subnet"
            ]["SubnetId"]
            for n, zone in enumerate([lacking, sorted(offering)[0]], 1)
        ]
        image = base_ami(cloud)
        with pytest.raises(botocore.exceptions.ClientError, match="Unsupported"):
            ec2.run_instances(
                DryRun=True,
                ImageId=image,
                InstanceType=TYPE,
                MinCount=1,
                MaxCount=1,
                SubnetId=subnets[0],
            )
        request = replace(_request(), dry_run=True)
        outcome = pipelines.build(_with(cloud, subnet_ids=tuple(subnets)), request)[0]
        assert outcome.ok, outcome.error
        with pytest.raises(UserError, match=f"none of subnet_ids \\({subnets[0]}\\) is in an"):
            pipelines.build(_with(cloud, subnet_ids=(subnets[0],)), request)
    finally:
        control.down(cfg)
    assert wait_until_clean(tmp_path / "cloud") == []
