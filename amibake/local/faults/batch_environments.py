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

Locally: an environment created within FRESH_S of an IAM role or instance profile being made
(or a role added to a profile) goes INVALID at a seeded rate, and is described so, whatever its
state, until it is deleted. An environment deleted within LINGER_S (seeded) of a queue's update
or deletion is refused so.
"""

from __future__ import annotations

from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request, json_error

# IAM propagation "usually seconds, at times minutes": the window in which a new environment
# may find its roles or profile not usable yet.
FRESH_S = 60.0
INVALID = 0.35  # share of environments created in that window that go INVALID
LINGER_S = (0.5, 3.0)  # a queue's old relationship to an environment, after its update
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


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if not reply.ok:
        return reply
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
        "terraform-provider-aws#37945, #21281, #46925; kops#35; metaflow-tools#9; "
        "Batch API reference"
    ),
    before=_before,
    after=_after,
)
