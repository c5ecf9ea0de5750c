"""Requests refused for their rate, as every AWS service does now and then: the caller is to wait
and send the same request again (the SDKs do, with backoff; a client without retries fails).

Each service in its own form: EC2 ``RequestLimitExceeded`` with HTTP 503, IAM and STS
``Throttling`` ("Rate exceeded"), Batch ``TooManyRequestsException`` (429), the JSON services
(SSM, ECR, Logs) ``ThrottlingException``, S3 ``SlowDown`` with 503 ("Please reduce your request
rate"). A refused request was not acted on: sending it again is safe.

Sources: the EC2 developer guide, "Request throttling for the Amazon EC2 API" (RequestLimitExceeded;
retry with exponential backoff); the IAM and STS error references (Throttling); the S3 user guide,
"Best practices design patterns: optimizing Amazon S3 performance" (503 Slow Down: retry); the
AWS SDKs and Tools reference guide, "Retry behavior" (the throttling codes the standard mode
retries, with backoff); boto3's "Retries" guide (the same list).

Locally: a share of the requests to each service, drawn per request and attempt, so that a retry
of a refused request is drawn afresh, as AWS's token bucket refills.
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

NAME = "throttling"
SHARE = 0.02  # of the requests to a service (AWS: per account and API, when a bucket runs dry)


def refusal(service: str) -> Reply:
    """The service's own answer to a request over its rate."""
    if service == "ec2":
        return query_error("RequestLimitExceeded", "Request limit exceeded.", 503)
    if service in ("iam", "sts"):
        return query_error("Throttling", "Rate exceeded")
    if service == "batch":
        return json_error("TooManyRequestsException", "Too Many Requests", 429)
    if service == "s3":
        return s3_error("SlowDown", "Please reduce your request rate.", 503)
    return json_error("ThrottlingException", "Rate exceeded")


def _before(faults: Faults, request: Request) -> Reply | None:
    about, attempt = faults.attempt(NAME, request)
    if not faults.chance(SHARE, NAME, about, attempt):
        return None
    faults.count(NAME, f"{request.service} {request.action or 'request'} refused")
    return refusal(request.service)


BEHAVIOUR = Behaviour(
    name=NAME,
    source="EC2 developer guide, Request throttling for the Amazon EC2 API; IAM and STS error "
    "references (Throttling); S3 user guide, optimizing performance (503 Slow Down); AWS SDKs "
    "and Tools reference guide, Retry behavior",
    before=_before,
)
