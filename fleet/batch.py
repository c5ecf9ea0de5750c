"""The batch executor: each instance type's replicates as one AWS Batch array job (one child per
replicate) on the images `amibake batch up` registered.

To measure *that* type, the run gives it a compute environment of its own (a copy of the
architecture's registered one: same baked image, role, subnets and security group, but only this
instance type, at most one instance) and a queue over it; both are tagged with the run and torn
down at its end. Builds, the agent and the job wrapper travel as one payload through the bucket
of `amibake batch up`, which each child reads, and puts its monitor CSV back, with its job
role's own credentials (agent/s3.py). The results come from the job's CloudWatch Logs stream
(the replicate's output and its FLEET-RESULT line) and from S3 (the monitor CSV).

A child that failed with Batch's "Host EC2 (instance ...) terminated." reason, or whose wrapper
saw the spot interruption notice, is recorded as interrupted and its replicate goes into the
next array job: never scored as a failure.

Jobs can wait RUNNABLE for ever on AWS (no capacity for the type, a job larger than the
environment): the job timeout counts from startedAt, so it never fires. The run's queue cancels
jobs held for a reason Batch can act on (jobStateTimeLimitActions), and the run itself gives up
when its jobs have all been waiting, none running, for FLEET_BATCH_RUNNABLE_TIMEOUT_S seconds
(default 1800; an environment variable of the controller), naming the jobs' statusReason.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time
from dataclasses import dataclass, replace
from typing import Any

import botocore.exceptions

from amibake import batch as amibake_batch
from amibake import cpu as cpu_module
from amibake.cloud import Cloud
from amibake.cloud.calls import creating, error_code
from amibake.errors import RemoteError, UserError
from amibake.pipelines import MAX_ATTEMPTS
from amibake.runner import RunContext, Step
from fleet import container
from fleet.executor import (
    AGENT,
    IDLE,
    BenchState,
    Replicate,
    build_verdict,
    failed_row,
    host_setup,
    launched_at,
    monitor_csv,
    record_host,
    result_row,
    with_monitor,
)
from fleet.results import ReplicateRow

log = logging.getLogger("amibake")
LOG_GROUP = "/aws/batch/job"
HOST_GONE = "Host EC2"  # how Batch's status reason starts when the instance went away
POLL_S = 1.0
# How long a run's jobs may all wait (SUBMITTED to RUNNABLE) with none running before the run
# gives up: an environment scaling from zero takes minutes; capacity that is not there may
# never come.
RUNNABLE_TIMEOUT_VARIABLE = "FLEET_BATCH_RUNNABLE_TIMEOUT_S"
RUNNABLE_TIMEOUT_S = float(amibake_batch.RUNNABLE_LIMIT_S)
WAITING = ("SUBMITTED", "PENDING", "RUNNABLE")
# GetLogEvents may answer empty pages (a new token each) before events that follow; the end of
# the stream is the token coming back as it was sent. Reading stops there, or at these bounds.
LOG_PAGES = 200
LOG_EMPTY_WAIT_S = 0.5
LOG_DEADLINE_S = 120.0
# Events reach CloudWatch Logs after the job has ended (its agent ships them in batches): a
# stream read to its end without the wrapper's FLEET-RESULT line is read again for this long
# before the replicate is taken to have died without one (the local cloud's logs-pages
# behaviour holds events back 1-4 s; a test run lost two replicates' results that way).
LOG_LATE_S = 30.0
# A job whose host went away (a spot reclaim) printed its result line only if it finished just
# before: its agent went with the host, and what it had not shipped never comes. A short wait
# covers events still being ingested (the local cloud holds them back 1-4 s); the full one held
# every other job's results back 30 s per lost replicate.
LOG_LATE_HOST_GONE_S = 5.0
# The job's own side: fetch the payload, unpack it, hand over to job.py (standard library only).
# What replicate.sh runs that the amazonlinux:2023 container image lacks (it has bash,
# coreutils, curl and python3, and not util-linux's setsid). The local cloud runs jobs on the
# host's filesystem and cannot show this: it is asserted on the request.
CONTAINER_TOOLS = ("util-linux",)
# The job's own side: fetch the payload with the job role's credentials, unpack it, hand over
# to job.py (agent/s3.py, standard library only, run as the container's command).
BOOTSTRAP = (AGENT / "s3.py").read_text()


@dataclass(kw_only=True)
class JobsState(BenchState):
    """One instance type's share of a bench run on Batch."""

    environment: str = ""
    queue: str = ""
    job_definition: str = ""
    bucket: str = ""
    resources: dict[str, Any] | None = None  # the registered environment's computeResources
    service_role: str = ""
    array_job: str = ""
    children: list[str] | None = None
    seen_hosts: set[str] | None = None
    prefix: str = ""  # the run's files in the bucket, fixed by the first step
    round: int = 0  # array jobs submitted: reruns get files of their own


