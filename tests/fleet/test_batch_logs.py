"""How long fleet's Batch executor rereads a finished job's log for its result line, on a fake
clock: the end-to-end lost-host tests prove what a lost replicate becomes, not how long its
results were held back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fleet import batch


class Stream:
    """GetLogEvents over one stream whose events have all arrived: the first page holds them,
    then the token sent comes back (the end, for now)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.reads = 0

    def get_log_events(self, **kwargs: Any) -> dict[str, Any]:
        self.reads += 1
        if "nextToken" not in kwargs:
            return {"events": [{"message": m} for m in self.lines], "nextForwardToken": "f/1"}
        return {"events": [], "nextForwardToken": kwargs["nextToken"]}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(batch.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(batch.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def read(stream: Stream, job: dict[str, Any]) -> str:
    context = SimpleNamespace(cloud=SimpleNamespace(client=lambda name: stream))
    jobs = batch.Jobs(context)  # type: ignore[arg-type]
    return jobs._output(job, batch.log_late_s(job))


def job(status: str, reason: str = "") -> dict[str, Any]:
    return {
        "jobId": "j:0",
        "status": status,
        "statusReason": reason,
        "container": {"logStreamName": "fleet/default/j"},
    }


@pytest.mark.parametrize(
    ("ended", "waited"),
    [
        (job("FAILED", "Host EC2 (instance i-0abc) terminated."), batch.LOG_LATE_HOST_GONE_S),
        (job("FAILED", "Essential container in task exited"), batch.LOG_LATE_S),
        (job("SUCCEEDED"), batch.LOG_LATE_S),
    ],
    ids=["host-gone", "failed", "succeeded"],
)
def test_a_log_without_a_result_line_is_reread_for_as_long_as_its_end_allows(
    clock: list[float], ended: dict[str, Any], waited: float
) -> None:
    """Its host gone, a job's agent went with it and what it had not shipped never comes: a
    short wait, not the 30 s that held every other job's results back per lost replicate."""
    stream = Stream(["FLEET-HOST {}", "running"])
    start = clock[0]
    assert read(stream, ended) == "FLEET-HOST {}\nrunning"
    assert waited <= clock[0] - start <= waited + batch.LOG_EMPTY_WAIT_S
    assert stream.reads >= waited / batch.LOG_EMPTY_WAIT_S  # reread all along, not slept through


def test_the_short_wait_is_shorter_and_a_result_line_ends_the_reading_at_once(
    clock: list[float],
) -> None:
    assert batch.LOG_LATE_HOST_GONE_S < batch.LOG_LATE_S
    stream = Stream(["FLEET-RESULT {}"])
    start = clock[0]
    assert (
        read(stream, job("FAILED", "Host EC2 (instance i-0abc) terminated.")) == "FLEET-RESULT {}"
    )
    assert clock[0] == start and stream.reads == 2


def test_only_a_failure_naming_the_host_is_a_host_gone() -> None:
    assert batch.host_gone(job("FAILED", "Host EC2 (instance i-0abc) terminated."))
    assert not batch.host_gone(job("FAILED", "Task failed to start"))
    assert not batch.host_gone(job("SUCCEEDED", "Host EC2 (instance i-0abc) terminated."))
    assert not batch.host_gone({"status": "FAILED"})
