"""A Batch compute environment created seconds after its roles or instance profile can go
INVALID, with a reason, and stays INVALID: through UpdateComputeEnvironment (DISABLED too) until
it is deleted.

Sources: hashicorp/terraform-provider-aws#37945 (a new environment on a new IAM role "sometimes"
ends INVALID, "CLIENT_ERROR - User: arn:aws:sts::...:assumed-role/...-batch-service/aws-batch is
not authorized to perform: ecs:DescribeClusters ...": IAM had not propagated yet);
kubernetes/kops#35 and Netflix/metaflow-tools#9 ("CLIENT_ERROR - Invalid IamInstanceProfile" on
a fresh account: the profile not usable yet though it exists);
hashicorp/terraform-provider-aws#21281 (INVALID is terminal: the provider stopped waiting for
VALID and reports the statusReason). The Batch API reference, DeleteComputeEnvironment: disable
it and take it out of its job queues first.

And an environment just taken out of its job queue (UpdateJobQueue with another order, or the
queue deleted) still counts as the queue's for a moment: DeleteComputeEnvironment answers
ClientException "Cannot delete, found existing JobQueue relationship" though the update succeeded
(hashicorp/terraform-provider-aws#46925, "AWS Batch has eventual consistency").

And a queue or environment deleted is still described for a while, with status DELETED (the
Batch API's JQStatus and CEStatus have it; terraform-provider-aws waited for DELETED as the
target of a deletion, and its finders now take DELETED for not found).

Locally: an environment created within FRESH_S of an IAM role or instance profile being made
(or a role added to a profile) goes INVALID at a seeded rate, and is described so, whatever its
state, until it is deleted. An environment deleted within LINGER_S (seeded) of a queue's update
or deletion is refused so. A queue or environment deleted is described (by name, by ARN, or in
a listing's last page) as it last was, DELETED and DISABLED, for DELETED_S (seeded), unless one
of its name is made again.
"""

from __future__ import annotations

import copy
from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request, json_error

# IAM propagation "usually seconds, at times minutes": the window in which a new environment
# may find its roles or profile not usable yet.
FRESH_S = 60.0
INVALID = 0.35  # share of environments created in that window that go INVALID
LINGER_S = (0.5, 3.0)  # a queue's old relationship to an environment, after its update
# How long a deleted queue or environment is described DELETED: AWS does not say; long enough
# that a wait for it to vanish from the describe runs out (fleet's and gc's waited 300 s).
DELETED_S = (400.0, 900.0)
# each describe's list (asked and answered under one key) and its entries' name field
DESCRIBED = {
    "DescribeJobQueues": ("jobQueues", "jobQueueName"),
    "DescribeComputeEnvironments": ("computeEnvironments", "computeEnvironmentName"),
}
DELETES = {
    "DeleteJobQueue": ("DescribeJobQueues", "jobQueue"),
    "DeleteComputeEnvironment": ("DescribeComputeEnvironments", "computeEnvironment"),
}
CREATES = {
    "CreateJobQueue": ("DescribeJobQueues", "jobQueueName"),
    "CreateComputeEnvironment": ("DescribeComputeEnvironments", "computeEnvironmentName"),
}
# What changes an IAM principal an environment uses (AttachRolePolicy of a policy already
# attached changes nothing: amibake repeats it on every `up`).
IAM_CHANGES = (
    "CreateRole",
    "CreateInstanceProfile",
    "AddRoleToInstanceProfile",
    "CreateServiceLinkedRole",
)


def _name(environment: str) -> str:
    return environment.rsplit("/", 1)[-1]


def reason(faults: Faults, n: int, profile: str, service_role: str) -> str:
    """One of the reasons AWS gives, for the n-th environment."""
    if faults.chance(0.5, "compute-environment", n, "why") or not service_role:
        return f"CLIENT_ERROR - Invalid IamInstanceProfile: {profile}"
    assumed = service_role.replace(":iam:", ":sts:").replace(":role/", ":assumed-role/")
    return (
        f"CLIENT_ERROR - User: {assumed}"
        "/aws-batch is not authorized to perform: ecs:DescribeClusters because no "
        "identity-based policy allows the ecs:DescribeClusters action"
    )


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "batch" or request.action != "DeleteComputeEnvironment":
        return None
    changed = faults.remember("batch-environments:queues").get(request.account)
    if changed is None:
        return None
    when, n = changed
    if faults.now() < when + faults.between(*LINGER_S, "job-queue-update", n, "linger"):
        faults.count(BEHAVIOUR.name, "queue relationship lingers")
        return json_error("ClientException", "Cannot delete, found existing JobQueue relationship")
    return None


