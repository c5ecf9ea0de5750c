"""`amibake batch` on the local cloud: environments on the baked image, a job, the swap to a new
image, and a teardown that is safe to repeat."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from amibake import batch, pipelines
from amibake.cli import main
from amibake.cloud import Cloud
from tests.helpers import wait_for
from tests.test_bake import built  # noqa: F401 - the module-scoped artifact fixture


def _bake(cloud: Cloud) -> str:
    outcome = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    assert outcome.ok, outcome.error
    return outcome.state.image_id  # type: ignore[union-attr, no-any-return]


def _wait_job(client: object, job_id: str, timeout_s: float = 60) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.describe_jobs(jobs=[job_id])["jobs"][0]  # type: ignore[attr-defined]
        if job["status"] in ("SUCCEEDED", "FAILED"):
            return job  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end in {timeout_s}s")


def test_full_flow_up_job_swap_down(
    cloud: Cloud,
    built: None,  # noqa: F811
    local_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = _bake(cloud)
    amis = cloud.config.results_dir / "amis.json"
    up = batch.up(cloud, batch.images_from_bake(amis))
    env_name = f"amibake-x86_64-{first}"
    assert up["queues"] == {"amibake-x86_64": env_name}
    again = batch.up(cloud, batch.images_from_bake(amis))
    assert again["job_definitions"] == up["job_definitions"]  # no new revision
    assert again["retired"] == []

    client = cloud.client("batch")
    env = client.describe_compute_environments(computeEnvironments=[env_name])[
        "computeEnvironments"
    ][0]
    resources = env["computeResources"]
    assert resources["type"] == "SPOT"
    assert resources["allocationStrategy"] == "SPOT_PRICE_CAPACITY_OPTIMIZED"
    assert resources["minvCpus"] == 0
    assert resources["ec2Configuration"] == [{"imageType": "ECS_AL2023", "imageIdOverride": first}]
    definition = client.describe_job_definitions(
        jobDefinitionName="amibake-trivial-x86_64", status="ACTIVE"
    )["jobDefinitions"][0]["containerProperties"]
    assert definition["volumes"] == [{"name": "shared", "host": {"sourcePath": "/shared"}}]
    assert definition["mountPoints"][0]["containerPath"] == "/shared"

    def submit(name: str, script: str) -> str:
        return str(
            client.submit_job(
                jobName=name,
                jobQueue="amibake-x86_64",
                jobDefinition="amibake-trivial-x86_64",
                containerOverrides={"command": ["/bin/sh", "-c", script]},
            )["jobId"]
        )

    # Terminated while the environment's first host boots: failed at once, and never run (it
    # was started once the host was up, and showed RUNNING for good).
    early = submit("early", "echo ran early")
    client.terminate_job(jobId=early, reason="test")
    job = client.submit_job(
        jobName="probe", jobQueue="amibake-x86_64", jobDefinition="amibake-trivial-x86_64"
    )["jobId"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = client.describe_jobs(jobs=[job])["jobs"][0]["status"]
        if state in ("SUCCEEDED", "FAILED"):
            break
        time.sleep(0.5)
    assert state == "SUCCEEDED"
    # It really ran on a host booted from the baked image: its output is the staged build.
    described = client.describe_jobs(jobs=[job])["jobs"][0]
    events = cloud.client("logs").get_log_events(
        logGroupName="/aws/batch/job", logStreamName=described["container"]["logStreamName"]
    )["events"]
    assert '"app": "trivial"' in "\n".join(e["message"] for e in events)
    assert described["container"]["exitCode"] == 0
    terminated = client.describe_jobs(jobs=[early])["jobs"][0]
    assert terminated["status"] == "FAILED", terminated
    assert not terminated.get("container", {}).get("logStreamName"), terminated  # never ran

    # A command that fails makes a FAILED job with its exit code and Batch's reason.
    failing = submit("fails", "echo no; exit 3")
    ended = _wait_job(client, failing)
    assert (ended["status"], ended["container"]["exitCode"]) == ("FAILED", 3)
    assert ended["statusReason"] == "Essential container in task exited"

    # TerminateJob as ECS stops a container: SIGTERM to its PID 1, which ignores it unless it
    # handles it, and the job ends only when its container has (SIGKILL after the stop timeout).
    # A job not started yet fails at once.
    def log_of(job: dict) -> str:  # type: ignore[type-arg]
        stream = job["container"]["logStreamName"]
        events = cloud.client("logs").get_log_events(
            logGroupName="/aws/batch/job", logStreamName=stream
        )["events"]
        return "\n".join(e["message"] for e in events)

    def started(job_id: str) -> None:
        deadline = time.monotonic() + 60
        while client.describe_jobs(jobs=[job_id])["jobs"][0]["status"] != "RUNNING":
            assert time.monotonic() < deadline, f"job {job_id} never ran"
            time.sleep(0.2)

    ignores = submit("ignores", "sleep 3; echo ran on")
    queued = submit("queued", "echo never")  # behind it: the host runs one job at a time
    started(ignores)
    time.sleep(0.5)  # the shell is past its start-up
    for job_id in (ignores, queued):
        client.terminate_job(jobId=job_id, reason="test")
    now = {j["jobId"]: j for j in client.describe_jobs(jobs=[ignores, queued])["jobs"]}
    assert now[ignores]["status"] == "RUNNING"  # stopping, not stopped
    assert (now[queued]["status"], now[queued]["statusReason"]) == ("FAILED", "test")
    ended = _wait_job(client, ignores)
    assert (ended["status"], ended["statusReason"]) == ("FAILED", "test")
    assert "ran on" in log_of(ended)

    def trapped(job_id: str) -> None:  # its handler is set: the log streams as the job runs
        started(job_id)
        wait_for(
            lambda: "trapped" in log_of(client.describe_jobs(jobs=[job_id])["jobs"][0]),
            60,
            f"job {job_id} to set its handler",
        )

    handles = submit(
        "handles", "trap 'echo stopping; exit 143' TERM; echo trapped; sleep 100 & wait"
    )
    trapped(handles)
    asked = time.monotonic()
    client.terminate_job(jobId=handles, reason="test")
    ended = _wait_job(client, handles)
    assert time.monotonic() - asked < 10  # its own handler ended it: no SIGKILL waited for
    assert "stopping" in log_of(ended)
    array = str(
        client.submit_job(
            jobName="array",
            jobQueue="amibake-x86_64",
            jobDefinition="amibake-trivial-x86_64",
            arrayProperties={"size": 2},
            containerOverrides={
                "command": ["/bin/sh", "-c", "trap 'exit 143' TERM; echo trapped; sleep 100 & wait"]
            },
        )["jobId"]
    )
    trapped(f"{array}:0")
    # Its parent cancels the children still queued; a running one runs on until terminated.
    client.terminate_job(jobId=array, reason="test")
    children = client.describe_jobs(jobs=[f"{array}:0", f"{array}:1"])["jobs"]
    assert [c["status"] for c in children] == ["RUNNING", "FAILED"], children
    client.terminate_job(jobId=f"{array}:0", reason="test")
    assert _wait_job(client, array, timeout_s=20)["status"] == "FAILED"
    children = client.describe_jobs(jobs=[f"{array}:0", f"{array}:1"])["jobs"]
    assert [(c["status"], c["statusReason"]) for c in children] == [("FAILED", "test")] * 2

    # A new image: a new environment swapped into the queue, the old one retired.
    second = _bake(cloud)
    swapped = batch.up(cloud, batch.images_from_bake(amis))
    assert swapped["queues"] == {"amibake-x86_64": f"amibake-x86_64-{second}"}
    assert any(first in retired for retired in swapped["retired"])
    status = batch.status(cloud)
    assert list(status["compute_environments"]) == [f"amibake-x86_64-{second}"]
    queue, definition, retired = batch.up_text(swapped).splitlines()
    assert queue == f"queue amibake-x86_64 -> amibake-x86_64-{second}"
    assert re.fullmatch(r"job definition amibake-trivial-x86_64:\d+", definition), definition
    assert retired == f"retired amibake-x86_64-{first}"
    capsys.readouterr()
    assert main(["batch", "status"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert f"compute environment amibake-x86_64-{second}: ENABLED, VALID, image {second}" in shown
    assert f"queue amibake-x86_64 -> amibake-x86_64-{second}" in shown

    done = batch.down(cloud)
    assert "deleted job queue amibake-x86_64" in done
    assert batch.status(cloud) == {"compute_environments": {}, "queues": {}, "job_definitions": []}
    # The hosts' security group goes too: amibake ls listed it after every down.
    named = [{"Name": "group-name", "Values": [batch.SECURITY_GROUP]}]
    assert cloud.ec2.describe_security_groups(Filters=named)["SecurityGroups"] == []
    assert any(d.startswith("deleted security group sg-") for d in done), done
    assert batch.down(cloud) == []  # safe to re-run
    assert main(["batch", "status"]) == 0
    assert capsys.readouterr().out.startswith("nothing registered")


def test_up_enables_an_environment_it_finds_disabled_and_refuses_one_made_otherwise(
    cloud: Cloud,
    built: None,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An environment left DISABLED (retired while its queue's jobs drained, or by a down
    stopped between disabling and deleting it) was taken as it was: the queue pointed at it,
    and its jobs waited RUNNABLE for ever (Batch places nothing in a DISABLED environment)."""
    _bake(cloud)
    images = batch.images_from_bake(cloud.config.results_dir / "amis.json")
    up = batch.up(cloud, images)
    client = cloud.client("batch")
    (queue, environment), *_ = up["queues"].items()
    try:
        client.update_compute_environment(computeEnvironment=environment, state="DISABLED")
        batch.up(cloud, images)
        (found,) = batch.environments(client, environment)
        assert found["state"] == "ENABLED", found
        job = client.submit_job(
            jobName="after", jobQueue=queue, jobDefinition="amibake-trivial-x86_64"
        )["jobId"]
        assert _wait_job(client, job)["status"] == "SUCCEEDED"
        # Asked on-demand after a spot up: Batch changes no managed environment's market in
        # place, and the up did nothing, saying nothing.
        capsys.readouterr()
        assert main(["batch", "up", "--from-bake", "--on-demand"]) == 2
        said = capsys.readouterr().err.strip()
        assert said.startswith(f"amibake: error: compute environment {environment} was made ")
        assert "the market (SPOT or EC2: on-demand)" in said and "\n" not in said, said
        (kept,) = batch.environments(client, environment)
        assert kept["computeResources"]["type"] == "SPOT"
    finally:
        batch.down(cloud)


