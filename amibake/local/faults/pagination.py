"""Describes and lists in pages, as AWS answers them: a page of a few items and a token the next
request must carry, never the whole list at once.

Which calls page, under which names, is botocore's own paginator model (the ``paginators-1.json``
each SDK ships): the operation, its input and output token, its limit and its result key. A call
with no paginator there (DescribeKeyPairs, DescribeAvailabilityZones, DescribeJobs) is never cut.
moto answers the whole list; this behaviour keeps a page of it (1 to 5 items, drawn from the seed
per operation, fewer if the request's own limit says so) and remembers the rest under a token it
mints, which a later request carrying it continues from. A list moto itself paged (the caller set
a limit) is cut the same way, its token handed back on the last of the cut pages.

A filtered request (EC2's Filter.N, SSM's Filters) may first get an empty page with a token: the
service filters the page it read, which may hold nothing that matches, so a caller that reads
"no items" as "none" without following the token misses what the next page holds.

A request that names what it describes (InstanceIds, ImageIds, a Batch list of queue names) is
answered whole: the EC2 guide calls a list of ids "the fastest way to describe a large number of
resources" and DescribeInstances refuses MaxResults beside InstanceIds; Batch takes "up to 100"
names and pages by 100, so a named request fits one page.

Sources: the EC2 developer guide, "Pagination in the Amazon EC2 API" (unpaginated calls "might
be throttled and could time out"; use ids or pagination), and the API reference's MaxResults
("to get the next page of items, make another request with the token returned in the output");
the AWS Batch API reference (Describe*: "If this parameter isn't used, then ... returns up to 100
results and a nextToken value if applicable"); the IAM API reference (MaxItems "defaults to 100.
Note that IAM might return fewer results, even when there are more results available");
GetParametersByPath (at most 10 a call); boto/boto3#2643 (an SSM list with filters answered an
empty list and a NextToken; the maintainers: keep reading until no token); S3 ListObjectsV2
(1,000 keys a call and NextContinuationToken). issue 26, findings 7 and 9.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from amibake.local.faults import Behaviour, Faults, Reply, Request, json_error, query_error
from amibake.service_models import paginators, service_model

NAME = "pagination"
PAGE = (1, 5)  # items a page, drawn per operation (AWS: 100 or 1,000; shrunk so tests page)
# The services whose lists the product reads (Logs' pages are the log-pages behaviour's own).
SERVICES = ("ec2", "iam", "batch", "ssm", "s3", "ecr")
TOKEN = "amibake-page-"
# The services whose filtered lists may start with an empty page, and how often (per operation
# and seed: a test finds a seed where its call gets one).
FILTERING = ("ec2", "ssm")
EMPTY_FIRST = 0.3
# Lists of ids that are not the resources asked for: whose snapshots, whose images.
_NOT_NAMES = {"OwnerIds", "RestorableByUserIds", "ExecutableUsers", "Owners"}


@dataclass(frozen=True)
class Paged:
    """One paginated operation, as botocore's models name its parts on the wire."""

    service: str
    action: str
    protocol: str
    token_in: str  # the request parameter that carries the token
    limit_in: str  # the request parameter that caps a page ("" when none)
    token_out: str  # the reply element or key that carries the next token
    result: str  # the reply element or key holding the items
    flattened: bool  # XML: the items are the result element repeated, not children of one
    more: str  # IAM and S3: the element that says more follow (IsTruncated), else ""
    count: str  # S3: KeyCount, which must match the page
    names: tuple[str, ...]  # request parameters that name the resources described


def _model(service: str) -> tuple[Any, dict[str, Any]]:
    return service_model(service), paginators(service)


def wire_name(protocol: str, name: str, shape: Any) -> str:
    """A request member's name on the wire (botocore's serializers)."""
    where = shape.serialization
    if protocol == "ec2":
        if "queryName" in where:
            return str(where["queryName"])
        if "name" in where:
            return str(where["name"][0].upper() + where["name"][1:])
        return name
    if protocol in ("query", "rest-xml"):
        return str(where.get("name", name))
    return name  # JSON: the member's name


