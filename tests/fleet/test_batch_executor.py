"""`fleet bench` with executor = "batch" on the local cloud: array jobs on the environments of
`amibake batch up`, results from CloudWatch Logs and S3, a host lost mid-job ("Host EC2
terminated") rerun, runs stopped after each resource-creating step or killed mid-job leaving
nothing, and a missing registration refused before anything is created."""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

from amibake import batch, config, gc, pipelines, runner
from amibake.cli import main as main_amibake
from amibake.cloud import Cloud
from amibake.cloud.tags import RUN_ID
from amibake.journal import Journal
from amibake.local import control as local_control
from amibake.local import jobs as local_jobs
from amibake.runner import Interrupted
from fleet import batch as fleet_batch
from fleet import bench, control, evaluators, tune
from fleet.cli import main
from tests.fleet.test_bench import assert_nothing_left, fleet_process, new_run, results_of
from tests.helpers import left_queue, wait_for, wait_until_clean
from tests.test_bake import built  # noqa: F401 - the module-scoped artifact fixture


@pytest.fixture(scope="module")
def registered(cloud: Cloud, built: None) -> Iterator[None]:  # noqa: F811
    outcome = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    assert outcome.ok, outcome.error
    batch.up(cloud, batch.images_from_bake(cloud.config.results_dir / "amis.json"))
    yield
    batch.down(cloud)


def bucket_files(cloud: Cloud, run_id: str) -> list[str]:
    listed = cloud.client("s3").list_objects_v2(
        Bucket=batch.job_bucket(cloud), Prefix=f"fleet/{run_id}/"
    )
    return [o["Key"] for o in listed.get("Contents", [])]


def run_queue(cloud: Cloud, run_id: str) -> str | None:
    """The run's own job queue, once it exists."""
    for queue in batch.queues(cloud.client("batch")):  # not one deleted, described DELETED
        if queue["jobQueueName"].startswith(f"fleet-{run_id}-"):
            return str(queue["jobQueueName"])
    return None


def queue_jobs(client: Any, queue: str, statuses: tuple[str, ...]) -> list[dict[str, Any]]:
    """The queue's jobs in these states, an array's children included: ListJobs by queue gives
    the parent alone (PENDING while its children run), as on AWS."""
    found = []
    for status in (*batch.ACTIVE_JOBS, "SUCCEEDED", "FAILED"):
        for job in client.list_jobs(jobQueue=queue, jobStatus=status)["jobSummaryList"]:
            if "size" in job.get("arrayProperties", {}):
                for wanted in statuses:
                    listed = client.list_jobs(arrayJobId=job["jobId"], jobStatus=wanted)
                    found += listed["jobSummaryList"]
            elif status in statuses:
                found.append(job)
    return found


def agent_started(cloud: Cloud, job_ids: list[str]) -> bool:
    """Whether one of these jobs' agents has set up and printed its host (FLEET-HOST): its
    replicate and the watcher on the spot notice start next."""
    logs = cloud.client("logs")
    for job in cloud.client("batch").describe_jobs(jobs=job_ids)["jobs"]:
        stream = (job.get("container") or {}).get("logStreamName")
        if stream:
            events = logs.get_log_events(logGroupName=fleet_batch.LOG_GROUP, logStreamName=stream)
            if any(e["message"].startswith("FLEET-HOST ") for e in events["events"]):
                return True
    return False


def running_jobs(cloud: Cloud, run_id: str) -> bool:
    queue = run_queue(cloud, run_id)
    return bool(queue) and bool(queue_jobs(cloud.client("batch"), queue, ("RUNNING",)))


def batch_left(cloud: Cloud, run_id: str, local_dir: Path) -> None:
    results = results_of(cloud)
    assert_nothing_left(cloud, results, run_id, local_dir)
    assert bucket_files(cloud, run_id) == []
    names = [e["computeEnvironmentName"] for e in batch.environments(cloud.client("batch"))]
    assert not [n for n in names if n.startswith(f"fleet-{run_id}")], names
    assert wait_until_clean(local_dir) == []  # each trial's host went with its environment


