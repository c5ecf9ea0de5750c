"""An answer lost after AWS acted on its request: a create's reply is an HTTP 500 (or never
comes, and the client times out) though the resource was made. The SDKs send the request again.
A request with a ClientToken is idempotent: sent again, it answers what the first made
(RunInstances, CreateFleet, CreateLaunchTemplate), and the same token with other parameters is
refused, IdempotentParameterMismatch. One without a token is made again, or refused for the
first one's name: InvalidGroup.Duplicate, InvalidKeyPair.Duplicate, InvalidAMIName.Duplicate.
A caller that takes that refusal for its failure leaves the first resource known only by its
tags.

Sources: the EC2 API reference, "Ensuring idempotency in Amazon EC2 API requests" (a client
token makes a retry of RunInstances, CreateFleet, CreateLaunchTemplate safe; a mismatch is
IdempotentParameterMismatch); the AWS SDKs and Tools reference guide, "Retry behavior" (HTTP
500 and timeouts are retried, whatever the operation); skypilot-org/skypilot#4584 (a security
group's create answered InvalidGroup.Duplicate, and the group was found by its name).

Locally: a share of the EC2, Batch, IAM and S3 creates (SHARE) that moto made have their answer
replaced by the service's 500 (EC2's InternalError, Batch's ServerException, IAM's
ServiceFailure, S3's InternalError), drawn by the request's place
among its action's and its attempt; the gateway keeps each ClientToken's first answer and gives
it to the same request sent again.
"""

from __future__ import annotations

from amibake.local.faults import (
    Behaviour,
    Faults,
    Reply,
    Request,
    json_error,
    query_error,
    s3_error,
)

NAME = "lost-answers"
SHARE = 0.05  # of the creates below (AWS: rare, but a run makes dozens and retries them all)
# action -> its service
CREATES = {
    "CreateKeyPair": "ec2",
    "ImportKeyPair": "ec2",
    "CreateSecurityGroup": "ec2",
    "CreateLaunchTemplate": "ec2",
    "CreateFleet": "ec2",
    "RunInstances": "ec2",
    "CreateImage": "ec2",
    # Batch's: an environment's or queue's name is refused "already exists" (ClientException);
    # a job definition sent again is registered again, a revision more.
    "CreateComputeEnvironment": "batch",
    "CreateJobQueue": "batch",
    "RegisterJobDefinition": "batch",
    # IAM's: a role's or instance profile's name sent again is EntityAlreadyExists, the
    # service-linked role's InvalidInput ("has been taken in this account").
    "CreateServiceLinkedRole": "iam",
    "CreateRole": "iam",
    "CreateInstanceProfile": "iam",
    # S3's: a bucket's name sent again is BucketAlreadyOwnedByYou (us-east-1: 200, as the first)
    "CreateBucket": "s3",
}
IDEMPOTENT = {"RunInstances", "CreateFleet", "CreateLaunchTemplate"}  # by their ClientToken


def lost(faults: Faults, action: str, n: int, attempt: int) -> bool:
    """Whether the answer to the cloud's n-th create of this action, at this attempt, is lost
    (by the request's place among the action's, not its parameters: those hold random ids)."""
    return faults.chance(SHARE, NAME, action, n, attempt)


def _token(request: Request) -> str:
    if request.service != "ec2" or request.action not in IDEMPOTENT:
        return ""
    return str(request.params.get("ClientToken") or "")


def _scope(request: Request, token: str) -> str:
    """A token is the account's, in a region, for one action."""
    return f"{request.account} {request.region} {request.action} {token}"


def _asked(request: Request) -> dict[str, object]:
    """What a request asks, without what the SDK changes on each sending."""
    return {k: v for k, v in request.params.items() if k not in ("Version",)}


def _before(faults: Faults, request: Request) -> Reply | None:
    token = _token(request)
    if not token:
        return None
    first = faults.remember(f"{NAME}:tokens").get(_scope(request, token))
    if first is None:
        return None
    asked, reply = first  # what the first asked, and its answer (a Reply)
    if asked != _asked(request):
        return query_error(
            "IdempotentParameterMismatch",
            f"The client token {token} was used by a request with other parameters.",
        )
    faults.count(NAME, f"{request.action} answered again for its client token")
    return reply if isinstance(reply, Reply) else None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if CREATES.get(request.action) != request.service or not reply.ok:
        return reply
    token = _token(request)
    if token:
        faults.remember(f"{NAME}:tokens")[_scope(request, token)] = (_asked(request), reply)
    about, attempt = faults.attempt(NAME, request)
    if not lost(faults, request.action, faults.ordinal(f"{NAME}:{request.action}", about), attempt):
        return reply
    faults.count(NAME, f"{request.action} made, its answer lost")
    if request.service == "batch":
        return json_error("ServerException", "An internal error occurred.", 500)
    if request.service == "iam":
        return query_error("ServiceFailure", "Request processing has failed.", 500)
    if request.service == "s3":
        return s3_error("InternalError", "We encountered an internal error. Please try again.", 500)
    return query_error("InternalError", "An internal error has occurred.", 500)


BEHAVIOUR = Behaviour(
    name=NAME,
    source="EC2 API reference, Ensuring idempotency; AWS SDKs and Tools reference guide, Retry "
    "behavior; skypilot-org/skypilot#4584",
    before=_before,
    after=_after,
    outermost=True,
)
