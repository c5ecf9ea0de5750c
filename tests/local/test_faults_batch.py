"""AWS Batch and CloudWatch Logs as AWS answers them (the local cloud's behaviour layer), and
amibake and fleet surviving each with nothing left: compute environments that go INVALID, jobs
held RUNNABLE, describes in pages, log reads with empty pages and late events.

Each test runs a local cloud of its own with one behaviour on, at a seed where the behaviour is
certain to be met, and checks the layer's own count that it was. The Batch environments are on
the region's base image: what is measured here is Batch's control plane and fleet's jobs, not a
bake, and a plain command's type (c5a.large) runs on any machine."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import botocore.exceptions
import pytest

from amibake import batch
from amibake.cloud import Cloud
from amibake.cloud.calls import error_code, retry_on
from amibake.errors import CloudError, UserError
from amibake.local import faults
from amibake.local.faults import (
    batch_environments,
    batch_jobs,
    iam_consistency,
    iam_principals,
    logs,
    s3_buckets,
)
from fleet import bench
from tests.fleet.test_bench import ANY_TYPE, assert_nothing_left, new_run, results_of
from tests.helpers import base_ami
from tests.local.test_faults import faulty, met, seed_where  # noqa: F401 - the fixture

Faulty = Callable[[str, int], Cloud]


def _image(cloud: Cloud) -> batch.Image:
    from amibake import catalog

    family = catalog.family(ANY_TYPE.split(".")[0])
    return batch.Image(base_ami(cloud), family.architecture, (family.name,), ("trivial",))


def _nothing_registered(cloud: Cloud) -> None:
    client = cloud.client("batch")
    assert batch.status(cloud) == {"compute_environments": {}, "queues": {}, "job_definitions": []}
    assert batch.environments(client) == [] and batch.queues(client) == []
    assert batch.job_bucket(cloud) is None


def _invalid(f: faults.Faults, n: int) -> bool:
    return f.chance(batch_environments.INVALID, "compute-environment", n, "invalid")


def _left_over(cloud: Cloud, image: batch.Image) -> str:
    """A compute environment of `up`'s name, made as a crashed earlier `up` would have left it
    (seconds after its roles), with the queue over it."""
    client = cloud.client("batch")
    subnets, groups = batch._network(cloud)
    service_role, profile = batch._ensure_iam(cloud)
    env_name, queue = batch.names(image)
    client.create_compute_environment(
        computeEnvironmentName=env_name,
        type="MANAGED",
        state="ENABLED",
        computeResources={
            "type": "SPOT",
            "allocationStrategy": "SPOT_PRICE_CAPACITY_OPTIMIZED",
            "minvCpus": 0,
            "maxvCpus": 4,
            "instanceTypes": [ANY_TYPE],
            "subnets": subnets,
            "securityGroupIds": groups,
            "instanceRole": profile,
            "ec2Configuration": [{"imageType": "ECS_AL2023", "imageIdOverride": image.image_id}],
        },
        serviceRole=service_role,
    )
    client.create_job_queue(
        jobQueueName=queue,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env_name}],
    )
    return env_name


def test_up_replaces_an_invalid_environment_it_finds_or_makes_and_says_why(
    faulty: Faulty,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The one left over goes INVALID, so does the first replacement; the second is VALID.
    seed = seed_where(lambda f: _invalid(f, 1) and _invalid(f, 2) and not _invalid(f, 3))
    cloud = faulty("batch-environments", seed)
    image = _image(cloud)
    env_name = _left_over(cloud, image)
    client = cloud.client("batch")
    assert batch.environments(client, env_name)[0]["status"] == "INVALID"
    caplog.set_level(logging.WARNING, logger="amibake")
    result = batch.up(cloud, [image])
    assert result["queues"] == {batch.names(image)[1]: env_name}
    found = batch.environments(client, env_name)[0]
    assert found["status"] == "VALID" and found["state"] == "ENABLED"
    said = [r.getMessage() for r in caplog.records if "is INVALID" in r.getMessage()]
    assert len(said) == 2 and all("CLIENT_ERROR - " in s for s in said), said
    assert "making it again" in said[0]
    assert met(cloud)["batch-environments"]["compute environment invalid"] == 2
    batch.down(cloud)
    _nothing_registered(cloud)


def test_up_gives_up_on_an_environment_that_stays_invalid_in_one_line_leaving_nothing(
    faulty: Faulty,  # noqa: F811
) -> None:
    seed = seed_where(lambda f: all(_invalid(f, n) for n in (1, 2, 3)))
    cloud = faulty("batch-environments", seed)
    image = _image(cloud)
    with pytest.raises(CloudError) as raised:
        batch.up(cloud, [image])
    message = str(raised.value)
    assert "\n" not in message and "went INVALID 3 times, last: CLIENT_ERROR - " in message
    assert "amibake batch up" in message
    assert met(cloud)["batch-environments"]["compute environment invalid"] == 3
    assert batch.environments(cloud.client("batch")) == []  # each INVALID one was deleted
    batch.down(cloud)
    _nothing_registered(cloud)


def _lingers(f: faults.Faults) -> bool:
    """The queue's disabling (1) and deletion (2) linger long; the environment stays VALID."""
    between = f.between(*batch_environments.LINGER_S, "job-queue-update", 2, "linger")
    return between > 2.5 and not _invalid(f, 1)