@pytest.mark.e2e
def test_two_builds_measured_as_array_jobs(cloud: Cloud, registered: None, local_dir: Path) -> None:
    run_id = new_run(
        cloud,
        executor="batch",
        recipe="kernels",
        builds=["tuned", "generic"],
        replicates=2,
        warmups=1,
        args="--size 2",
    )
    results = results_of(cloud)
    submitted: list[dict[str, Any]] = []
    client = cloud.client("batch")

    def record(params: dict[str, Any], **_: Any) -> None:
        submitted.append(params)

    client.meta.events.register("provide-client-params.batch.SubmitJob", record)
    try:
        summary = bench.execute(cloud, run_id, results)
    finally:
        client.meta.events.unregister("provide-client-params.batch.SubmitJob", record)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    assert len(rows) == 6 and set(rows.state) == {"ok"}, rows[["state", "error"]]
    assert set(rows.build) == {"tuned", "generic"} and (rows.metric > 0).all()
    # One array job of 6 children on the run's own queue, the whole instance per child.
    assert len(submitted) == 1 and submitted[0]["arrayProperties"] == {"size": 6}
    assert submitted[0]["jobQueue"].startswith(f"fleet-{run_id}-")
    assert submitted[0]["jobQueue"].endswith("-c5a-large-0")
    # The job installs what the minimal container image lacks: setsid (util-linux) for
    # replicate.sh, the build's runtime (libgomp) and the monitor's psutil.
    environment_vars = {
        e["name"]: e["value"] for e in submitted[0]["containerOverrides"]["environment"]
    }
    setup = environment_vars["FLEET_SETUP"]
    assert "install -y -q util-linux libgomp >&2" in setup
    assert "( if ! rpm -q python3-psutil" in setup  # optional: without it, no monitor
    requirements = submitted[0]["containerOverrides"]["resourceRequirements"]
    assert {"type": "VCPU", "value": "2"} in requirements
    # Where each ran came from the job itself (IMDS) and is recorded with its price.
    environment = results.environments(run_id)[0]
    assert environment["instance_id"].startswith("i-")
    assert set(environment["builds"]) == {"tuned", "generic"}
    assert set(rows.instance_id) == {environment["instance_id"]}
    assert (rows.price_usd_hour > 0).all()
    # Its spend runs from the host's launch (it was billed through its boot and the first
    # job), not from when the first job reported: at least until its last replicate ended.
    host = cloud.ec2.describe_instances(InstanceIds=[environment["instance_id"]])
    launched = host["Reservations"][0]["Instances"][0]["LaunchTime"].timestamp()
    billed_s = rows.finished.max() - launched
    assert summary["spent_usd"] >= billed_s * rows.price_usd_hour.iloc[0] / 3600, (
        summary["spent_usd"],
        billed_s,
    )
    # The monitor ran (the job installed psutil) and its CSV came back through S3. (An empty
    # monitor_csv is Path(""), the current directory, which exists: hence the bool.)
    measured = rows[~rows.warmup.astype(bool)]
    assert measured.monitor_csv.map(lambda p: bool(p) and Path(p).is_file()).all()
    batch_left(cloud, run_id, local_dir)
    # The jobs read and wrote the bucket with their job role's own credentials: no URL, key
    # or token is in what the run logged, what DescribeJobs and the job definitions show, or
    # what the local cloud logged.
    client = cloud.client("batch")
    jobs = client.describe_jobs(jobs=[j for j in _submitted_jobs(client, run_id)])["jobs"]
    definitions = client.describe_job_definitions(status="ACTIVE")["jobDefinitions"]
    assert all(d["containerProperties"].get("jobRoleArn") for d in definitions)
    texts = {
        "submitted": json.dumps(submitted, default=str),
        "describe_jobs": json.dumps(jobs, default=str),
        "job definitions": json.dumps(definitions, default=str),
        "results/logs": "".join(
            p.read_text(errors="replace")
            for p in (cloud.config.results_dir / "logs").rglob("*")
            if p.is_file() and p.suffix in (".log", ".json")
        ),
        "daemon.log": (local_dir / "daemon.log").read_text(errors="replace"),
    }
    for where, text in texts.items():
        found = SECRETS.findall(text)
        assert not found, f"{where} holds {found[:3]}"


# What a presigned URL, an access key, an STS session or a task-role endpoint carries (values,
# not names: the job's own code names the variables it reads).
SECRETS = re.compile(
    r"X-Amz-(?:Signature|Credential|Security-Token)=|(?:AKIA|ASIA)[A-Z0-9]{16}|"
    r"(?:SecretAccessKey|aws_secret_access_key)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+]{20,}|"
    r"/v2/credentials/[0-9a-f-]{36}",
    re.IGNORECASE,
)


