"""An instant EC2 Fleet as EC2 answers it: a FleetId even when nothing launched, the reasons in
``Errors`` (no spot capacity, throttling, an override in an AZ that does not offer its type,
no service-linked role for spot), some pools refused beside the one that launched, and instant
fleets missing from a DescribeFleets that names no ids.

Sources: the CreateFleet API reference (``Errors``: "the instances that could not be launched",
for instant fleets; the FleetId is returned with them); the DescribeFleets reference ("if a
fleet is of type instant, you must specify the fleet ID in the request, otherwise the fleet does
not appear in the response"); osbuild/osbuild-composer#4220 and #4413 (UnfulfillableCapacity, and
InsufficientInstanceCapacity too, from CreateFleet); aws/aws-parallelcluster-node#579, #734 and
#740 (RequestLimitExceeded inside Errors, with HTTP 200, had been taken for no capacity);
compiler-explorer/infra#601 and c6fc/npk#70 ("InvalidFleetConfiguration - Your requested instance
type (c5.large) is not supported in your requested Availability Zone (us-east-1e)", reported per
AZ); the EC2 user guide, "Service-linked role for Spot Instances" (with the API, "you must ensure
that this role exists"), and kubernetes/kops#16475
(AuthFailure.ServiceLinkedRoleCreationNotPermitted among a fleet's errors).

Which AZ offers a type is moto's table (us-east-1e has no c5a, as on AWS) less a seeded few more
gaps, never in the first AZ that offers it; DescribeInstanceTypeOfferings by AZ agrees, and a
RunInstances in such an AZ (by its subnet or placement, DryRun too) is refused Unsupported, "Your
requested instance type ... is not supported in your requested Availability Zone". An account
starts without the spot service-linked role, and EC2 is taken not to create it on the caller's
behalf (the case that fails on AWS: the caller lacks iam:CreateServiceLinkedRole).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

UNFULFILLABLE = 0.12  # share of requests: no spot capacity in any pool asked
INSUFFICIENT = 0.08  # the same, as InsufficientInstanceCapacity
THROTTLED = 0.10  # RequestLimitExceeded inside Errors
PARTIAL = 0.20  # launched, with other pools refused beside it
AZ_GAP = 0.15  # share of (type, AZ) pairs offered by moto's table yet not here
SPOT_ROLE_PATH = "/aws-service-role/spot.amazonaws.com/"
_OVERRIDE = re.compile(r"LaunchTemplateConfigs\.(\d+)\.Overrides\.(\d+)\.(\w+)")
_TAG = re.compile(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.(Key|Value)")
_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"


@dataclass(frozen=True)
class Override:
    template_id: str
    version: str
    instance_type: str
    subnet_id: str
    zone: str
    priority: str


@functools.cache
def moto_zones(region: str) -> dict[str, tuple[str, ...]]:
    """moto's table: instance type -> the AZs that offer it, in order."""
    from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS

    zones: dict[str, list[str]] = {}
    for offering in INSTANCE_TYPE_OFFERINGS["availability-zone"].get(region, []):
        zones.setdefault(offering["InstanceType"], []).append(offering["Location"])
    return {t: tuple(sorted(z)) for t, z in zones.items()}


def offers(faults: Faults, region: str, instance_type: str, zone: str) -> bool:
    """Whether the AZ offers the type here: moto's table, less the seed's gaps (never the first
    AZ offering it, so the region still offers what moto says it does)."""
    zones = moto_zones(region).get(instance_type, ())
    if zone not in zones:
        return False
    return zone == zones[0] or not faults.chance(AZ_GAP, "offering", instance_type, zone)