@pytest.mark.parametrize(
    ("seed_for", "met_as"),
    [(lambda f: _invalid(f, 1), "described invalid"), (_lingers, "queue relationship lingers")],
    ids=["invalid", "queue-lingers"],
)
def test_an_environment_still_in_its_queue_is_deleted(
    faulty: Faulty,  # noqa: F811
    seed_for: Callable[[faults.Faults], bool],
    met_as: str,
) -> None:
    """gc's way: the queue is still there. Disabling an INVALID environment leaves it INVALID,
    so deletion must not wait for VALID. And once out of its queue, the environment still
    counts as the queue's for seconds: Delete is refused "found existing JobQueue relationship"
    (terraform-provider-aws#46925), and retried; before, gc, down and fleet's cleanup failed
    there, the environment left."""
    cloud = faulty("batch-environments", seed_where(seed_for))
    env_name = _left_over(cloud, _image(cloud))
    client = cloud.client("batch")
    batch.delete_environment(client, env_name)
    assert batch.environments(client) == [] and batch.queues(client) == []
    assert met(cloud)["batch-environments"][met_as] > 0
    batch.down(cloud)
    _nothing_registered(cloud)


def test_a_deleted_queue_and_environment_described_deleted_are_gone(
    faulty: Faulty,  # noqa: F811
) -> None:
    """Batch describes a deleted queue or environment for a while after, status DELETED: the
    waits for them to go waited that out (300 s each, then failed), so `down` stopped before
    the job definitions, and an `up` after it took the deleted environment for its own."""
    cloud = faulty("batch-environments", 0)
    image = _image(cloud)
    batch.up(cloud, [image])
    env_name, queue = batch.names(image)
    assert batch.images_launched(cloud) == {image.image_id: env_name}  # what bake --keep keeps
    batch.down(cloud)
    assert batch.images_launched(cloud) == {}
    client = cloud.client("batch")
    described = client.describe_compute_environments()["computeEnvironments"]
    assert [e["status"] for e in described] == ["DELETED"], described
    assert [q["status"] for q in client.describe_job_queues()["jobQueues"]] == ["DELETED"]
    assert met(cloud)["batch-environments"]["deleted still described"] > 0
    _nothing_registered(cloud)
    batch.up(cloud, [image])  # the same names again, while the deleted ones are described
    assert [e["status"] for e in batch.environments(client, env_name)] == ["VALID"]
    assert [q["status"] for q in batch.queues(client, queue)] == ["VALID"]
    batch.down(cloud)
    _nothing_registered(cloud)


# --- a new role not yet known to S3 ------------------------------------------------------