def _submitted_jobs(client: Any, run_id: str) -> list[str]:
    ids = []
    for queue in batch.queues(client):
        if queue["jobQueueName"].startswith(f"fleet-{run_id}-"):
            for status in ("SUCCEEDED", "FAILED"):
                ids += [
                    j["jobId"]
                    for j in client.list_jobs(jobQueue=queue["jobQueueName"], jobStatus=status)[
                        "jobSummaryList"
                    ]
                ]
    return ids


def test_the_job_bucket_is_random_recorded_and_every_s3_call_names_its_owner(
    cloud: Cloud, registered: None
) -> None:
    name = batch.job_bucket(cloud)
    assert name is not None
    assert re.fullmatch(rf"amibake-batch-{cloud.config.region}-[0-9a-f]{{16}}", name)
    headers: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        headers.append((model.name, dict(params.get("headers", {}))))

    s3 = cloud.client("s3")
    s3.meta.events.register("before-call.s3.*", record)
    try:
        batch.up(cloud, batch.images_from_bake(cloud.config.results_dir / "amis.json"))
    finally:
        s3.meta.events.unregister("before-call.s3.*", record)
    assert batch.job_bucket(cloud) == name  # found again, not made anew
    assert headers, "batch up made no S3 call: the recording is broken"
    for operation, sent in headers:
        assert sent.get("x-amz-expected-bucket-owner") == cloud.account, operation
    # Its policy lets the job role read and write the run files, over TLS only (Security Hub's
    # S3.5), as AWS evaluates it: a plain-HTTP request is denied, whoever makes it.
    from amibake.local import iam

    policy = json.loads(s3.get_bucket_policy(Bucket=name)["Policy"])
    role = cloud.client("iam").get_role(RoleName=batch.JOB_ROLE)["Role"]["Arn"]
    payload = f"arn:aws:s3:::{name}/fleet/fb-0123456789/payload.tar"
    for action in ("s3:GetObject", "s3:PutObject"):
        over = {"aws:PrincipalArn": role}
        assert (
            iam.decide(
                [policy], iam.Check(action, payload, {**over, "aws:SecureTransport": "true"})
            )
            == "allow"
        )
        assert (
            iam.decide(
                [policy], iam.Check(action, payload, {**over, "aws:SecureTransport": "false"})
            )
            == "deny"
        )
    anyone = {
        "aws:PrincipalArn": f"arn:aws:iam::{cloud.account}:root",
        "aws:SecureTransport": "false",
    }
    assert (
        iam.decide([policy], iam.Check("s3:ListBucket", f"arn:aws:s3:::{name}", anyone)) == "deny"
    )


def _ecs_tasks_trust(condition: dict[str, Any] | None = None) -> dict[str, Any]:
    """A trust policy that lets ECS assume a role for tasks (under `condition`)."""
    statement: dict[str, Any] = {
        "Effect": "Allow",
        "Principal": {"Service": "ecs-tasks.amazonaws.com"},
        "Action": "sts:AssumeRole",
    }
    if condition:
        statement["Condition"] = condition
    return {"Version": "2012-10-17", "Statement": [statement]}