@functools.cache
def paged(service: str, action: str) -> Paged | None:
    """The operation's paging, from botocore's paginator model; None if it does not page (or
    pages in a way not handled here: several tokens, several result lists)."""
    if service not in SERVICES or not action:
        return None
    model, pages = _model(service)
    config = pages.get(action)
    if config is None:
        return None
    token_in, token_out = config.get("input_token"), config.get("output_token")
    result = config.get("result_key")
    if isinstance(result, list):
        result = result[0] if service == "s3" else None  # ListObjectsV2: Contents
    if not all(isinstance(x, str) for x in (token_in, token_out, result)):
        return None
    if any(c in str(result) + str(token_out) for c in ".[]|"):
        return None  # a JMESPath into nested results
    operation = model.operation_model(action)
    inputs, outputs = operation.input_shape.members, operation.output_shape.members
    limit = config.get("limit_key", "")
    more = config.get("more_results", "")
    result_shape = outputs[result]
    names = tuple(
        wire_name(model.protocol, n, s)
        for n, s in inputs.items()
        if s.type_name == "list"
        and n not in _NOT_NAMES
        and (n.endswith(("Ids", "Names")) or n == result)
    )
    return Paged(
        service=service,
        action=action,
        protocol=model.protocol,
        token_in=wire_name(model.protocol, token_in, inputs[token_in]),
        limit_in=wire_name(model.protocol, limit, inputs[limit]) if limit in inputs else "",
        token_out=str(outputs[token_out].serialization.get("name", token_out)),
        result=str(result_shape.serialization.get("name", result)),
        flattened=bool(result_shape.serialization.get("flattened")),
        more=str(outputs[more].serialization.get("name", more)) if more in outputs else "",
        count="KeyCount" if service == "s3" and "KeyCount" in outputs else "",
        names=names,
    )


def _operation(request: Request) -> Paged | None:
    action = request.action
    if request.service == "s3" and str(request.params.get("list-type", "")) == "2":
        action = "ListObjectsV2"  # S3's REST calls carry no action: a GET with list-type=2
    return paged(request.service, action)


def _names_resources(op: Paged, request: Request) -> bool:
    params = request.params
    for name in op.names:
        if op.protocol in ("json", "rest-json"):
            if params.get(name):
                return True
        elif any(k == name or k.startswith(f"{name}.") for k in params):
            return True
    return False


def _filtered(op: Paged, request: Request) -> bool:
    params = request.params
    if op.protocol in ("json", "rest-json"):
        return any(params.get(k) for k in ("Filters", "ParameterFilters"))
    return any(k.startswith("Filter.") for k in params)


def _page_size(faults: Faults, op: Paged, request: Request) -> int:
    low, high = PAGE
    size = low + int(faults.draw("page", op.service, op.action) * (high - low + 1))
    try:
        asked = int(request.params.get(op.limit_in) or 0) if op.limit_in else 0
    except (TypeError, ValueError):
        asked = 0
    return min(size, asked) if asked > 0 else size


# --- replies: the items, the envelope around them, and the token ------------------------------


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _find(root: ElementTree.Element, name: str) -> ElementTree.Element | None:
    """The first element (root included) whose local name is `name`."""
    return next((e for e in root.iter() if _local(e.tag) == name), None)


def _parent_of(root: ElementTree.Element, child: ElementTree.Element) -> ElementTree.Element:
    return next((p for p in root.iter() if child in list(p)), root)


def _xml_items(op: Paged, body: bytes) -> list[ElementTree.Element] | None:
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    if op.flattened:
        return [e for e in root.iter() if _local(e.tag) == op.result]
    holder = _find(root, op.result)
    return None if holder is None else list(holder)


def _set_text(
    root: ElementTree.Element, near: ElementTree.Element, name: str, text: str | None
) -> None:
    """Set (or, for None, remove) the element `name` beside `near`."""
    parent = _parent_of(root, near) if near is not root else root
    found = next((e for e in parent if _local(e.tag) == name), None)
    if text is None:
        if found is not None:
            parent.remove(found)
        return
    if found is None:
        namespace = root.tag[: root.tag.find("}") + 1] if root.tag.startswith("{") else ""
        found = ElementTree.SubElement(parent, namespace + name)
    found.text = text


def _xml_page(op: Paged, body: bytes, items: list[ElementTree.Element], token: str | None) -> bytes:
    """The reply `body` with `items` in place of its list and `token` as the next."""
    root = ElementTree.fromstring(body)
    if op.flattened:
        for old in [e for e in root.iter() if _local(e.tag) == op.result]:
            _parent_of(root, old).remove(old)
        anchor = root
        for item in items:
            root.append(item)
    else:
        holder = _find(root, op.result)
        assert holder is not None  # _xml_items found it in the same body
        for old in list(holder):
            holder.remove(old)
        holder.extend(items)
        anchor = holder
    _set_text(root, anchor, op.token_out, token)
    if op.more:
        _set_text(root, anchor, op.more, "true" if token else "false")
    if op.count:
        _set_text(root, anchor, op.count, str(len(items)))
    namespace = root.tag[1 : root.tag.find("}")] if root.tag.startswith("{") else ""
    try:
        text = ElementTree.tostring(root, encoding="unicode", default_namespace=namespace or None)
    except ValueError:  # an element outside the namespace: prefixes, which botocore ignores
        text = ElementTree.tostring(root, encoding="unicode")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + text).encode()


