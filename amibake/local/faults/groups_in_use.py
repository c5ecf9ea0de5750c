"""A security group held for a while by the network interface of an instance just terminated:
DeleteSecurityGroup answers DependencyViolation, "resource sg-... has a dependent object", until
EC2 has deleted the interface.

Sources: hashicorp/terraform#11047 (Terraform retries it for five minutes: "there is a delay
between the instance being destroyed and its network interface being destroyed, and the network
interface 'holds on to' the security group"); cloud-barista/cb-spider#460 (deleting the group
right after the VM fails now and then; the wait varies, at times minutes); the DeleteSecurityGroup
API reference (a group associated with an instance or network interface fails with
DependencyViolation).

Locally: each group of an instance terminated through the API stays in use for a window drawn
per group from IN_USE_S after the TerminateInstances.
"""

from __future__ import annotations

from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

IN_USE_S = (0.5, 4.0)  # AWS: seconds, at times minutes (shortened here)


def _groups(request: Request, instance_ids: list[str]) -> set[str]:
    """The groups of the instances, on the instance or on its network interfaces, as moto
    holds them."""
    from moto.ec2.models import ec2_backends

    from amibake.local.moto_gaps import BACKENDS

    found: set[str] = set()
    with BACKENDS:
        backend = ec2_backends[request.account][request.region]
        for instance_id in instance_ids:
            try:
                instance: Any = backend.get_instance(instance_id)
            except Exception:  # gone or never there: it holds nothing
                continue
            for group in getattr(instance, "security_groups", None) or []:
                found.add(str(getattr(group, "id", group)))
            for nic in (getattr(instance, "nics", None) or {}).values():
                for group in getattr(nic, "group_set", None) or []:
                    found.add(str(getattr(group, "id", group)))
    return {g for g in found if g.startswith("sg-")}


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "ec2" or request.action != "DeleteSecurityGroup":
        return None
    group = str(request.params.get("GroupId", ""))
    freed = faults.remember("groups-in-use:terminated").get(group)
    if freed is None:
        return None
    n = faults.ordinal("group", group)
    if faults.now() < freed + faults.between(*IN_USE_S, "group", n, "in-use"):
        faults.count(BEHAVIOUR.name, "group still in use")
        return query_error("DependencyViolation", f"resource {group} has a dependent object")
    return None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service == "ec2" and request.action == "TerminateInstances" and reply.ok:
        instance_ids = [str(v) for k, v in request.params.items() if k.startswith("InstanceId.")]
        now = faults.now()
        held = faults.remember("groups-in-use:terminated")
        for group in _groups(request, instance_ids):
            held[group] = now
    return reply


BEHAVIOUR = Behaviour(
    name="groups-in-use",
    source="hashicorp/terraform#11047; cloud-barista/cb-spider#460; DeleteSecurityGroup API",
    before=_before,
    after=_after,
)