def test_the_job_role_trusts_this_account_s_ecs_tasks_alone_and_an_older_trust_is_renewed(
    cloud: Cloud, registered: None
) -> None:
    from amibake.local import iam as local_iam

    iam = cloud.client("iam")
    role = iam.get_role(RoleName=batch.JOB_ROLE)["Role"]
    account, region = cloud.account, cloud.config.region
    task = f"arn:aws:ecs:{region}:{account}:task/AWSBatch-env/0123456789abcdef"
    ours = {
        "aws:PrincipalServiceName": "ecs-tasks.amazonaws.com",
        "aws:SourceAccount": account,
        "aws:SourceArn": task,
    }

    def assumes(context: dict[str, str]) -> str:
        asked = local_iam.Check("sts:AssumeRole", role["Arn"], context)
        return local_iam.decide([role["AssumeRolePolicyDocument"]], asked)

    assert assumes(ours) == "allow"
    elsewhere = task.replace(f":{account}:", ":111111111111:")
    refused = {
        "another account's task": {
            **ours,
            "aws:SourceAccount": "111111111111",
            "aws:SourceArn": elsewhere,
        },
        "a task in another region": {**ours, "aws:SourceArn": task.replace(region, "zz-west-9")},
        "no source named": {"aws:PrincipalServiceName": "ecs-tasks.amazonaws.com"},
        "another service": {**ours, "aws:PrincipalServiceName": "ec2.amazonaws.com"},
    }
    for why, context in refused.items():
        assert assumes(context) == "implicit", why

    # An older amibake made the role with a bare trust: the next up gives it this one. (The
    # other tests' jobs run as it, the local cloud judging its trust at each start.)
    bare = json.dumps(_ecs_tasks_trust())
    iam.update_assume_role_policy(RoleName=batch.JOB_ROLE, PolicyDocument=bare)
    batch.up(cloud, batch.images_from_bake(cloud.config.results_dir / "amis.json"))
    renewed = iam.get_role(RoleName=batch.JOB_ROLE)["Role"]["AssumeRolePolicyDocument"]
    assert renewed == role["AssumeRolePolicyDocument"]


def test_a_job_whose_role_does_not_trust_its_ecs_task_never_starts(
    cloud: Cloud, registered: None
) -> None:
    """As ECS: a role that lets no task of this account in is not assumed, and the job fails
    with ECS's reason, never run."""
    iam, client = cloud.client("iam"), cloud.client("batch")
    trust = _ecs_tasks_trust({"StringEquals": {"aws:SourceAccount": "111111111111"}})
    name = "test-another-account-s-tasks"
    arn = iam.create_role(
        RoleName=name, Path="/amibake/", AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]["Arn"]
    definition = "test-untrusted-role"
    try:
        client.register_job_definition(
            jobDefinitionName=definition,
            type="container",
            containerProperties={
                "image": "busybox",
                "jobRoleArn": arn,
                "command": ["/bin/sh", "-c", "echo ran"],
                "resourceRequirements": [
                    {"type": "VCPU", "value": "1"},
                    {"type": "MEMORY", "value": "128"},
                ],
            },
        )
        job = client.submit_job(
            jobName="untrusted", jobQueue="amibake-x86_64", jobDefinition=definition
        )["jobId"]
        wait_for(
            lambda: (
                client.describe_jobs(jobs=[job])["jobs"][0]["status"] in ("SUCCEEDED", "FAILED")
            ),
            120,
        )
        ended = client.describe_jobs(jobs=[job])["jobs"][0]
        assert ended["status"] == "FAILED", ended
        assert ended["statusReason"].startswith(f"ECS was unable to assume the role '{arn}'")
        assert not ended.get("container", {}).get("logStreamName"), ended  # never ran
    finally:
        for listed in client.describe_job_definitions(
            jobDefinitionName=definition, status="ACTIVE"
        )["jobDefinitions"]:
            client.deregister_job_definition(jobDefinition=listed["jobDefinitionArn"])
        iam.delete_role(RoleName=name)
        # The host the job's environment started, ended as Batch scales in: the other tests
        # count the sandboxes left, and take any Batch host for their run's.
        registered_environments = list(batch.status(cloud)["compute_environments"])
        hosts = [{"Name": "tag:aws:batch:compute-environment", "Values": registered_environments}]
        for reservation in cloud.ec2.describe_instances(Filters=hosts)["Reservations"]:
            ids = [i["InstanceId"] for i in reservation["Instances"]]
            cloud.ec2.terminate_instances(InstanceIds=ids)


