"""What amibake owns in a region, alive now: `amibake ls` lists it with age, size and cost, and
`amibake gc` deletes the part of it that is not kept. One discovery for both.

Found by tag and by the journal, because either alone can miss something: the tags
(``amibake:run-id`` on what a run creates, at creation, so nothing a run makes is untagged even if
the journal write never happened; ``amibake:batch`` on what `amibake batch up` makes) and the
journal (which knows what a describe cannot list: DescribeFleets without ids never lists an
instant fleet, so amibake's fleets are found by their journaled ids). A journaled resource is
confirmed alive by describing it: a NotFound for an instance just created is EC2 not seeing it
yet. The job bucket is found by the SSM parameter that records its name.

Kept, not gc's to delete: baked images and their snapshots (the product; `amibake bake --keep N`
retires old ones) and what `amibake batch up` registered (`amibake batch down` removes it).
amibake makes no log group: Batch jobs log to /aws/batch/job, which AWS makes and keeps.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.exceptions

from amibake import batch
from amibake.catalog import prices
from amibake.cloud import Cloud
from amibake.cloud.calls import error_code, every
from amibake.cloud.ec2 import (
    NEW_IMAGE_VISIBLE_S,
    NEW_INSTANCE_VISIBLE_S,
    NEW_RESOURCE_VISIBLE_S,
    snapshots_of,
)
from amibake.cloud.tags import EXPIRES, KEPT, RUN_ID, parse_expires
from amibake.errors import UserError
from amibake.journal import Journal

log = logging.getLogger("amibake")
TAG_TTL = timedelta(hours=6)  # amibake:expires = creation + this (see cloud.tags.run_tags)
# What holds others first: the order gc deletes in, and ls lists in.
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
    "job-definition",
    "run-files",  # after the queues: gc stops their jobs, which write files until they stop
    "bucket",
]
# Why gc leaves each kind of kept resource (the text after "keep ...: ").
BAKED = "a baked image, the product (amibake bake --keep N retires older ones)"
BATCH_DOWN = "registered by amibake batch up; amibake batch down removes it"
BATCH_GROUP = "amibake batch up's group for its hosts: amibake batch down removes it (free)"
BATCH_HOST = "a host of amibake's Batch environment; amibake batch down ends it"
DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "403")


@dataclass(frozen=True)
class Resource:
    kind: str
    resource_id: str
    run_id: str
    created: datetime | None
    kept: str = ""  # why gc leaves it alone; '' when it is a leftover gc deletes
    running: bool = False  # kept because its run is running (gc says so, dry run or not)
    size_gib: float | None = None  # volumes, snapshots
    objects: int | None = None  # buckets
    size_bytes: int | None = None  # buckets
    usd_per_hour: float | None = None  # what runs: instances (None: no price known)
    usd_per_month: float | None = None  # what is stored: volumes, snapshots, buckets
    detail: str = ""  # instance type and market, volume type, a snapshot's image
    expires: datetime | None = None  # its amibake:expires tag: until when its run may live

    def lives_until(self) -> datetime | None:
        """Until when its run may still be running, as far as its tags tell."""
        if self.expires is not None:
            return self.expires
        return None if self.created is None else self.created + TAG_TTL

    def unseen_for(self) -> float:
        """How much longer EC2 may answer NotFound for it though it exists (eventual
        consistency after its creation); 0 when its age is not known."""
        if self.created is None:
            return 0.0
        age = (datetime.now(UTC) - self.created).total_seconds()
        window = {
            "instance": NEW_INSTANCE_VISIBLE_S,
            "fleet": NEW_INSTANCE_VISIBLE_S,
            "image": NEW_IMAGE_VISIBLE_S,
        }.get(self.kind, NEW_RESOURCE_VISIBLE_S)
        return max(0.0, window - age)

    def age_s(self) -> float | None:
        if self.created is None:
            return None
        return (datetime.now(UTC) - self.created).total_seconds()

    def describe(self) -> str:
        age = ""
        if self.created is not None:
            age = f", {(datetime.now(UTC) - self.created).total_seconds() / 3600:.1f}h old"
        return f"{self.kind} {self.resource_id} (run {self.run_id or '?'}{age})"

    def as_json(self) -> dict[str, Any]:
        found = asdict(self)
        found["id"] = found.pop("resource_id")
        found["created"] = None if self.created is None else self.created.isoformat()
        found["age_s"] = self.age_s()
        found["gc"] = "keep" if self.kept else "delete"
        return found


def _tags(item: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def _created(item: dict[str, Any], field: str = "") -> datetime | None:
    """When it was made: the describe's own time where it gives one, else from its expiry tag."""
    stamp = item.get(field) if field else None
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            pass
    expires = parse_expires(_tags(item).get(EXPIRES, ""))
    return None if expires is None else expires - TAG_TTL


