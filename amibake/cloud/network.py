"""Where instances launch and how SSH reaches them: the account's network shape.

Most accounts have a default VPC whose default subnets give every instance a public address;
many organisations delete default VPCs. So the subnets are the region's default ones unless
`subnet_ids` names others (any AZs of one VPC), `security_group_ids` adds groups the account
requires beside amibake's own SSH group, and `ssh_address` says which address SSH dials. When it
is the public one, the launch asks for a public IPv4 explicitly (a non-default subnet gives none
by default), in the launch's network interface, as Packer and Karpenter do with EC2 Fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from amibake.cloud.calls import default_vpc, error_code
from amibake.config import Config
from amibake.errors import UserError


@dataclass(frozen=True)
class Network:
    vpc_id: str
    subnets: tuple[dict[str, Any], ...]  # described subnets: SubnetId, AvailabilityZone, VpcId
    groups: tuple[str, ...]  # the account's groups every instance joins, beside amibake's own
    public_ip: bool  # SSH dials the public address: ask for one at launch
    configured: bool  # subnet_ids named the subnets (else the default VPC's)

    def interfaces(self, own_group: str, subnet_id: str = "") -> dict[str, Any]:
        """The launch's network part (a launch template's data or RunInstances' parameters):
        the security groups, and a public IPv4 asked for when SSH needs one, refused when it
        does not (a default subnet would give one: an open door, billed by the hour). EC2
        refuses instance-level groups beside network interfaces, so they go in the interface."""
        interface: dict[str, Any] = {
            "DeviceIndex": 0,
            "AssociatePublicIpAddress": self.public_ip,
            "DeleteOnTermination": True,
            "Groups": [own_group, *self.groups],
        }
        if subnet_id:
            interface["SubnetId"] = subnet_id
        return {"NetworkInterfaces": [interface]}

    def subnets_in(self, zones: set[str]) -> list[str]:
        """The subnets in `zones` (where the type is offered), one an AZ, or [""] to let EC2
        choose among the default VPC's subnets; configured subnets are never left to EC2."""
        found: dict[str, str] = {}
        for subnet in self.subnets:
            if subnet["AvailabilityZone"] in zones:
                found.setdefault(str(subnet["AvailabilityZone"]), str(subnet["SubnetId"]))
        if found:
            return list(found.values())
        if self.configured:
            raise UserError(
                f"none of subnet_ids ({', '.join(s['SubnetId'] for s in self.subnets)}) is in an "
                f"availability zone offering the type ({', '.join(sorted(zones)) or 'none'}): "
                "add a subnet in one of those zones"
            )
        return [""]


def find(ec2: Any, config: Config) -> Network:
    """The run's network: the configured subnets (checked to exist, in one VPC, with the groups
    in that VPC) or the default VPC's default subnets."""
    public = config.ssh_address == "public"
    if not config.subnet_ids:
        vpc = default_vpc(ec2)
        subnets = _subnets(ec2, Filters=[{"Name": "default-for-az", "Values": ["true"]}])
        return Network(vpc, tuple(subnets), (), public, configured=False)
    try:
        subnets = _subnets(ec2, SubnetIds=list(config.subnet_ids))
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != "InvalidSubnetID.NotFound":
            raise
        raise UserError(
            f"subnet_ids: {exc.response['Error']['Message']} in {config.region}; list the "
            f"region's subnets with 'aws ec2 describe-subnets --region {config.region}'"
        ) from None
    vpcs = sorted({str(s["VpcId"]) for s in subnets})
    if len(vpcs) != 1:
        raise UserError(f"subnet_ids span VPCs {', '.join(vpcs)}: give subnets of one VPC")
    if config.security_group_ids:
        try:
            groups = ec2.describe_security_groups(GroupIds=list(config.security_group_ids))
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "InvalidGroup.NotFound":
                raise
            raise UserError(
                f"security_group_ids: {exc.response['Error']['Message']} in {config.region}"
            ) from None
        elsewhere = [g["GroupId"] for g in groups["SecurityGroups"] if g["VpcId"] != vpcs[0]]
        if elsewhere:
            raise UserError(
                f"security_group_ids: {', '.join(elsewhere)} not in {vpcs[0]}, the VPC of "
                "subnet_ids: give groups of the subnets' VPC"
            )
    return Network(
        vpcs[0], tuple(subnets), tuple(config.security_group_ids), public, configured=True
    )


def _subnets(ec2: Any, **query: Any) -> list[dict[str, Any]]:
    return [
        subnet
        for page in ec2.get_paginator("describe_subnets").paginate(**query)
        for subnet in page["Subnets"]
    ]
