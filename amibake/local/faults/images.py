"""A new image as EC2 has it: not found for a while, then pending, sometimes failed; and its
snapshot in use for a moment after the image is deregistered.

Sources: the EC2 API reference, "Eventual consistency in the Amazon EC2 API" (a resource just
created may not be found by the next call); ansible/ansible#4368 (InvalidAMIID.NotFound right
after CreateImage "roughly 1 time out of 10"); hashicorp/packer#2033 and #3377 (AWS support: retry
NotFound on a new AMI for up to 2.5 minutes); CreateImage's documented states (pending,
available, failed with a StateReason); boto/boto#3019 (DeleteSnapshot right after DeregisterImage
fails with InvalidSnapshot.InUse, 1 in 5).
"""

from __future__ import annotations

import re
from xml.etree import ElementTree

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

_IMAGE_ID = re.compile(r"<imageId>(ami-[0-9a-f]+)</imageId>")
_STATE = re.compile(r"<imageState>available</imageState>")
# Local delays: AWS's seconds to minutes, shrunk (the product waits on them the same way).
UNSEEN_S = (0.3, 2.5)  # NotFound after CreateImage
PENDING_S = (0.5, 3.0)  # pending before available
IN_USE_S = (0.3, 1.5)  # a deregistered image's snapshot still in use
FAILED = 0.15  # share of images that end failed


def _images(request: Request) -> list[str]:
    return [str(v) for k, v in request.params.items() if k == "ImageId" or k.startswith("ImageId.")]


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "ec2":
        return None
    created = faults.remember("images:created")
    now = faults.now()
    if request.action in (
        "DescribeImages",
        "ModifyImageAttribute",
        "DescribeImageAttribute",
        "DeregisterImage",
        "CreateTags",
    ):
        resources = [str(v) for k, v in request.params.items() if k.startswith("ResourceId.")]
        for image in _images(request) + resources:
            born = created.get(image)
            if born is None:  # not one made here: never unseen
                continue
            n = faults.ordinal("image", image)
            if now < born + faults.between(*UNSEEN_S, "image", n, "unseen"):
                faults.count(BEHAVIOUR.name, "image not found yet")
                return query_error(
                    "InvalidAMIID.NotFound", f"The image id '[{image}]' does not exist"
                )
    if request.action == "DeleteSnapshot":
        snapshot = str(request.params.get("SnapshotId", ""))
        freed = faults.remember("images:deregistered").get(snapshot)
        n = faults.ordinal("snapshot", snapshot) if freed is not None else 0
        if freed is not None and now < freed + faults.between(*IN_USE_S, "snapshot", n, "in-use"):
            faults.count(BEHAVIOUR.name, "snapshot in use")
            return query_error(
                "InvalidSnapshot.InUse",
                f"The snapshot {snapshot} is currently in use by an image",
            )
    return None


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "ec2" or not reply.ok:
        return reply
    now = faults.now()
    text = reply.body.decode()
    if request.action == "CreateImage":
        found = _IMAGE_ID.search(text)
        if found:
            faults.remember("images:created")[found.group(1)] = now
            faults.ordinal("image", found.group(1))
    elif request.action == "DescribeImages":
        created = faults.remember("images:created")
        for image in set(_IMAGE_ID.findall(text)):
            born = created.get(image)
            if born is None:
                continue
            n = faults.ordinal("image", image)
            if faults.chance(FAILED, "image", n, "failed"):
                faults.count(BEHAVIOUR.name, "image failed")
                text = _set_state(
                    text,
                    image,
                    "failed",
                    "Client.InternalError",
                    "Client.InternalError: Client error on launch",
                )
            elif now < born + faults.between(*UNSEEN_S, "image", n, "unseen") + faults.between(
                *PENDING_S, "image", n, "pending"
            ):  # pending from when it shows
                faults.count(BEHAVIOUR.name, "image pending")
                text = _set_state(text, image, "pending")
        reply = Reply(reply.status, reply.headers, text.encode())
    elif request.action == "DeregisterImage":
        image = str(request.params.get("ImageId", ""))
        snapshots = faults.remember("images:snapshots").get(image, [])
        gone = faults.remember("images:deregistered")
        for snapshot in snapshots:
            gone[snapshot] = now
    if request.action == "DescribeImages":
        _note_snapshots(faults, text)
    return reply


def _note_snapshots(faults: Faults, text: str) -> None:
    """Which snapshots each described image has (DeregisterImage names only the image)."""
    mine = faults.remember("images:snapshots")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return
    for item in root.iterfind("{*}imagesSet/{*}item"):
        image = item.findtext("{*}imageId") or ""
        mine[image] = [s.text or "" for s in item.iterfind(".//{*}snapshotId")]


def _set_state(text: str, image: str, state: str, code: str = "", message: str = "") -> str:
    """The image's <imageState> (and a <stateReason> for a failed one) in a DescribeImages
    answer."""
    start = text.find(f"<imageId>{image}</imageId>")
    end = text.find("</item>", start) if start >= 0 else -1
    if start < 0 or end < 0:
        return text
    part = text[start:end]
    changed = _STATE.sub(f"<imageState>{state}</imageState>", part, count=1)
    if code:
        changed += f"<stateReason><code>{code}</code><message>{message}</message></stateReason>"
    return text[:start] + changed + text[end:]


BEHAVIOUR = Behaviour(
    name="image-consistency",
    source="EC2 API eventual consistency; ansible#4368; packer#2033, #3377; boto#3019",
    before=_before,
    after=_after,
)
