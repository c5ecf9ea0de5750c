"""Request lists held to the length the API takes, as AWS refuses them: moto takes any number.

The limits are botocore's service models': a list member's ``max`` (DescribeInstanceTypes takes
100 InstanceTypes, GetParameters 10 Names), and where the model states it only in words, its
documentation's "up to N" (Batch's DescribeJobs: "A list of up to 100 job IDs"; its Describe*
names likewise). botocore checks a list's minimum length before sending, never its maximum:
that is the service's to refuse, which is what this behaviour does, each service in its form.

Sources: the EC2 API reference (DescribeInstanceTypes, InstanceTypes: "Maximum number of 100
items"); aws-samples/ec2-topology-aware-for-slurm#4 (EC2 refusing a list over its limit:
"InvalidParameterValue ... instance-ids cannot contain over 100 values");
pegasus-isi/pegasus#2086 (Batch: "ClientException: ... Maximum number of jobs supported is
100"); the JSON services' validation message ("1 validation error detected: ... Member must have
length less than or equal to N"). issue 26, finding 9 (bake sent 108 instance types).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request, json_error, query_error
from amibake.local.faults.pagination import wire_name
from amibake.service_models import service_model

NAME = "request-limits"
_UP_TO = re.compile(r"\b[Aa] (?:space-separated )?list of up to (\d+)\b")


@functools.cache
def limits(service: str, action: str) -> tuple[str, tuple[tuple[str, str, int], ...]]:
    """The service's protocol, and (member, its name on the wire, the most items it takes) for
    the operation's top-level list members that have a limit."""
    if not action:
        return "", ()
    try:
        model = service_model(service)
        operation = model.operation_model(action)
    except Exception:  # not a service or operation botocore knows
        return "", ()
    if operation.input_shape is None:
        return model.protocol, ()
    found = []
    for name, shape in operation.input_shape.members.items():
        if shape.type_name != "list":
            continue
        most = shape.metadata.get("max")
        if most is None:
            words = _UP_TO.search(re.sub(r"<[^>]+>", "", shape.documentation or ""))
            most = int(words.group(1)) if words else None
        if most is not None:
            found.append((name, wire_name(model.protocol, name, shape), int(most)))
    return model.protocol, tuple(found)


def _length(protocol: str, params: dict[str, Any], wire: str) -> int:
    if protocol in ("json", "rest-json"):
        value = params.get(wire)
        return len(value) if isinstance(value, list) else 0
    # Query protocols flatten a list: EC2 as Name.1, Name.2; IAM and STS as Name.member.1.
    pattern = re.compile(rf"{re.escape(wire)}\.(?:member\.)?(\d+)(?:\.|$)")
    return len({m.group(1) for k in params if (m := pattern.match(k))})


def _refuse(service: str, protocol: str, member: str, count: int, most: int) -> Reply:
    if service == "ec2":
        return query_error(
            "InvalidParameterValue", f"{member} cannot contain over {most} values ({count} given)"
        )
    if service == "batch":
        return json_error(
            "ClientException",
            f"Error executing request, Exception : Maximum number of {member} supported is "
            f"{most} ., {count} given",
        )
    message = (
        f"1 validation error detected: Value at '{member[0].lower() + member[1:]}' failed to "
        f"satisfy constraint: Member must have length less than or equal to {most}"
    )
    if protocol in ("json", "rest-json"):
        return json_error("ValidationException", message)
    return query_error("ValidationError", message)


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service in ("s3",):  # REST-XML: no action on the wire to look the limits up by
        return None
    protocol, members = limits(request.service, request.action)
    for member, wire, most in members:
        count = _length(protocol, request.params, wire)
        if count > most:
            faults.count(NAME, f"{request.action} {member} over {most}")
            return _refuse(request.service, protocol, member, count, most)
    return None


BEHAVIOUR = Behaviour(
    name=NAME,
    source="botocore service models (list max, 'up to N'); EC2 DescribeInstanceTypes API "
    "reference; aws-samples/ec2-topology-aware-for-slurm#4; pegasus-isi/pegasus#2086",
    before=_before,
)