def batch_steps(context: RunContext) -> list[Step[JobsState]]:
    return [Environment(context), ImageDefinition(context), Payload(context), Jobs(context)]


def runnable_timeout_s() -> float:
    """The deadline on jobs that wait with none running (FLEET_BATCH_RUNNABLE_TIMEOUT_S)."""
    text = os.environ.get(RUNNABLE_TIMEOUT_VARIABLE, "")
    if not text:
        return RUNNABLE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 7 * 86400:  # nan fails too
        raise UserError(
            f"{RUNNABLE_TIMEOUT_VARIABLE} must be seconds, more than 0 and at most a week, "
            f"got {text!r}"
        )
    return value


def registered(cloud: Any, state: JobsState) -> None:
    """What `amibake batch up` registered for the type's architecture; a one-line error naming
    the command to run when it is missing. Creates nothing."""
    client = cloud.client("batch")
    architecture = state.family.architecture
    queue = f"amibake-{architecture}"
    found = amibake_batch.queues(client, queue)
    if not found or not found[0]["computeEnvironmentOrder"]:
        raise UserError(
            f"no Batch queue {queue} for {state.label}: register one with "
            '`amibake batch up --from-bake` (after `amibake bake`), or use executor = "ssh"'
        )
    environment = amibake_batch.environment_arn(
        client, found[0]["computeEnvironmentOrder"][0]["computeEnvironment"]
    )
    registered_env = amibake_batch.environments(client, environment)[0]
    state.resources = registered_env["computeResources"]
    state.service_role = registered_env.get("serviceRole", "")
    bucket = amibake_batch.job_bucket(cloud)
    if bucket is None or not amibake_batch.check_owned(cloud, bucket):
        raise UserError(
            f"no job bucket {bucket or ''} for Batch in {cloud.config.region}: run "
            "`amibake batch up --from-bake`"
        )
    state.bucket = bucket
    if state.spec.image:
        return  # the run's own job definition, on the image (ImageDefinition)
    app = state.spec.recipe or ""
    definitions = [
        d
        for d in amibake_batch.pages(
            client, "describe_job_definitions", "jobDefinitions", status="ACTIVE"
        )
        if d["jobDefinitionName"].startswith("amibake-")
        and d["jobDefinitionName"].endswith(f"-{architecture}")
    ]
    # The app's own definition when the image holds it; else any of the architecture's: the
    # payload brings the builds, so the image need not hold the app.
    mine = [d for d in definitions if d["jobDefinitionName"] == f"amibake-{app}-{architecture}"]
    chosen = (mine or definitions)[-1:]
    if not chosen:
        raise UserError(
            f"no Batch job definition amibake-*-{architecture}: run `amibake batch up "
            "--from-bake` (after `amibake bake`)"
        )
    state.job_definition = str(chosen[0]["jobDefinitionArn"])