def _monthly(kind: str, size_gib: float, region: str) -> float | None:
    return prices.storage_monthly(kind, size_gib * prices.GIB, region)


def scan(cloud: Cloud) -> dict[tuple[str, str], Resource]:
    """Every tagged resource of amibake's in the region, kept or not, each list read to its
    last page (AWS answers in pages: a leftover on the second one would be reported as nothing
    left, issue 26 finding 7). Only describes that gc's own policy statement grants."""
    ec2 = cloud.ec2
    region = cloud.config.region
    tagged = [{"Name": "tag-key", "Values": [RUN_ID]}]
    # `batch up` puts its own tag on the two EC2 things it makes: its security group and (by
    # the environment's tags) the hosts Batch starts. One tag a filter: moto takes several
    # values of tag-key as all of them, where AWS takes any.
    by_batch = [{"Name": "tag-key", "Values": [batch.TAG]}]
    found: dict[tuple[str, str], Resource] = {}

    def add(
        kind: str,
        resource_id: str,
        item: dict[str, Any],
        field: str = "",
        *,
        kept: str = "",
        batch_kept: str = BATCH_DOWN,
        orphaned: bool = False,
        **extra: Any,
    ) -> None:
        """`kept`: why gc leaves it; `batch_kept`: why, when `batch up` made it (no run did);
        `orphaned`: what it was kept for is gone, and its amibake:kept tag with it."""
        item_tags = _tags(item)
        if RUN_ID not in item_tags and batch.TAG not in item_tags:
            return
        if KEPT in item_tags and not orphaned:
            kept = kept or "marked amibake:kept"
        if RUN_ID not in item_tags:
            kept = kept or batch_kept
        found[(kind, resource_id)] = Resource(
            kind,
            resource_id,
            item_tags.get(RUN_ID, ""),
            _created(item, field),
            kept,
            expires=parse_expires(item_tags.get(EXPIRES, "")),
            **extra,
        )

    reservations = [
        *every(ec2, "describe_instances", "Reservations", Filters=tagged),
        *every(ec2, "describe_instances", "Reservations", Filters=by_batch),
    ]
    for reservation in reservations:
        for instance in reservation["Instances"]:
            state = instance["State"]["Name"]
            if state in ("terminated", "shutting-down"):
                continue
            spot = instance.get("InstanceLifecycle") == "spot"
            kind = instance["InstanceType"]
            hourly = prices.instance_hourly(kind, spot, region) if state != "stopped" else 0.0
            add(
                "instance",
                instance["InstanceId"],
                instance,
                "LaunchTime",
                batch_kept=BATCH_HOST,
                usd_per_hour=hourly,
                detail=f"{kind} {'spot' if spot else 'on-demand'}, {state}",
            )
    # Fleets of type maintain or request only: an instant fleet (amibake's) is never listed
    # without its id, and is found through the journal.
    for fleet in every(ec2, "describe_fleets", "Fleets"):
        if fleet.get("FleetState") not in ("deleted", "deleted_running", "deleted_terminating"):
            add("fleet", fleet["FleetId"], fleet, "CreateTime", usd_per_hour=0.0)
    for template in every(ec2, "describe_launch_templates", "LaunchTemplates", Filters=tagged):
        add(
            "launch-template",
            template["LaunchTemplateId"],
            template,
            "CreateTime",
            usd_per_month=0.0,
        )
    for group in [
        *every(ec2, "describe_security_groups", "SecurityGroups", Filters=tagged),
        *every(ec2, "describe_security_groups", "SecurityGroups", Filters=by_batch),
    ]:
        add("security-group", group["GroupId"], group, batch_kept=BATCH_GROUP, usd_per_month=0.0)
    for pair in ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]:  # one page: no paginator
        add("key-pair", pair["KeyName"], pair, "CreateTime", usd_per_month=0.0)
    image_of: dict[str, str] = {}
    for image in every(ec2, "describe_images", "Images", Owners=["self"], Filters=tagged):
        if image.get("State") == "deregistered":  # described for a while after: gone
            continue
        baked = KEPT in _tags(image)
        for snapshot_id in snapshots_of(image):
            image_of[snapshot_id] = image["ImageId"]
        add(
            "image",
            image["ImageId"],
            image,
            "CreationDate",
            kept=BAKED if baked else "",
            usd_per_month=0.0,
            detail=f"{image.get('Architecture', '?')}, billed as its snapshots",
        )
    for snapshot in every(
        ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"], Filters=tagged
    ):
        snapshot_id = snapshot["SnapshotId"]
        # Billed for the blocks it holds: its full size where EC2 says it, else at most its
        # volume's.
        stored = snapshot.get("FullSnapshotSizeInBytes")
        size = stored / prices.GIB if stored else float(snapshot.get("VolumeSize", 0))
        image = image_of.get(snapshot_id, "")
        gone = "" if image or KEPT not in _tags(snapshot) else _deregistered_image(ec2, snapshot)
        add(
            "snapshot",
            snapshot_id,
            snapshot,
            "StartTime",
            kept=f"the snapshot of baked image {image}"
            if image and KEPT in _tags(snapshot)
            else "",
            orphaned=bool(gone),
            size_gib=size,
            usd_per_month=_monthly("ebs-snapshot", size, region),
            detail=", ".join(
                ([f"of {image}"] if image else [])
                + ([f"of {gone}, deregistered"] if gone else [])
                + ([] if stored else ["at most this size"])
            ),
        )
    for volume in every(ec2, "describe_volumes", "Volumes", Filters=tagged):
        size, kind = float(volume["Size"]), volume.get("VolumeType", "")
        attached = [a["InstanceId"] for a in volume.get("Attachments", [])]
        add(
            "volume",
            volume["VolumeId"],
            volume,
            "CreateTime",
            size_gib=size,
            usd_per_month=_monthly(f"ebs-{kind}", size, region),
            detail=f"{kind}" + (f", on {', '.join(attached)}" if attached else ", unattached"),
        )
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
                # Free: the instances an environment starts are listed (and priced) as such.
                add(kind, item[name], {"Tags": tags}, usd_per_hour=0.0)
    # Free, but a run's (an image run registers its own) is deregistered at its end: one left by
    # a SIGKILLed run is a leftover, which ls listed for ever and gc never deleted.
    for definition in every(client, "describe_job_definitions", "jobDefinitions", status="ACTIVE"):
        tags = [{"Key": k, "Value": v} for k, v in definition.get("tags", {}).items()]
        revision = f"{definition['jobDefinitionName']}:{definition['revision']}"
        add("job-definition", revision, {"Tags": tags}, usd_per_month=0.0)
    return found