def _deleted_lingers(faults: Faults, request: Request, reply: Reply) -> Reply:
    """Remember each queue and environment as last described; describe a deleted one DELETED
    for DELETED_S after its deletion. Keyed "account action name"."""
    seen = faults.remember("batch-environments:seen")
    gone = faults.remember("batch-environments:deleted")  # key -> (until, entry)
    if request.action in CREATES:
        action, field = CREATES[request.action]
        gone.pop(f"{request.account} {action} {request.params.get(field, '')}", None)
        return reply
    if request.action in DELETES:
        action, field = DELETES[request.action]
        name = _name(str(request.params.get(field, "")))
        key = f"{request.account} {action} {name}"
        last = copy.deepcopy(seen.get(key) or {DESCRIBED[action][1]: name})
        last.update(status="DELETED", state="DISABLED")
        with faults.lock:
            made = faults.state.setdefault("batch-environments:deletions", [0])
            made[0] += 1
            n = made[0]
        gone[key] = (faults.now() + faults.between(*DELETED_S, "batch-deleted", n), last)
        return reply
    if request.action not in DESCRIBED:
        return reply
    listed_key, name_key = DESCRIBED[request.action]
    data = reply.json()
    listed: list[dict[str, Any]] = data.get(listed_key, [])
    prefix = f"{request.account} {request.action} "
    for entry in listed:
        seen[prefix + str(entry.get(name_key, ""))] = copy.deepcopy(entry)
    if data.get("nextToken"):  # the deleted ones go on the last page
        return reply
    asked = {_name(str(a)) for a in request.params.get(listed_key) or []}
    live = {str(e.get(name_key, "")) for e in listed}
    now = faults.now()
    added = False
    for key, (until, entry) in list(gone.items()):
        name = key.removeprefix(prefix)
        if not key.startswith(prefix):
            continue
        if now >= until:
            gone.pop(key, None)
        elif name not in live and (not asked or name in asked):
            listed.append(copy.deepcopy(entry))
            added = True
            faults.count(BEHAVIOUR.name, "deleted still described")
    if not added:
        return reply
    data[listed_key] = listed
    return reply.with_json(data)


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if not reply.ok:
        return reply
    if request.service == "batch":
        reply = _deleted_lingers(faults, request, reply)
    now = faults.now()
    if request.service == "batch" and request.action in ("UpdateJobQueue", "DeleteJobQueue"):
        with faults.lock:
            made = faults.state.setdefault("batch-environments:queue-updates", [0])
            made[0] += 1
            n = made[0]
        faults.remember("batch-environments:queues")[request.account] = (now, n)
    if request.service == "iam" and request.action in IAM_CHANGES:
        faults.remember("batch-environments:iam")[request.account] = now
        return reply
    if request.service != "batch":
        return reply
    invalid: dict[str, str] = faults.remember("batch-environments:invalid")
    if request.action == "CreateComputeEnvironment":
        name = str(request.params.get("computeEnvironmentName", ""))
        with faults.lock:
            made = faults.state.setdefault("batch-environments:made", [0])
            made[0] += 1
            n = made[0]
        changed = faults.remember("batch-environments:iam").get(request.account)
        fresh = changed is not None and now - changed < FRESH_S
        if fresh and faults.chance(INVALID, "compute-environment", n, "invalid"):
            resources: dict[str, Any] = request.params.get("computeResources") or {}
            why = reason(
                faults,
                n,
                str(resources.get("instanceRole", "")),
                str(request.params.get("serviceRole", "")),
            )
            invalid[name] = why
            faults.count(BEHAVIOUR.name, "compute environment invalid")
    elif request.action == "DeleteComputeEnvironment":
        name = _name(str(request.params.get("computeEnvironment", "")))
        invalid.pop(name, None)
    elif request.action == "DescribeComputeEnvironments" and invalid:
        data = reply.json()
        changed_any = False
        for environment in data.get("computeEnvironments", []):
            found = invalid.get(environment.get("computeEnvironmentName", ""))
            if found is not None:
                environment["status"], environment["statusReason"] = "INVALID", found
                changed_any = True
                faults.count(BEHAVIOUR.name, "described invalid")
        if changed_any:
            return reply.with_json(data)
    return reply


BEHAVIOUR = Behaviour(
    name="batch-environments",
    source=(
        "terraform-provider-aws#37945, #21281, #46925, its job queue finder; kops#35; "
        "metaflow-tools#9; Batch API reference"
    ),
    before=_before,
    after=_after,
)