class Environment:
    """A compute environment with only this instance type, and a queue over it."""

    name = "environment"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: JobsState) -> None:
        assert state.resources is not None, "registered() fills it at preflight"
        state.market = "spot" if state.spot else "on-demand"
        client = self.context.cloud.client("batch")
        # Unique per controller run: a tune search measures trial after trial on the same type,
        # and a name just deleted may still be held by its environment going away.
        name = f"fleet-{state.fleet_run}-{self.context.run_id.removeprefix('ab-')[:6]}-{state.slot}"
        state.prefix = f"fleet/{state.fleet_run}/{name}/"
        vcpus, _ = _size(self.context.cloud, state.label)
        resources: dict[str, Any] = {
            key: state.resources[key]
            for key in ("subnets", "securityGroupIds", "instanceRole", "ec2Configuration")
            if key in state.resources
        }
        spot = state.market == "spot"

        def made(environment: str) -> None:
            if not state.environment:
                state.environment = environment
                self.context.created("compute-environment", environment)

        # An environment that goes INVALID is said why, deleted and made again (a few times).
        environment_arn = amibake_batch.ensure_environment(
            client,
            {
                "computeEnvironmentName": name,
                "type": "MANAGED",
                "state": "ENABLED",
                "computeResources": {
                    **resources,
                    "type": "SPOT" if spot else "EC2",
                    "allocationStrategy": "SPOT_PRICE_CAPACITY_OPTIMIZED"
                    if spot
                    else "BEST_FIT_PROGRESSIVE",
                    "minvCpus": 0,
                    "maxvCpus": vcpus,  # one instance: the replicates run one after another
                    "instanceTypes": [state.label],
                    "tags": self.context.tags,  # on its instances: gc finds them too
                },
                "serviceRole": state.service_role,
                "tags": self.context.tags,
            },
            on_created=made,
        )
        with creating("the job queue"):
            amibake_batch.create_queue(
                client,
                jobQueueName=name,
                state="ENABLED",
                priority=1,
                computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment_arn}],
                # The queue cancels what waits for capacity that does not come (AWS: 600 s at
                # least).
                jobStateTimeLimitActions=amibake_batch.time_limit_actions(runnable_timeout_s()),
                tags=self.context.tags,
            )
            state.queue = name
            self.context.created("job-queue", name)
        amibake_batch.wait_valid(client, "job queue", name)

    def cleanup(self, state: JobsState) -> None:
        client = self.context.cloud.client("batch")
        if state.queue:
            amibake_batch.delete_queue(client, state.queue)
            self.context.deleted("job-queue", state.queue)
            state.queue = ""
        if state.environment:
            # Gone already when it went INVALID too often (ensure_environment deleted it).
            if amibake_batch.environments(client, state.environment):
                amibake_batch.delete_environment(client, state.environment)
            self.context.deleted("compute-environment", state.environment)
            state.environment = ""


def _size(cloud: Any, instance_type: str) -> tuple[int, int]:
    """(vCPUs, MiB of memory) of an instance type."""
    info = cloud.ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"][0]
    return int(info["VCpuInfo"]["DefaultVCpus"]), int(info["MemoryInfo"]["SizeInMiB"])


# A job of the user's image runs in that image alone: no python, no agent beside it. This POSIX
# shell script times the command, reads the metric file and prints the line replicate.sh would
# (start and end on one clock: only their difference is read).
IMAGE_WRAPPER = """mkdir -p /tmp 2>/dev/null
FLEET_METRIC_FILE=/tmp/fleet-metric.$$; export FLEET_METRIC_FILE; rm -f "$FLEET_METRIC_FILE"
now() {  # busybox's date may lack %N: the kernel's uptime has hundredths (a difference is read)
  t=$(date +%s.%N 2>/dev/null)
  case "$t" in *N*|"") read -r t _ </proc/uptime 2>/dev/null || t=$(date +%s);; esac; echo "$t"
}
start=$(now)
# As PID 1 it ignored ECS's SIGTERM, and a terminated job ran on 30 s: passed on, then ended.
trap 'kill -TERM "$p" 2>/dev/null; exit 143' TERM
/bin/sh -c "$FLEET_COMMAND" </dev/null 2>&1 &
p=$!
wait "$p"
code=$?
end=$(now)
metric=$(head -c 200 "$FLEET_METRIC_FILE" 2>/dev/null | tr -s ' \\n\\t' '   ')
echo "FLEET-RESULT exit=$code start=$start end=$end state=finished metric_file=$metric"
"""
# What a Batch job of an image cannot give, said in the run's environment record.
IMAGE_UNMEASURED = (
    "the monitor: a Batch job runs the image alone (no psutil agent beside it), so there are "
    'no CPU or memory samples; use executor = "ssh" for them'
)


