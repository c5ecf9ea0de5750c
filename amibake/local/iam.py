"""IAM authorization as AWS does it, for the calls amibake makes: by resource ARN and condition.

moto's enforcement checks only the action (the resource is always "*" outside S3) and treats
any Condition it cannot fill as a denial, so a least-privilege policy scoped by ARN and tag is
denied everything, while Resource "*" passes: the opposite of AWS. Here each call becomes the
authorization requests AWS makes for it (the Service Authorization Reference: which resources
each action authorizes and which condition keys it supplies), including those AWS adds on the
caller's behalf: ec2:CreateTags for tags given at creation (with ec2:CreateAction), the
ec2:RunInstances an EC2 Fleet makes from its launch template, iam:PassRole for each role handed
to a service (with iam:PassedToService). Each is evaluated against the caller's policies (and,
for S3, the bucket's own policy): an explicit Deny wins, else an Allow is needed.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Context = dict[str, Any]  # condition key -> value (a str, or a list for multivalued keys)
# Every request the local cloud serves stands for one amibake makes to AWS over TLS (boto3's
# endpoints and the job agent's are https: fleet/agent/s3.py), and it travels on loopback
# addresses no other host reaches. So each carries aws:SecureTransport "true": a policy that
# refuses plain HTTP (AWS Security Hub's S3.5) refuses none of amibake's calls, here as on AWS.
TRANSPORT: Context = {"aws:SecureTransport": "true"}


@dataclass
class Check:
    action: str
    resource: str
    context: Context = field(default_factory=dict)


# --- policy evaluation ----------------------------------------------------------------------


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str) -> bool:
    """IAM's wildcards: * any run, ? one character; case-sensitive."""
    return fnmatch.fnmatchcase(value, pattern)


def _matches(patterns: Any, value: str, *, ignore_case: bool = False) -> bool:
    for pattern in _as_list(patterns):
        text, wanted = (value.lower(), str(pattern).lower()) if ignore_case else (value, pattern)
        if _like(str(wanted), text):
            return True
    return False


_OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda want, have: have == want,
    "StringNotEquals": lambda want, have: have != want,
    "StringEqualsIgnoreCase": lambda want, have: have.lower() == want.lower(),
    "StringLike": lambda want, have: _like(want, have),
    "StringNotLike": lambda want, have: not _like(want, have),
    "ArnEquals": lambda want, have: have == want,
    "ArnLike": lambda want, have: _like(want, have),
    "ArnNotLike": lambda want, have: not _like(want, have),
    "Bool": lambda want, have: have.lower() == want.lower(),
}
_NEGATED = {"StringNotEquals", "StringNotLike", "ArnNotLike"}


def _condition(operator: str, key: str, wanted: Any, context: Context) -> bool:
    """One operator on one key, with IAM's rules for missing keys and set qualifiers."""
    qualifier, _, operator = operator.rpartition(":")
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    present = key in context
    if operator == "Null":  # "true": the key must be absent; "false": present
        return str(_as_list(wanted)[0]).lower() == ("false" if present else "true")
    if not present:
        if qualifier == "ForAllValues":
            return True  # vacuously
        return if_exists
    test = _OPERATORS.get(operator)
    if test is None:
        return False  # an operator this evaluator does not know never grants
    values = [str(v) for v in _as_list(context[key])]
    wants = [str(w) for w in _as_list(wanted)]

    def one(value: str) -> bool:
        if operator in _NEGATED:
            return all(test(w, value) for w in wants)
        return any(test(w, value) for w in wants)

    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    return any(one(v) for v in values)  # ForAnyValue, and single-valued keys


def _statement_applies(statement: dict[str, Any], check: Check) -> bool:
    if "Action" in statement:
        if not _matches(statement["Action"], check.action, ignore_case=True):
            return False
    elif _matches(statement.get("NotAction", []), check.action, ignore_case=True):
        return False
    if "Resource" in statement:
        if not _matches(statement["Resource"], check.resource):
            return False
    elif "NotResource" in statement and _matches(statement["NotResource"], check.resource):
        return False
    if "Principal" in statement and not _principal(statement["Principal"], check):
        return False
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, wanted in keys.items():
            if not _condition(operator, key, wanted, check.context):
                return False
    return True


def _principal(principal: Any, check: Check) -> bool:
    """A resource policy's Principal: "*", AWS ARNs / account ids naming the caller, or (a
    role's trust policy) the service asking for it, named in ``aws:PrincipalServiceName``."""
    if principal == "*":
        return True
    service = str(check.context.get("aws:PrincipalServiceName", ""))
    if service and isinstance(principal, dict):
        return service in [str(s) for s in _as_list(principal.get("Service", []))]
    caller = str(check.context.get("aws:PrincipalArn", ""))
    for named in _as_list(principal.get("AWS", []) if isinstance(principal, dict) else []):
        named = str(named)
        if named == "*" or named == caller or (named.isdigit() and f":{named}:" in caller):
            return True
    return False


def decide(policies: Iterable[dict[str, Any]], check: Check) -> str:
    """ "deny" (explicitly), "allow", or "implicit" (no statement allows it)."""
    allowed = False
    for policy in policies:
        for statement in _as_list(policy.get("Statement", [])):
            if not _statement_applies(statement, check):
                continue
            if statement.get("Effect") == "Deny":
                return "deny"
            allowed = True
    return "allow" if allowed else "implicit"


def documents(policies: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """moto's policies as dicts: managed policy objects (their default version), inline ones
    as text or as {"policy_document": text}."""
    for policy in policies:
        if hasattr(policy, "versions"):
            policy = next(v.document for v in policy.versions if v.is_default)
        elif isinstance(policy, dict) and "policy_document" in policy:
            policy = policy["policy_document"]
        if isinstance(policy, str):
            policy = json.loads(policy)
        yield policy
