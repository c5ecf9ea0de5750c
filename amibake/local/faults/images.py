"""A new image as EC2 has it: not found for a while, then pending, sometimes failed; and its
snapshot in use for a moment after the image is deregistered. While pending, its attributes
cannot be changed (ModifyImageAttribute: InvalidAMIID.Unavailable, "currently pending and may
not be used for this operation": SUSE-Enceladus/ec2imgutils#45, app-sre/qontract-reconcile#2222)
and its block device mappings may not name their snapshot yet (bonclay7/aws-amicleaner#114).

Sources: the EC2 API reference, "Eventual consistency in the Amazon EC2 API" (a resource just
created may not be found by the next call); ansible/ansible#4368 (InvalidAMIID.NotFound right
after CreateImage "roughly 1 time out of 10"); hashicorp/packer#2033 and #3377 (AWS support: retry
NotFound on a new AMI for up to 2.5 minutes); CreateImage's documented states (pending,
available, failed with a StateReason); boto/boto#3019 (DeleteSnapshot right after DeregisterImage
fails with InvalidSnapshot.InUse, 1 in 5); DescribeImages' API reference ("recently deregistered
images appear in the returned results for a short interval"), State deregistered.
"""

from __future__ import annotations

import re
from xml.etree import ElementTree

from amibake.local.faults import Behaviour, Faults, Reply, Request, query_error

_IMAGE_ID = re.compile(r"<imageId>(ami-[0-9a-f]+)</imageId>")
_STATE = re.compile(r"<imageState>[a-z]+</imageState>")
_REASON = re.compile(r"<stateReason>.*?</stateReason>", re.S)
_SNAPSHOT = re.compile(r"<snapshotId>snap-[0-9a-f]+</snapshotId>")
# Local delays: AWS's seconds to minutes, shrunk (the product waits on them the same way).
UNSEEN_S = (0.3, 2.5)  # NotFound after CreateImage
PENDING_S = (0.5, 3.0)  # pending before available
IN_USE_S = (0.3, 1.5)  # a deregistered image's snapshot still in use
DEREGISTERED_S = (1.0, 4.0)  # a deregistered image still described, State deregistered
FAILED = 0.15  # share of images that end failed


def _pending(faults: Faults, image: str, born: float) -> bool:
    """Pending from when it shows until PENDING_S later (whether it then fails or not)."""
    n = faults.ordinal("image", image)
    shows = born + faults.between(*UNSEEN_S, "image", n, "unseen")
    return faults.now() < shows + faults.between(*PENDING_S, "image", n, "pending")


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
            if request.action == "ModifyImageAttribute" and _pending(faults, image, born):
                faults.count(BEHAVIOUR.name, "pending image modified")
                return query_error(
                    "InvalidAMIID.Unavailable",
                    f"The AMI ID '{image}' is currently pending and may not be used for this "
                    "operation",
                )
    if request.action == "DescribeImages":
        described = _deregistered(faults, _images(request), now)
        if described is not None:
            return described
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
    if request.action in ("CreateImage", "RegisterImage"):  # either image is new to EC2 alike
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
            elif _pending(faults, image, born):
                faults.count(BEHAVIOUR.name, "image pending")
                text = _set_state(text, image, "pending", snapshots=False)
        reply = Reply(reply.status, reply.headers, text.encode())
    elif request.action == "DeregisterImage":
        image = str(request.params.get("ImageId", ""))
        snapshots = faults.remember("images:snapshots").get(image, [])
        gone = faults.remember("images:deregistered")
        for snapshot in snapshots:
            gone[snapshot] = now
        faults.remember("images:gone")[image] = now
    if request.action == "DescribeImages":
        _note_snapshots(faults, text)
    return reply


def _note_snapshots(faults: Faults, text: str) -> None:
    """Which snapshots each described image has (DeregisterImage names only the image), and
    how it was described (EC2 describes it so for a moment after it is deregistered)."""
    mine = faults.remember("images:snapshots")
    described = faults.remember("images:described")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return
    for item in root.iterfind("{*}imagesSet/{*}item"):
        image = item.findtext("{*}imageId") or ""
        mine[image] = [s.text or "" for s in item.iterfind(".//{*}snapshotId")]
        span = _item(text, image)
        if span is not None:
            described[image] = text[span[0] : span[1]] + "</item>"


def _deregistered(faults: Faults, images: list[str], now: float) -> Reply | None:
    """A describe naming only images deregistered within their window: each as it was last
    described, State deregistered (moto forgets an image as it deregisters it)."""
    gone, described = faults.remember("images:gone"), faults.remember("images:described")
    items = []
    for image in images:
        at = gone.get(image)
        if at is None or image not in described:
            return None
        n = faults.ordinal("image", image)  # only of an image made here: others take none
        if now >= at + faults.between(*DEREGISTERED_S, "image", n, "deregistered"):
            return None
        items.append(_set_state(described[image], image, "deregistered"))
    if not items:
        return None
    faults.count(BEHAVIOUR.name, "deregistered image still described")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<DescribeImagesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>00000000-0000-0000-0000-000000000000</requestId>"
        f"<imagesSet>{''.join(items)}</imagesSet></DescribeImagesResponse>"
    )
    return Reply(200, [("Content-Type", "text/xml")], body.encode())


def _set_state(
    text: str, image: str, state: str, code: str = "", message: str = "", snapshots: bool = True
) -> str:
    """The image's <imageState> (and a <stateReason> for a failed one) in a DescribeImages
    answer; without `snapshots`, its block device mappings name none."""
    span = _item(text, image)
    if span is None:
        return text
    start, end = span
    # Whatever it was last described as (pending, failed, with its reason), it is now `state`.
    changed = _REASON.sub("", text[start:end])
    changed = _STATE.sub(f"<imageState>{state}</imageState>", changed, count=1)
    if not snapshots:
        changed = _SNAPSHOT.sub("", changed)
    if code:
        changed += f"<stateReason><code>{code}</code><message>{message}</message></stateReason>"
    return text[:start] + changed + text[end:]


def _item(text: str, image: str) -> tuple[int, int] | None:
    """Where the image's <item> of imagesSet begins and its </item> is, in a DescribeImages
    answer: its block device mappings, items themselves, come before its imageId."""
    at = text.find(f"<imageId>{image}</imageId>")
    if at < 0:
        return None
    depth, pos = 0, at
    while True:  # back to the <item> that holds it
        opened, closed = text.rfind("<item>", 0, pos), text.rfind("</item>", 0, pos)
        if opened < 0:
            return None
        if closed > opened:
            depth, pos = depth + 1, closed
        elif depth:
            depth, pos = depth - 1, opened
        else:
            start = opened
            break
    depth, pos = 0, at
    while True:  # on to its </item>
        opened, closed = text.find("<item>", pos), text.find("</item>", pos)
        if closed < 0:
            return None
        if 0 <= opened < closed:
            depth, pos = depth + 1, opened + 1
        elif depth:
            depth, pos = depth - 1, closed + 1
        else:
            return start, closed


BEHAVIOUR = Behaviour(
    name="image-consistency",
    source="EC2 API eventual consistency; ansible#4368; packer#2033, #3377; boto#3019",
    before=_before,
    after=_after,
)