def _json_page(op: Paged, body: bytes, items: list[Any], token: str | None) -> bytes:
    import json

    data = json.loads(body or b"{}")
    data[op.result] = items
    if token:
        data[op.token_out] = token
    else:
        data.pop(op.token_out, None)
    return json.dumps(data).encode()


def _items(op: Paged, reply: Reply) -> tuple[list[Any] | None, str | None]:
    """The reply's items and the token moto itself gave (it pages when a limit was asked)."""
    if op.protocol in ("json", "rest-json"):
        data = reply.json()
        items = data.get(op.result)
        return (items if isinstance(items, list) else None), data.get(op.token_out) or None
    found = _xml_items(op, reply.body)
    if found is None:
        return None, None
    root = ElementTree.fromstring(reply.body)
    anchor = root if op.flattened else _find(root, op.result)
    parent = _parent_of(root, anchor) if anchor is not None and anchor is not root else root
    token = next((e.text for e in parent if _local(e.tag) == op.token_out), None)
    return found, (token or None)


def _render(op: Paged, body: bytes, items: list[Any], token: str | None) -> bytes:
    if op.protocol in ("json", "rest-json"):
        return _json_page(op, body, items, token)
    return _xml_page(op, body, items, token)


@dataclass
class _Rest:
    """What a minted token continues: the rest of one reply."""

    op: Paged
    status: int
    headers: list[tuple[str, str]]
    body: bytes  # the first reply: the envelope each page is cut from
    items: list[Any]
    upstream: str | None  # moto's own token, handed on with the last cut page
    size: int


_minted = itertools.count(1)


def _mint(faults: Faults, rest: _Rest) -> str:
    token = f"{TOKEN}{next(_minted)}"
    faults.remember(NAME)[token] = rest  # kept: a retried request may carry it again
    return token


def _serve(faults: Faults, rest: _Rest) -> Reply:
    """The next page of `rest`, with a token for what follows it."""
    page, after = rest.items[: rest.size], rest.items[rest.size :]
    token = rest.upstream
    if after:
        token = _mint(faults, _Rest(rest.op, rest.status, rest.headers, rest.body, after,
                                    rest.upstream, rest.size))  # fmt: skip
    return Reply(rest.status, rest.headers, _render(rest.op, rest.body, page, token))


def _before(faults: Faults, request: Request) -> Reply | None:
    op = _operation(request)
    if op is None:
        return None
    token = str(request.params.get(op.token_in) or "")
    if not token.startswith(TOKEN):
        return None  # a first request, or moto's own token: moto answers
    rest = faults.remember(NAME).get(token)
    if rest is None or rest.op != op:
        faults.count(NAME, "token refused")
        message = f"The token '{token}' is not valid for {op.action}"
        if op.protocol in ("json", "rest-json"):
            code = "ClientException" if op.service == "batch" else "ValidationException"
            return json_error(code, message)
        return query_error("InvalidNextToken" if op.service == "ec2" else "InvalidInput", message)
    size = _page_size(faults, op, request)
    faults.count(NAME, f"{op.action} continued")
    return _serve(faults, _Rest(op, rest.status, rest.headers, rest.body, rest.items,
                                rest.upstream, size))  # fmt: skip


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    op = _operation(request)
    if op is None or not reply.ok or _names_resources(op, request):
        return reply
    items, upstream = _items(op, reply)
    size = _page_size(faults, op, request)
    if items is None:
        return reply
    if (
        items
        and op.service in FILTERING
        and _filtered(op, request)
        and faults.chance(EMPTY_FIRST, "empty", op.service, op.action)
    ):
        faults.count(NAME, f"{op.action} empty filtered page")
        rest = _Rest(op, reply.status, reply.headers, reply.body, items, upstream, size)
        return Reply(reply.status, reply.headers, _render(op, reply.body, [], _mint(faults, rest)))
    if len(items) <= size:
        return reply
    faults.count(NAME, f"{op.action} truncated")
    return _serve(faults, _Rest(op, reply.status, reply.headers, reply.body, items, upstream, size))


BEHAVIOUR = Behaviour(
    name=NAME,
    source="EC2 developer guide, Pagination in the Amazon EC2 API; EC2, Batch, IAM, SSM, S3, ECR "
    "API references (MaxResults/maxResults/MaxItems/MaxKeys and their tokens); botocore's "
    "paginators-1.json for which calls page",
    before=_before,
    after=_after,
)