# A kept snapshot whose image is gone this long after the snapshot began is no one's product: the
# image was deregistered by hand (EC2 leaves its snapshots, billed), and gc kept the snapshot
# for ever. Younger, the image's absence may be EC2 not listing a new image yet.
ORPHANED_AFTER_S = 3600.0
# EC2's description of an image's snapshot: "Created by CreateImage(i-...) for ami-...".
_IMAGE_OF_SNAPSHOT = re.compile(r"\bfor (ami-[0-9a-f]+)")


def _deregistered_image(ec2: Any, snapshot: dict[str, Any]) -> str:
    """The image a kept snapshot was made for when that image is gone; '' otherwise, or when
    the snapshot is too young to be sure (see ORPHANED_AFTER_S)."""
    named = _IMAGE_OF_SNAPSHOT.search(str(snapshot.get("Description", "")))
    started = _created(snapshot, "StartTime")
    if named is None or started is None:
        return ""
    if (datetime.now(UTC) - started).total_seconds() < ORPHANED_AFTER_S:
        return ""
    image_id = named.group(1)
    try:
        # A disabled image is left out unless asked for, and is not gone.
        images = ec2.describe_images(ImageIds=[image_id], IncludeDisabled=True)["Images"]
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if "NotFound" in code or "Unavailable" in code:
            return image_id
        if "Malformed" in code:
            return ""
        raise
    return image_id if all(i.get("State") == "deregistered" for i in images) else ""


