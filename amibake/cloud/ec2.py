"""EC2 operations more than one caller needs, written for EC2's eventual consistency.

EC2 is eventually consistent: a resource just created may be NotFound to the next call, and a
resource just deleted may still be in use ("Eventual consistency in the Amazon EC2 API"). A
NotFound is retried for as long as AWS says it may last, and "gone" is confirmed by a describe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import botocore.exceptions

from amibake.cloud.calls import chunks, error_code, every, ignore_missing, retry_on, wait_until
from amibake.errors import CloudError

log = logging.getLogger("amibake")
# How long a new AMI may be NotFound: AWS support's answer in hashicorp/packer#2033 and #3377.
NEW_IMAGE_VISIBLE_S = 150.0
# How long a deregistered image's snapshot may stay InvalidSnapshot.InUse (boto/boto#3019).
SNAPSHOT_RELEASED_S = 120.0
IMAGE_NOT_FOUND = {"InvalidAMIID.NotFound", "InvalidAMIID.Unavailable"}


def describe_new_image(
    ec2: Any, image_id: str, unseen_for: float = NEW_IMAGE_VISIBLE_S
) -> dict[str, Any]:
    """An image amibake just created: NotFound is retried until it shows (for `unseen_for`)."""
    images: list[dict[str, Any]] = retry_on(
        IMAGE_NOT_FOUND,
        lambda: ec2.describe_images(ImageIds=[image_id])["Images"],
        within_s=unseen_for,
    )
    if not images:  # an empty answer is NotFound too, eventually consistent the same way
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "InvalidAMIID.NotFound", "Message": image_id}}, "DescribeImages"
        )
    return images[0]


def snapshots_of(image: dict[str, Any]) -> list[str]:
    """Its snapshots, as far as they are named: a pending image's mappings may name none yet
    (bonclay7/aws-amicleaner#114)."""
    return [
        m["Ebs"]["SnapshotId"]
        for m in image.get("BlockDeviceMappings", [])
        if "SnapshotId" in m.get("Ebs", {})
    ]


def delete_image(
    ec2: Any, image_id: str, snapshots: list[str], *, unseen_for: float = 0.0
) -> list[str]:
    """Deregister the image and delete its snapshots; the snapshots deleted.

    DeregisterImage deletes the snapshots with it (DeleteAssociatedSnapshots), which cannot race;
    a snapshot still there after it is deleted, retrying InvalidSnapshot.InUse. Within
    `unseen_for` of the image's creation its NotFound is asked again (EC2 may not know it yet:
    NEW_IMAGE_VISIBLE_S); after, NotFound means gone."""
    missing = IMAGE_NOT_FOUND if unseen_for > 0 else set()
    if unseen_for > 0 and not snapshots:
        try:
            snapshots = snapshots_of(describe_new_image(ec2, image_id, unseen_for))
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) not in IMAGE_NOT_FOUND:
                raise
    try:
        retry_on(
            missing,
            lambda: ec2.deregister_image(ImageId=image_id, DeleteAssociatedSnapshots=True),
            within_s=unseen_for,
        )
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in IMAGE_NOT_FOUND:
            raise
    deleted = []
    for snapshot in snapshots:
        try:
            retry_on(
                {"InvalidSnapshot.InUse"},
                lambda s=snapshot: ec2.delete_snapshot(SnapshotId=s),  # type: ignore[misc]
                within_s=SNAPSHOT_RELEASED_S,
            )
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "InvalidSnapshot.NotFound":
                raise
        deleted.append(snapshot)
    return deleted


# --- instances and fleets -------------------------------------------------------------------

# How long a new instance (or the fleet that launched it) may be NotFound: the EC2 API guide
# says to back off "starting with a couple of seconds ... up to a few minutes".
NEW_INSTANCE_VISIBLE_S = 300.0
# How long a new security group or launch template may be NotFound to its delete
# (the same guide): its run's cleanup asks again until then.
NEW_RESOURCE_VISIBLE_S = 60.0
INSTANCE_NOT_FOUND = {"InvalidInstanceID.NotFound"}
TERMINATE_TIMEOUT_S = 600.0


def _not_found(instance_id: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": "InvalidInstanceID.NotFound", "Message": instance_id}}, operation
    )


def describe_instance(
    ec2: Any, instance_id: str, *, within_s: float = NEW_INSTANCE_VISIBLE_S
) -> dict[str, Any]:
    """An instance amibake launched: NotFound (or an empty answer) is retried until it shows."""

    def once() -> dict[str, Any]:
        found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        instances = [i for r in found for i in r["Instances"]]
        if not instances:
            raise _not_found(instance_id, "DescribeInstances")
        return dict(instances[0])

    return retry_on(INSTANCE_NOT_FOUND, once, within_s=within_s)


def terminate_instances(
    ec2: Any, unseen_for_s: dict[str, float], *, timeout_s: float = TERMINATE_TIMEOUT_S
) -> None:
    """Terminate the instances and confirm it by describing them: each is gone once EC2
    describes it terminated. A NotFound is not "gone" while the instance may be too new to be
    seen (`unseen_for_s`, by id: the whole NEW_INSTANCE_VISIBLE_S right after the launch, 0 for
    one known to EC2 for longer): EC2 says such an instance "might still be running". Past that,
    NotFound means EC2 has forgotten it (it describes a terminated instance for about an hour)."""
    started = time.monotonic()
    for instance_id, window in unseen_for_s.items():
        try:
            retry_on(
                INSTANCE_NOT_FOUND,
                lambda i=instance_id: ec2.terminate_instances(InstanceIds=[i]),  # type: ignore[misc]
                within_s=window,
            )
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) not in INSTANCE_NOT_FOUND:
                raise
    pending = set(unseen_for_s)

    def all_terminated() -> bool:
        for instance_id in sorted(pending):
            state = instance_state(ec2, instance_id)
            seen_out = time.monotonic() > started + unseen_for_s[instance_id]
            if state == "terminated" or (state is None and seen_out):
                pending.discard(instance_id)
        return not pending

    names = ", ".join(sorted(unseen_for_s))
    wait_until(f"{names} to terminate", all_terminated, timeout_s=timeout_s)


