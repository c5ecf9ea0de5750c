"""A new instance as EC2 has it: not found for a while after RunInstances or CreateFleet (nor is
its fleet), and a terminated one still described as shutting-down for a moment.

Sources: the EC2 developer guide, "Eventual consistency in the Amazon EC2 API": an instance id
RunInstances just returned may be InvalidInstanceID.NotFound to DescribeInstances and
TerminateInstances, and "if you get an InvalidInstanceID.NotFound error after running
TerminateInstances, this does not mean that the instance is or will be terminated: it might still
be running"; back off "starting with a couple of seconds ... up to a few minutes". The
DeleteFleets reference: an unknown fleet is reported per fleet (UnsuccessfulFleetDeletions,
fleetIdDoesNotExist) in a 200 answer, not as an error. TerminateInstances' documented
CurrentState (shutting-down, then terminated).

Locally: NotFound for 0.5 to 4 s after the launch (a NotFound TerminateInstances does not
terminate: moto is not asked), the launching fleet unknown to DeleteFleets for as long, filtered
describes not listing the instance yet, and a terminated instance shutting-down for up to 2 s.
"""

from __future__ import annotations

import re
from xml.etree import ElementTree

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

_INSTANCE = re.compile(r"<(?:instanceId|item)>(i-[0-9a-f]+)</(?:instanceId|item)>")
_FLEET = re.compile(r"<fleetId>(fleet-[0-9a-f-]+)</fleetId>")
UNSEEN_S = (0.5, 4.0)  # NotFound after the launch (AWS: seconds, at times minutes)
SHUTTING_DOWN_S = (0.3, 2.0)  # described shutting-down after TerminateInstances
# The calls that name an instance and fail NotFound while it is not visible yet.
BY_ID = {
    "DescribeInstances": "InstanceId.",
    "DescribeInstanceStatus": "InstanceId.",
    "DescribeInstanceAttribute": "InstanceId",
    "ModifyInstanceAttribute": "InstanceId",
    "TerminateInstances": "InstanceId.",
    "StopInstances": "InstanceId.",
    "GetConsoleOutput": "InstanceId",
    "CreateImage": "InstanceId",
    "CreateTags": "ResourceId.",
    "DeleteTags": "ResourceId.",
}


def _named(request: Request) -> list[str]:
    prefix = BY_ID.get(request.action, "")
    return [
        str(v)
        for k, v in request.params.items()
        if prefix
        and (k == prefix or (prefix.endswith(".") and k.startswith(prefix)))
        and str(v).startswith("i-")
    ]


def _unseen(faults: Faults, instance: str, now: float) -> bool:
    born = faults.remember("instances:born").get(instance)
    if born is None:  # not launched through this layer (a Batch host): always seen
        return False
    n = faults.ordinal("instance", instance)
    unseen: bool = now < born + faults.between(*UNSEEN_S, "instance", n, "unseen")
    return unseen


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "ec2":
        return None
    now = faults.now()
    for instance in _named(request):
        if _unseen(faults, instance, now):
            faults.count(BEHAVIOUR.name, f"instance not found yet ({request.action})")
            return query_error(
                "InvalidInstanceID.NotFound", f"The instance ID '{instance}' does not exist"
            )
    if request.action == "DeleteFleets":
        return _unseen_fleets(faults, request, now)
    return None