def requested(request: Request) -> list[Override]:
    """A CreateFleet request's overrides, each with its launch template and AZ."""
    fields: dict[tuple[int, int], dict[str, str]] = {}
    for key, value in request.params.items():
        found = _OVERRIDE.fullmatch(key)
        if found:
            config, n, name = int(found.group(1)), int(found.group(2)), found.group(3)
            fields.setdefault((config, n), {})[name] = str(value)
    out = []
    for (config, _), f in sorted(fields.items()):
        prefix = f"LaunchTemplateConfigs.{config}.LaunchTemplateSpecification."
        out.append(
            Override(
                str(request.params.get(prefix + "LaunchTemplateId", "")),
                str(request.params.get(prefix + "Version", "")),
                f.get("InstanceType", ""),
                f.get("SubnetId", ""),
                f.get("AvailabilityZone", "") or zone_of(request, f.get("SubnetId", "")),
                f.get("Priority", ""),
            )
        )
    return out


def zone_of(request: Request, subnet_id: str) -> str:
    if not subnet_id:
        return ""
    from moto.ec2.models import ec2_backends

    from amibake.local.moto_gaps import BACKENDS

    try:
        with BACKENDS:
            subnet = ec2_backends[request.account][request.region].get_subnet(subnet_id)
            return str(subnet.availability_zone)
    except Exception:  # an unknown subnet: moto's own answer says so
        return ""


def _market(request: Request) -> str:
    return str(request.params.get("TargetCapacitySpecification.DefaultTargetCapacityType", ""))


def _has_spot_role(request: Request) -> bool:
    from moto.iam.models import iam_backends

    from amibake.local.moto_gaps import BACKENDS

    with BACKENDS:
        roles = iam_backends[request.account]["global"].roles.values()
        return any(r.path.startswith(SPOT_ROLE_PATH) for r in roles)


def outcome(faults: Faults, n: int) -> str:
    """What EC2 does with the cloud's n-th CreateFleet request (an error code, "partial" or
    "launched"), drawn from the seed."""
    draw = faults.draw("fleet", n, "outcome")
    for code, share in (
        ("UnfulfillableCapacity", UNFULFILLABLE),
        ("InsufficientInstanceCapacity", INSUFFICIENT),
        ("RequestLimitExceeded", THROTTLED),
        ("partial", PARTIAL),
    ):
        if draw < share:
            return code
        draw -= share
    return "launched"


def _outcome(faults: Faults, request: Request) -> str:
    # By the request's place among the cloud's requests (its ClientToken), not moto's ids.
    return outcome(faults, faults.ordinal("fleet-request", str(request.params.get("ClientToken"))))


MESSAGES = {
    "UnfulfillableCapacity": "Unable to fulfill capacity due to your request configuration. "
    "Please adjust your request and try again.",
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the "
    "Availability Zone you requested ({zone}).",
    "RequestLimitExceeded": "Request limit exceeded.",
    "InvalidFleetConfiguration": "Your requested instance type ({type}) is not supported in your "
    "requested Availability Zone ({zone}).",
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted": "The provided credentials do not have "
    "permission to create the service-linked role for EC2 Spot Instances.",
    "InvalidLaunchTemplateId.NotFound": "The specified launch template, with template ID {id}, "
    "does not exist.",
}


def _errors(request: Request, refused: list[tuple[Override, str]]) -> str:
    items = []
    for override, code in refused:
        message = MESSAGES[code].format(
            type=override.instance_type, zone=override.zone, id=override.template_id
        )
        overrides = "".join(
            f"<{tag}>{escape(value)}</{tag}>"
            for tag, value in (
                ("instanceType", override.instance_type),
                ("subnetId", override.subnet_id),
                ("availabilityZone", override.zone),
                ("priority", override.priority),
            )
            if value
        )
        items.append(
            "<item><launchTemplateAndOverrides><launchTemplateSpecification>"
            f"<launchTemplateId>{escape(override.template_id)}</launchTemplateId>"
            f"<version>{escape(override.version)}</version></launchTemplateSpecification>"
            f"<overrides>{overrides}</overrides></launchTemplateAndOverrides>"
            f"<lifecycle>{escape(_market(request))}</lifecycle>"
            f"<errorCode>{code}</errorCode><errorMessage>{escape(message)}</errorMessage></item>"
        )
    return f"<errorSet>{''.join(items)}</errorSet>"


