"""The local cloud's AWS behaviour layer: it answers as AWS documents, not as a mock would.

moto answers instantly, consistently, in one page and always with capacity. AWS does not: a new
image is not found for a while, a terminated instance is still described, CreateFleet returns
errors beside a fleet id, describes come in pages. With ``amibake local up --faults aws``
(``AMIBAKE_LOCAL_FAULTS=aws``) the gateway in front of moto answers that way, at rates and
delays drawn from a seed (``--faults-seed``), shortened so tests stay fast. The product has no
test-only path: it survives these exactly as it must on AWS.

Each behaviour is a module of this package with a ``BEHAVIOUR`` (name, the source that says AWS
does this, and its hooks), switchable one by one: ``--faults aws`` is all of them,
``--faults aws,-pagination`` all but one, ``--faults image-consistency,pagination`` just those.
``--faults none`` (the default) is moto as it is.

A behaviour sees each request (service, action, parameters, the caller's account and region)
``before`` moto does, and may answer it itself; and ``after``, with moto's reply, which it may
change. Decisions are drawn by hashing the seed with what they are about (a resource id, an
attempt number), never from a shared random stream: the same seed gives the same answers
whatever order threads ask in.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amibake.errors import UserError
from amibake.service_models import service_model


@dataclass
class Request:
    service: str  # botocore's name: ec2, batch, logs, s3, iam, sts, ssm
    action: str  # the operation: CreateImage, DescribeJobs, GetLogEvents, ...
    params: dict[str, Any]  # query parameters (EC2, IAM) or the JSON body (Batch, Logs, SSM)
    account: str
    region: str
    path: str = ""  # the request's path: what an S3 call is about (its bucket and key)
    method: str = ""  # GET, PUT, ...: what an S3 call does to that path


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def with_json(self, data: Any) -> Reply:
        return Reply(self.status, self.headers, json.dumps(data).encode())


Before = Callable[["Faults", Request], Reply | None]
After = Callable[["Faults", Request, Reply], Reply]


@dataclass(frozen=True)
class Behaviour:
    name: str
    source: str  # where AWS says it behaves so: a documentation page, an issue thread
    before: Before | None = None
    after: After | None = None
    elsewhere: str = ""  # where it acts when not on requests (an instance's IMDS, say)
    # Sees each request before every other behaviour and each reply after them: what the wire
    # between the caller and AWS does to both (an answer lost after AWS acted on its request).
    outermost: bool = False


@dataclass
class Faults:
    """The behaviours switched on, the seed, and the state they keep between requests."""

    enabled: tuple[Behaviour, ...] = ()
    seed: int = 0
    scale: float = 1.0  # local delays are AWS's seconds to minutes shrunk to fit a test
    state: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # What a behaviour may have the cloud do beyond answering a request (the gateway sets
    # them): "reclaim" (instance id) raises a spot notice and terminates the instance after.
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.enabled]

    def on(self, name: str) -> bool:
        return name in self.names

    def draw(self, *about: object) -> float:
        """A number in [0, 1) fixed by the seed and what it is about."""
        text = "\0".join(str(a) for a in (self.seed, *about))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64

    def chance(self, probability: float, *about: object) -> bool:
        return self.draw(*about) < probability

    def between(self, low: float, high: float, *about: object) -> float:
        return low + (high - low) * self.draw(*about)

    def remember(self, key: str) -> dict[str, Any]:
        """A behaviour's own state (a dict), shared by the daemon's request threads under
        `lock`."""
        with self.lock:
            found: dict[str, Any] = self.state.setdefault(key, {})
            return found

    def now(self) -> float:
        return time.monotonic()

    def ordinal(self, kind: str, resource_id: str) -> int:
        """The resource's place among its kind in this cloud's life (1, 2, ...): decisions keyed
        on it repeat with the seed, where moto's random ids would not."""
        with self.lock:
            seen: dict[str, int] = self.state.setdefault(f"ordinal:{kind}", {})
            return seen.setdefault(resource_id, len(seen) + 1)

    def made(self, kind: str, reply: Reply, pattern: re.Pattern[str]) -> None:
        """Note when a resource was made, its id read off the create's reply (the pattern's
        first group), for `fresh` to ask."""
        found = pattern.search(reply.body.decode(errors="replace"))
        if found:
            self.remember(f"made:{kind}")[found.group(1)] = self.now()

    def fresh(self, kind: str, resource_id: str, window: tuple[float, float]) -> bool:
        """Whether a resource noted by `made` is still within its window after its creation
        (drawn per resource from `window`); False for one not made through this layer."""
        born = self.remember(f"made:{kind}").get(resource_id)
        if born is None:
            return False
        n = self.ordinal(kind, resource_id)
        return bool(self.now() < born + self.between(*window, kind, n))

    def attempt(self, name: str, request: Request) -> tuple[str, int]:
        """What the request is, and which time of its sending this is: the same request sent
        again (a retry, a poll) is its next attempt, so a draw on both is fixed by the seed
        whatever order threads send in, and a retry is drawn afresh. An S3 GET and PUT of one
        key are two requests. Kept as a digest: the daemon counts every distinct request it is
        sent, for its lifetime, and a request's parameters may be a whole document."""
        what = [request.service, request.action, request.method, request.path, request.params]
        about = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
        about = about[:32]
        with self.lock:
            attempts: dict[str, int] = self.state.setdefault(f"{name}:attempts", {})
            attempts[about] = attempts.get(about, 0) + 1
            return about, attempts[about]

    def count(self, name: str, what: str) -> None:
        """Note that a behaviour did something (the local cloud's status shows it: a test can
        tell the product met the fault, not only that it passed)."""
        with self.lock:
            done: dict[str, int] = self.state.setdefault(f"count:{name}", {})
            done[what] = done.get(what, 0) + 1

    def counts(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {
                k.removeprefix("count:"): dict(v)
                for k, v in self.state.items()
                if k.startswith("count:")
            }

    def _layers(self, outermost: bool) -> list[Behaviour]:
        return [b for b in self.enabled if b.outermost == outermost]

    def before(self, request: Request) -> Reply | None:
        for behaviour in self._layers(True) + self._layers(False):
            if behaviour.before is not None:
                answer = behaviour.before(self, request)
                if answer is not None:
                    return answer
        return None

    def after(self, request: Request, reply: Reply) -> Reply:
        for behaviour in self._layers(False) + self._layers(True):
            if behaviour.after is not None:
                reply = behaviour.after(self, request, reply)
        return reply


def available() -> dict[str, Behaviour]:
    """Every behaviour this package has, by name (each module's BEHAVIOUR)."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("_"):
            continue
        behaviour = importlib.import_module(f"{__name__}.{module.name}").BEHAVIOUR
        found[behaviour.name] = behaviour
    return dict(sorted(found.items()))


def parse(spec: str, seed: int = 0) -> Faults:
    """`none`, `aws`, `aws,-NAME,...` or `NAME,NAME,...`; a name that does not exist is an
    error naming the ones that do."""
    known = available()
    chosen: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "none":
            continue
        if part == "aws":
            chosen += [n for n in known if n not in chosen]
            continue
        name = part.removeprefix("-")
        if name not in known:
            raise UserError(
                f"local_faults: no behaviour {name!r}; use none, aws, or some of: "
                f"{', '.join(known)} (-NAME leaves one out of aws)"
            )
        if part.startswith("-"):
            chosen = [n for n in chosen if n != name]
        elif name not in chosen:
            chosen.append(name)
    return Faults(tuple(known[n] for n in chosen), seed)


# --- replies in each protocol's error form --------------------------------------------------


def query_error(code: str, message: str, status: int = 400) -> Reply:
    """An error as EC2 (and IAM's query protocol) sends it."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        "</Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    ).encode()
    return Reply(status, [("Content-Type", "text/xml")], body)


def s3_error(code: str, message: str, status: int = 400) -> Reply:
    """An error as S3 sends it (REST-XML: the code at the document's root)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()
    return Reply(status, [("Content-Type", "application/xml")], body)


def json_error(code: str, message: str, status: int = 400) -> Reply:
    """An error as the JSON protocols send it (Batch's REST-JSON, Logs, SSM)."""
    body = json.dumps({"__type": code, "message": message}).encode()
    return Reply(
        status, [("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-ErrorType", code)], body
    )


# --- requests, read from the wire ------------------------------------------------------------

_REST_PATHS: dict[str, dict[str, str]] = {}


def _rest_operation(service: str, path: str) -> str:
    """A REST-JSON operation by its request path (Batch: POST /v1/describejobs)."""
    if service not in _REST_PATHS:
        model = service_model(service)
        _REST_PATHS[service] = {
            model.operation_model(name).http["requestUri"].lower(): name
            for name in model.operation_names
        }
    return _REST_PATHS[service].get(path.lower().rstrip("/"), "")


# A bucket's PUT by its sub-resource (the query string's key): the operation's name.
_S3_BUCKET_PUTS = {
    "policy": "PutBucketPolicy",
    "publicAccessBlock": "PutPublicAccessBlock",
    "encryption": "PutBucketEncryption",
    "lifecycle": "PutBucketLifecycleConfiguration",
    "tagging": "PutBucketTagging",
}


def request_of(
    service: str, environ: dict[str, Any], body: bytes, account: str, region: str
) -> Request:
    """What a signed call asks, whatever its protocol."""
    from urllib.parse import parse_qs

    target = environ.get("HTTP_X_AMZ_TARGET", "")
    params: dict[str, Any] = {}
    if target:  # JSON protocol: the operation in a header, the parameters in the body
        action = target.rpartition(".")[2]
        params = json.loads(body or b"{}")
    elif service == "batch":
        action = _rest_operation(service, environ.get("PATH_INFO", ""))
        params = json.loads(body or b"{}")
    elif service == "s3":  # REST-XML: what it asks is in the method, path and query string
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        params = {k: v[0] for k, v in query.items()}
        action = ""
        bucket_only = environ.get("PATH_INFO", "").strip("/").count("/") == 0
        if environ.get("REQUEST_METHOD") == "PUT" and bucket_only:
            action = next((name for key, name in _S3_BUCKET_PUTS.items() if key in params), "")
            action = action or ("" if params else "CreateBucket")
        if action == "PutBucketPolicy":
            params["Policy"] = body.decode(errors="replace")
    else:  # query protocol (EC2, IAM, STS): a form, in the body or the query string
        text = body.decode(errors="replace") or environ.get("QUERY_STRING", "")
        params = {k: v[0] for k, v in parse_qs(text).items()}
        action = str(params.get("Action", ""))
    path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
    return Request(service, action, params, account, region, path, method)
