"""RunInstances as EC2 answers it when an AZ has no on-demand capacity for the type:
InsufficientInstanceCapacity, naming the AZs where there is (EC2's message: "We currently do not
have sufficient c5.large capacity in the Availability Zone you requested (us-east-1a). Our system
will be working on provisioning additional capacity. You can currently get c5.large capacity by
not specifying an Availability Zone in your request or choosing us-east-1b, us-east-1c.").

Sources: the EC2 user guide, "Insufficient instance capacity" (on-demand capacity is per AZ: try
another AZ, or wait); scylladb/scylla-cluster-tests#5119, skyplane-project/skyplane#299 and
red-hat-storage/ocs-ci#9263 (RunInstances refused so in one AZ while others had the type, HTTP
500, which the SDKs retry in vain before it is raised: amibake.cloud.session raises it at
once).

Locally: a seeded share of (type, AZ) pairs has no capacity for as long as the cloud lives, never
in the last AZ that offers the type (as DescribeInstanceTypeOfferings says), so the region still
has it. A RunInstances whose subnet is in
such an AZ is refused; one that leaves the AZ to EC2, or is a DryRun, is not.
"""

from __future__ import annotations

from amibake.local.faults import Behaviour, Faults, Reply, Request, fleets, query_error

SHORT = 0.3  # share of (type, AZ) pairs without on-demand capacity


def short(faults: Faults, region: str, instance_type: str, zone: str) -> bool:
    """Whether the AZ has no on-demand capacity for the type here."""
    offered = [
        z
        for z in fleets.moto_zones(region).get(instance_type, ())
        if fleets.offers(faults, region, instance_type, z)  # fleet-errors' gaps left out
    ]
    if zone not in offered or zone == offered[-1]:
        return False
    return faults.chance(SHORT, "on-demand", instance_type, zone)


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "ec2" or request.action != "RunInstances":
        return None
    if str(request.params.get("DryRun", "")).lower() == "true":
        return None
    instance_type = str(request.params.get("InstanceType", ""))
    zone = fleets.launch_zone(request)
    if not zone or not short(faults, request.region, instance_type, zone):
        return None
    others = [
        z
        for z in fleets.moto_zones(request.region).get(instance_type, ())
        if z != zone and not short(faults, request.region, instance_type, z)
    ]
    faults.count(BEHAVIOUR.name, "no on-demand capacity in the AZ")
    return query_error(
        "InsufficientInstanceCapacity",
        f"We currently do not have sufficient {instance_type} capacity in the Availability Zone "
        f"you requested ({zone}). Our system will be working on provisioning additional "
        f"capacity. You can currently get {instance_type} capacity by not specifying an "
        f"Availability Zone in your request or choosing {', '.join(others)}.",
        500,
    )


BEHAVIOUR = Behaviour(
    name="on-demand-capacity",
    source=(
        "EC2 user guide, Insufficient instance capacity; scylla-cluster-tests#5119; "
        "skyplane#299; ocs-ci#9263"
    ),
    before=_before,
)