def still_there(cloud: Cloud, kind: str, resource_id: str, unseen_for: float = 0.0) -> bool:
    """Describe one journal entry: is it really alive? Gone is confirmed, never assumed: what
    is NotFound within `unseen_for` of its creation may exist (EC2's eventual consistency), and
    taking it for gone journaled a live run's new security group or launch template deleted
    (`ls` beside a build, a second after it made them)."""
    try:
        found = _described(cloud, kind, resource_id)
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if "NotFound" in code or code.startswith("InvalidKeyPair") or "Malformed" in code:
            found = None
        else:
            raise
    return unseen_for > 0 if found is None else found


# kind -> the EC2 describe that names one by id, its parameter, the answer's list.
_EC2_BY_ID = {
    "launch-template": ("describe_launch_templates", "LaunchTemplateIds", "LaunchTemplates"),
    "security-group": ("describe_security_groups", "GroupIds", "SecurityGroups"),
    "key-pair": ("describe_key_pairs", "KeyNames", "KeyPairs"),
    "image": ("describe_images", "ImageIds", "Images"),
    "snapshot": ("describe_snapshots", "SnapshotIds", "Snapshots"),
    "volume": ("describe_volumes", "VolumeIds", "Volumes"),
}


def _described(cloud: Cloud, kind: str, resource_id: str) -> bool | None:
    """Whether a describe of the resource finds it alive; None when the answer does not have
    it (some kinds answer an empty list, others raise NotFound)."""
    ec2 = cloud.ec2
    listed: list[Any]
    if kind == "instance":
        found = ec2.describe_instances(InstanceIds=[resource_id])["Reservations"]
        states = [i["State"]["Name"] for r in found for i in r["Instances"]]
        return any(s != "terminated" for s in states) if states else None
    if kind == "fleet":
        fleets = ec2.describe_fleets(FleetIds=[resource_id])["Fleets"]
        if not fleets:
            return None
        return any(not f.get("FleetState", "").startswith("deleted") for f in fleets)
    if kind == "job-definition":
        definitions = cloud.client("batch").describe_job_definitions(jobDefinitions=[resource_id])[
            "jobDefinitions"
        ]
        if not definitions:
            return None
        return any(d.get("status") == "ACTIVE" for d in definitions)
    if kind in _EC2_BY_ID:
        operation, parameter, key = _EC2_BY_ID[kind]
        listed = getattr(ec2, operation)(**{parameter: [resource_id]})[key]
        # A deregistered image is described for a while after, State deregistered: gone, as
        # EC2 has said (not "not listed", which within its window may be not known yet).
        if listed and all(r.get("State") == "deregistered" for r in listed):
            return False
    elif kind == "job-queue":
        listed = batch.queues(cloud.client("batch"), resource_id)
    elif kind == "compute-environment":
        listed = batch.environments(cloud.client("batch"), resource_id)
    else:
        return False
    return True if listed else None


def _bucket_objects(cloud: Cloud) -> tuple[str, list[dict[str, Any]]] | None:
    """The job bucket's name and every object in it; None when there is none, or this identity
    may not list it (said, and the rest found)."""
    try:
        name = batch.job_bucket(cloud)
        if name is None or not batch.check_owned(cloud, name):
            return None
        return name, list(every(cloud.client("s3"), "list_objects_v2", "Contents", Bucket=name))
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in DENIED:
            raise
        log.warning("the job bucket not listed: %s", exc)
        return None
    except UserError as exc:  # check_owned's 403: another account's, or not ours to list
        log.warning("the job bucket not listed: %s", exc)
        return None


def _run_files(
    cloud: Cloud, bucket: str, objects: list[dict[str, Any]], found: dict[tuple[str, str], Resource]
) -> Iterator[Resource]:
    """A fleet Batch run's files, one resource per compute environment it measured on
    (``fleet/<fleet run>/<environment>/``: its payload, results and monitor CSVs). They belong
    to that environment's run: kept while it runs, and left once the environment is gone or
    left itself (a SIGKILLed run's own cleanup never removed them; only `fleet kill`, a resume
    or the bucket's 7-day expiry did, and gc found nothing). The environment is made before
    any file and deleted after them, so files without one are nobody's."""
    environments = {
        r.resource_id.rsplit("/", 1)[-1]: r
        for (kind, _), r in found.items()
        if kind == "compute-environment"
    }
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in objects:
        parts = str(item["Key"]).split("/")
        if parts[0] == "fleet" and len(parts) > 3:
            groups.setdefault("/".join(parts[:3]) + "/", []).append(item)
    for prefix, items in sorted(groups.items()):
        environment = prefix.split("/")[2]
        owner = environments.get(environment)
        size = sum(int(i.get("Size", 0)) for i in items)
        yield Resource(
            "run-files",
            f"s3://{bucket}/{prefix}",
            owner.run_id if owner else "",
            max(_created(i, "LastModified") or datetime.now(UTC) for i in items),
            owner.kept if owner else "",
            objects=len(items),
            size_bytes=size,
            usd_per_month=prices.storage_monthly("s3-standard", size, cloud.config.region),
            detail=f"of compute environment {environment}" + ("" if owner else ", gone"),
        )


