"""EC2 operations more than one caller needs, written for EC2's eventual consistency.

EC2 is eventually consistent: a resource just created may be NotFound to the next call, and a
resource just deleted may still be in use ("Eventual consistency in the Amazon EC2 API"). A
NotFound is retried for as long as AWS says it may last, and "gone" is confirmed by a describe.
"""

from __future__ import annotations

import logging
from typing import Any

import botocore.exceptions

from amibake.cloud.calls import error_code, retry_on

log = logging.getLogger("amibake")
# How long a new AMI may be NotFound: AWS support's answer in hashicorp/packer#2033 and #3377.
NEW_IMAGE_VISIBLE_S = 150.0
# How long a deregistered image's snapshot may stay InvalidSnapshot.InUse (boto/boto#3019).
SNAPSHOT_RELEASED_S = 120.0
IMAGE_NOT_FOUND = {"InvalidAMIID.NotFound", "InvalidAMIID.Unavailable"}


def describe_new_image(ec2: Any, image_id: str) -> dict[str, Any]:
    """An image amibake just created: NotFound is retried until it shows."""
    images: list[dict[str, Any]] = retry_on(
        IMAGE_NOT_FOUND,
        lambda: ec2.describe_images(ImageIds=[image_id])["Images"],
        within_s=NEW_IMAGE_VISIBLE_S,
    )
    if not images:  # an empty answer is NotFound too, eventually consistent the same way
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "InvalidAMIID.NotFound", "Message": image_id}}, "DescribeImages"
        )
    return images[0]


def snapshots_of(image: dict[str, Any]) -> list[str]:
    return [m["Ebs"]["SnapshotId"] for m in image.get("BlockDeviceMappings", []) if "Ebs" in m]


def delete_image(
    ec2: Any, image_id: str, snapshots: list[str], *, just_created: bool = False
) -> list[str]:
    """Deregister the image and delete its snapshots; the snapshots deleted.

    DeregisterImage deletes the snapshots with it (DeleteAssociatedSnapshots), which cannot race;
    a snapshot still there after it is deleted, retrying InvalidSnapshot.InUse. A just-created
    image's NotFound is retried (it may not be visible yet); otherwise NotFound means gone."""
    missing = IMAGE_NOT_FOUND if just_created else set()
    if just_created and not snapshots:
        try:
            snapshots = snapshots_of(describe_new_image(ec2, image_id))
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) not in IMAGE_NOT_FOUND:
                raise
    try:
        retry_on(
            missing,
            lambda: ec2.deregister_image(ImageId=image_id, DeleteAssociatedSnapshots=True),
            within_s=NEW_IMAGE_VISIBLE_S,
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