def test_a_recorded_bucket_another_account_holds_is_refused_untouched(
    cloud: Cloud, registered: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # Someone else's account holds a bucket, and the account's record names it (as a
    # predictable name once could): batch up refuses it, names it, and writes nothing there.
    sts = cloud.client("sts")
    other = sts.assume_role(
        RoleArn="arn:aws:iam::111111111111:role/someone-else", RoleSessionName="squatter"
    )["Credentials"]
    theirs = boto3.client(
        "s3",
        endpoint_url=cloud.endpoint_url,
        region_name=cloud.config.region,
        aws_access_key_id=other["AccessKeyId"],
        aws_secret_access_key=other["SecretAccessKey"],
        aws_session_token=other["SessionToken"],
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )
    squatted = f"amibake-batch-{cloud.config.region}-0123456789abcdef"
    theirs.create_bucket(Bucket=squatted)
    ours = batch.job_bucket(cloud)
    cloud.ssm.put_parameter(
        Name=batch.BUCKET_PARAMETER, Value=squatted, Overwrite=True, Type="String"
    )
    try:
        assert main_amibake(["batch", "up", "--from-bake"]) == 2
        err = capsys.readouterr().err
        assert (
            f"the job bucket {squatted} (recorded in SSM {batch.BUCKET_PARAMETER}) is not this account's"
            in err
        )
        assert "\n" not in err.strip()
        assert theirs.list_objects_v2(Bucket=squatted).get("KeyCount", 0) == 0
        assert theirs.get_bucket_tagging  # still theirs: never configured by us
        with pytest.raises(botocore.exceptions.ClientError):
            theirs.get_public_access_block(Bucket=squatted)  # we set none on it
    finally:
        cloud.ssm.put_parameter(
            Name=batch.BUCKET_PARAMETER, Value=str(ours), Overwrite=True, Type="String"
        )
        theirs.delete_bucket(Bucket=squatted)


@pytest.mark.parametrize("how", ["terminated", "notice"])
def test_a_lost_host_reruns_its_replicate(
    cloud: Cloud, registered: None, local_dir: Path, how: str
) -> None:
    run_id = new_run(
        # 4 s: a host is killed half a second after its job is seen RUNNING, and the job must
        # still be running then on a loaded host (2 s left about one second to spare)
        cloud,
        executor="batch",
        command="sleep 4; echo value=7",
        metric="value=(\\d+)",
    )
    results = results_of(cloud)
    killed: list[str] = []

    def terminate_first_host() -> None:
        # The run's first host, once a job runs on it: as a spot reclaim would. Its own: the
        # registered environment may have a host up too (its queue ran another test's job).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            queue = run_queue(cloud, run_id)  # named as its compute environment
            reservations = cloud.ec2.describe_instances(
                Filters=[
                    {"Name": "tag:aws:batch:compute-environment", "Values": [queue or "-"]},
                    {"Name": "instance-state-name", "Values": ["running"]},
                ]
            )["Reservations"]
            for reservation in reservations:
                for instance in reservation["Instances"]:
                    jobs = queue and queue_jobs(cloud.client("batch"), queue, ("RUNNING",))
                    if jobs:
                        # RUNNING comes as the container starts; the notice is for a replicate
                        # under way, its watcher up: the agent says so (its log streams).
                        ids = [j["jobId"] for j in jobs]
                        wait_for(
                            functools.partial(agent_started, cloud, ids),
                            60,
                            "the job's agent to start its replicate",
                        )
                        time.sleep(0.5)
                        if how == "terminated":
                            cloud.ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
                        else:
                            local_control.interrupt(cloud.config, instance["InstanceId"])
                        killed.append(instance["InstanceId"])
                        return
            time.sleep(0.2)

    thread = threading.Thread(target=terminate_first_host)
    thread.start()
    summary = bench.execute(cloud, run_id, results)
    thread.join()
    assert killed and all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    interrupted = rows[rows.state == "interrupted"]
    assert len(interrupted) >= 1
    reason = {
        "terminated": f"Host EC2 (instance {killed[0]}) terminated.",
        "notice": "spot interruption notice",
    }[how]
    assert interrupted.error.iloc[0] == reason
    ok = rows[rows.state == "ok"]
    assert sorted(ok.replicate) == [0, 1, 2] and (ok.metric == 7).all()
    assert killed[0] not in set(ok.instance_id)
    batch_left(cloud, run_id, local_dir)


@pytest.mark.parametrize("step", ["environment", "payload"])
def test_a_run_stopped_after_each_creating_step_leaves_nothing(
    cloud: Cloud, registered: None, local_dir: Path, step: str
) -> None:
    run_id = new_run(cloud, executor="batch", command="echo value=1", metric="value=(\\d+)")
    results = results_of(cloud)

    def stop(name: str) -> None:
        if name == step:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        bench.execute(cloud, run_id, results, on_boundary=stop)
    batch_left(cloud, run_id, local_dir)


@pytest.mark.parametrize("sweeper", ["fleet kill", "amibake gc"])
def test_a_sigkill_mid_job_then_fleet_kill_or_gc_removes_everything(
    cloud: Cloud, registered: None, local_dir: Path, monkeypatch: pytest.MonkeyPatch, sweeper: str
) -> None:
    """SIGKILL: no cleanup by the controller. `fleet kill` finds it all by tag, journal and the
    run's prefix; `amibake gc` by tag and journal, and the run's files in the job bucket as its
    compute environment's (gc found none before: untagged objects, listed only as the
    bucket's). Either stops the run's jobs before it removes their files."""
    run_id = new_run(
        cloud, executor="batch", command="sleep 60; echo value=1", metric="value=(\\d+)"
    )
    results = results_of(cloud)
    process = fleet_process("bench", "--resume", run_id)
    client = cloud.client("batch")
    jobs: list[str] = []
    statuses: list[str] = []
    delete_prefix = batch.delete_prefix

    def at_deletion(cloud: Cloud, bucket: str, prefix: str) -> int:
        statuses.extend(j["status"] for j in client.describe_jobs(jobs=jobs)["jobs"])
        return delete_prefix(cloud, bucket, prefix)

    monkeypatch.setattr(batch, "delete_prefix", at_deletion)
    try:
        wait_for(lambda: running_jobs(cloud, run_id), timeout_s=120)
        queue = run_queue(cloud, run_id)
        assert queue is not None
        jobs += [j["jobId"] for j in queue_jobs(client, queue, ("RUNNING",))]
        assert bucket_files(cloud, run_id), "the run wrote no file: nothing to find"
        process.kill()
        process.wait(30)
        if sweeper == "fleet kill":
            assert main(["kill", run_id]) == 0
        else:
            assert main_amibake(["gc"]) == 0
    finally:
        process.kill()
    # Its jobs had stopped before their files were removed: one still stopping wrote on.
    assert statuses and set(statuses) <= {"SUCCEEDED", "FAILED"}, statuses
    if sweeper == "fleet kill":
        assert control.status(results, run_id)["state"] == "killed"
    batch_left(cloud, run_id, local_dir)


def test_ctrl_c_mid_job_removes_the_runs_files_once_its_jobs_have_stopped(
    cloud: Cloud, registered: None, local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as a job runs: its files are removed only once its jobs have stopped. A terminated
    job runs on until its container stops (SIGTERM, SIGKILL 30 s later), and one that wrote its
    replicate's file after the prefix was emptied left it in the bucket."""
    run_id = new_run(
        cloud, executor="batch", command="sleep 60; echo value=1", metric="value=(\\d+)"
    )
    results = results_of(cloud)
    client = cloud.client("batch")
    queue: list[str] = []
    statuses: list[str] = []
    when: list[float] = []  # interrupted, the files removed
    update, delete_prefix = bench.Board.update, batch.delete_prefix

    def interrupt_once_running(board: Any, state: Any, what: str) -> None:
        update(board, state, what)
        if what.startswith("jobs ") and "running" in what and not queue:
            queue.append(state.queue)
            # Into its replicate: a job told to stop as it starts may not handle SIGTERM yet
            # (then it is SIGKILLed 30 s on, as on AWS), and the timing below is not the test.
            time.sleep(2)
            when.append(time.monotonic())
            raise KeyboardInterrupt

    def at_deletion(cloud: Cloud, bucket: str, prefix: str) -> int:
        if not queue:  # the take-over's sweep, before anything ran
            return delete_prefix(cloud, bucket, prefix)
        every = (*batch.ACTIVE_JOBS, "SUCCEEDED", "FAILED")
        statuses.extend(j["status"] for j in queue_jobs(client, queue[0], every))
        when.append(time.monotonic())
        return delete_prefix(cloud, bucket, prefix)

    monkeypatch.setattr(bench.Board, "update", interrupt_once_running)
    monkeypatch.setattr(batch, "delete_prefix", at_deletion)
    with pytest.raises(Interrupted):
        bench.execute(cloud, run_id, results)
    assert queue and statuses, "the run was never interrupted mid-job"
    assert set(statuses) <= {"SUCCEEDED", "FAILED"}, statuses  # none still running
    # The agent stops at SIGTERM: the cleanup did not wait out the stop timeout's SIGKILL.
    assert when[1] - when[0] < local_jobs.STOP_TIMEOUT_S, when
    batch_left(cloud, run_id, local_dir)


def test_gc_stops_a_queues_jobs_before_it_deletes_the_queue(
    cloud: Cloud, registered: None, local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's queue left with a job running (its controller SIGKILLed): gc terminates its jobs
    and waits for them to stop. Deleting the queue let the job run on, and fleet kill removed
    the run's files while it could still write them. Two runs' queues: both queues' jobs are
    terminated before one wait (a queue at a time waited out each one's stop in turn)."""
    client = cloud.client("batch")
    # An environment of its own, like the registered one: a host started on that stayed up for
    # the module's later tests, which found it left over.
    like = batch.environments(client, next(iter(batch.status(cloud)["compute_environments"])))[0]
    run_id = runner.new_run_id()
    name = f"fleet-gc-{run_id.removeprefix('ab-')}"
    keys = ("type", "minvCpus", "maxvCpus", "instanceTypes", "subnets", "securityGroupIds")
    keys += ("instanceRole", "ec2Configuration", "allocationStrategy")
    environment = client.create_compute_environment(
        computeEnvironmentName=name,
        type="MANAGED",
        state="ENABLED",
        computeResources={
            k: like["computeResources"][k] for k in keys if k in like["computeResources"]
        },
        serviceRole=like["serviceRole"],
    )["computeEnvironmentArn"]
    batch.wait_valid(client, "compute environment", name)
    queue = left_queue(cloud, environment, run_id)
    other_run = runner.new_run_id()
    other = left_queue(cloud, environment, other_run)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    # An array, as a run submits: its parent cancels only the children still queued.
    sleeps = {"command": ["/bin/sh", "-c", "trap 'exit 143' TERM; sleep 300 & wait"]}
    array = client.submit_job(
        jobName="left",
        jobQueue=queue,
        jobDefinition="amibake-trivial-x86_64",
        arrayProperties={"size": 2},
        containerOverrides=sleeps,
    )["jobId"]
    single = client.submit_job(
        jobName="left",
        jobQueue=other,
        jobDefinition="amibake-trivial-x86_64",
        containerOverrides=sleeps,
    )["jobId"]
    jobs = [array, f"{array}:0", f"{array}:1", single]
    wait_for(lambda: client.describe_jobs(jobs=jobs[1:2])["jobs"][0]["status"] == "RUNNING", 120)
    found = gc.find(cloud, journal, run_id=run_id) + gc.find(cloud, journal, run_id=other_run)
    assert [x.kind for x in found] == ["job-queue", "job-queue"]
    waits: list[list[str]] = []
    wait_stopped = batch.wait_stopped

    def spy(client: object, ids: list[str], what: str) -> list[str]:
        waits.append(sorted(ids))
        return wait_stopped(client, ids, what)

    monkeypatch.setattr(batch, "wait_stopped", spy)
    try:
        assert gc.delete(cloud, journal, found) == (found, [])
        statuses = [j["status"] for j in client.describe_jobs(jobs=jobs)["jobs"]]
        assert statuses == ["FAILED"] * 4, statuses
        assert waits == [sorted(jobs)], waits
    finally:
        batch.delete_environment(client, environment)
    assert wait_until_clean(local_dir) == []


def test_gc_deregisters_the_job_definition_a_killed_image_run_left(
    cloud: Cloud, registered: None
) -> None:
    """An image run registers a job definition of its own (fleet.batch.ImageDefinition) and
    deregisters it at its end; one a SIGKILLed run left is a leftover gc deletes, found by its
    tag and dated by the journal. Before, ls listed it as kept for ever and gc never saw it."""
    client = cloud.client("batch")
    like = client.describe_job_definitions(
        jobDefinitionName="amibake-trivial-x86_64", status="ACTIVE"
    )["jobDefinitions"][0]
    run_id = runner.new_run_id()
    name = f"amibake-image-x86_64-{run_id.removeprefix('ab-')}-0"
    made = client.register_job_definition(
        jobDefinitionName=name,
        type="container",
        containerProperties=like["containerProperties"],
        tags={RUN_ID: run_id},
    )
    revision = f"{name}:{made['revision']}"
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    journal.created(run_id, "job-definition", revision, cloud.config.region, "local")
    found = gc.find(cloud, journal, run_id=run_id)
    assert [(x.kind, x.resource_id) for x in found] == [("job-definition", revision)]
    assert found[0].created is not None  # from the journal: Batch says no time
    assert gc.delete(cloud, journal, found) == (found, [])
    statuses = client.describe_job_definitions(jobDefinitions=[revision])["jobDefinitions"]
    assert [d["status"] for d in statuses] == ["INACTIVE"], statuses
    assert gc.find(cloud, journal, run_id=run_id) == []


def test_fleet_kill_sweeps_a_batch_tune_runs_files_from_the_job_bucket(
    cloud: Cloud, registered: None
) -> None:
    """A tune's trials are measured as jobs of its own run, their files under fleet/TUNE/ in the
    job bucket: fleet kill of a dead tune controller removes them, as of a bench run. Before,
    only a bench run's were swept, and a tune's stayed until the bucket's 7-day expiry."""
    results = results_of(cloud)
    run_id = runner.new_run_id()
    results.create_run(run_id, "tune", {"executor": "batch", "trials": 3}, "local", "us-east-1")
    bucket = batch.job_bucket(cloud)
    key = f"fleet/{run_id}/fleet-x/payload.tar"
    cloud.client("s3").put_object(Bucket=bucket, Key=key, Body=b"payload")
    assert bucket_files(cloud, run_id) == [key]
    deleted, failures = control.sweep(cloud, results, run_id)
    assert failures == [] and deleted == [f"1 files under s3://{bucket}/fleet/{run_id}/"], deleted
    assert bucket_files(cloud, run_id) == []


def test_batch_without_registration_is_refused_before_creating_anything(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    # No `amibake batch up` in this module's cloud state outside the fixture: use another arch.
    run_id = new_run(
        cloud, executor="batch", types=["c7g.large"], command="echo value=1", metric="value=(\\d+)"
    )
    assert main(["bench", "--resume", run_id]) == 2
    err = capsys.readouterr().err
    assert "no Batch queue amibake-arm64" in err and "amibake batch up" in err
    assert results_of(cloud).replicates(run_id).empty


def test_a_cap_is_refused_for_a_batch_run_resumed_or_tuned(
    cloud: Cloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Batch starts and stops its hosts, and fleet sees a job's host only once the job has run:
    a cap on it would count a trial's spend short. A new bench's max_cost was refused; a resumed
    one's --max-cost was printed as the cap and then ignored, and a tune took max_usd."""
    run_id = new_run(
        cloud, executor="batch", types=["c7g.large"], command="echo value=1", metric="value=(\\d+)"
    )
    assert main(["bench", "--resume", run_id, "--max-cost", "0.01"]) == 2
    err = capsys.readouterr().err
    assert f"--max-cost: run {run_id} runs on batch" in err and err.count("\n") == 1, err
    assert results_of(cloud).replicates(run_id).empty
    tune_file = tmp_path / "tune.toml"
    tune_file.write_text(
        'recipe = "kernels"\ntypes = ["c7g.large"]\nexecutor = "batch"\nmax_usd = 5\n'
        '[params.a]\nkind = "int"\nlow = 1\nhigh = 3\n'
    )
    assert main(["tune", str(tune_file)]) == 2
    err = capsys.readouterr().err
    assert ":4: max_usd: caps tunes on the ssh executor only" in err, err


def test_a_tune_search_measures_its_trials_as_batch_jobs(
    cloud: Cloud, registered: None, tmp_path: Path, local_dir: Path
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        'recipe = "kernels"\ntypes = ["c5a.large"]\nexecutor = "batch"\nalgorithm = "grid"\n'
        "trials = 2\nreplicates = 1\n"
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    spec = tune.load(path)
    results = results_of(cloud)
    run_id = tune.start(results, spec, "local", cloud.config.region)
    outcome = tune.search(spec, evaluators.evaluator(spec, config.load()), results, run_id)
    trials = results.trials(run_id)
    final = trials[trials.state != "asked"]
    assert len(final) == 2 and set(final.state) == {"ok"}, final.reason.tolist()
    assert outcome.best is not None
    rows = results.replicates(run_id)
    assert sorted(rows.trial) == [0, 1] and set(rows.state) == {"ok"}
    # Each trial ran on its own Batch environment's host, now gone with it.
    assert all(i.startswith("i-") for i in rows.instance_id)
    names = [e["computeEnvironmentName"] for e in batch.environments(cloud.client("batch"))]
    assert not [n for n in names if n.startswith(f"fleet-{run_id}")], names
    assert wait_until_clean(local_dir) == []  # each trial's host went with its environment
