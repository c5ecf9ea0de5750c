"""Requests refused for their rate (the `throttling` behaviour), as every AWS service refuses
some: each service's own code and status reach a client that does not retry, and the product's
clients (botocore's standard retries) and a Batch job's own S3 access send the request again
until it passes."""

from __future__ import annotations

import http.client
import urllib.error
from collections.abc import Callable
from typing import Any

import botocore.config
import botocore.exceptions
import pytest

from amibake.cloud import Cloud
from fleet.agent import s3
from tests.local.test_faults import faulty, met  # noqa: F401 - faulty: a fixture

# (service, a read the product makes of it, the code and HTTP status AWS refuses it with)
READS = [
    ("ec2", "describe_security_groups", "RequestLimitExceeded", 503),
    ("iam", "list_roles", "Throttling", 400),
    ("batch", "describe_job_queues", "TooManyRequestsException", 429),
    ("ssm", "describe_parameters", "ThrottlingException", 400),
    ("s3", "list_buckets", "SlowDown", 503),
]
TRIES = 400  # at a refusal in 50, far more than enough to meet one


def test_each_service_refuses_in_its_own_form_and_the_product_s_clients_retry(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    cloud = faulty("throttling", 0)
    once = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1})
    for service, read, code, status in READS:
        strict = cloud.session.client(  # type: ignore[call-overload]
            service, endpoint_url=cloud.endpoint_url, config=once
        )
        refused = None
        for _ in range(TRIES):
            try:
                getattr(strict, read)()
            except botocore.exceptions.ClientError as exc:
                refused = exc.response
                break
        assert refused is not None, f"{service}: no request refused in {TRIES}"
        assert (refused["Error"]["Code"], refused["ResponseMetadata"]["HTTPStatusCode"]) == (
            code,
            status,
        ), service
        # The product's own clients never see a refusal, though the layer refuses some.
        before = refusals = sum(met(cloud)["throttling"].values())
        for n in range(1, TRIES + 1):
            getattr(cloud.client(service), read)()
            if n % 10 == 0 and (refusals := sum(met(cloud)["throttling"].values())) > before:
                break
        assert refusals > before, f"{service}: no request of the product's refused in {TRIES}"


def test_a_batch_job_s_s3_request_is_sent_again_while_s3_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job's own S3 access (standard library only, no SDK) retries 503 SlowDown and 500
    InternalError with backoff, and passes any other refusal (403) on at once."""
    answers: list[Any] = []
    sent: list[str] = []

    def once(method: str, key: str, body: bytes | None) -> bytes:
        sent.append(key)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            raise urllib.error.HTTPError(key, answer, "refused", {}, None)  # type: ignore[arg-type]
        return bytes(answer)

    waits: list[float] = []
    monkeypatch.setattr(s3, "_once", once)
    monkeypatch.setattr(s3.time, "sleep", waits.append)
    answers[:] = [503, 500, b"payload"]
    assert s3.request("GET", "k") == b"payload" and len(sent) == 3 and len(waits) == 2
    # A connection reset while the reply is read is no URLError: it is sent again too.
    answers[:] = [http.client.RemoteDisconnected("closed"), b"again"]
    assert s3.request("PUT", "k", b"body") == b"again"
    answers[:] = [403]
    with pytest.raises(urllib.error.HTTPError, match="refused"):
        s3.request("GET", "k")
    answers[:] = [503] * s3.ATTEMPTS
    with pytest.raises(urllib.error.HTTPError):
        s3.request("GET", "k")
    assert not answers  # every attempt made, then the refusal raised


def test_each_distinct_request_counts_its_own_attempts_under_a_short_key() -> None:
    """A retry of a request is its next attempt; an S3 GET and PUT of one key are two requests
    (they shared one count); what is kept per request is a digest, not its parameters."""
    from amibake.local.faults import Faults, Request, throttling

    faults = Faults(seed=1)
    document = {"Policy": "x" * 10_000}

    def send(method: str, params: dict[str, Any]) -> None:
        request = Request("s3", "", params, "123456789012", "us-east-1", "/b/k", method)
        throttling.BEHAVIOUR.before(faults, request)  # type: ignore[misc]

    for _ in range(3):
        send("GET", {})
    send("PUT", {})
    send("PUT", document)
    attempts = faults.state[f"{throttling.NAME}:attempts"]
    assert sorted(attempts.values()) == [1, 1, 3]
    assert all(len(key) <= 64 for key in attempts)
