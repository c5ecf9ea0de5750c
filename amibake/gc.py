"""``amibake gc``: find and delete what amibake created that is still alive, even after SIGKILL.

What is alive is found as `amibake ls` finds it (amibake.inventory: by tag and by the journal,
confirmed by describing); gc deletes what is not kept, in dependency order, and confirms it gone
by describing after: a NotFound for an instance or fleet just created is EC2 not seeing it yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import botocore.exceptions

from amibake import bake, batch, inventory
from amibake.cloud import Cloud
from amibake.cloud.calls import ignore_missing, retry_on
from amibake.cloud.ec2 import (
    SNAPSHOT_RELEASED_S,
    delete_fleet,
    delete_image,
    delete_key_pair,
    delete_security_group,
    terminate_instances,
)
from amibake.errors import CloudError
from amibake.inventory import Resource
from amibake.journal import Journal

log = logging.getLogger("amibake")


def find(
    cloud: Cloud,
    journal: Journal,
    *,
    run_id: str | None = None,
    older_than: timedelta | None = None,
) -> list[Resource]:
    """What gc deletes: amibake's resources in the region (inventory.discover) that are not
    kept (baked images and their snapshots, what `amibake batch up` registered, and what runs
    still running hold)."""
    found = inventory.discover(cloud, journal, run_id=run_id, older_than=older_than)
    return [item for item in found if not item.kept]


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
    folder = cloud.config.results_dir / "logs" / run_id
    for key_file in [*folder.glob("*.pem"), *folder.glob("*.known_hosts")]:
        key_file.unlink(missing_ok=True)
        log.info("removed %s: its key pair is deleted", key_file)


class _Queues:
    """Left job queues, deleted with their jobs stopped first: a fleet run's files are removed
    after (fleet kill's sweep), and a job still stopping wrote them on. Every queue's jobs are
    terminated at the first deletion and waited for once (a job may take the stop timeout,
    which gc of several left runs waited out a queue at a time); should that fail, that queue
    is reported and the others stop theirs at their turn."""

    def __init__(self, client: Any, queues: list[str]) -> None:
        self.client = client
        self.stopping = queues  # those whose jobs are still to stop

    def delete(self, queue: str) -> None:
        if queue in self.stopping:
            together, self.stopping = self.stopping, []
            try:
                batch.stop_jobs(self.client, together)
            except BaseException:
                self.stopping = [q for q in together if q != queue]
                raise
        batch.delete_queue(self.client, queue)


def delete(
    cloud: Cloud, journal: Journal, leftovers: list[Resource]
) -> tuple[list[Resource], list[str]]:
    """Delete in dependency order; return what was deleted, and one line per failure (with the
    command to finish). Each deletion is logged at debug only: the caller says what was deleted
    (said twice on a terminal, and a failed one was said "deleted" besides its failure)."""
    ec2 = cloud.ec2
    amis_file = cloud.config.results_dir / "amis.json"
    deleted: list[Resource] = []
    failures = []
    batch_client = cloud.client("batch")
    actions: dict[str, Callable[[str], object]] = {
        "job-queue": _Queues(
            batch_client, [x.resource_id for x in leftovers if x.kind == "job-queue"]
        ).delete,
        "compute-environment": lambda i: batch.delete_environment(batch_client, i),
        "fleet": lambda i: delete_fleet(ec2, i, unseen_for_s=unseen[i]),
        "launch-template": lambda i: ignore_missing(
            lambda: ec2.delete_launch_template(LaunchTemplateId=i), unseen_for=unseen[i]
        ),
        # With its snapshots (DeleteAssociatedSnapshots): a snapshot deleted right after its
        # image may still be in use (InvalidSnapshot.InUse), and was left, billed.
        # Within its unseen_for, a NotFound is EC2 not knowing the image yet (a bake killed as
        # it was made): taken for gone, it was journaled deleted and became available, billed.
        "image": lambda i: delete_image(ec2, i, [], unseen_for=unseen[i]),
        "snapshot": lambda i: retry_on(
            {"InvalidSnapshot.InUse"},
            lambda: ec2.delete_snapshot(SnapshotId=i),
            within_s=SNAPSHOT_RELEASED_S,
        ),
        "volume": lambda i: ec2.delete_volume(VolumeId=i),
        "security-group": lambda i: delete_security_group(ec2, i, unseen[i]),
        "key-pair": lambda i: delete_key_pair(ec2, i, unseen[i]),
        "job-definition": lambda i: batch_client.deregister_job_definition(jobDefinition=i),
        "run-files": lambda i: batch.delete_prefix(cloud, *i.removeprefix("s3://").split("/", 1)),
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
            deleted.append(item)
            if item.kind == "image":  # a bake killed as it kept it had recorded it first
                bake.mark_retired(amis_file, bake.retired_now([item.resource_id]))
            log.debug("deleted %s", item.describe())
            if item.kind == "key-pair" and item.run_id:
                _forget_private_keys(cloud, journal, item.run_id)
        except (botocore.exceptions.ClientError, CloudError) as exc:
            failures.append(f"{item.describe()}: {exc}")
    return deleted, failures