def _job_bucket(cloud: Cloud, bucket: str, objects: list[dict[str, Any]]) -> Resource:
    """What `amibake batch up` registered besides environments, queues and job definitions: the
    job bucket, with its objects and bytes besides the run files listed on their own."""
    rest = [
        i
        for i in objects
        if len(str(i["Key"]).split("/")) <= 3 or not i["Key"].startswith("fleet/")
    ]
    size = sum(int(i.get("Size", 0)) for i in rest)
    return Resource(
        "bucket",
        bucket,
        "",
        None,
        "amibake batch up's job bucket; amibake batch down deletes it",
        objects=len(rest),
        size_bytes=size,
        usd_per_month=prices.storage_monthly("s3-standard", size, cloud.config.region),
        detail="besides the run files listed" if len(rest) < len(objects) else "",
    )


def discover(
    cloud: Cloud,
    journal: Journal,
    *,
    run_id: str | None = None,
    older_than: timedelta | None = None,
    everything: bool = False,
) -> list[Resource]:
    """What amibake owns in the region (of one run when `run_id` is given), kept or not, in
    ORDER. `everything` adds Batch's job definitions and the job bucket (ls, gc --dry-run)."""
    found = scan(cloud)
    for entry in journal.alive(run_id=run_id, cloud=cloud.config.cloud):
        key = (entry.kind, entry.resource_id)
        created = datetime.fromtimestamp(entry.created, UTC)
        if key in found and found[key].created is None:  # a job definition says no time
            found[key] = replace(found[key], created=created)
        if key in found or entry.region != cloud.config.region:
            continue
        resource = Resource(entry.kind, entry.resource_id, entry.run_id, created)
        if still_there(cloud, entry.kind, entry.resource_id, resource.unseen_for()):
            found[key] = resource
        else:
            journal.deleted(entry.kind, entry.resource_id)
    listed = _bucket_objects(cloud)
    if listed is not None:
        bucket, objects = listed
        found.update(
            {(r.kind, r.resource_id): r for r in _run_files(cloud, bucket, objects, found)}
        )
        if everything:
            found[("bucket", bucket)] = _job_bucket(cloud, bucket, objects)
    # A run elsewhere counts as running for as long as its resources' amibake:expires says:
    # one of this journal's on another machine (a shared results dir), or one this journal
    # never had (another machine's, user's or results dir's in the same account).
    live, elsewhere = journal.live_runs(), journal.running_elsewhere(TAG_TTL.total_seconds())
    known = journal.known_runs()
    chosen = [
        _unless_running(item, live, {} if run_id is not None else elsewhere, known, run_id)
        for item in selected(list(found.values()), run_id, older_than)
    ]
    return sorted(chosen, key=lambda x: (ORDER.index(x.kind), x.resource_id))


def selected(
    found: list[Resource], run_id: str | None, older_than: timedelta | None
) -> list[Resource]:
    """Those of the run asked for (all without one), and with --older-than those of runs that
    began that long ago: a run's age is its oldest resource's, and a run is taken whole. By each
    resource's own age, a killed bake's hour-old key pair and template went and its younger
    boot-test instance stayed, billed, its group refused as still in use for minutes."""
    mine = [r for r in found if run_id is None or r.run_id == run_id]
    if older_than is None:
        return mine
    began: dict[str, datetime] = {}
    for resource in mine:
        if resource.run_id and resource.created is not None:
            earliest = began.get(resource.run_id, resource.created)
            began[resource.run_id] = min(earliest, resource.created)
    now = datetime.now(UTC)

    def old_enough(resource: Resource) -> bool:
        when = began.get(resource.run_id) if resource.run_id else resource.created
        return when is None or now - when >= older_than

    return [r for r in mine if old_enough(r)]


