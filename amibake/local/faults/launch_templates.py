"""A launch template EC2 has just made, not yet known to EC2 Fleet: an instant fleet asked
seconds later returns its FleetId with every override refused, InvalidLaunchTemplateId.NotFound,
and the same request succeeds a little later.

Sources: the EC2 API reference, "Eventual consistency in the Amazon EC2 API" (a resource just
created may not be found by the next call, and a call that names it may fail); 4dn-dcic/tibanna
#383 (CreateFleet retried "in the case the launch template is not yet available when the fleet
is created"). An instant fleet reports what it could not launch in its Errors (CreateFleet API
reference), as it does capacity (fleet-errors).

Locally: a share of launch templates (UNSEEN) is unknown to CreateFleet for a window drawn per
template from UNSEEN_S after CreateLaunchTemplate.
"""

from __future__ import annotations

import re

from amibake.local.faults import Behaviour, Faults, Reply, Request
from amibake.local.faults.fleets import instant, refused_fleet, requested

UNSEEN = 0.3  # share of new launch templates CreateFleet does not see at first
UNSEEN_S = (0.5, 2.5)  # for this long after their creation (AWS: seconds)
CODE = "InvalidLaunchTemplateId.NotFound"
_ID = re.compile(r"<launchTemplateId>(lt-[0-9a-f]+)</launchTemplateId>")


def unseen(faults: Faults, n: int) -> bool:
    """Whether the cloud's n-th launch template is unknown to CreateFleet at first."""
    return faults.chance(UNSEEN, "launch-template", n, "unseen")


def _before(faults: Faults, request: Request) -> Reply | None:
    if not instant(request):
        return None
    overrides = requested(request)
    for template in {o.template_id for o in overrides}:
        n = faults.ordinal("launch-template", template)
        if unseen(faults, n) and faults.fresh("launch-template", template, UNSEEN_S):
            faults.count(BEHAVIOUR.name, "launch template not found yet")
            return refused_fleet(request, [(o, CODE) for o in overrides])
    return None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service == "ec2" and request.action == "CreateLaunchTemplate" and reply.ok:
        faults.made("launch-template", reply, _ID)
    return reply


BEHAVIOUR = Behaviour(
    name="launch-templates",
    source="EC2 API reference, Eventual consistency; 4dn-dcic/tibanna#383",
    before=_before,
    after=_after,
)
