"""A principal IAM has just made is not known yet where other services check policies: a bucket
policy naming a role created seconds before is refused with MalformedPolicy, "Invalid principal
in policy", and the same call succeeds a little later.

Sources: hashicorp/terraform#4315 (the S3 bucket resource retries MalformedPolicy for a minute,
"errors ... due to newly created IAM resources"); aws/aws-sdk-java-v2#1946 (PutBucketPolicy right
after creating the user it names: "Invalid principal in policy", then success after a couple of
retries); opstrace/opstrace#88 (the same refusal for about a minute).

Locally: a role made within a window drawn per role from UNKNOWN_S is refused as a bucket
policy's principal.
"""

from __future__ import annotations

import json
import re
from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request, s3_error

UNKNOWN_S = (0.5, 3.0)  # AWS: seconds, at times a minute (shortened here)
_ARN = re.compile(r"<Arn>(arn:[^<]+:role/[^<]+)</Arn>")


def principals(policy: str) -> set[str]:
    """The AWS principals a policy document names (an unreadable one names none: S3 answers it
    as malformed for its own reasons)."""
    try:
        document = json.loads(policy)
    except ValueError:
        return set()
    statements: Any = document.get("Statement", []) if isinstance(document, dict) else []
    found: set[str] = set()
    for statement in statements if isinstance(statements, list) else [statements]:
        principal = statement.get("Principal") if isinstance(statement, dict) else None
        named = principal.get("AWS", []) if isinstance(principal, dict) else []
        found.update(str(n) for n in (named if isinstance(named, list) else [named]))
    return found


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "s3" or request.action != "PutBucketPolicy":
        return None
    for arn in principals(str(request.params.get("Policy", ""))):
        if faults.fresh("role", arn, UNKNOWN_S):
            faults.count(BEHAVIOUR.name, "principal not known yet")
            return s3_error("MalformedPolicy", "Invalid principal in policy")
    return None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service == "iam" and request.action == "CreateRole" and reply.ok:
        faults.made("role", reply, _ARN)
    return reply


BEHAVIOUR = Behaviour(
    name="iam-principals",
    source="hashicorp/terraform#4315; aws/aws-sdk-java-v2#1946; opstrace/opstrace#88",
    before=_before,
    after=_after,
)