def image_job_definition(
    cloud: Cloud, state: JobsState, name: str, tags: dict[str, str]
) -> dict[str, Any]:
    """RegisterJobDefinition's request for the run's image on the type's architecture: the
    image pinned to that architecture's own manifest, the command through its POSIX shell."""
    ref = container.ImageRef.parse(state.spec.image)
    image = container.lookup(cloud, ref)
    architecture = state.family.architecture
    where = container.login(cloud, ref)
    resources = [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}]
    if state.spec.gpus:
        resources.append({"type": "GPU", "value": str(state.spec.gpus)})
    return {
        "jobDefinitionName": name,
        "type": "container",
        "platformCapabilities": ["EC2"],
        "containerProperties": {
            "image": where.pull_name(ref, image.variants[architecture]),
            "command": ["/bin/sh", "-c", IMAGE_WRAPPER],
            "resourceRequirements": resources,
        },
        "tags": tags,
    }


class ImageDefinition:
    """A job definition of the run's image for this type's architecture (image runs only):
    registered for the run, deregistered at its end. Named amibake-* (amibake iam-policy allows
    those), never ending in the architecture, which names `amibake batch up`'s own."""

    name = "image-definition"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: JobsState) -> None:
        if not state.spec.image:
            return
        architecture = state.family.architecture
        name = f"amibake-image-{architecture}-{state.fleet_run}-{state.slot}"
        request = image_job_definition(self.context.cloud, state, name, self.context.tags)
        client = self.context.cloud.client("batch")
        with creating("the job definition"):
            made = client.register_job_definition(**request)
            state.job_definition = str(made["jobDefinitionArn"])
            self.context.created("job-definition", f"{name}:{made['revision']}")
        # The name is this run's alone: another active revision of it is a registration whose
        # answer was lost and that botocore sent again (each makes a revision).
        active = amibake_batch.pages(
            client,
            "describe_job_definitions",
            "jobDefinitions",
            jobDefinitionName=name,
            status="ACTIVE",
        )
        for twin in active:
            if twin["jobDefinitionArn"] != state.job_definition:
                log.warning("%s: registered twice (an answer lost): deregistering one", name)
                client.deregister_job_definition(jobDefinition=twin["jobDefinitionArn"])

    def cleanup(self, state: JobsState) -> None:
        if state.spec.image and state.job_definition:
            self.context.cloud.client("batch").deregister_job_definition(
                jobDefinition=state.job_definition
            )
            # Journaled as name:revision, the end of its ARN.
            self.context.deleted("job-definition", state.job_definition.rsplit("/", 1)[-1])
            state.job_definition = ""


class Payload:
    """The agent and the builds, as one tar in the job bucket under the run's prefix."""

    name = "payload"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: JobsState) -> None:
        if state.spec.image:
            return  # the image is the payload
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name in ("job.py", "s3.py", "replicate.sh", "monitor.py"):
                tar.add(AGENT / name, arcname=name)
            for build in state.artifacts.values():
                tar.add(build.path, arcname=f"builds/{build.name}.tar.xz")
        self.context.cloud.client("s3").put_object(
            Bucket=state.bucket, Key=state.prefix + "payload.tar", Body=buffer.getvalue()
        )

    def cleanup(self, state: JobsState) -> None:
        if state.prefix:
            amibake_batch.delete_prefix(self.context.cloud, state.bucket, state.prefix)