def _unless_running(
    item: Resource,
    live: dict[str, int],
    elsewhere: dict[str, str],
    known: frozenset[str],
    asked: str | None,
) -> Resource:
    """Kept while its run runs: on this machine (`live`: its own cleanup removes it; gc took a
    live bake's image, a bench's instance, a colleague's run in the same results dir), or, as
    far as the journal knows, on another (`elsewhere`; empty when gc is given a run id: what
    runs there cannot be told from here), or, for a run this journal never had (`known`: its
    runs), until its resources' amibake:expires: gc took a colleague's or CI's live build in a
    shared account. A run asked for by id (`asked`) is taken as stopped."""
    if item.kept or not item.run_id:
        return item
    until = item.lives_until()
    if item.run_id not in known and asked is None and until and until > datetime.now(UTC):
        why = (
            f"run {item.run_id} is not in this journal (another machine's, user's or results "
            f"dir's) and may be running until {until.strftime('%Y-%m-%d %H:%M')} UTC, its "
            f"amibake:expires: gc there, or amibake gc --run-id {item.run_id} once it has stopped"
        )
        return replace(item, kept=why, running=True)
    pid = live.get(item.run_id)
    if pid is not None:
        why = (
            f"run {item.run_id} is running (pid {pid}): its own cleanup removes it on exit "
            f"(stop it first, kill {pid}, for gc to take what it leaves)"
        )
        return replace(item, kept=why, running=True)
    host = elsewhere.get(item.run_id)
    if host is not None:
        why = (
            f"run {item.run_id} is running on {host} as far as the journal knows (taken for "
            f"dead {TAG_TTL.total_seconds() / 3600:.0f}h after its start): gc there, or "
            f"amibake gc --run-id {item.run_id} once it has stopped"
        )
        return replace(item, kept=why, running=True)
    return item


def totals(resources: list[Resource]) -> dict[str, float]:
    return {
        "usd_per_hour": sum(r.usd_per_hour or 0.0 for r in resources),
        "usd_per_month": sum(r.usd_per_month or 0.0 for r in resources),
    }


def basis(region: str) -> str:
    """Where the prices come from, said once under the list."""
    ec2, storage = prices.snapshot(), prices.storage()
    rates = ", ".join(
        f"{p['what'].split(',')[0]} ${p['usd_per_gb_month']}/GB-month"
        for p in storage["prices"].values()
    )
    where = (
        "" if region == ec2["region"] else f" (no prices for {region}: these are {ec2['region']}'s)"
    )
    return (
        f"prices{where}: instances per hour from amibake/catalog/{prices.SNAPSHOT} "
        f"({ec2['date']}; spot as the median over the zones), storage per month (730 hours) "
        f"at AWS's {storage['region']} list prices of {storage['date']}: {rates} "
        f"({', '.join(sorted({p['source'] for p in storage['prices'].values()}))}); "
        "fleets, launch templates, security groups, key pairs, queues, environments and job "
        "definitions are free; amibake makes no log group"
    )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _size(resource: Resource) -> str:
    if resource.size_gib is not None:
        return f"{resource.size_gib:g} GiB"
    if resource.size_bytes is not None:
        return f"{resource.objects} objects, {resource.size_bytes} bytes"
    return ""


def cost_text(resource: Resource) -> str:
    if resource.usd_per_hour is not None:
        return "free" if resource.usd_per_hour == 0 else f"${resource.usd_per_hour:.4f}/h"
    if resource.usd_per_month is not None:
        return "free" if resource.usd_per_month == 0 else f"${resource.usd_per_month:.4f}/month"
    return "no price"


def table(resources: list[Resource], region: str) -> str:
    """`amibake ls` for a reader: one row per resource, the totals, the basis of the prices."""
    from tabulate import tabulate

    if not resources:
        return f"amibake owns nothing in {region}"
    rows = [
        [r.kind, r.resource_id, r.run_id or "-", _age(r.age_s()), _size(r), cost_text(r), r.detail]
        for r in resources
    ]
    total = totals(resources)
    return "\n".join(
        [
            tabulate(rows, headers=["kind", "id", "run", "age", "size", "cost", "what"]),
            f"{len(resources)} resources in {region}: ${total['usd_per_hour']:.4f}/h running, "
            f"${total['usd_per_month']:.4f}/month stored",
            basis(region),
        ]
    )