def test_an_environment_retired_while_jobs_ran_goes_at_the_next_up(
    cloud: Cloud,
    built: None,  # noqa: F811
) -> None:
    """Retired while the queue had a job running, it was kept (DISABLED) until batch down, and
    bake --keep kept its image for it: a later up found it in no queue, and left it."""
    first = _bake(cloud)
    amis = cloud.config.results_dir / "amis.json"
    batch.up(cloud, batch.images_from_bake(amis))
    client = cloud.client("batch")
    try:
        job = client.submit_job(
            jobName="long",
            jobQueue="amibake-x86_64",
            jobDefinition="amibake-trivial-x86_64",
            containerOverrides={
                "command": ["/bin/sh", "-c", "trap 'exit 143' TERM; sleep 300 & wait"]
            },
        )["jobId"]
        deadline = time.monotonic() + 60
        while client.describe_jobs(jobs=[job])["jobs"][0]["status"] != "RUNNING":
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.2)
        _bake(cloud)
        swapped = batch.up(cloud, batch.images_from_bake(amis))
        old = f"amibake-x86_64-{first}"
        (kept,) = batch.environments(client, old)  # its job runs on: kept, disabled
        assert kept["state"] == "DISABLED" and any(old in r for r in swapped["retired"])
        client.terminate_job(jobId=job, reason="test")
        assert _wait_job(client, job)["status"] == "FAILED"
        again = batch.up(cloud, batch.images_from_bake(amis))
        assert batch.environments(client, old) == []
        assert any(old in r for r in again["retired"]), again
    finally:
        batch.down(cloud)