def host_gone(job: dict[str, Any]) -> bool:
    """A job that failed because its instance went away (a spot reclaim, a terminated host):
    its replicate is interrupted, not failed, and its late log lines will not come."""
    return job["status"] == "FAILED" and str(job.get("statusReason", "")).startswith(HOST_GONE)


def log_late_s(job: dict[str, Any]) -> float:
    """How long an ended job's log is read again for a result line not yet in it."""
    return LOG_LATE_HOST_GONE_S if host_gone(job) else LOG_LATE_S


class Jobs:
    """Submit the pending replicates as an array job; record each child as it ends; resubmit
    the interrupted ones."""

    name = "jobs"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: JobsState) -> None:
        try:
            self._rounds(state)
        finally:  # ended or failed midway: nothing runs for it now (the heartbeat stops)
            state.on_event(state, IDLE)

    def _rounds(self, state: JobsState) -> None:
        rounds = 0
        while state.pending:
            rounds += 1
            if rounds > MAX_ATTEMPTS:
                raise RemoteError(
                    f"{state.label}: replicates interrupted {MAX_ATTEMPTS} times in a row"
                )
            self._submit(state)
            interrupted = self._follow(state)
            state.pending = interrupted
            state.round += 1

    def cleanup(self, state: JobsState) -> None:
        """Terminate what still runs (children too: terminating a parent need not reach them),
        and wait for it to have stopped: the payload's cleanup then empties the run's prefix."""
        client = self.context.cloud.client("batch")
        for job_id in [state.array_job, *(state.children or [])]:
            if job_id:
                client.terminate_job(jobId=job_id, reason="fleet: the run stopped")
        ids = (state.children or [state.array_job]) if state.array_job else []
        if amibake_batch.wait_stopped(client, ids, state.label):
            log.warning(
                "%s: what those jobs write under s3://%s/%s stays until the bucket's lifecycle "
                "expires it",
                state.label,
                state.bucket,
                state.prefix,
            )

    def _submit(self, state: JobsState) -> None:
        cloud = self.context.cloud
        vcpus, memory = _size(cloud, state.label)
        plan = [[r.build if state.artifacts else "run", r.tag] for r in state.pending]
        # Where the run's files are, not how to reach them: the job reads and writes them with
        # its job role's own credentials, so no URL or key is in what DescribeJobs shows.
        environment = {
            "FLEET_BUCKET": state.bucket,
            "FLEET_PREFIX": state.prefix,
            "FLEET_OWNER": cloud.account,
            "FLEET_REGION": cloud.config.region,
            "FLEET_ROUND": str(state.round),
            "FLEET_PLAN": json.dumps(plan),
            "FLEET_COMMAND": state.spec.command_line(),
            "FLEET_TIMEOUT": f"{state.spec.timeout_s:.0f}",
            "FLEET_MONITOR": "1" if state.spec.monitor else "0",
            "FLEET_IMDS": cloud.imds_endpoint,
            # The container image is minimal Amazon Linux: what the replicates need goes in
            # first (the job unpacks builds with Python, so it needs no tar or xz).
            "FLEET_SETUP": host_setup(state, CONTAINER_TOOLS),
            "FLEET_EMULATE": json.dumps(emulation(cloud, state)),
        }
        if cloud.endpoint_url:  # the local cloud's one endpoint; AWS's S3 is found by region
            environment["FLEET_S3_ENDPOINT"] = cloud.endpoint_url
        command = ["python3", "-c", BOOTSTRAP]
        # The whole instance: one replicate at a time, nothing beside it. ECS keeps some memory
        # for itself.
        resources = [
            {"type": "VCPU", "value": str(vcpus)},
            {"type": "MEMORY", "value": str(int(memory * 0.85))},
        ]
        if state.spec.image:
            # The user's image runs alone: its own shell times the command (IMAGE_WRAPPER).
            environment = {"FLEET_COMMAND": state.spec.command_line()}
            command = ["/bin/sh", "-c", IMAGE_WRAPPER]
            if state.spec.gpus:
                resources.append({"type": "GPU", "value": str(state.spec.gpus)})
        request: dict[str, Any] = {
            "jobName": state.queue,
            "jobQueue": state.queue,
            "jobDefinition": state.job_definition,
            "containerOverrides": {
                "command": command,
                "environment": [{"name": k, "value": v} for k, v in environment.items()],
                "resourceRequirements": resources,
            },
            "timeout": {"attemptDurationSeconds": int(state.spec.timeout_s + 600)},
            "tags": self.context.tags,
        }
        if len(plan) > 1:  # Batch arrays have at least 2 children
            request["arrayProperties"] = {"size": len(plan)}
        with creating("the jobs"):
            job_id = cloud.client("batch").submit_job(**request)["jobId"]
            state.array_job = job_id
            state.children = [f"{job_id}:{i}" for i in range(len(plan))] if len(plan) > 1 else []
        state.on_event(state, f"submitted {len(plan)} jobs")

    def _follow(self, state: JobsState) -> list[Replicate]:
        """Wait for every child; record each as it ends. Returns the interrupted replicates."""
        client = self.context.cloud.client("batch")
        ids = state.children or [state.array_job]
        by_id = dict(zip(ids, list(state.pending), strict=True))
        open_ids = list(ids)
        interrupted: list[Replicate] = []
        last_line = ""
        deadline = runnable_timeout_s()
        waiting_since = time.monotonic()
        while open_ids:
            self.context.check_cancel()
            described = amibake_batch.describe_jobs(client, open_ids)
            counts: dict[str, int] = {}
            reasons: dict[str, int] = {}
            for job in described:
                counts[job["status"]] = counts.get(job["status"], 0) + 1
                if job["status"] in WAITING and job.get("statusReason"):
                    reasons[job["statusReason"]] = reasons.get(job["statusReason"], 0) + 1
                if job["status"] not in amibake_batch.ENDED_JOBS:
                    continue
                open_ids.remove(job["jobId"])
                replicate = by_id[job["jobId"]]
                row = self._row(state, replicate, job)
                state.record(row)
                if row.state == "interrupted":
                    interrupted.append(replicate)
                    self._retire(row.instance_id, job)
                else:
                    state.done += 1
                    state.on_event(state, "replicate done")
            line = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
            if reasons:
                line += " (" + "; ".join(sorted(reasons)) + ")"
            if line and line != last_line:
                state.on_event(state, f"jobs {line}")
                last_line = line
            # The clock runs while every open job waits; one running or ending restarts it.
            if not open_ids or any(
                j["status"] not in WAITING or j["jobId"] not in open_ids for j in described
            ):
                waiting_since = time.monotonic()
            elif time.monotonic() - waiting_since > deadline:
                raise RemoteError(_stuck(state, len(open_ids), deadline, reasons))
            if open_ids:
                time.sleep(POLL_S)
        state.array_job, state.children = "", []
        return interrupted

    def _row(self, state: JobsState, replicate: Replicate, job: dict[str, Any]) -> ReplicateRow:
        reason = str(job.get("statusReason", ""))
        gone = host_gone(job)
        output = self._output(job, log_late_s(job))
        started = job.get("startedAt", time.time() * 1000) / 1000
        host = next(
            (
                json.loads(line[11:])
                for line in output.splitlines()
                if line.startswith("FLEET-HOST ")
            ),
            None,
        )
        if host is None and state.spec.image:
            host = self._image_host(state, job)
        if host is not None:
            self._host(state, host)
        if gone:
            base = result_row_or_none(state, replicate, output, started)
            return replace(
                base or failed_row(state, replicate, started),
                state="interrupted",
                error=reason,
            )
        row = result_row_or_none(state, replicate, output, started)
        if row is None:
            tail = " | ".join(output.splitlines()[-8:])
            return replace(
                failed_row(state, replicate, started),
                exit_code=(job.get("container") or {}).get("exitCode"),
                error=f"job {job['jobId']} {job['status']}: {reason or 'no reason given'}; "
                f"last lines: {tail or '(no output)'}",
            )
        if row.state == "ok" and state.monitor:
            local = monitor_csv(state, replicate)
            key = f"{state.prefix}{state.round}-{replicate.tag}.csv"
            try:
                self.context.cloud.client("s3").download_file(state.bucket, key, str(local))
                row = with_monitor(row, local)
            except botocore.exceptions.ClientError as exc:
                log.warning("%s: no monitor CSV for %s: %s", state.label, replicate.tag, exc)
        return row

    def _retire(self, instance_id: str | None, job: dict[str, Any]) -> None:
        """A host with a spot notice dies within two minutes: end it now, so Batch places the
        rerun on a new host instead of the doomed one."""
        if instance_id and not str(job.get("statusReason", "")).startswith(HOST_GONE):
            log.info("terminating %s: it has a spot interruption notice", instance_id)
            self.context.cloud.ec2.terminate_instances(InstanceIds=[instance_id])

    def _output(self, job: dict[str, Any], late_s: float) -> str:
        stream = (job.get("container") or {}).get("logStreamName")
        if not stream:
            return ""
        logs = self.context.cloud.client("logs")
        lines: list[str] = []
        token = None
        deadline = time.monotonic() + LOG_DEADLINE_S
        late_until = time.monotonic() + late_s
        # An empty page is not the end: only the token sent coming back is (GetLogEvents:
        # "If you have reached the end of the stream, it returns the same token you passed in").
        for _ in range(LOG_PAGES):
            kwargs: dict[str, Any] = {
                "logGroupName": LOG_GROUP,
                "logStreamName": stream,
                "startFromHead": True,
            }
            if token:
                kwargs["nextToken"] = token
            try:
                page = logs.get_log_events(**kwargs)
            except botocore.exceptions.ClientError as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    return ""
                raise
            lines += [e["message"] for e in page["events"]]
            following = page.get("nextForwardToken")
            if not following or following == token:
                ended = any(line.startswith("FLEET-RESULT ") for line in lines)
                if ended or not following or time.monotonic() > late_until:
                    return "\n".join(lines)
                time.sleep(LOG_EMPTY_WAIT_S)  # the end for now: later events may follow
                continue
            token = following
            if not page["events"]:
                if time.monotonic() > deadline:
                    break
                time.sleep(LOG_EMPTY_WAIT_S)  # events still arriving: AWS allows 25 reads a second
        log.warning("%s: stopped reading log stream %s before its end", job["jobId"], stream)
        return "\n".join(lines)

    def _launched(self, instance_id: str) -> float:
        """The host's launch (now, where EC2 does not describe it: asked once, not waited for;
        a job ran on it, so EC2 has long known it)."""
        try:
            found = self.context.cloud.ec2.describe_instances(InstanceIds=[instance_id])
        except botocore.exceptions.ClientError as exc:
            log.warning("%s: no launch time (%s): its spend counts from now", instance_id, exc)
            return time.time()
        instances = [i for r in found["Reservations"] for i in r["Instances"]]
        return launched_at(instances[0]) if instances else time.time()

    def _image_host(self, state: JobsState, job: dict[str, Any]) -> dict[str, Any] | None:
        """Where a job of the user's image ran, read from outside (its image has no agent to
        say): the container instance Batch names, as EC2 describes it."""
        cloud = self.context.cloud
        arn = str((job.get("container") or {}).get("containerInstanceArn") or "")
        instance_id = arn if arn.startswith("i-") else ""  # the local cloud names the instance
        if arn and not instance_id:
            cluster = amibake_batch.environments(cloud.client("batch"), state.environment)
            found = cloud.client("ecs").describe_container_instances(
                cluster=cluster[0]["ecsClusterArn"] if cluster else "", containerInstances=[arn]
            )["containerInstances"]
            instance_id = found[0]["ec2InstanceId"] if found else ""
        if not instance_id:
            return None
        instance = cloud.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0][
            "Instances"
        ][0]
        zone = instance.get("Placement", {}).get("AvailabilityZone", "")
        zones = cloud.ec2.describe_availability_zones(ZoneNames=[zone])["AvailabilityZones"]
        return {
            "instance_id": instance_id,
            "zone_id": zones[0].get("ZoneId", zone) if zones else zone,
            "lifecycle": instance.get("InstanceLifecycle", "on-demand"),
            "ami": instance.get("ImageId", ""),
        }

    def _host(self, state: JobsState, host: dict[str, Any]) -> None:
        """Where a child ran: the instance, its zone and price; recorded once per instance."""
        state.instance_id = host.get("instance_id", "")
        state.zone = host.get("zone_id", "")
        spot = host.get("lifecycle", "spot" if state.spot else "on-demand") == "spot"
        state.market = "spot" if spot else "on-demand"
        state.price = state.price_of(state.label, spot, state.zone)
        seen = state.seen_hosts if state.seen_hosts is not None else set()
        state.seen_hosts = seen
        if state.instance_id not in seen:
            seen.add(state.instance_id)
            if not state.launched_at:
                # From its launch: the host ran (and was billed) from then, through its boot,
                # its ECS registration and the first job, not from when that job reported.
                state.launched_at = self._launched(state.instance_id)
                state.on_event(state, "staging")
            record_host(
                self.context.cloud, state, host, host.get("ami", ""), image_facts(self, state)
            )


