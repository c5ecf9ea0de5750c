"""The local cloud's AWS Batch data plane: a job submitted to moto really runs.

moto without Docker marks every job SUCCEEDED at once and runs nothing. Here, as on AWS, a job
waits RUNNABLE until its queue's compute environment has a host. The host is an EC2 instance
launched for the environment (its image override, its first instance type, its subnets and
security groups, its ``computeResources.tags``), and so a real sandbox that boots the image's
units. The job runs on it as ECS runs a container: its own PID namespace, the host's ``/shared``,
the job's command and environment plus Batch's ``AWS_BATCH_*`` variables. Its output goes to
CloudWatch Logs (``/aws/batch/job``, the stream named in the job's attempt), its exit code
decides SUCCEEDED or FAILED, and ``TerminateJob`` stops it as ECS stops a container: SIGTERM to
its PID 1 (which, as PID 1, ignores it unless it handles it), SIGKILL after the stop timeout, and
only then is the job FAILED: until then it runs on, and may still write its files. A host that
dies under a job fails the job with Batch's own reason, ``Host EC2 (instance i-...) terminated.``:
that is how a spot interruption shows on Batch.

A job definition whose ``image`` is in the local cloud's ECR registry runs that image, as Batch
does: the host logs in to the registry (the ECS agent's ECR credentials on AWS) and runs
``docker run`` of the image, for the host type's architecture (emulated by QEMU when this machine's
differs), with the host's network and the job's environment, the job's command as entrypoint and
arguments. The host's ``docker`` is the local cloud's runtime (amibake.local.container_runtime),
whose image store is a tmpfs in the job's own mount namespace: it goes with the job.

What differs from AWS, on purpose: an image from anywhere else (``amazonlinux:2023``, what the
recipe jobs name) is not pulled, the job sees the host's filesystem; each environment has one
host that runs its jobs one at a time (what a benchmark
wants anyway), and the host lives until its environment is deleted instead of scaling in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amibake.errors import LocalCloudError
from amibake.local.engine import LocalCloud
from amibake.local.iam import Check, decide
from amibake.local.moto_gaps import BACKENDS

log = logging.getLogger("amibake.local")
LOG_GROUP = "/aws/batch/job"
HOST_GONE = "Host EC2 (instance {}) terminated."
EXITED = "Essential container in task exited"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_TIMEOUT_S = 120.0
QUEUED = ("SUBMITTED", "PENDING", "RUNNABLE")  # a job's states before its host takes it
# ECS_CONTAINER_STOP_TIMEOUT's default: how long a stopped container has between SIGTERM and
# SIGKILL (ECS agent docs; `docker stop -t`).
STOP_TIMEOUT_S = 30.0


class RoleRefused(Exception):
    """The job role's trust does not let ECS assume it for the task (ECS's reason)."""


# (EC2 backend, instance id, account, region): starts the sandbox of an instance moto created.
LaunchFn = Callable[[Any, str, str, str], None]


class JobRunner:
    """Takes every job moto accepts and runs it on its compute environment's host."""

    def __init__(self, cloud: LocalCloud, launch: LaunchFn, registry: str | None = None) -> None:
        self.cloud = cloud
        self.launch = launch
        self._registry = registry  # the ECR registry's endpoint, http://127.0.0.1:PORT
        self.hosts: dict[str, Host] = {}  # compute environment ARN -> its host
        self._lock = threading.Lock()

    def registry_host(self) -> str | None:
        """host:port of the local cloud's ECR registry (None: no registry, no image runs)."""
        endpoint = self._registry
        return endpoint.split("://", 1)[-1].rstrip("/") if endpoint else None

    def accept(self, backend: Any, job: Any, runs: bool) -> None:
        """Called by moto's submit_job for each job; ``runs`` is False for an array's parent,
        whose status follows its children."""
        backend._jobs[job.job_id] = job
        job.status = "PENDING" if not runs else "RUNNABLE"
        if not runs:
            return
        environment = next((e for e in job.job_queue.environments if e.state == "ENABLED"), None)
        if environment is None:
            return  # as on AWS: RUNNABLE until the queue has an enabled environment
        with self._lock:
            host = self.hosts.get(environment.arn)
            # A new environment may reuse a deleted one's name, and so its ARN.
            if host is None or not host.thread.is_alive() or host.environment is not environment:
                host = self.hosts[environment.arn] = Host(self, backend, environment)
        host.jobs.put(job)


