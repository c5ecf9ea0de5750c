"""``amibake gc``: find and delete what amibake created that is still alive, even after SIGKILL.

Two sources, because either alone can miss something: the ``amibake:run-id`` tag (applied at
creation, so nothing amibake makes is untagged, even if the journal write never happened) and
the journal (which knows what a describe cannot list: DescribeFleets without ids never lists an
instant fleet, so amibake's fleets are found by their journaled ids, their instances by tag).
Everything is confirmed alive by describing before it is reported, and gone by describing after
it is deleted: a NotFound for an instance or fleet just created is EC2 not seeing it yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.exceptions

from amibake import batch
from amibake.cloud import Cloud
from amibake.cloud.calls import error_code, every, ignore_missing, retry_on
from amibake.cloud.ec2 import (
    NEW_INSTANCE_VISIBLE_S,
    SNAPSHOT_RELEASED_S,
    delete_fleet,
    delete_image,
    terminate_instances,
)
from amibake.cloud.tags import EXPIRES, KEPT, RUN_ID, parse_expires
from amibake.errors import CloudError
from amibake.journal import Journal

log = logging.getLogger("amibake")
TAG_TTL = timedelta(hours=6)  # amibake:expires = creation + this (see cloud.tags.run_tags)
# Deletion order: what holds others goes first.
ORDER = [
    "job-queue",
    "compute-environment",
    "fleet",
    "instance",
    "launch-template",
    "image",
    "snapshot",
    "volume",
    "security-group",
    "key-pair",
]


@dataclass(frozen=True)
class Leftover:
    kind: str
    resource_id: str
    run_id: str
    created: datetime | None

    def unseen_for(self) -> float:
        """How much longer EC2 may answer NotFound for it though it exists (eventual
        consistency after its creation); 0 when its age is not known."""
        if self.created is None:
            return 0.0
        age = (datetime.now(UTC) - self.created).total_seconds()
        return max(0.0, NEW_INSTANCE_VISIBLE_S - age)

    def describe(self) -> str:
        age = ""
        if self.created is not None:
            age = f", {(datetime.now(UTC) - self.created).total_seconds() / 3600:.1f}h old"
        return f"{self.kind} {self.resource_id} (run {self.run_id or '?'}{age})"


def _tags(item: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def _created(item_tags: dict[str, str]) -> datetime | None:
    expires = parse_expires(item_tags.get(EXPIRES, ""))
    return None if expires is None else expires - TAG_TTL


def _by_tag(cloud: Cloud) -> dict[tuple[str, str], Leftover]:
    ec2 = cloud.ec2
    tagged = [{"Name": "tag-key", "Values": [RUN_ID]}]
    found: dict[tuple[str, str], Leftover] = {}

    def add(kind: str, resource_id: str, item: dict[str, Any]) -> None:
        item_tags = _tags(item)
        if RUN_ID in item_tags and KEPT not in item_tags:
            found[(kind, resource_id)] = Leftover(
                kind, resource_id, item_tags[RUN_ID], _created(item_tags)
            )

    # Every list read to its last page: AWS answers in pages, and a leftover on the second
    # one would be reported as nothing left (issue 26, finding 7).
    for reservation in every(ec2, "describe_instances", "Reservations", Filters=tagged):
        for instance in reservation["Instances"]:
            if instance["State"]["Name"] not in ("terminated", "shutting-down"):
                add("instance", instance["InstanceId"], instance)  # type: ignore[arg-type]
    # Fleets of type maintain or request only: an instant fleet (amibake's) is never listed
    # without its id, and is found through the journal.
    for fleet in every(ec2, "describe_fleets", "Fleets"):
        if fleet.get("FleetState") not in ("deleted", "deleted_running", "deleted_terminating"):
            add("fleet", fleet["FleetId"], fleet)  # type: ignore[arg-type]
    for template in every(ec2, "describe_launch_templates", "LaunchTemplates", Filters=tagged):
        add("launch-template", template["LaunchTemplateId"], template)  # type: ignore[arg-type]
    for group in every(ec2, "describe_security_groups", "SecurityGroups", Filters=tagged):
        add("security-group", group["GroupId"], group)  # type: ignore[arg-type]
    for pair in ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]:  # one page: no paginator
        add("key-pair", pair["KeyName"], pair)  # type: ignore[arg-type]
    for image in every(ec2, "describe_images", "Images", Owners=["self"], Filters=tagged):
        add("image", image["ImageId"], image)  # type: ignore[arg-type]
    for snapshot in every(
        ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"], Filters=tagged
    ):
        add("snapshot", snapshot["SnapshotId"], snapshot)  # type: ignore[arg-type]
    for volume in every(ec2, "describe_volumes", "Volumes", Filters=tagged):
        add("volume", volume["VolumeId"], volume)  # type: ignore[arg-type]
    # Batch returns tags as a map, and deleted queues and environments for a while.
    client = cloud.client("batch")
    for kind, pages, key, name in (
        ("job-queue", "describe_job_queues", "jobQueues", "jobQueueName"),
        (
            "compute-environment",
            "describe_compute_environments",
            "computeEnvironments",
            "computeEnvironmentName",
        ),
    ):
        for item in every(client, pages, key):
            if item.get("status") not in ("DELETING", "DELETED"):
                tags = [{"Key": k, "Value": v} for k, v in item.get("tags", {}).items()]
                add(kind, item[name], {"Tags": tags})
    return found


def _still_there(cloud: Cloud, kind: str, resource_id: str, unseen_for: float = 0.0) -> bool:
    """Describe one journal entry: is it really alive? (gone is confirmed, never assumed: an
    instance NotFound within `unseen_for` of its creation may be running)"""
    ec2 = cloud.ec2
    try:
        if kind == "instance":
            found = ec2.describe_instances(InstanceIds=[resource_id])["Reservations"]
            states = [i["State"]["Name"] for r in found for i in r["Instances"]]
            if not states:
                return unseen_for > 0
            return any(s not in ("terminated",) for s in states)
        if kind == "fleet":
            fleets = ec2.describe_fleets(FleetIds=[resource_id])["Fleets"]
            return any(not f.get("FleetState", "").startswith("deleted") for f in fleets)
        if kind == "launch-template":
            return bool(
                ec2.describe_launch_templates(LaunchTemplateIds=[resource_id])["LaunchTemplates"]
            )
        if kind == "security-group":
            return bool(ec2.describe_security_groups(GroupIds=[resource_id])["SecurityGroups"])
        if kind == "key-pair":
            return bool(ec2.describe_key_pairs(KeyNames=[resource_id])["KeyPairs"])
        if kind == "image":
            return bool(ec2.describe_images(ImageIds=[resource_id])["Images"])
        if kind == "snapshot":
            return bool(ec2.describe_snapshots(SnapshotIds=[resource_id])["Snapshots"])
        if kind == "volume":
            return bool(ec2.describe_volumes(VolumeIds=[resource_id])["Volumes"])
        if kind == "job-queue":
            queues = cloud.client("batch").describe_job_queues(jobQueues=[resource_id])
            return any(q.get("status") != "DELETED" for q in queues["jobQueues"])
        if kind == "compute-environment":
            envs = cloud.client("batch").describe_compute_environments(
                computeEnvironments=[resource_id]
            )
            return any(e.get("status") != "DELETED" for e in envs["computeEnvironments"])
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if kind == "instance" and code == "InvalidInstanceID.NotFound":
            return unseen_for > 0
        if "NotFound" in code or code.startswith("InvalidKeyPair") or "Malformed" in code:
            return False
        raise
    return False


def find(
    cloud: Cloud,
    journal: Journal,
    *,
    run_id: str | None = None,
    older_than: timedelta | None = None,
) -> list[Leftover]:
    found = _by_tag(cloud)
    for entry in journal.alive(run_id=run_id, cloud=cloud.config.cloud):
        key = (entry.kind, entry.resource_id)
        if key in found:
            continue
        if entry.region != cloud.config.region:
            continue
        created = datetime.fromtimestamp(entry.created, UTC)
        leftover = Leftover(entry.kind, entry.resource_id, entry.run_id, created)
        if _still_there(cloud, entry.kind, entry.resource_id, leftover.unseen_for()):
            found[key] = leftover
        else:
            journal.deleted(entry.kind, entry.resource_id)
    leftovers = [
        item
        for item in found.values()
        if (run_id is None or item.run_id == run_id)
        and (
            older_than is None
            or item.created is None
            or datetime.now(UTC) - item.created >= older_than
        )
    ]
    return sorted(leftovers, key=lambda x: (ORDER.index(x.kind), x.resource_id))


def other_regions(cloud: Cloud, journal: Journal, run_id: str | None = None) -> list[str]:
    """Regions besides the cloud's where the journal holds resources not known to be deleted.
    gc looks in one region (tags and describes are regional): these it has not looked at."""
    return sorted(
        {
            entry.region
            for entry in journal.alive(run_id=run_id, cloud=cloud.config.cloud)
            if entry.region != cloud.config.region
        }
    )


def _forget_private_keys(cloud: Cloud, journal: Journal, run_id: str) -> None:
    """A run kept on error wrote its instances' private keys beside its log (to debug them):
    once its last key pair is gone they open nothing, and are removed with it."""
    if any(r.kind == "key-pair" for r in journal.alive(run_id)):
        return
    for key_file in (cloud.config.results_dir / "logs" / run_id).glob("*.pem"):
        key_file.unlink(missing_ok=True)
        log.info("removed %s: its key pair is deleted", key_file)


def delete(cloud: Cloud, journal: Journal, leftovers: list[Leftover]) -> list[str]:
    """Delete in dependency order; return one line per failure (with the command to finish)."""
    ec2 = cloud.ec2
    failures = []
    batch_client = cloud.client("batch")
    actions: dict[str, Callable[[str], object]] = {
        "job-queue": lambda i: batch.delete_queue(batch_client, i),
        "compute-environment": lambda i: batch.delete_environment(batch_client, i),
        "fleet": lambda i: delete_fleet(ec2, i, unseen_for_s=unseen[i]),
        "launch-template": lambda i: ec2.delete_launch_template(LaunchTemplateId=i),
        # With its snapshots (DeleteAssociatedSnapshots): a snapshot deleted right after its
        # image may still be in use (InvalidSnapshot.InUse), and was left, billed.
        "image": lambda i: delete_image(ec2, i, []),
        "snapshot": lambda i: retry_on(
            {"InvalidSnapshot.InUse"},
            lambda: ec2.delete_snapshot(SnapshotId=i),
            within_s=SNAPSHOT_RELEASED_S,
        ),
        "volume": lambda i: ec2.delete_volume(VolumeId=i),
        "security-group": lambda i: retry_on(
            {"DependencyViolation"}, lambda: ec2.delete_security_group(GroupId=i), attempts=12
        ),
        "key-pair": lambda i: ec2.delete_key_pair(KeyName=i),
    }
    unseen = {x.resource_id: x.unseen_for() for x in leftovers}
    instances = {x.resource_id: unseen[x.resource_id] for x in leftovers if x.kind == "instance"}
    ended: str | None = None  # instances: None until terminated together, then "" or the error
    for item in leftovers:
        try:
            if item.kind == "instance":
                if ended is None:
                    # Security groups and volumes stay in use until instances are really
                    # gone: confirmed by describing them terminated, never by a NotFound.
                    try:
                        terminate_instances(ec2, instances)
                        ended = ""
                    except (botocore.exceptions.ClientError, CloudError) as exc:
                        ended = str(exc)
                if ended:
                    raise CloudError(ended)
            else:
                ignore_missing(lambda item=item: actions[item.kind](item.resource_id))  # type: ignore[misc]
            journal.deleted(item.kind, item.resource_id)
            log.info("deleted %s", item.describe())
            if item.kind == "key-pair" and item.run_id:
                _forget_private_keys(cloud, journal, item.run_id)
        except (botocore.exceptions.ClientError, CloudError) as exc:
            failures.append(f"{item.describe()}: {exc}")
    return failures
