"""A security group or launch template EC2 has just made is not yet known to every call: its
delete seconds later answers InvalidGroup.NotFound / InvalidLaunchTemplateId.NotFound, and the
resource stays; a describe naming it answers the same, though it exists.

Sources: the EC2 API reference, "Eventual consistency in the Amazon EC2 API" (a resource just
created may not be found by the next call that names it); terraform-provider-aws waits for a new
security group to be found (waitSecurityGroupCreated) before it acts on it.

Locally: a share of new groups and templates (UNSEEN) are NotFound to their delete, and to a
describe by id, for a window drawn per resource from UNSEEN_S after their creation; the delete
then does nothing.
"""

from __future__ import annotations

import re

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

UNSEEN = 0.3  # share of new groups and templates whose delete does not find them at first
UNSEEN_S = (0.5, 2.5)  # for this long after their creation (AWS: seconds)
# kind -> (the create, the create reply's id, the delete, the delete's id parameter, its code,
# the describe, the prefix of its id parameters)
KINDS = {
    "security-group": (
        "CreateSecurityGroup",
        re.compile(r"<groupId>(sg-[0-9a-f]+)</groupId>"),
        "DeleteSecurityGroup",
        "GroupId",
        "InvalidGroup.NotFound",
        "DescribeSecurityGroups",
        "GroupId.",
    ),
    "launch-template": (
        "CreateLaunchTemplate",
        re.compile(r"<launchTemplateId>(lt-[0-9a-f]+)</launchTemplateId>"),
        "DeleteLaunchTemplate",
        "LaunchTemplateId",
        "InvalidLaunchTemplateId.NotFound",
        "DescribeLaunchTemplates",
        "LaunchTemplateId.",
    ),
}


def unseen(faults: Faults, kind: str, n: int) -> bool:
    """Whether the cloud's n-th resource of the kind is unknown to its delete at first."""
    return faults.chance(UNSEEN, kind, n, "delete-unseen")


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "ec2":
        return None
    for kind, (_, _, delete, parameter, code, describe, prefix) in KINDS.items():
        if request.action == delete:
            named, by = [str(request.params.get(parameter, ""))], "its delete"
        elif request.action == describe:
            named = [str(v) for k, v in request.params.items() if k.startswith(prefix)]
            by = "a describe"
        else:
            continue
        for resource in named:
            # fresh first: it is False for what this layer did not see made (a user's group),
            # which then takes no ordinal from the ones it did.
            fresh = faults.fresh(f"new-{kind}", resource, UNSEEN_S)
            if fresh and unseen(faults, kind, faults.ordinal(kind, resource)):
                faults.count(BEHAVIOUR.name, f"new {kind} not found by {by}")
                return query_error(code, f"The {kind} ID '{resource}' does not exist")
    return None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "ec2" or not reply.ok:
        return reply
    for kind, (create, pattern, *_) in KINDS.items():
        if request.action == create:
            faults.made(f"new-{kind}", reply, pattern)
    return reply


BEHAVIOUR = Behaviour(
    name="new-resources",
    source="EC2 API reference, Eventual consistency; terraform-provider-aws's security groups",
    before=_before,
    after=_after,
)