def image_facts(jobs: Jobs, state: JobsState) -> dict[str, Any] | None:
    """The environment record's "image" of a Batch run of an image (None for other runs): on
    a cloud whose instances all run one CPU (the local cloud's), the other architecture's
    variant is emulated."""
    if not state.spec.image:
        return None
    cloud = jobs.context.cloud
    ref = container.ImageRef.parse(state.spec.image)
    image = container.lookup(cloud, ref)
    architecture = state.family.architecture
    machine = cloud.instance_cpu
    return {
        "reference": str(ref),
        "digest": image.digest,
        "pull": container.login(cloud, ref).pull_name(ref, image.variants[architecture]),
        "platform": f"linux/{container.OCI_ARCHITECTURE[architecture]}",
        "shell": True,  # the job runs through it (IMAGE_WRAPPER): no shell, no result
        "emulated": machine is not None and machine.architecture != architecture,
        "not_measured": [IMAGE_UNMEASURED],
    }


def _stuck(state: JobsState, waiting: int, deadline: float, reasons: dict[str, int]) -> str:
    """Why the run gives up on jobs that never start: Batch's own reasons, or what to check."""
    why = "; ".join(f"{r} ({n} jobs)" if n > 1 else r for r, n in sorted(reasons.items()))
    return (
        f"{state.label}: {waiting} Batch jobs waited {deadline:.0f}s with none running: "
        f"{why or 'Batch gave no reason (check the compute environment and its instances)'} "
        f"({RUNNABLE_TIMEOUT_VARIABLE} sets how long to wait)"
    )


def emulation(cloud: Cloud, state: JobsState) -> dict[str, str]:
    """Shell, per build, that puts its programs behind QEMU before its replicates run: for the
    builds the CPU every instance runs on (the local cloud's) runs only emulated. On AWS the
    host is the type's and runs its builds natively, which record_host checks."""
    machine = cloud.instance_cpu
    if machine is None:
        return {}
    wraps = {}
    for build in state.artifacts.values():
        verdict = build_verdict(build, state.family, machine)
        if verdict.how == "emulated":
            programs = list(build.manifest.get("programs", []))
            wraps[build.name] = cpu_module.wrap_programs(programs, verdict.emulator)
    return wraps


def result_row_or_none(
    state: JobsState, replicate: Replicate, output: str, started: float
) -> ReplicateRow | None:
    """The replicate's row, or None when the wrapper never finished (no FLEET-RESULT line)."""
    try:
        return result_row(state, replicate, output, started)
    except RemoteError:
        return None
