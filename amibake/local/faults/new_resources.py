"""A security group, launch template or key pair EC2 has just made is not yet known to every
call: a group's or template's delete seconds later answers InvalidGroup.NotFound /
InvalidLaunchTemplateId.NotFound, and the resource stays; a key pair's delete by name answers
success and deletes nothing (by name it succeeds for a key EC2 does not know); a describe naming
any of them answers NotFound, though it exists.

Sources: the EC2 API reference, "Eventual consistency in the Amazon EC2 API" (a resource just
created may not be found by the next call that names it); terraform-provider-aws waits for a new
security group to be found (waitSecurityGroupCreated) before it acts on it.

Locally: a share of new groups, templates and key pairs (UNSEEN) are unknown to their delete,
and to a describe naming them, for a window drawn per resource from UNSEEN_S after their
creation; the delete then does nothing.
"""

from __future__ import annotations

import re

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

UNSEEN = 0.3  # share of new groups, templates, key pairs their delete does not find at first
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
    # By name, DeleteKeyPair answers success whether or not EC2 knows the key (boto/boto3#865):
    # of a key it does not know yet, it deletes nothing, and says so no more than that.
    "key-pair": (
        "ImportKeyPair",
        re.compile(r"<keyName>([^<]+)</keyName>"),
        "DeleteKeyPair",
        "KeyName",
        "InvalidKeyPair.NotFound",  # a describe's; the delete answers DELETED_NOTHING
        "DescribeKeyPairs",
        "KeyName.",
    ),
}
DELETED_NOTHING = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteKeyPairResponse '
    b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>'
    b"00000000-0000-0000-0000-000000000000</requestId><return>true</return>"
    b"</DeleteKeyPairResponse>"
)


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
                if kind == "key-pair" and request.action == delete:
                    return Reply(200, [("Content-Type", "text/xml")], DELETED_NOTHING)
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