def _empty_fleet(request: Request) -> str:
    """A fleet that launched nothing, as EC2 keeps one: its id is real (DescribeFleets and
    DeleteFleets know it) and it bears the request's tags."""
    from moto.ec2.models import ec2_backends

    from amibake.local.moto_gaps import BACKENDS

    tags: dict[str, dict[str, dict[str, str]]] = {}  # specification -> tag -> Key, Value
    for key, value in request.params.items():
        found = _TAG.fullmatch(key)
        if found:
            tag = tags.setdefault(found.group(1), {}).setdefault(found.group(2), {})
            tag[found.group(3)] = str(value)
    tag_specs = [
        {
            "ResourceType": request.params.get(f"TagSpecification.{n}.ResourceType", ""),
            "Tags": [t for t in spec.values() if "Key" in t],
        }
        for n, spec in tags.items()
    ]
    with BACKENDS:
        fleet = ec2_backends[request.account][request.region].create_fleet(
            on_demand_options={},
            spot_options={},
            target_capacity_specification={
                "TotalTargetCapacity": 0,
                "DefaultTargetCapacityType": _market(request),
            },
            launch_template_configs=[],
            excess_capacity_termination_policy="",
            replace_unhealthy_instances=False,
            terminate_instances_with_expiration=True,
            fleet_type="instant",
            valid_from=None,
            valid_until=None,
            tag_specifications=tag_specs,
        )
    return str(fleet.id)


def _refused(faults: Faults, request: Request, overrides: list[Override]) -> list[Override]:
    """The overrides naming an AZ that does not offer their type."""
    return [
        o
        for o in overrides
        if o.zone and not offers(faults, request.region, o.instance_type, o.zone)
    ]


def refused_fleet(request: Request, refused: list[tuple[Override, str]]) -> Reply:
    """CreateFleet's answer for an instant fleet that launched nothing: a real FleetId, and why
    each override was refused in its Errors."""
    fleet_id = _empty_fleet(request)
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<CreateFleetResponse xmlns="{_XMLNS}">'
        "<requestId>00000000-0000-0000-0000-000000000000</requestId>"
        f"<fleetId>{fleet_id}</fleetId>{_errors(request, refused)}<fleetInstanceSet/>"
        "</CreateFleetResponse>"
    )
    return Reply(200, [("Content-Type", "text/xml")], body.encode())


def instant(request: Request) -> bool:
    return (
        request.service == "ec2"
        and request.action == "CreateFleet"
        and (request.params.get("Type") == "instant")
    )


def launch_zone(request: Request) -> str:
    """The AZ a RunInstances names, by its placement or its subnet's ("" leaves it to EC2)."""
    subnet = str(
        request.params.get("SubnetId") or request.params.get("NetworkInterface.1.SubnetId") or ""
    )
    return str(request.params.get("Placement.AvailabilityZone") or "") or zone_of(request, subnet)


