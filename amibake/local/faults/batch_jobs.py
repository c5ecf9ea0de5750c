"""Batch jobs held RUNNABLE with a reason: for a while (the job then starts), or for ever (until
it is terminated, or its queue's jobStateTimeLimitActions cancel it).

Sources: the AWS Batch user guide, "Jobs stuck in a RUNNABLE status" (a job at the head of the
queue that cannot be placed stays RUNNABLE, its reason in the statusReason of ListJobs and
DescribeJobs: "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Service cannot fulfill the capacity
requested for instance type [...]", "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource
requirement (vCPU/memory/GPU) is higher than that can be met by the CE(s) attached to the job
queue."), and "Automatic remediation with jobStateTimeLimitActions" (after maxTimeSeconds in
RUNNABLE with a matching reason the job is cancelled: "Canceled by JobStateTimeLimit action due to
reason: ..."). The job's own timeout counts from startedAt: a job that never starts never times
out (the Batch API reference, JobTimeout).

Locally the hold is in what Batch answers (DescribeJobs, ListJobs): the local host may run the
job meanwhile, as the product cannot see. A cancel by the queue's time limit is real (the job is
terminated in moto). moto 5.2 accepts jobStateTimeLimitActions on CreateJobQueue and
UpdateJobQueue and drops them (DescribeJobQueues does not show them, nothing acts on them): this
layer keeps them from the requests and acts on them, at AWS's seconds times TIME_LIMIT_SCALE.
A held job is shown RUNNABLE to ListJobs filtered on its real status no more, but is not added to
a RUNNABLE listing it was not in.
"""

from __future__ import annotations

import logging
from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request

log = logging.getLogger("amibake.local")
HELD = 0.4  # share of jobs held RUNNABLE for a while
HELD_S = (0.5, 4.0)  # how long (AWS: while an environment scales, minutes)
FOREVER = 0.1  # share of held jobs that never start (no capacity that comes back)
TIME_LIMIT_SCALE = 0.01  # AWS's maxTimeSeconds (600 at least) shrunk: 600 s is 6 s here
CAPACITY = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
REQUIREMENT = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
CANCELED = "Canceled by JobStateTimeLimit action due to reason: {}"


def _name(resource: str) -> str:
    return resource.rsplit("/", 1)[-1]


def hold(faults: Faults, n: int, index: int) -> tuple[bool, bool, float]:
    """(held, for ever, seconds) for the n-th job submitted (an array's child by its index)."""
    held = faults.chance(HELD, "job", n, index, "held")
    forever = held and faults.chance(FOREVER, "job", n, index, "forever")
    return held, forever, faults.between(*HELD_S, "job", n, index, "hold")


def _reason(faults: Faults, n: int, index: int, instance_type: str) -> str:
    if instance_type and faults.chance(0.7, "job", n, index, "why"):
        return (
            f"{CAPACITY} - Service cannot fulfill the capacity requested for instance type "
            f"[{instance_type}]"
        )
    return (
        f"{REQUIREMENT} - The job resource requirement (vCPU/memory/GPU) is higher than that "
        "can be met by the CE(s) attached to the job queue."
    )


def _remember_queue(faults: Faults, request: Request) -> None:
    name = _name(str(request.params.get("jobQueueName") or request.params.get("jobQueue") or ""))
    if "jobStateTimeLimitActions" in request.params:
        faults.remember("batch-jobs:limits")[name] = list(
            request.params.get("jobStateTimeLimitActions") or []
        )
    order = request.params.get("computeEnvironmentOrder")
    if order:
        faults.remember("batch-jobs:queue-environments")[name] = [
            _name(str(o.get("computeEnvironment", ""))) for o in order
        ]


def _instance_type(faults: Faults, queue: str) -> str:
    environments = faults.remember("batch-jobs:queue-environments").get(queue, [])
    types = faults.remember("batch-jobs:types")
    return next((types[e] for e in environments if types.get(e)), "")


def _held(faults: Faults, job_id: str) -> dict[str, Any] | None:
    """The hold on a job, while it lasts; None when there is none (or no longer)."""
    parent, _, index = job_id.partition(":")
    submitted = faults.remember("batch-jobs:submitted").get(parent)
    if submitted is None or (not index and submitted["size"] > 1):  # an array's parent
        return None
    if faults.remember("batch-jobs:released").get(job_id) or faults.remember(
        "batch-jobs:released"
    ).get(parent):
        return None
    i = int(index) if index.isdigit() else 0
    held, forever, seconds = hold(faults, submitted["n"], i)
    if not held or (not forever and faults.now() > submitted["at"] + seconds):
        return None
    why = _reason(faults, submitted["n"], i, _instance_type(faults, submitted["queue"]))
    return {"reason": why, "forever": forever, "at": submitted["at"], "queue": submitted["queue"]}


def _time_limit(faults: Faults, request: Request, job_id: str, held: dict[str, Any]) -> str:
    """The queue's cancel reason when its time limit for this job's reason has passed."""
    code = held["reason"].split(" - ", 1)[0]
    for action in faults.remember("batch-jobs:limits").get(held["queue"], []):
        if action.get("reason") != code or action.get("state", "RUNNABLE") != "RUNNABLE":
            continue
        limit = float(action.get("maxTimeSeconds", 0)) * TIME_LIMIT_SCALE
        if faults.now() > held["at"] + limit:
            reason = CANCELED.format(code)
            _cancel(request, job_id, reason)
            faults.remember("batch-jobs:cancelled")[job_id] = reason
            faults.count(BEHAVIOUR.name, "job cancelled by the queue's time limit")
            return reason
    return ""