def _unseen_fleets(faults: Faults, request: Request, now: float) -> Reply | None:
    """DeleteFleets of a fleet just created: 'fleetIdDoesNotExist', in a 200 answer, and the
    fleet (with its instances) left as it was."""
    born = faults.remember("fleets:born")
    fleets = [str(v) for k, v in request.params.items() if k.startswith("FleetId.")]
    unseen = [
        f
        for f in fleets
        if f in born
        and now < born[f] + faults.between(*UNSEEN_S, "fleet", faults.ordinal("fleet", f), "unseen")
    ]
    if not unseen:
        return None
    faults.count(BEHAVIOUR.name, "fleet not found yet (DeleteFleets)")
    items = "".join(
        f"<item><error><code>fleetIdDoesNotExist</code><message>The fleet ID '{f}' does not "
        f"exist</message></error><fleetId>{f}</fleetId></item>"
        for f in unseen
    )
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<DeleteFleetsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>00000000-0000-0000-0000-000000000000</requestId>"
        "<successfulFleetDeletionSet/>"
        f"<unsuccessfulFleetDeletionSet>{items}</unsuccessfulFleetDeletionSet>"
        "</DeleteFleetsResponse>"
    )
    # Every fleet of the request is answered as unknown: a mix would need moto's answer too,
    # and amibake deletes one fleet per call.
    return Reply(200, [("Content-Type", "text/xml")], body.encode())


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "ec2" or not reply.ok:
        return reply
    now = faults.now()
    text = reply.body.decode()
    if request.action in ("RunInstances", "CreateFleet"):
        born = faults.remember("instances:born")
        for instance in sorted(set(_INSTANCE.findall(text))):
            born[instance] = now
            faults.ordinal("instance", instance)
        fleet = _FLEET.search(text) if request.action == "CreateFleet" else None
        if fleet:
            faults.remember("fleets:born")[fleet.group(1)] = now
            faults.ordinal("fleet", fleet.group(1))
    elif request.action == "TerminateInstances":
        ended = faults.remember("instances:terminated")
        for instance in _named(request):
            ended.setdefault(instance, now)
        return _shutting_down(faults, reply, text, now)
    elif request.action == "DescribeInstances":
        if not _named(request):  # by filter: an instance not visible yet is not listed
            reply = _hide_unseen(faults, reply, now)
        return _shutting_down(faults, reply, reply.body.decode(), now)
    return reply


def _shutting_down(faults: Faults, reply: Reply, text: str, now: float) -> Reply:
    """A terminated instance is shutting-down (code 32) for a moment first."""
    ended = faults.remember("instances:terminated")
    changed = text
    for instance, when in list(ended.items()):
        n = faults.ordinal("instance", instance)
        if now >= when + faults.between(*SHUTTING_DOWN_S, "instance", n, "shutting-down"):
            continue
        start = changed.find(f"<instanceId>{instance}</instanceId>")
        if start < 0:
            continue
        # The state follows the id, in DescribeInstances (instanceState) and in
        # TerminateInstances' answer (currentState).
        end = changed.find("</item>", start)
        end = len(changed) if end < 0 else end
        part = re.sub(
            r"<code>48</code>(\s*)<name>terminated</name>",
            r"<code>32</code>\1<name>shutting-down</name>",
            changed[start:end],
            count=1,
        )
        if part != changed[start:end]:
            faults.count(BEHAVIOUR.name, "terminated instance still shutting-down")
            changed = changed[:start] + part + changed[end:]
    return reply if changed == text else Reply(reply.status, reply.headers, changed.encode())


def _hide_unseen(faults: Faults, reply: Reply, now: float) -> Reply:
    try:
        root = ElementTree.fromstring(reply.body)
    except ElementTree.ParseError:
        return reply
    hidden = False
    for reservations in root.iterfind("{*}reservationSet"):
        for reservation in list(reservations):
            for instances in reservation.iterfind("{*}instancesSet"):
                for item in list(instances):
                    if _unseen(faults, item.findtext("{*}instanceId") or "", now):
                        instances.remove(item)
                        hidden = True
                if not len(instances):
                    reservations.remove(reservation)
    if not hidden:
        return reply
    faults.count(BEHAVIOUR.name, "new instance not listed yet")
    return Reply(reply.status, reply.headers, ElementTree.tostring(root, encoding="utf-8"))


BEHAVIOUR = Behaviour(
    name="instance-consistency",
    source="EC2 developer guide: Eventual consistency in the Amazon EC2 API; DeleteFleets",
    before=_before,
    after=_after,
)
