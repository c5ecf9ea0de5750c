"""A role or instance profile IAM has just made is not yet known to every IAM call: one that
names it seconds later (AttachRolePolicy, AddRoleToInstanceProfile, GetInstanceProfile, ...)
answers NoSuchEntity, and the same call succeeds a little later.

Sources: the IAM user guide, "Troubleshoot IAM" ("changes that I make are not always immediately
visible": IAM is eventually consistent, replicated across regions); hashicorp/terraform-provider-
aws#6079 and its propagation retries (AddRoleToInstanceProfile NoSuchEntity right after
CreateRole and CreateInstanceProfile, retried for up to two minutes).

Locally: a share of new roles and instance profiles (UNSEEN) is unknown, to the IAM calls that
name them, for a window drawn per entity from UNSEEN_S after its creation.
"""

from __future__ import annotations

import re

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

NAME = "iam-consistency"
UNSEEN = 0.5  # share of new roles and instance profiles unknown at first
UNSEEN_S = (0.5, 3.0)  # for this long after their creation (AWS: seconds, at times a minute)
# kind -> (its create, the create reply's name, the parameter naming it)
KINDS = {
    "role": ("CreateRole", re.compile(r"<RoleName>([^<]+)</RoleName>"), "RoleName"),
    "instance-profile": (
        "CreateInstanceProfile",
        re.compile(r"<InstanceProfileName>([^<]+)</InstanceProfileName>"),
        "InstanceProfileName",
    ),
}


def unseen(faults: Faults, kind: str, n: int) -> bool:
    """Whether the cloud's n-th role (or instance profile) is unknown at first."""
    return faults.chance(UNSEEN, kind, n, "iam-unseen")


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "iam":
        return None
    for kind, (create, _, parameter) in KINDS.items():
        name = str(request.params.get(parameter, ""))
        if not name or request.action == create:
            continue
        # fresh first: False for what this layer did not see made, which takes no ordinal.
        if faults.fresh(f"iam-{kind}", name, UNSEEN_S) and unseen(
            faults, kind, faults.ordinal(f"iam-{kind}", name)
        ):
            faults.count(NAME, f"new {kind} not found by {request.action}")
            noun = "role" if kind == "role" else "Instance Profile"
            return query_error("NoSuchEntity", f"The {noun} with name {name} cannot be found.", 404)
    return None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "iam" or not reply.ok:
        return reply
    for kind, (create, pattern, _) in KINDS.items():
        if request.action == create:
            faults.made(f"iam-{kind}", reply, pattern)
    return reply


BEHAVIOUR = Behaviour(
    name=NAME,
    source="IAM user guide, Troubleshoot IAM (changes not immediately visible); "
    "hashicorp/terraform-provider-aws#6079",
    before=_before,
    after=_after,
)
