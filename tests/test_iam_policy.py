"""The least-privilege policy: every call the commands make is in it; build and bake pass under
IAM enforcement with exactly it; and each action, removed alone, makes the run fail naming it.

moto enforces IAM for EC2, SSM, STS and IAM in server mode, but denies Batch calls even when
allowed, so Batch's part of the policy is checked by recording its calls, not by enforcement.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amibake import batch, config, gc, iam_policy, pipelines
from amibake.cloud import Cloud, connect
from amibake.journal import Journal
from amibake.local import control
from tests.test_build import FIXTURES

SERVICES = ("ec2", "ssm", "sts", "iam", "batch", "s3")


class Recorder:
    """The IAM actions a client makes, from botocore's before-call events."""

    def __init__(self, cloud: Cloud) -> None:
        self.calls: set[str] = set()
        self.cloud = cloud
        for service in SERVICES:
            cloud.client(service).meta.events.register("before-call.*.*", self.record)

    def record(self, event_name: str, **_: Any) -> None:
        _, service, operation = event_name.split(".")
        self.calls.add(iam_policy.action_of(service, operation))

    def take(self) -> set[str]:
        calls, self.calls = self.calls, set()
        return calls

    def close(self) -> None:
        for service in SERVICES:
            self.cloud.client(service).meta.events.unregister("before-call.*.*", self.record)


def _fresh(cloud: Cloud) -> None:
    shutil.rmtree(cloud.config.results_dir / "artifacts", ignore_errors=True)


def test_every_call_each_command_makes_is_in_its_statement(cloud: Cloud) -> None:
    recorder = Recorder(cloud)
    try:
        _fresh(cloud)
        request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
        assert pipelines.build(cloud, request)[0].ok
        used = {"build": recorder.take()}
        assert pipelines.bake(cloud, pipelines.BakeRequest())[0].ok
        used["bake"] = recorder.take()
        amis = cloud.config.results_dir / "amis.json"
        batch.up(cloud, batch.images_from_bake(amis))
        batch.status(cloud)
        batch.down(cloud)
        used["batch"] = recorder.take()
        journal = Journal(cloud.config.results_dir / "journal.sqlite")
        gc.delete(cloud, journal, gc.find(cloud, journal))
        used["gc"] = recorder.take()
    finally:
        recorder.close()
    for command, calls in used.items():
        missing = sorted(calls - iam_policy.actions([command]) - iam_policy.NEEDS_NO_PERMISSION)
        assert not missing, f"{command} calls {missing}, which its policy statement lacks"
        assert calls, f"{command} made no call: the recording is broken"


@pytest.fixture
def enforcing_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A local cloud of its own, with an IAM user holding exactly the build+bake policy."""
    monkeypatch.setenv("AMIBAKE_CLOUD", "local")  # never AWS, whatever else is set
    monkeypatch.setenv("AMIBAKE_LOCAL_DIR", str(tmp_path / "cloud"))
    monkeypatch.setenv("AMIBAKE_LOCAL_PORT", "5184")
    monkeypatch.setenv("AMIBAKE_LOCAL_SUBNET", "127.84.0.0/16")
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    admin = connect(config.load())
    iam = admin.client("iam")
    iam.create_user(UserName="amibake")
    key = iam.create_access_key(UserName="amibake")["AccessKey"]
    endpoint = admin.endpoint_url
    assert endpoint is not None

    def allow(actions: set[str]) -> None:
        statement = {"Effect": "Allow", "Action": sorted(actions), "Resource": "*"}
        document = {"Version": "2012-10-17", "Statement": [statement]}
        # Enforcement off while the policy changes (the admin has no IAM identity).
        _auth(endpoint, "inf")
        iam.put_user_policy(
            UserName="amibake", PolicyName="amibake", PolicyDocument=json.dumps(document)
        )
        _auth(endpoint, "0")

    monkeypatch.setenv(
        "AMIBAKE_LOCAL_CREDENTIALS", f"{key['AccessKeyId']}:{key['SecretAccessKey']}"
    )
    yield {"allow": allow, "user": lambda: connect(config.load())}
    _auth(endpoint, "inf")
    control.down(config.load())


def _auth(endpoint: str, after: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=after.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _build_and_bake(user: Cloud) -> str:
    """Run build then bake; return '' on success, else the first error."""
    _fresh(user)
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    try:
        built = pipelines.build(user, request)[0]
        if not built.ok:
            return built.error
        baked = pipelines.bake(user, pipelines.BakeRequest())[0]
        return "" if baked.ok else baked.error
    except Exception as exc:  # an AccessDenied in preflight is raised, not an outcome
        return str(exc)


def test_build_and_bake_under_enforcement_need_exactly_the_policy(
    enforcing_cloud: dict[str, Any],
) -> None:
    policy = iam_policy.actions(["build", "bake"])
    enforcing_cloud["allow"](policy)
    user = enforcing_cloud["user"]()
    recorder = Recorder(user)
    try:
        assert _build_and_bake(user) == ""
        called = recorder.take()
    finally:
        recorder.close()
    # Every action the run called, removed alone, must break it with an error naming it.
    for action in sorted(called - iam_policy.NEEDS_NO_PERMISSION):
        enforcing_cloud["allow"](policy - {action})
        error = _build_and_bake(enforcing_cloud["user"]())
        assert f"not authorized to perform: {action}" in error, (action, error)