def instance_state(ec2: Any, instance_id: str) -> str | None:
    """The instance's state as EC2 describes it now; None when EC2 says NotFound (which, for a
    new instance, does not mean it is not running)."""
    try:
        found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) in INSTANCE_NOT_FOUND:
            return None
        raise
    states = [i["State"]["Name"] for r in found for i in r["Instances"]]
    return str(states[0]) if states else None


def delete_fleet(ec2: Any, fleet_id: str, *, unseen_for_s: float = NEW_INSTANCE_VISIBLE_S) -> None:
    """Delete an instant fleet and the instances it launched (the caller confirms those gone).

    DeleteFleets answers 200 and reports a fleet it could not delete in
    UnsuccessfulFleetDeletions: `fleetIdDoesNotExist` for a fleet too new to be seen is retried
    for `unseen_for_s`; any other refusal is an error, never taken for done."""
    deadline = time.monotonic() + unseen_for_s
    delay = 0.2
    while True:
        try:
            answer = retry_on(
                {"RequestLimitExceeded"},
                lambda: ec2.delete_fleets(FleetIds=[fleet_id], TerminateInstances=True),
            )
        except botocore.exceptions.ClientError as exc:
            # moto refuses TerminateInstances=True for a fleet holding no instance any more
            # (AWS does not: an instant fleet must terminate its instances).
            if error_code(exc) != "InvalidParameterCombination":
                raise
            answer = ec2.delete_fleets(FleetIds=[fleet_id], TerminateInstances=False)
        refused = [
            f.get("Error", {})
            for f in answer.get("UnsuccessfulFleetDeletions", [])
            if f.get("FleetId") == fleet_id
        ]
        if not refused:
            return
        code = str(refused[0].get("Code", ""))
        if code == "fleetIdDoesNotExist":
            if time.monotonic() + delay > deadline:
                return  # unknown for longer than a new fleet can be unseen: it is gone
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        if code == "fleetNotInDeletableState" and fleet_deleted(ec2, fleet_id):
            return
        raise CloudError(f"DeleteFleets {fleet_id}: {code}: {refused[0].get('Message', '')}")


# How long a terminated instance's network interface may hold its security group
# (DependencyViolation): Terraform waits five minutes (hashicorp/terraform#11047).
GROUP_RELEASED_S = 300.0


def delete_security_group(ec2: Any, group_id: str, unseen_for: float = 0.0) -> bool:
    """Delete a group, waiting while the interface of an instance just terminated still holds
    it; True if it was there (a NotFound: someone deleted it already, or, within `unseen_for`
    of its creation, EC2 does not know it yet: asked again)."""
    return retry_on(
        {"DependencyViolation"},
        lambda: ignore_missing(
            lambda: ec2.delete_security_group(GroupId=group_id), unseen_for=unseen_for
        ),
        within_s=GROUP_RELEASED_S,
    )


def delete_key_pair(ec2: Any, name: str, unseen_for: float = 0.0) -> None:
    """Delete a key pair by name. By name, DeleteKeyPair answers success whether or not EC2
    knows the key, and of one it does not know yet (made a second ago, its run stopped at once)
    it deletes nothing: the key stayed, journaled deleted. Within `unseen_for` of its creation a
    describe must find it first; one never found in that time was never there."""
    if unseen_for > 0:
        ignore_missing(lambda: ec2.describe_key_pairs(KeyNames=[name]), unseen_for=unseen_for)
    ec2.delete_key_pair(KeyName=name)


def fleet_deleted(ec2: Any, fleet_id: str) -> bool:
    """Whether EC2 describes the fleet as deleted (an instant fleet is found only by its id)."""
    fleets = ec2.describe_fleets(FleetIds=[fleet_id])["Fleets"]
    return all(str(f.get("FleetState", "")).startswith("deleted") for f in fleets)


def zones_offering(ec2: Any, instance_types: list[str]) -> dict[str, set[str]]:
    """Instance type -> the availability zones that offer it. An EC2 Fleet override naming an
    AZ without its type fails with InvalidFleetConfiguration (us-east-1e has no c5 sizes)."""
    zones: dict[str, set[str]] = {t: set() for t in instance_types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": instance_types}],
    )
    for page in pages:
        for offering in page["InstanceTypeOfferings"]:
            zones.setdefault(offering["InstanceType"], set()).add(offering["Location"])
    return zones


# DescribeInstanceTypes takes at most 100 names (the API reference; botocore's model: max 100).
INSTANCE_TYPES_PER_CALL = 100


def describe_instance_types(ec2: Any, instance_types: Sequence[str]) -> list[dict[str, Any]]:
    """Every named instance type, described: the names in runs of 100 (a longer list is
    refused, and the x86 families alone have 108 sizes), each run read to its last page."""
    described: list[dict[str, Any]] = []
    for run in chunks(sorted(set(instance_types)), INSTANCE_TYPES_PER_CALL):
        described += every(ec2, "describe_instance_types", "InstanceTypes", InstanceTypes=list(run))
    return described
