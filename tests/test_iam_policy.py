"""The least-privilege policy: every call the commands make is in it; build, bake and batch pass
under IAM enforcement with exactly it; and each action, removed alone, makes the run fail naming
it. (moto denied every Batch call under enforcement until amibake.local.moto_gaps named Batch's
actions as AWS does.)
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from amibake import batch, config, gc, iam_policy, pipelines
from amibake.cloud import Cloud, connect
from amibake.cloud.session import name_denied_action
from amibake.journal import Journal
from amibake.local import control
from tests.conftest import free_port
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


@pytest.mark.parametrize(
    ("service", "operation", "error", "named"),
    [
        ("s3", "CreateBucket", {"Code": "AccessDenied", "Message": "Access Denied"},
         "Access Denied (not authorized to perform: s3:CreateBucket; see amibake iam-policy)"),
        ("s3", "HeadBucket", {"Code": "403", "Message": "Forbidden"},
         "Forbidden (not authorized to perform: s3:ListBucket; see amibake iam-policy)"),
        ("ec2", "RunInstances",
         {"Code": "UnauthorizedOperation", "Message": "not authorized to perform: ec2:X"},
         "not authorized to perform: ec2:X"),  # AWS's own naming is kept
        ("ec2", "RunInstances", {"Code": "InvalidAMIID.NotFound", "Message": "no such image"},
         "no such image"),  # not a denial
    ],
)  # fmt: skip
def test_a_denial_names_the_iam_action_it_needs(
    service: str, operation: str, error: dict[str, str], named: str
) -> None:
    model = botocore.session.get_session().get_service_model(service).operation_model(operation)
    parsed = {"Error": dict(error)}
    name_denied_action(parsed, model)
    assert parsed["Error"]["Message"] == named


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
    # A free port, not a fixed one: a suite running in another checkout holds a fixed one.
    port = free_port()
    monkeypatch.setenv("AMIBAKE_LOCAL_PORT", str(port))
    monkeypatch.setenv("AMIBAKE_LOCAL_SUBNET", f"127.{180 + port % 50}.0.0/16")
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


def _batch_cycle(user: Cloud, images: Any) -> str:
    """batch up, status and down; return '' on success, else the first error."""
    try:
        batch.up(user, images)
        batch.status(user)
        batch.down(user)
        return ""
    except Exception as exc:
        return str(exc)


def test_batch_under_enforcement_needs_exactly_the_policy(
    enforcing_cloud: dict[str, Any],
) -> None:
    policy = iam_policy.actions(["build", "bake", "batch"])
    enforcing_cloud["allow"](policy)
    user = enforcing_cloud["user"]()
    assert _build_and_bake(user) == ""
    images = batch.images_from_bake(user.config.results_dir / "amis.json")
    # The first cycle creates the IAM pieces batch needs, under exactly the policy; they are
    # kept (found, not created, from then on), so the removals below are judged against the
    # calls of a later cycle.
    assert _batch_cycle(user, images) == ""
    recorder = Recorder(user)
    try:
        assert _batch_cycle(user, images) == ""
        called = recorder.take()
    finally:
        recorder.close()
    assert any(action.startswith("batch:Create") for action in called), called
    for action in sorted(called - iam_policy.NEEDS_NO_PERMISSION):
        enforcing_cloud["allow"](policy - {action})
        error = _batch_cycle(enforcing_cloud["user"](), images)
        assert f"not authorized to perform: {action}" in error, (action, error)
        enforcing_cloud["allow"](policy)
        assert _batch_cycle(enforcing_cloud["user"](), images) == ""  # nothing left half up