def _unsupported(faults: Faults, request: Request) -> Reply | None:
    """RunInstances (dry or not) in an AZ that does not offer the type: EC2's Unsupported."""
    instance_type, zone = str(request.params.get("InstanceType", "")), launch_zone(request)
    zones = moto_zones(request.region).get(instance_type, ())
    if not zone or not zones or offers(faults, request.region, instance_type, zone):
        return None  # a type moto's table lacks is not refused for it
    faults.count(BEHAVIOUR.name, "launch in an AZ without its type")
    offering = [z for z in zones if offers(faults, request.region, instance_type, z)]
    return query_error(
        "Unsupported",
        f"Your requested instance type ({instance_type}) is not supported in your requested "
        f"Availability Zone ({zone}). Please retry your request by not specifying an "
        f"Availability Zone or choosing {', '.join(offering)}.",
    )


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service == "ec2" and request.action == "RunInstances":
        return _unsupported(faults, request)
    if not instant(request):
        return None
    name = BEHAVIOUR.name
    overrides = requested(request)
    invalid = _refused(faults, request, overrides)
    for _ in invalid:
        faults.count(name, "override in an AZ without its type")
    valid = [o for o in overrides if o not in invalid]
    refused = [(o, "InvalidFleetConfiguration") for o in invalid]
    if _market(request) == "spot" and not _has_spot_role(request):
        faults.count(name, "spot without its service-linked role")
        code = "AuthFailure.ServiceLinkedRoleCreationNotPermitted"
        refused += [(o, code) for o in valid[:1]]
    elif not valid:
        pass  # every override refused: nothing to launch
    else:
        outcome = _outcome(faults, request)
        if outcome in ("launched", "partial"):
            return None  # moto launches (from the first override, an AZ that offers it)
        faults.count(name, f"{outcome} in Errors")
        if outcome == "UnfulfillableCapacity":  # one error for the request, not per pool
            refused += [(valid[0], outcome)]
        else:
            refused += [(o, outcome) for o in valid]
    return refused_fleet(request, refused)


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "ec2" or not reply.ok:
        return reply
    if request.action == "CreateFleet" and request.params.get("Type") == "instant":
        return _with_errors(faults, request, reply)
    if (
        request.action == "DescribeInstanceTypeOfferings"
        and request.params.get("LocationType") == "availability-zone"
    ):
        return _without_gaps(faults, request, reply)
    if request.action == "DescribeFleets" and not any(
        k.startswith("FleetId.") for k in request.params
    ):
        return _without_instant(faults, reply)
    return reply


def _with_errors(faults: Faults, request: Request, reply: Reply) -> Reply:
    """A fleet that launched: the refused overrides in its Errors, and for a partial one the
    other pools said to lack capacity."""
    overrides = requested(request)
    invalid = _refused(faults, request, overrides)
    refused = [(o, "InvalidFleetConfiguration") for o in invalid]
    if _outcome(faults, request) == "partial":
        others = [o for o in overrides if o not in invalid][1:]
        if others:
            faults.count(BEHAVIOUR.name, "partial fulfilment")
            refused += [(o, "InsufficientInstanceCapacity") for o in others]
    if not refused:
        return reply
    text = re.sub(r"<errorSet\s*/>|<errorSet>.*?</errorSet>", "", reply.body.decode(), flags=re.S)
    end = "</CreateFleetResponse>"
    text = text.replace(end, f"{_errors(request, refused)}{end}")
    return Reply(reply.status, reply.headers, text.encode())


def _without_gaps(faults: Faults, request: Request, reply: Reply) -> Reply:
    root = _parse(reply)
    if root is None:
        return reply
    changed = False
    for offerings in root.iterfind("{*}instanceTypeOfferingSet"):
        for item in list(offerings):
            instance_type = item.findtext("{*}instanceType") or ""
            zone = item.findtext("{*}location") or ""
            if not offers(faults, request.region, instance_type, zone):
                offerings.remove(item)
                changed = True
    if not changed:
        return reply
    faults.count(BEHAVIOUR.name, "type not offered in an AZ")
    return Reply(reply.status, reply.headers, ElementTree.tostring(root, encoding="utf-8"))


def _without_instant(faults: Faults, reply: Reply) -> Reply:
    root = _parse(reply)
    if root is None:
        return reply
    changed = False
    for fleets in root.iterfind("{*}fleetSet"):
        for item in list(fleets):
            if item.findtext("{*}type") == "instant":
                fleets.remove(item)
                changed = True
    if not changed:
        return reply
    faults.count(BEHAVIOUR.name, "instant fleet not listed")
    return Reply(reply.status, reply.headers, ElementTree.tostring(root, encoding="utf-8"))


def _parse(reply: Reply) -> ElementTree.Element | None:
    try:
        return ElementTree.fromstring(reply.body)
    except ElementTree.ParseError:
        return None


BEHAVIOUR = Behaviour(
    name="fleet-errors",
    source="CreateFleet and DescribeFleets API reference; osbuild-composer#4220, #4413; "
    "aws-parallelcluster-node#579, #740; compiler-explorer/infra#601; kops#16475",
    before=_before,
    after=_after,
)