def test_a_bucket_policy_naming_a_role_made_a_moment_ago_is_refused_then_taken(
    faulty: Faulty,  # noqa: F811
) -> None:
    """The layer itself: S3 refuses the new role as a principal for a while (AWS: seconds, at
    times a minute), then takes the same policy."""
    cloud = faulty("iam-principals", 0)  # any seed: every new role is unknown for 0.5 s or more
    iam, s3 = cloud.client("iam"), cloud.client("s3")
    trust = {"Version": "2012-10-17", "Statement": []}
    arn = iam.create_role(RoleName="fresh", AssumeRolePolicyDocument=json.dumps(trust))["Role"][
        "Arn"
    ]
    s3.create_bucket(Bucket="fresh-bucket")
    statement = {"Effect": "Allow", "Principal": {"AWS": arn}, "Action": "s3:GetObject",
                 "Resource": "arn:aws:s3:::fresh-bucket/*"}  # fmt: skip
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        s3.put_bucket_policy(Bucket="fresh-bucket", Policy=policy)
    assert error_code(refused.value) == "MalformedPolicy"
    assert "Invalid principal in policy" in str(refused.value)
    retry_on(
        {"MalformedPolicy"},
        lambda: s3.put_bucket_policy(Bucket="fresh-bucket", Policy=policy),
        within_s=iam_principals.UNKNOWN_S[1] * 2,
    )
    assert json.loads(s3.get_bucket_policy(Bucket="fresh-bucket")["Policy"]) == json.loads(policy)
    s3.delete_bucket_policy(Bucket="fresh-bucket")
    s3.delete_bucket(Bucket="fresh-bucket")
    iam.delete_role(RoleName="fresh")


def test_a_new_bucket_s_settings_are_refused_for_a_moment_then_taken(
    faulty: Faulty,  # noqa: F811
) -> None:
    """The layer itself: NoSuchBucket, or OperationAborted for encryption, then the same call
    succeeds."""
    seed = seed_where(lambda f: f.chance(s3_buckets.ABORTED, "bucket", 1, "abort"))
    cloud = faulty("s3-buckets", seed)
    s3 = cloud.client("s3")
    s3.create_bucket(Bucket="fresh-bucket")
    encryption = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        s3.put_bucket_encryption(
            Bucket="fresh-bucket", ServerSideEncryptionConfiguration=encryption
        )
    assert error_code(refused.value) == "OperationAborted"
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        s3.put_bucket_tagging(Bucket="fresh-bucket", Tagging={"TagSet": []})
    assert error_code(refused.value) == "NoSuchBucket"
    batch.bucket_settled(
        lambda: s3.put_bucket_encryption(
            Bucket="fresh-bucket", ServerSideEncryptionConfiguration=encryption
        )
    )
    assert s3.get_bucket_encryption(Bucket="fresh-bucket")["ServerSideEncryptionConfiguration"]
    s3.delete_bucket(Bucket="fresh-bucket")


