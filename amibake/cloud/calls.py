"""Helpers for the shapes of AWS answers: error codes, retry-until, confirmed deletion, lists
read to their last page, requests cut to the API's limits, and creates not cut off by Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, TypeVar

import botocore.exceptions

from amibake.errors import CloudError

T = TypeVar("T")
log = logging.getLogger("amibake")


def error_code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


# A wait AWS states in time (a new instance or image seen within seconds to minutes) is polled at
# least once a second: doubling to 5 s, a thing visible after 3.1 s was seen after 6.2 s, and the
# demo under the local cloud's AWS behaviours spent most of its extra time so (issue 26's 2x).
# Once a second is far inside EC2's describe rate limits.
WITHIN_POLL_S = 1.0


def retry_on(
    codes: set[str],
    call: Callable[[], T],
    *,
    attempts: int = 8,
    first_delay_s: float = 0.2,
    within_s: float | None = None,
    saying: str = "",
) -> T:
    """Retry a call while it fails with one of the codes (eventual consistency, dependencies):
    `attempts` times, or for as long as `within_s` seconds when given (AWS states some waits
    in time: a new AMI may be NotFound for up to 2.5 minutes). With `saying`, only while its
    message says that (Batch answers every refusal ClientException).

    Throttling is retried by botocore itself (standard/adaptive mode); this is for the codes it
    does not retry because they are not transient in general, only right after a create.
    """
    delay = first_delay_s
    deadline = None if within_s is None else time.monotonic() + within_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            over = (
                time.monotonic() + delay > deadline if deadline is not None else attempt >= attempts
            )
            if error_code(exc) not in codes or saying not in str(exc) or over:
                raise
            time.sleep(delay)
            delay = min(delay * 2, WITHIN_POLL_S if deadline is not None else 5.0)


def retried(exc: botocore.exceptions.ClientError) -> bool:
    """Whether botocore had sent the request more than once when this answer came."""
    return bool(exc.response.get("ResponseMetadata", {}).get("RetryAttempts"))


def made_once(
    create: Callable[[], T],
    duplicate: str,
    find: Callable[[], T | None],
    what: str,
    *,
    within_s: float,
    saying: str = "",
) -> T:
    """A create without a client token, whose first answer may have been lost after AWS acted
    on it (a 500 or a timeout): botocore sends it again, and the retry is refused for the name
    the first attempt took (`duplicate`). That refusal, on a retry only, is the first attempt's
    resource: `find` it by its name and this run's tag, asked until EC2 lists it (`within_s`).
    Taken for the run's failure, it was left known to no cleanup, for gc's tag scan to find.
    With `saying`, only a refusal whose message says it (Batch refuses all as ClientException).
    """
    try:
        return create()
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != duplicate or saying not in str(exc) or not retried(exc):
            raise
    log.warning("%s: made, but its answer was lost; the retry found it taken: looking it up", what)
    deadline = time.monotonic() + within_s
    while (found := find()) is None:
        if time.monotonic() > deadline:
            raise CloudError(
                f"{what}: its create was retried and refused {duplicate}, and no {what} of this "
                f"run has that name after {within_s:.0f}s; run `amibake gc` to find what it left"
            )
        time.sleep(WITHIN_POLL_S)
    return found


def ignore_missing(call: Callable[[], object], *missing: str, unseen_for: float = 0.0) -> bool:
    """Run a delete; a NotFound means someone already deleted it. True if it was there.

    `unseen_for`: how much longer EC2 may not know the resource yet (made seconds ago: the API
    guide's eventual consistency). A NotFound until then is asked again: taken for gone, the
    resource was journaled deleted and stayed, found by gc's tag scan at best."""
    deadline = time.monotonic() + unseen_for
    delay = 0.2
    while True:
        try:
            call()
            return True
        except botocore.exceptions.ClientError as exc:
            code = error_code(exc)
            if code not in missing and not code.endswith("NotFound"):
                raise
            if time.monotonic() + delay > deadline:
                return False
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def wait_until(
    what: str, done: Callable[[], bool], timeout_s: float = 300.0, first_delay_s: float = 0.05
) -> None:
    from amibake.progress import Progress

    progress = Progress(f"waiting for {what}")
    delay = first_delay_s
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise CloudError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        progress.tick("still waiting")
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)
    progress.done()


def every(client: Any, operation: str, key: str, **params: Any) -> Iterator[Any]:
    """Every item a Describe/List answers, page after page (boto3's paginator for the
    operation). AWS answers in pages whatever the caller asks: Batch's and IAM's by 100 with a
    token, EC2's when it pleases ("Pagination in the Amazon EC2 API"); a first page taken for the
    whole list is how `batch down` reported success with definitions left (issue 26, finding 7).
    """
    for page in client.get_paginator(operation).paginate(**params):
        yield from page.get(key, [])


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in runs of at most `size`: the most one request's list takes (DescribeInstanceTypes
    100 types, Batch's DescribeJobs 100 jobs); one over is refused, not truncated."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def describe_image(ec2: Any, image_id: str) -> dict[str, Any] | None:
    """One image, or None if EC2 has no such image (other errors, AccessDenied say, are raised:
    they must not pass for a missing image). A recently deregistered image is described for a
    while, State deregistered (DescribeImages' reference): it is gone too, and taken for alive
    it was an image `batch up --ami` registered environments on."""
    try:
        images = ec2.describe_images(ImageIds=[image_id])["Images"]
    except botocore.exceptions.ClientError as exc:
        if not error_code(exc).startswith("InvalidAMIID"):
            raise
        return None
    alive = [i for i in images if i.get("State") != "deregistered"]
    return alive[0] if alive else None


def no_default_vpc(region: str) -> CloudError:
    """amibake launches into the default VPC unless subnets are named; accounts whose default
    VPC was deleted are common, so say both ways out."""
    return CloudError(
        f"no default VPC in {region}: name the subnets to launch in (subnet_ids in amibake.toml, "
        f"AMIBAKE_SUBNET_IDS or --subnet), or create it with 'aws ec2 create-default-vpc "
        f"--region {region}'"
    )


def default_vpc(ec2: Any) -> str:
    """The region's default VPC's id, or the error naming how to create it."""
    vpc = next(
        every(ec2, "describe_vpcs", "Vpcs", Filters=[{"Name": "isDefault", "Values": ["true"]}]),
        None,
    )
    if vpc is None:
        raise no_default_vpc(ec2.meta.region_name)
    return str(vpc["VpcId"])


# What stops a run as Ctrl-C does: Ctrl-C, SIGTERM (`kill`, `fleet kill`, a CI timeout) and
# SIGHUP (the terminal closed, an ssh session to the controller dropped: it ended the process
# with no cleanup, and its instances ran on).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def creating(what: str) -> Iterator[None]:
    """Around a create call and the recording of what it made: a Ctrl-C or SIGTERM that lands
    while the call is in flight is held until the block ends, then raised. Raised inside the
    call, it left what the call made unknown to the run's cleanup: an instant fleet found by
    nothing (EC2 lists none without its id), the rest by gc's tag scan at best. A second Ctrl-C
    stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Ctrl-C reaches only the main thread; runs on workers stop at step boundaries
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(signum)
        log.warning("finishing %s to record it; Ctrl-C again to stop now (it may be left)", what)

    previous = [signal.signal(signum, hold) for signum in STOP_SIGNALS]
    try:
        yield
    finally:
        for signum, handler in zip(STOP_SIGNALS, previous, strict=True):
            if handler is not None:  # None: set outside Python, which cannot set it back
                signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])  # to the handler the block held it from