class Host:
    """One compute environment's instance and the jobs it runs, one at a time, in order."""

    def __init__(self, runner: JobRunner, backend: Any, environment: Any) -> None:
        self.runner = runner
        self.backend = backend
        self.environment = environment
        self.instance_id: str | None = None
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(
            target=self._loop, name=f"batch-host-{environment.name}", daemon=True
        )
        self.thread.start()

    # --- the environment's life ---------------------------------------------------------

    def _environment_alive(self) -> bool:
        return self.backend._compute_environments.get(self.environment.arn) is self.environment

    def _loop(self) -> None:
        while self._environment_alive():
            try:
                job = self.jobs.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self._run(job)
            except Exception as exc:  # a job must end, whatever broke
                log.exception("batch job %s", job.job_id)
                self._stop(job, False, f"local cloud: {exc}")

    def _sandbox_alive(self) -> bool:
        return self.instance_id is not None and self.instance_id in self.runner.cloud.sandboxes

    def _ensure_instance(self) -> str:
        if self._sandbox_alive():
            assert self.instance_id is not None
            return self.instance_id
        from moto.ec2.models import ec2_backends

        resources = self.environment.compute_resources
        image = next(
            (c.get("imageIdOverride") for c in resources.get("ec2Configuration", [])), None
        )
        if not image:
            raise LocalCloudError(
                f"compute environment {self.environment.name} has no ec2Configuration "
                "imageIdOverride: the local cloud has no ECS-optimized image to pick"
            )
        account, region = self.backend.account_id, self.backend.region_name
        ec2 = ec2_backends[account][region]
        tags = {
            **(resources.get("tags") or {}),
            "aws:batch:compute-environment": self.environment.name,
        }
        with BACKENDS:  # this thread's launch must not race a request's in the same subnet
            reservation = ec2.run_instances(
                image_id=image,
                count=1,
                user_data=None,
                security_group_names=[],
                instance_type=resources["instanceTypes"][0],
                region_name=region,
                subnet_id=resources["subnets"][0],
                key_name=None,
                security_group_ids=resources.get("securityGroupIds", []),
                is_instance_type_default=False,
                tags={"instance": tags},
                lifecycle="spot" if resources.get("type") == "SPOT" else None,
            )
            instance = reservation.instances[0]
            self.environment.add_instance(instance)  # DeleteComputeEnvironment terminates it
        self.runner.launch(ec2, instance.id, account, region)
        sandbox = self.runner.cloud.sandboxes.get(instance.id)
        if sandbox is None:
            raise LocalCloudError(f"host {instance.id} of {self.environment.name} did not start")
        # The ECS agent registers once the instance has booted: wait for the boot units.
        finished = sandbox.upper / "var/lib/cloud/instance/boot-finished"
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while not finished.exists():
            if time.monotonic() > deadline or instance.id not in self.runner.cloud.sandboxes:
                raise LocalCloudError(f"host {instance.id} did not finish booting")
            time.sleep(0.1)
        self.instance_id = instance.id
        log.info("batch host %s up for %s", instance.id, self.environment.name)
        return instance.id

    # --- one job ------------------------------------------------------------------------

    def _run(self, job: Any) -> None:
        if job.stop:
            self._stop(job, False, job.job_stopped_reason or "terminated before it started")
            return
        instance_id = self._ensure_instance()
        sandbox = self.runner.cloud.sandboxes[instance_id]
        with BACKENDS:  # TerminateJob (under the same lock) sees it queued, or starting
            if job.stop or job.job_stopped:
                # Terminated while its host booted: failed then as a queued job; never run.
                self._stop(job, False, job.job_stopped_reason or "terminated before it started")
                return
            job.status = "STARTING"
        try:
            credentials = self._task_role(job, instance_id)
        except RoleRefused as refused:  # the task never starts: no attempt, no log stream
            self._stop(job, False, str(refused))
            return
        job.log_stream_name = f"{job.job_definition.name}/default/{uuid.uuid4().hex}"
        job.job_started_at = _now()
        job._start_attempt()
        job.latest_attempt["container"]["containerInstanceArn"] = instance_id
        environment = {**self._environment(job), **credentials}
        command = self._command(job)
        image = self._local_image(job)
        if image is not None:
            self._login(sandbox, image)
            command = self._docker_run(image, command, environment)
        process = sandbox.container(command, environment)
        job.status = "RUNNING"
        lines: list[dict[str, Any]] = []
        reader = threading.Thread(target=_read, args=(process, lines), daemon=True)
        reader.start()
        # As the awslogs driver: the stream is there once the container starts, and what it
        # prints reaches it as it runs (GetLogEvents on a running job reads it so far).
        self._stream(job)
        sent = 0
        while process.poll() is None:
            if instance_id not in self.runner.cloud.sandboxes:
                _kill(process)
                break
            if job.stop:
                _stop_container(process)
                break
            sent = self._logs(job, lines, sent)
            time.sleep(0.2)
        code = process.wait()
        reader.join(timeout=5)
        self._logs(job, lines, sent)
        if instance_id not in self.runner.cloud.sandboxes:
            self.instance_id = None
            self._stop(job, False, HOST_GONE.format(instance_id))
        elif job.stop:
            self._stop(job, False, job.job_stopped_reason or "terminated")
        else:
            job.exit_code = code
            self._stop(job, code == 0, None if code == 0 else EXITED)

    @staticmethod
    def _command(job: Any) -> list[str]:
        command = job._add_parameters_to_command(job._get_container_property("command", []))
        if not command:
            raise LocalCloudError(
                "the job has no command (the local cloud reads no entrypoint from an image "
                "outside its registry)"
            )
        return [str(part) for part in command]

    def _local_image(self, job: Any) -> str | None:
        """The job definition's image when the local registry serves it, else None."""
        image = str((job.job_definition.container_properties or {}).get("image") or "")
        host = self.runner.registry_host()
        return image if host and image.startswith(host + "/") else None

    def _platform(self) -> str:
        """The host type's architecture, as docker names it: Batch runs the image on the host,
        whose CPU is the type's (this machine's, through QEMU, for the other architecture)."""
        from moto.ec2.models.instance_types import INSTANCE_TYPES

        instance_type = self.environment.compute_resources["instanceTypes"][0]
        info = INSTANCE_TYPES.get(instance_type, {}).get("ProcessorInfo", {})
        architecture = (info.get("SupportedArchitectures") or ["x86_64"])[0]
        return "linux/arm64" if architecture == "arm64" else "linux/amd64"

    def _login(self, sandbox: Any, image: str) -> None:
        """The host logs in to the registry before the pull, as the ECS agent does with the
        instance's ECR credentials (the local registry checks no token: GetAuthorizationToken's
        is enough)."""
        host = image.split("/", 1)[0]
        argv = ["docker", "login", "-u", "AWS", "-p", "local-cloud", f"http://{host}"]
        process = sandbox.container(argv, {"PATH": PATH, "HOME": "/root"})
        output = process.communicate(timeout=60)[0]
        if process.returncode != 0:
            raise LocalCloudError(
                f"docker login {host} on the host failed: {output.decode(errors='replace')}"
            )

    def _docker_run(self, image: str, command: list[str], environment: dict[str, str]) -> list[str]:
        """``docker run`` of the image with the job's command and environment. Each variable is
        passed by name (``-e NAME``, its value from docker's own environment) so that no value,
        the task role's credentials endpoint among them, is on a command line."""
        argv = ["docker", "run", "--rm", "--network", "host", "--platform", self._platform()]
        for name in environment:
            argv += ["-e", name]
        return [*argv, "--entrypoint", command[0], image, *command[1:]]

    def _environment(self, job: Any) -> dict[str, str]:
        props = job.job_definition.container_properties or {}
        env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        overrides = job.container_overrides.get("environment", [])
        for source in (props.get("environment", []), overrides):
            env.update({e["name"]: str(e["value"]) for e in source})
        env.update(
            AWS_BATCH_JOB_ID=job.job_id,
            AWS_BATCH_JQ_NAME=job.job_queue.name,
            AWS_BATCH_CE_NAME=self.environment.name,
            AWS_BATCH_JOB_ATTEMPT=str(len(job.attempts)),
        )
        if "index" in job.array_properties:
            env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(job.array_properties["index"])
        return env

    def _task_role(self, job: Any, instance_id: str) -> dict[str, str]:
        """The job role's credentials, as ECS gives a container its task role: STS credentials
        for the job definition's jobRoleArn on an endpoint of the host, named in the
        container's environment only (never in the job's record, which DescribeJobs shows)."""
        role = (job.job_definition.container_properties or {}).get("jobRoleArn")
        metadata = self.runner.cloud.metadata.get(instance_id)
        if not role or metadata is None:
            return {}
        from moto.sts.models import sts_backends

        self._check_trust(job, role)
        with BACKENDS:
            assumed = sts_backends[self.backend.account_id]["global"].assume_role(
                region_name=self.backend.region_name,
                role_session_name=f"batch-job-{job.job_id[:40]}".replace(":", "-"),
                role_arn=role,
                policy="",
                duration=3600,
                external_id="",
            )
        path = f"/v2/credentials/{uuid.uuid4()}"
        metadata.task_credentials[path] = {
            "RoleArn": role,
            "AccessKeyId": assumed.access_key_id,
            "SecretAccessKey": assumed.secret_access_key,
            "Token": assumed.session_token,
            "Expiration": assumed.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        port = self.runner.cloud.settings.imds_port
        return {"AWS_CONTAINER_CREDENTIALS_FULL_URI": f"http://{metadata.address}:{port}{path}"}

    def _check_trust(self, job: Any, role_arn: str) -> None:
        """ECS assumes a task's role as the service ecs-tasks.amazonaws.com, on behalf of the
        task: the role's trust policy is judged with the task's account and ARN as
        aws:SourceAccount and aws:SourceArn (the ECS developer guide, "Task IAM role", which
        recommends conditions on them against the confused deputy). A role whose trust does not
        let that request in is not assumed, and the task does not start."""
        from moto.iam.models import iam_backends

        account, region = self.backend.account_id, self.backend.region_name
        with BACKENDS:
            try:
                found = iam_backends[account]["global"].get_role_by_arn(role_arn)
                trust = json.loads(found.assume_role_policy_document)
            except Exception:  # no such role: nothing trusts ECS
                trust = {}
        cluster = self.environment.ecs_name or self.environment.name
        asked = Check(
            "sts:AssumeRole",
            role_arn,
            {
                "aws:PrincipalServiceName": "ecs-tasks.amazonaws.com",
                "aws:SourceAccount": account,
                "aws:SourceArn": f"arn:aws:ecs:{region}:{account}:task/{cluster}/"
                + job.job_id.replace(":", "-")[:32],
            },
        )
        if decide([trust], asked) != "allow":
            raise RoleRefused(
                f"ECS was unable to assume the role '{role_arn}' that was provided for this "
                "task. Please verify that the role being passed has the proper trust "
                "relationship and permissions and that your IAM user has permissions to pass "
                "this role."
            )

    @staticmethod
    def _stream(job: Any) -> None:
        """The job's log group and stream, as its container starts."""
        with BACKENDS:
            job._log_backend.ensure_log_group(LOG_GROUP)
            job._log_backend.ensure_log_stream(LOG_GROUP, job.log_stream_name)

    @staticmethod
    def _logs(job: Any, lines: list[dict[str, Any]], sent: int) -> int:
        """The job's lines from `sent` on put to its stream; how many are sent now. `lines`
        grows in the reader's thread: its length is read once."""
        upto = len(lines)
        if upto > sent:
            with BACKENDS:
                job._log_backend.put_log_events(LOG_GROUP, job.log_stream_name, lines[sent:upto])
        return upto

    def _stop(self, job: Any, success: bool, reason: str | None) -> None:
        stop_job(self.backend, job, success, reason)


def stop_job(backend: Any, job: Any, success: bool, reason: str | None) -> None:
    """The job ends SUCCEEDED or FAILED, and an array's parent once its last child has."""
    with BACKENDS:
        if job.job_stopped:
            return  # terminated while queued, then reached by its host
        if reason:
            job.job_stopped_reason = reason
        job._mark_stopped(success=success)
        parent_id, _, index = job.job_id.rpartition(":")
        parent = backend._jobs.get(parent_id) if index.isdigit() else None
        children = getattr(parent, "_child_jobs", None) or []
        if parent is not None and children and all(c.job_stopped for c in children):
            parent._mark_stopped(success=all(c.status == "SUCCEEDED" for c in children))


def _now() -> Any:
    from datetime import datetime

    return datetime.now()


def _read(process: subprocess.Popen[bytes], lines: list[dict[str, Any]]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        message = raw.decode(errors="replace").rstrip("\n")
        lines.append({"timestamp": int(time.time() * 1000), "message": message})


def _kill(process: subprocess.Popen[bytes]) -> None:
    """The job's process group: nsenter and unshare, whose death takes the job's PID namespace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _stop_container(process: subprocess.Popen[bytes]) -> None:
    """As ECS stops a task's container: SIGTERM to the container's PID 1, SIGKILL to all of it
    once STOP_TIMEOUT_S have passed."""
    init = _container_init(process.pid)
    # nsenter and unshare fork as the container starts: a user namespace's setup can take
    # seconds on a loaded host, and waiting longer costs nothing when PID 1 shows sooner.
    deadline = time.monotonic() + 10.0
    while init is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        init = _container_init(process.pid)
    if init is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill(process)


def _container_init(pid: int) -> int | None:
    """The container's PID 1 (its command) below ``pid``, the nsenter of Sandbox.container: the
    first descendant that is PID 1 of its own namespace (the last NSpid field)."""
    for _ in range(8):  # nsenter, its child (unshare), unshare's child: a few levels at most
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            if next(ln for ln in status.splitlines() if ln.startswith("NSpid:")).split()[-1] == "1":
                return pid
            pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        except (OSError, IndexError, StopIteration, ValueError):
            return None
    return None


def install(runner: JobRunner) -> None:
    """Route moto's Docker-less Batch (which would mark every job SUCCEEDED) to the runner."""
    from moto.batch_simple.models import BatchSimpleBackend
    from moto.moto_api import state_manager

    # Job states are ours to set: never advanced by moto on describe.
    state_manager.set_transition("batch::job", {"progression": "manual", "times": 10**9})

    def mark(self: Any, include_start_attempt: bool, job: Any) -> None:
        runner.accept(self.backend, job, runs=include_start_attempt)

    BatchSimpleBackend._mark_job_as_finished = mark  # type: ignore[method-assign]

    # TerminateJob of a job not started yet (SUBMITTED, PENDING, RUNNABLE) fails it at once, as
    # on AWS; moto only flags it, and here it stayed RUNNABLE until its host reached it; an
    # array's parent cancels its queued children, as on AWS, where moto flagged the parent. (The
    # simple backend hands every call but submit_job to moto's own BatchBackend.)
    from moto.batch.models import BatchBackend, Job

    terminate = BatchBackend.terminate_job
    if not getattr(terminate, "_amibake", False):

        def terminate_job(self: Any, job_id: str, reason: str) -> None:
            terminate(self, job_id, reason)
            job = self._jobs.get(job_id)
            if job is None:
                return
            children = getattr(job, "_child_jobs", None) or []
            if job.status in QUEUED and not children:
                stop_job(self, job, False, reason)
            # An array's parent cancels its children still queued; those STARTING or RUNNING
            # run on until terminated one by one (CancelJob's and TerminateJob's API reference).
            for child in children:
                if child.status in QUEUED:
                    child.terminate(reason)
                    stop_job(self, child, False, reason)

        terminate_job._amibake = True  # type: ignore[attr-defined]
        BatchBackend.terminate_job = terminate_job  # type: ignore[method-assign]

    # ListJobs by queue gives an array's parent, not its children (they are listed by
    # arrayJobId), and each summary says which it is (arrayProperties: size, or index), as on
    # AWS; moto listed the children among the queue's jobs, unmarked.
    listing, summary = BatchBackend.list_jobs, Job.describe_short
    if not getattr(listing, "_amibake", False):

        def list_jobs(
            self: Any, job_queue_name: Any, array_job_id: Any, *args: Any, **kwargs: Any
        ) -> list[Any]:
            jobs = listing(self, job_queue_name, array_job_id, *args, **kwargs)
            if array_job_id:
                return jobs
            return [j for j in jobs if "index" not in (j.array_properties or {})]

        def describe_short(self: Any) -> dict[str, Any]:
            found = summary(self)
            if self._child_jobs:
                found["arrayProperties"] = {"size": len(self._child_jobs)}
            elif "index" in (self.array_properties or {}):
                found["arrayProperties"] = {"index": self.array_properties["index"]}
            return found

        list_jobs._amibake = True  # type: ignore[attr-defined]
        BatchBackend.list_jobs = list_jobs  # type: ignore[method-assign]
        Job.describe_short = describe_short  # type: ignore[method-assign]

    # DescribeJobs on AWS reports the container's exit code; moto's full describe drops it.

    details = Job._container_details
    if getattr(details, "_amibake", False):
        return

    def container_details(self: Any) -> dict[str, Any]:
        found = details(self)
        if self.exit_code is not None:
            found["exitCode"] = self.exit_code
        # AWS names the job's container instance there too (the product reads where a job of
        # an image ran from it); here it is the host's instance id.
        attempt = (getattr(self, "latest_attempt", None) or {}).get("container") or {}
        if attempt.get("containerInstanceArn"):
            found["containerInstanceArn"] = attempt["containerInstanceArn"]
        return found

    container_details._amibake = True  # type: ignore[attr-defined]
    Job._container_details = container_details  # type: ignore[method-assign]