def _cancel(request: Request, job_id: str, reason: str) -> None:
    """The job really stops (the local host may be running it)."""
    from moto.batch_simple.models import batch_simple_backends

    from amibake.local.moto_gaps import BACKENDS

    try:
        with BACKENDS:
            batch_simple_backends[request.account][request.region].terminate_job(job_id, reason)
    except Exception as exc:  # the job may be gone already: the answer is what matters
        log.warning("batch-jobs: terminating %s: %s", job_id, exc)


def _note(faults: Faults, job_id: str, what: str) -> None:
    """Count each job once per thing done to it."""
    seen = faults.remember("batch-jobs:noted")
    if f"{job_id}\0{what}" not in seen:
        seen[f"{job_id}\0{what}"] = True
        faults.count(BEHAVIOUR.name, what)


def _never_started(job: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    """The job as Batch shows one that has not started (whatever the local host did with it)."""
    shown = {
        k: v for k, v in job.items() if k not in ("startedAt", "stoppedAt", "attempts", "container")
    }
    if "container" in job:
        shown["container"] = {
            k: v
            for k, v in (job.get("container") or {}).items()
            if k not in ("exitCode", "logStreamName", "containerInstanceArn", "taskArn", "reason")
        }
    shown.update(status=status, statusReason=reason)
    return shown


def _shown(faults: Faults, request: Request, job: dict[str, Any]) -> dict[str, Any] | None:
    """The job as AWS would show it now, or None to leave it as moto has it."""
    job_id = str(job.get("jobId", ""))
    cancelled = faults.remember("batch-jobs:cancelled").get(job_id)
    if cancelled:  # cancelled while RUNNABLE: it never ran
        return _never_started(job, "FAILED", cancelled)
    held = _held(faults, job_id)
    if held is None:
        if job_id in faults.remember("batch-jobs:was-held"):
            _note(faults, job_id, "job released")
        return None
    reason = _time_limit(faults, request, job_id, held)
    if reason:
        return _never_started(job, "FAILED", reason)
    faults.remember("batch-jobs:was-held")[job_id] = True
    _note(faults, job_id, "job held runnable")
    if held["forever"]:
        _note(faults, job_id, "job held for ever")
    return _never_started(job, "RUNNABLE", held["reason"])


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "batch" or not reply.ok:
        return reply
    if request.action == "SubmitJob":
        job_id = str(reply.json().get("jobId", ""))
        size = int((request.params.get("arrayProperties") or {}).get("size") or 1)
        submitted = faults.remember("batch-jobs:submitted")
        with faults.lock:
            n = len(submitted) + 1
            submitted[job_id] = {
                "n": n,
                "at": faults.now(),
                "queue": _name(str(request.params.get("jobQueue", ""))),
                "size": size,
            }
    elif request.action in ("TerminateJob", "CancelJob"):
        job_id = str(request.params.get("jobId", ""))
        faults.remember("batch-jobs:released")[job_id] = True  # shown as it really is
    elif request.action in ("CreateJobQueue", "UpdateJobQueue"):
        _remember_queue(faults, request)
    elif request.action == "CreateComputeEnvironment":
        types = (request.params.get("computeResources") or {}).get("instanceTypes") or []
        name = str(request.params.get("computeEnvironmentName", ""))
        faults.remember("batch-jobs:types")[name] = str(types[0]) if types else ""
    elif request.action == "DescribeJobQueues":
        return _with_limits(faults, reply)
    elif request.action == "DescribeJobs":
        data = reply.json()
        changed = False
        for i, job in enumerate(data.get("jobs", [])):
            shown = _shown(faults, request, job)
            if shown is not None:
                data["jobs"][i], changed = shown, True
        if changed:
            return reply.with_json(data)
    elif request.action == "ListJobs":
        return _listed(faults, request, reply)
    return reply


def _listed(faults: Faults, request: Request, reply: Reply) -> Reply:
    data = reply.json()
    wanted = request.params.get("jobStatus")
    kept, changed = [], False
    for summary in data.get("jobSummaryList", []):
        shown = _shown(faults, request, summary)
        if shown is None:
            kept.append(summary)
            continue
        changed = True
        if wanted in (None, shown["status"]):
            kept.append({k: v for k, v in shown.items() if k != "container"})
    if not changed:
        return reply
    data["jobSummaryList"] = kept
    return reply.with_json(data)


def _with_limits(faults: Faults, reply: Reply) -> Reply:
    """DescribeJobQueues shows a queue's jobStateTimeLimitActions, as AWS does (moto drops
    them)."""
    limits = faults.remember("batch-jobs:limits")
    if not limits:
        return reply
    data = reply.json()
    for queue in data.get("jobQueues", []):
        found = limits.get(queue.get("jobQueueName", ""))
        if found is not None:
            queue["jobStateTimeLimitActions"] = found
    return reply.with_json(data)


BEHAVIOUR = Behaviour(
    name="batch-jobs",
    source="AWS Batch user guide: Jobs stuck in a RUNNABLE status; jobStateTimeLimitActions",
    after=_after,
)