def test_up_puts_every_setting_on_a_bucket_s3_does_not_find_yet(
    faulty: Faulty,  # noqa: F811
) -> None:
    """Settings put on a bucket made seconds before are refused NoSuchBucket for a while: `up`
    stopped there, the bucket unencrypted and its public access not blocked until the next
    `up`."""
    cloud = faulty("s3-buckets", 0)
    batch.up(cloud, [_image(cloud)])
    bucket = batch.job_bucket(cloud)
    assert bucket is not None
    s3 = cloud.client("s3")
    rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert all(s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"].values())
    lifecycle = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert lifecycle[0]["Expiration"] == {"Days": 7}
    assert "Deny" in s3.get_bucket_policy(Bucket=bucket)["Policy"]
    assert met(cloud)["s3-buckets"]["bucket not found yet"] >= 1
    batch.down(cloud)
    _nothing_registered(cloud)


@pytest.mark.parametrize("recorded", ["after-this-read", "before-this-read"])
def test_two_ups_at_once_share_one_job_bucket(
    faulty: Faulty,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    recorded: str,
) -> None:
    """Each `up` that found no bucket recorded one of its own: the last record won, and the
    other bucket was found by nothing (not ls, gc or down). And one that found the other's
    record before its bucket was made took it for stale and recorded a new one."""
    cloud = faulty("none", 0)
    image = _image(cloud)
    read = batch.job_bucket
    theirs = f"amibake-batch-{cloud.config.region}-0123456789abcdef"

    def the_other_up_records_just_after_this_one_read(c: Cloud) -> str | None:
        found = read(c)
        if found is None:
            c.ssm.put_parameter(Name=batch.BUCKET_PARAMETER, Value=theirs, Type="String")
        return found

    if recorded == "after-this-read":
        monkeypatch.setattr(batch, "job_bucket", the_other_up_records_just_after_this_one_read)
    else:  # recorded, its bucket not made yet
        cloud.ssm.put_parameter(Name=batch.BUCKET_PARAMETER, Value=theirs, Type="String")
    batch.up(cloud, [image])
    monkeypatch.undo()
    assert batch.job_bucket(cloud) == theirs
    buckets = [b["Name"] for b in cloud.client("s3").list_buckets()["Buckets"]]
    assert [b for b in buckets if b.startswith("amibake-batch-")] == [theirs]
    batch.down(cloud)
    _nothing_registered(cloud)


def test_up_waits_until_s3_knows_the_job_role_it_just_made(faulty: Faulty) -> None:  # noqa: F811
    cloud = faulty("iam-principals", 0)
    batch.up(cloud, [_image(cloud)])
    assert met(cloud)["iam-principals"]["principal not known yet"] >= 1
    bucket = batch.job_bucket(cloud)
    assert bucket is not None
    policy = json.loads(cloud.client("s3").get_bucket_policy(Bucket=bucket)["Policy"])
    (statement,) = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    assert statement["Principal"]["AWS"].endswith(f":role/amibake/{batch.JOB_ROLE}"), statement
    batch.down(cloud)
    _nothing_registered(cloud)


def test_up_waits_until_iam_knows_the_role_and_profile_it_just_made(
    faulty: Faulty,  # noqa: F811
) -> None:
    """IAM is eventually consistent: AttachRolePolicy naming the instance role made a moment
    before, and GetInstanceProfile the profile, answered NoSuchEntity, and the first `batch up`
    of an account failed there (terraform-provider-aws#6079)."""

    def both_unseen(f: faults.Faults) -> bool:
        return all(
            iam_consistency.unseen(f, kind, 1)
            and f.between(*iam_consistency.UNSEEN_S, f"iam-{kind}", 1) > 1.5
            for kind in iam_consistency.KINDS
        )

    cloud = faulty("iam-consistency", seed_where(both_unseen))
    batch.up(cloud, [_image(cloud)])
    counts = met(cloud)["iam-consistency"]
    assert counts.get("new role not found by AttachRolePolicy", 0) >= 1, counts
    assert counts.get("new instance-profile not found by GetInstanceProfile", 0) >= 1, counts
    batch.down(cloud)
    _nothing_registered(cloud)


# --- jobs held RUNNABLE -------------------------------------------------------------------


def _bench(cloud: Cloud, timeout_s: float = 240.0) -> tuple[str, dict[str, Any]]:
    """One plain job on Batch; fails the test rather than hang when the run does not end."""
    batch.up(cloud, [_image(cloud)])
    run_id = new_run(
        cloud,
        executor="batch",
        command="echo value=7",
        metric="value=(\\d+)",
        replicates=1,
        warmups=0,
    )
    done: dict[str, Any] = {}

    def execute() -> None:
        done["summary"] = bench.execute(cloud, run_id, results_of(cloud))

    thread = threading.Thread(target=execute, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert "summary" in done, f"the run did not end in {timeout_s:.0f}s"
    return run_id, done["summary"]


def _clean(cloud: Cloud, run_id: str) -> None:
    client = cloud.client("batch")
    fleet_made = [
        e for e in batch.environments(client) if e["computeEnvironmentName"].startswith("fleet-")
    ]
    assert (
        fleet_made == []
        and [q for q in batch.queues(client) if q["jobQueueName"].startswith("fleet-")] == []
    )
    assert_nothing_left(cloud, results_of(cloud), run_id, cloud.config.local_dir)
    batch.down(cloud)
    _nothing_registered(cloud)


def _held(f: faults.Faults, forever: bool) -> bool:
    held, for_ever, _ = batch_jobs.hold(f, 1, 0)
    return held and for_ever == forever


def test_a_job_held_runnable_for_a_while_then_runs(faulty: Faulty) -> None:  # noqa: F811
    cloud = faulty("batch-jobs", seed_where(lambda f: _held(f, forever=False)))
    run_id, summary = _bench(cloud)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results_of(cloud).replicates(run_id)
    assert list(rows.state) == ["ok"] and list(rows.metric) == [7]
    done = met(cloud)["batch-jobs"]
    assert done["job held runnable"] == 1 and done["job released"] == 1
    _clean(cloud, run_id)


def test_a_job_held_runnable_for_ever_is_given_up_with_batchs_reason(
    faulty: Faulty,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The run's own deadline (4 s) comes before the queue's time limit (600 s, 6 s here).
    monkeypatch.setenv("FLEET_BATCH_RUNNABLE_TIMEOUT_S", "4")
    cloud = faulty("batch-jobs", seed_where(lambda f: _held(f, forever=True)))
    run_id, summary = _bench(cloud)
    (outcome,) = summary["types"].values()
    assert not outcome["ok"]
    error = outcome["error"]
    assert "1 Batch jobs waited 4s with none running: " in error, error
    assert any(r in error for r in (batch_jobs.CAPACITY, batch_jobs.REQUIREMENT)), error
    assert "FLEET_BATCH_RUNNABLE_TIMEOUT_S" in error
    assert met(cloud)["batch-jobs"]["job held for ever"] == 1
    _clean(cloud, run_id)


def test_the_runs_queue_cancels_a_job_held_runnable_for_ever(
    faulty: Faulty,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The run waits 600 s itself; its queue's jobStateTimeLimitActions (600 s, 6 s here) cancel
    # the job first: the replicate fails with Batch's reason, the run ends.
    monkeypatch.setenv("FLEET_BATCH_RUNNABLE_TIMEOUT_S", "600")
    cloud = faulty("batch-jobs", seed_where(lambda f: _held(f, forever=True)))
    run_id, summary = _bench(cloud, timeout_s=120)
    rows = results_of(cloud).replicates(run_id)
    assert list(rows.state) == ["failed"], rows[["state", "error"]]
    assert "Canceled by JobStateTimeLimit action due to reason: " in rows.error.iloc[0]
    assert met(cloud)["batch-jobs"]["job cancelled by the queue's time limit"] == 1
    queue = [
        q
        for q in batch.queues(cloud.client("batch"))
        if q["jobQueueName"] == batch.names(_image(cloud))[1]
    ]
    assert queue and {a["reason"] for a in queue[0]["jobStateTimeLimitActions"]} == set(
        batch.TIME_LIMIT_REASONS
    )
    assert summary["types"]
    _clean(cloud, run_id)


# --- log pages ----------------------------------------------------------------------------


def test_the_result_line_is_read_through_empty_pages_and_late_events(
    faulty: Faulty,  # noqa: F811
) -> None:
    seed = seed_where(
        lambda f: (
            f.chance(logs.EMPTY, "stream", 1, "empty") and f.chance(logs.LATE, "stream", 1, "late")
        )
    )
    cloud = faulty("logs-pages", seed)
    run_id, summary = _bench(cloud)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results_of(cloud).replicates(run_id)
    assert list(rows.state) == ["ok"] and list(rows.metric) == [7], rows[["state", "error"]]
    done = met(cloud)["logs-pages"]
    assert done["empty page"] >= 1 and done["late events held back"] >= 1
    _clean(cloud, run_id)


# --- pages ----------------------------------------------------------------------------------


def test_down_removes_every_job_definition_page_after_page(faulty: Faulty) -> None:  # noqa: F811
    from amibake.local.faults import pagination

    cloud = faulty("pagination", 0)
    client = cloud.client("batch")
    many = 105  # more than one page of AWS's (100), and of the layer's
    for _ in range(many):
        client.register_job_definition(
            jobDefinitionName="amibake-many-x86_64",
            type="container",
            containerProperties={"image": "x", "command": ["true"], "vcpus": 1, "memory": 128},
        )
    done = batch.down(cloud)
    assert len([d for d in done if d.startswith("deregistered amibake-many-x86_64:")]) == many
    assert batch.status(cloud)["job_definitions"] == []
    assert met(cloud)[pagination.BEHAVIOUR.name]["DescribeJobDefinitions truncated"] > 0


def test_down_refuses_while_a_fleet_run_has_a_queue_and_touches_nothing(
    faulty: Faulty,  # noqa: F811
) -> None:
    """A fleet run's jobs use what `up` made (job definitions, the bucket with their payloads,
    the hosts' group): down deregistered and emptied them under it."""
    cloud = faulty("none", 0)
    image = _image(cloud)
    batch.up(cloud, [image])
    client = cloud.client("batch")
    env_name, _ = batch.names(image)
    run_queue = "fleet-fb-0123456789-abcdef-0"
    client.create_job_queue(
        jobQueueName=run_queue, state="ENABLED", priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env_name}],
    )  # fmt: skip
    before = batch.status(cloud)
    bucket = batch.job_bucket(cloud)
    with pytest.raises(UserError, match=r"fleet run\(s\) fb-0123456789: stop each first"):
        batch.down(cloud)
    assert batch.status(cloud) == before and batch.job_bucket(cloud) == bucket
    batch.delete_queue(client, run_queue)
    batch.down(cloud)
    _nothing_registered(cloud)
