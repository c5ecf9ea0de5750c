"""Steps that make the instance reachable by this run only: a fresh key pair, and a security
group open on port 22 to the caller's address alone."""

from __future__ import annotations

import ipaddress
import logging
import socket
import urllib.request

from amibake import ssh_keys
from amibake.cloud import tags
from amibake.cloud.calls import creating, every, made_once, retry_on
from amibake.cloud.ec2 import NEW_RESOURCE_VISIBLE_S, delete_key_pair, delete_security_group
from amibake.cloud.network import Network
from amibake.errors import CloudError
from amibake.runner import RunContext
from amibake.steps.state import InstanceState

log = logging.getLogger("amibake")


class KeyPair:
    name = "key-pair"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: InstanceState) -> None:
        ec2 = self.context.cloud.ec2
        name = f"{self.context.run_id}-{state.slot}"
        # Made here and its public half imported: the private half never crosses the network,
        # and an import sent again after its answer was lost is this run's key (the one made
        # by the first attempt holds the same public half), where a CreateKeyPair whose answer
        # was lost had taken its private half with it.
        private, public = ssh_keys.ed25519()

        def ours() -> str | None:
            found = ec2.describe_key_pairs(
                Filters=tags.made_by(self.context.run_id, "key-name", name)
            )["KeyPairs"]
            return name if found else None

        with creating("the key pair"):
            made_once(
                lambda: ec2.import_key_pair(
                    KeyName=name,
                    PublicKeyMaterial=public.encode(),
                    TagSpecifications=[tags.specification("key-pair", self.context.tags)],
                ),
                "InvalidKeyPair.Duplicate",
                ours,
                "the key pair",
                within_s=NEW_RESOURCE_VISIBLE_S,
            )
            state.key_name = name
            state.private_key = private
            self.context.created("key-pair", name)

    def cleanup(self, state: InstanceState) -> None:
        if not state.key_name:
            return
        unseen = self.context.unseen_for("key-pair", state.key_name)
        delete_key_pair(self.context.cloud.ec2, state.key_name, unseen)
        self.context.deleted("key-pair", state.key_name)
        state.private_key = ""


def caller_cidr(context: RunContext) -> str:
    """The caller's address as a /32: the only source SSH is opened to. Its public address
    (what checkip sees) when SSH dials instances' public addresses; with ssh_address private,
    the address this machine sends from toward the VPC (inside it, or over a VPN or peering):
    the public one was the rule's alone, and private SSH never connected."""
    config = context.cloud.config
    if config.is_local:
        return "127.0.0.1/32"
    if config.ssh_address == "private":
        return f"{source_toward(context.network())}/32"
    return f"{public_address()}/32"


# Asked directly, never through HTTPS_PROXY: SSH dials instances directly, so a proxy's address
# was the wrong source, and a rule open to everyone else behind that proxy.
CHECKIP = "https://checkip.amazonaws.com"


def public_address() -> str:
    """This machine's public IPv4 address, as checkip sees its direct connections."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(CHECKIP, timeout=10) as response:
            address = str(response.read().decode().strip())
    except OSError as exc:
        raise CloudError(f"cannot find this machine's public address: {exc}") from exc
    # Whatever answered (a proxy's or captive portal's page) must not become a firewall rule.
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise CloudError(
            f"cannot find this machine's public address: {CHECKIP} answered "
            f"{address[:60]!r}, not an IPv4 address"
        ) from None
    return address


def source_toward(network: Network) -> str:
    """The address this machine's packets to the network's first subnet leave from (the
    kernel's route choice; a UDP connect sends nothing)."""
    subnet = network.subnets[0]
    toward = str(next(ipaddress.ip_network(subnet["CidrBlock"]).hosts()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((toward, 22))
        except OSError as exc:
            raise CloudError(
                f"no route from this machine to subnet {subnet['SubnetId']} "
                f'({subnet["CidrBlock"]}): {exc.strerror or exc}; ssh_address = "private" '
                "needs this machine inside the VPC or on a VPN or peering to it"
            ) from None
        return str(probe.getsockname()[0])


class SecurityGroup:
    name = "security-group"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: InstanceState) -> None:
        ec2 = self.context.cloud.ec2
        vpc = self.context.network().vpc_id
        name = f"{self.context.run_id}-{state.slot}"

        def ours() -> dict[str, str] | None:
            filters = [
                {"Name": "vpc-id", "Values": [vpc]},
                *tags.made_by(self.context.run_id, "group-name", name),
            ]
            found = list(every(ec2, "describe_security_groups", "SecurityGroups", Filters=filters))
            return {"GroupId": found[0]["GroupId"]} if found else None

        with creating("the security group"):
            created = made_once(
                lambda: ec2.create_security_group(
                    GroupName=name,
                    Description="amibake build: SSH from the caller only",
                    VpcId=vpc,
                    TagSpecifications=[tags.specification("security-group", self.context.tags)],
                ),
                "InvalidGroup.Duplicate",
                ours,
                "the security group",
                within_s=NEW_RESOURCE_VISIBLE_S,
            )
            state.security_group_id = created["GroupId"]
            self.context.created("security-group", state.security_group_id)
        cidr = self.context.shared("caller-cidr", lambda: caller_cidr(self.context))
        retry_on(
            {"InvalidGroup.NotFound"},
            lambda: ec2.authorize_security_group_ingress(
                GroupId=state.security_group_id,
                IpPermissions=[
                    {
                        "IpProtocol": "tcp",
                        "FromPort": 22,
                        "ToPort": 22,
                        "IpRanges": [{"CidrIp": cidr, "Description": "amibake caller"}],
                    }
                ],
            ),
        )

    def cleanup(self, state: InstanceState) -> None:
        if not state.security_group_id:
            return
        ec2 = self.context.cloud.ec2
        unseen = self.context.unseen_for("security-group", state.security_group_id)
        delete_security_group(ec2, state.security_group_id, unseen)
        self.context.deleted("security-group", state.security_group_id)