def test_an_interrupted_batch_up_says_what_stays_and_up_again_completes_it(
    cloud: Cloud,
    built: None,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C after the environment is made, before its queue: exit 130 said "cleaned up" while
    the environment, bucket and security group stayed. They are registrations meant to last:
    the error says so, and up again converges."""
    image = _bake(cloud)
    swap = batch._swap_into_queue

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(batch, "_swap_into_queue", interrupted)
    assert main(["batch", "up", "--ami", image]) == 130
    err = capsys.readouterr().err
    assert "interrupted: what batch up had registered stays" in err and "batch down" in err, err
    assert list(batch.status(cloud)["compute_environments"]) == [f"amibake-x86_64-{image}"]
    monkeypatch.setattr(batch, "_swap_into_queue", swap)
    assert main(["batch", "up", "--ami", image]) == 0
    assert batch.status(cloud)["queues"]
    batch.down(cloud)
    assert batch.status(cloud) == {"compute_environments": {}, "queues": {}, "job_definitions": []}


def test_batch_up_interrupted_as_its_bucket_is_made_leaves_nothing_down_cannot_find(
    cloud: Cloud,
) -> None:
    """Ctrl-C as CreateBucket returns: the bucket was recorded (SSM) only after it was made, so
    it was found by nothing, not ls, gc or down. Ctrl-C before its settings: up again used it
    unencrypted, its public access not blocked, its objects never expiring."""
    s3 = cloud.client("s3")

    def ours() -> list[str]:
        return [
            b["Name"]
            for b in s3.list_buckets()["Buckets"]
            if b["Name"].startswith("amibake-batch-")
        ]

    def interrupt(**_: object) -> None:
        raise KeyboardInterrupt

    assert ours() == []
    for call in ("CreateBucket", "PutPublicAccessBlock"):
        s3.meta.events.register(f"after-call.s3.{call}", interrupt, unique_id="interrupt")
        try:
            with pytest.raises(KeyboardInterrupt):
                batch._ensure_bucket(cloud)
        finally:
            s3.meta.events.unregister(f"after-call.s3.{call}", unique_id="interrupt")
        if call == "CreateBucket":
            assert len(ours()) == 1
            assert any(d.startswith("deleted bucket ") for d in batch.down(cloud))
            assert ours() == []
    name = batch._ensure_bucket(cloud)  # up again: the bucket it had begun
    assert ours() == [name]
    rules = s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]
    assert [r["Expiration"] for r in rules] == [{"Days": 7}], rules
    encryption = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]
    assert encryption["Rules"][0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert s3.get_bucket_tagging(Bucket=name)["TagSet"] == [{"Key": batch.TAG, "Value": "true"}]
    assert batch.down(cloud) == [f"deleted bucket {name}"]
    assert ours() == []


def test_batch_bad_input(cloud: Cloud, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["batch", "up", "--ami", "ami-0123456789abcdef0"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["batch", "up"]) == 2
    assert "one of the arguments --ami --from-bake is required" in capsys.readouterr().err
    assert main(["batch", "down"]) == 0  # nothing up: nothing to do, no error


def test_up_refuses_a_group_of_its_name_it_did_not_make_or_that_lets_anything_in(
    cloud: Cloud,
) -> None:
    """batch up took any group named amibake-batch in the VPC: one made by someone else, open
    to 0.0.0.0/0, would have gone onto every Batch host."""
    from amibake import batch
    from amibake.cloud.calls import default_vpc
    from amibake.errors import UserError

    ec2 = cloud.ec2
    vpc = default_vpc(ec2)
    found = ec2.describe_security_groups(
        Filters=[
            {"Name": "group-name", "Values": [batch.SECURITY_GROUP]},
            {"Name": "vpc-id", "Values": [vpc]},
        ]
    )["SecurityGroups"]
    made = not found
    group = (
        ec2.create_security_group(
            GroupName=batch.SECURITY_GROUP, Description="not amibake's", VpcId=vpc
        )["GroupId"]
        if made
        else found[0]["GroupId"]
    )
    try:
        # an earlier test's group, if there was one: not amibake's now
        ec2.delete_tags(Resources=[group], Tags=[{"Key": batch.TAG}])
        with pytest.raises(UserError) as refused:
            batch._network(cloud)  # batch up's first step, before anything is made
        err = str(refused.value) + "\n"
        assert (
            f"security group {group} in {vpc} is named amibake-batch but was not made by amibake"
            in err
        )
        assert err.count("\n") == 1, err
        ec2.create_tags(Resources=[group], Tags=[{"Key": batch.TAG, "Value": "true"}])
        rule = [
            {
                "IpProtocol": "tcp",
                "FromPort": 22,
                "ToPort": 22,
                "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
            }
        ]
        ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=rule)
        with pytest.raises(UserError, match=f"amibake's Batch security group {group} has inbound"):
            batch._network(cloud)
        ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=rule)
    finally:
        if made:
            ec2.delete_security_group(GroupId=group)
        else:
            ec2.create_tags(Resources=[group], Tags=[{"Key": batch.TAG, "Value": "true"}])


def test_run_files_s3_refuses_to_delete_are_a_failure_not_a_count(cloud: Cloud) -> None:
    """DeleteObjects answers 200 and lists what it could not delete under Errors (AccessDenied
    without s3:DeleteObject). That answer was thrown away: gc said "deleted run-files" and
    `fleet kill` "N files", and the files stayed."""
    from amibake import gc
    from amibake.inventory import Resource
    from amibake.journal import Journal

    s3 = cloud.client("s3")
    bucket, key = "amibake-test-refused-deletes", "fleet/ab-refused0000/payload.tar"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=key, Body=b"payload")

    def refuse(parsed: dict[str, object], **_: object) -> None:
        parsed["Errors"] = [{"Key": key, "Code": "AccessDenied", "Message": "Access Denied"}]

    s3.meta.events.register("after-call.s3.DeleteObjects", refuse)
    try:
        left = Resource("run-files", f"s3://{bucket}/fleet/ab-refused0000/", "ab-refused0000", None)
        journal = Journal(cloud.config.results_dir / "journal.sqlite")
        deleted, failures = gc.delete(cloud, journal, [left])
    finally:
        s3.meta.events.unregister("after-call.s3.DeleteObjects", refuse)
        batch.delete_prefix(cloud, bucket, "")
        s3.delete_bucket(Bucket=bucket)
    assert deleted == [], deleted
    assert len(failures) == 1 and "S3 did not delete 1 of 1 files" in failures[0], failures
    assert "AccessDenied" in failures[0] and "aws s3 rm --recursive" in failures[0], failures
