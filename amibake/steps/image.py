"""Steps that turn a running base instance into an image: install, clean, snapshot, boot-test.

A failed bake deregisters the image and deletes its snapshots (CreateImage's cleanup, unless the
last step marked the image as kept).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import botocore.exceptions

from amibake import bake, deadline, packages
from amibake import cpu as cpu_module
from amibake.cloud import tags
from amibake.cloud.calls import creating, error_code, every, made_once, retry_on, wait_until
from amibake.cloud.ec2 import (
    IMAGE_NOT_FOUND,
    NEW_IMAGE_VISIBLE_S,
    delete_image,
    describe_new_image,
    snapshots_of,
    zones_offering,
)
from amibake.cloud.reach import reach
from amibake.errors import RemoteError
from amibake.runner import Rerun, RunContext
from amibake.steps.launch import terminate_launched
from amibake.steps.state import InstanceState

log = logging.getLogger("amibake")


@dataclass(kw_only=True)
class BakeState(InstanceState):
    architecture: str
    name: str
    artifacts: list[bake.Artifact]
    files: dict[str, tuple[str, int]]
    boot_user_data: str  # rendered and checked with the files, before anything is created
    reserve_mb_per_vcpu: int
    amis_file: Path
    image_id: str = ""
    snapshot_ids: list[str] = field(default_factory=list)
    image_request: dict[str, Any] = field(default_factory=dict)
    boot_instance_id: str = ""
    boot_report: dict[str, Any] = field(default_factory=dict)
    keep_image: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}-{self.architecture}"


class Install:
    """Artifacts into /usr/local/data, units and scripts in place, units enabled."""

    name = "install"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BakeState) -> None:
        remote = state.remote
        assert remote is not None
        started = time.monotonic()
        staging = "/tmp/amibake-bake"
        remote.run(f"rm -rf {staging} && mkdir -p {staging}", stream=False)
        for artifact in state.artifacts:
            remote.put(artifact.path, f"{staging}/{artifact.path.name}")
        local = self.context.log_dir / state.label
        local.mkdir(parents=True, exist_ok=True)
        for index, (content, _) in enumerate(state.files.values()):
            (local / f"{index}.file").write_text(content)
            remote.put(local / f"{index}.file", f"{staging}/{index}.file")
        state.phases["upload"] = time.monotonic() - started
        started = time.monotonic()
        # `systemctl enable` is, for these units, exactly this symlink (WantedBy=multi-user).
        wants = "/etc/systemd/system/multi-user.target.wants"
        # What the stage unit runs at boot (tar, xz) and what the builds need to run: baked in,
        # so instances of the image need no package repository.
        lines = [
            packages.install_command(
                [*packages.ARTIFACT_TOOLS, *packages.runtime(a.manifest for a in state.artifacts)]
            ),
            f"install -d -m 755 {bake.DATA_DIR} {bake.LIBEXEC} {wants}",
        ]
        lines += [
            f"install -m 644 {staging}/{a.path.name} {bake.DATA_DIR}/{a.installed}"
            for a in state.artifacts
        ]
        for index, (path, (_, mode)) in enumerate(state.files.items()):
            lines.append(f"install -D -m {mode:o} {staging}/{index}.file {shlex.quote(path)}")
            if path.endswith(".service"):
                lines.append(f"ln -sf {path} {wants}/{Path(path).name}")
        manifest = {a.installed: a.manifest for a in state.artifacts}
        lines.append(
            f"cat > {bake.DATA_DIR}/amibake-bake.json <<'JSON'\n{json.dumps(manifest)}\nJSON"
        )
        lines.append(f"rm -rf {staging}")
        remote.script("\n".join(lines), stream=False)
        state.phases["install"] = time.monotonic() - started

    def cleanup(self, state: BakeState) -> None:
        pass  # it all lives on the bake instance, which dies with its own step


HYGIENE = r"""
# Under systemd (sd_booted's test): is-system-running, asked before, is false on a degraded
# system (any failed unit), and the agent then kept running while its state was removed.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl stop ecs || true
fi
rm -rf /var/lib/ecs/data/*
# What dnf fetched for the installed packages (its repositories' metadata, tens of MiB) that
# every instance of the image would otherwise carry.
if command -v dnf >/dev/null; then dnf clean all >/dev/null 2>&1 || true; fi
rm -f /etc/ssh/ssh_host_*
rm -f /home/*/.ssh/authorized_keys /root/.ssh/authorized_keys
rm -rf /var/lib/cloud/instances/* /var/lib/cloud/instance /var/lib/cloud/data/*
truncate -s 0 /etc/machine-id 2>/dev/null || true
# The build host's name, logs and the hosts it reached are not the image's: every instance
# gets its own name at boot (cloud-init) and writes its own logs.
truncate -s 0 /etc/hostname 2>/dev/null || true
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
find /var/log -type f -exec truncate -s 0 {} +
rm -rf /var/log/journal/*
rm -f /root/.bash_history /home/*/.bash_history /root/.ssh/known_hosts /home/*/.ssh/known_hosts
sync
"""


class Hygiene:
    """What must not be in an image: agent state, host keys, our key, instance identity, the
    build host's name and logs, history."""

    name = "hygiene"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BakeState) -> None:
        assert state.remote is not None
        state.remote.script(HYGIENE, stream=False)

    def cleanup(self, state: BakeState) -> None:
        pass


class CreateImage:
    name = "create-image"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BakeState) -> None:
        ec2 = self.context.cloud.ec2
        started = time.monotonic()
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        state.image_request = {
            "InstanceId": state.instance_id,
            # The run's id in it: an account's image names are unique in a region, and two
            # bakes of one architecture in the same second took the same name.
            "Name": f"{state.name}-{state.architecture}-{stamp}-{self.context.run_id}",
            "Description": f"amibake: {', '.join(a.path.name for a in state.artifacts)}",
            "TagSpecifications": [
                tags.specification("image", self.context.tags),
                tags.specification("snapshot", self.context.tags),
            ],
        }
        if state.renewal is not None:
            # CreateImage reboots the build host: the connection renewing its deadline drops,
            # and the schedule (in /run) is forgotten. The hygiene removed cloud-init's record
            # of the instance, so the boot is its first to cloud-init, which runs the user data
            # again: the deadline is back, from the reboot, unrenewed (the host is not used
            # again; the bake's cleanup terminates it).
            state.renewal.stop()
            state.renewal = None

        def ours() -> dict[str, str] | None:
            name = str(state.image_request["Name"])
            mine = tags.made_by(self.context.run_id, "name", name)
            found = list(every(ec2, "describe_images", "Images", Owners=["self"], Filters=mine))
            return {"ImageId": found[0]["ImageId"]} if found else None

        with creating("the image"):
            made = made_once(
                lambda: ec2.create_image(**state.image_request),
                "InvalidAMIName.Duplicate",
                ours,
                "the image",
                within_s=NEW_IMAGE_VISIBLE_S,
            )
            state.image_id = made["ImageId"]
            self.context.created("image", state.image_id)
        failed = self._wait(state)
        if failed:
            # Not made again of this instance: CreateImage rebooted it (its default), and
            # cloud-init, systemd and the agent wrote their state anew after the hygiene (one
            # machine-id for every host of the image, the bake key authorized again). A fresh
            # instance, installed and cleaned anew; the failed image goes with the unwinding.
            raise Rerun(f"image {state.image_id} failed ({failed})")
        for snapshot_id in state.snapshot_ids:
            self.context.created("snapshot", snapshot_id)
        state.phases["snapshot"] = time.monotonic() - started

    def _wait(self, state: BakeState) -> str:
        """Until the image is available, then IMDSv2 only: '' then, or why it failed."""
        ec2 = self.context.cloud.ec2
        reason = ""

        def available() -> bool:
            nonlocal reason
            image = describe_new_image(ec2, state.image_id)
            state.snapshot_ids = snapshots_of(image)
            if image["State"] == "failed":
                reason = str(image.get("StateReason", {}).get("Message") or "no reason given")
                return True
            return bool(image["State"] == "available")

        wait_until(f"image {state.image_id} to become available", available, timeout_s=3600)
        if not reason:
            # IMDSv2 only, for every instance of the image (moto accepts and ignores this). Not
            # before it is available: a pending image's attributes cannot be changed
            # (InvalidAMIID.Unavailable), and it is pending for minutes.
            retry_on(
                IMAGE_NOT_FOUND,
                lambda: ec2.modify_image_attribute(
                    ImageId=state.image_id, ImdsSupport={"Value": "v2.0"}
                ),
                within_s=NEW_IMAGE_VISIBLE_S,
            )
        return reason

    def _delete(self, state: BakeState) -> None:
        ec2 = self.context.cloud.ec2
        for snapshot_id in delete_image(
            ec2, state.image_id, state.snapshot_ids, unseen_for=NEW_IMAGE_VISIBLE_S
        ):
            self.context.deleted("snapshot", snapshot_id)
        self.context.deleted("image", state.image_id)
        state.snapshot_ids = []
        # Recorded, then its mark failed: its record is retired with it.
        bake.mark_retired(state.amis_file, bake.retired_now([state.image_id]))

    def cleanup(self, state: BakeState) -> None:
        if not state.image_id or state.keep_image:
            return
        self._delete(state)


_SIZE = re.compile(r"size_mb=(\d+) available_mb=(\d+) vcpus=(\d+) reserve_mb_per_vcpu=(\d+)")


class BootTest:
    """Launch a fresh instance of the image and check what its boot must have done."""

    name = "boot-test"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BakeState) -> None:
        ec2 = self.context.cloud.ec2
        started = time.monotonic()
        instance_type = state.instance_type or state.family.instance_type(state.size)
        network = self.context.network()
        zones = zones_offering(ec2, [instance_type]).get(instance_type, set())
        # Named, as the interface carries it. On-demand capacity is an AZ's: one that has none
        # refuses (InsufficientInstanceCapacity) and the next may not; a bake that gave up there
        # had paid for its build and image.
        subnets = network.subnets_in(zones)
        for n, subnet in enumerate(subnets, 1):
            try:
                with creating("the boot-test instance"):
                    reservation = ec2.run_instances(
                        ImageId=state.image_id,
                        InstanceType=instance_type,
                        MinCount=1,
                        MaxCount=1,
                        KeyName=state.key_name,
                        **network.interfaces(state.security_group_id, subnet),
                        MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                        # Per-launch settings reach the image through user data: the check
                        # below reads them back. Its deadline too (amibake.deadline): a bake
                        # SIGKILLed in its boot test left the instance to gc.
                        UserData=deadline.appended(
                            state.boot_user_data, self.context.cloud.config.instance_deadline_min
                        ),
                        InstanceInitiatedShutdownBehavior="terminate",
                        TagSpecifications=[
                            tags.specification(
                                "instance",
                                {
                                    **self.context.tags,
                                    tags.STEP: "boot-test",
                                    tags.LABEL: state.label,
                                },
                            ),
                            tags.specification("volume", self.context.tags),
                        ],
                    )
                    state.boot_instance_id = reservation["Instances"][0]["InstanceId"]
                    self.context.created("instance", state.boot_instance_id)
                break
            except botocore.exceptions.ClientError as exc:
                if error_code(exc) != "InsufficientInstanceCapacity" or n == len(subnets):
                    raise
                log.warning(
                    "%s: no %s capacity in the subnet's zone; trying another (%d of %d)",
                    state.label,
                    instance_type,
                    n + 1,
                    len(subnets),
                )
        remote = reach(
            self.context.cloud,
            state.boot_instance_id,
            state.private_key,
            cancel=self.context.cancel,
        )
        try:
            state.boot_report = self._check(state, remote)
        finally:
            remote.close()
        state.phases["boot_test"] = time.monotonic() - started

    def _check(self, state: BakeState, remote: Any) -> dict[str, Any]:
        app = state.artifacts[0].app
        out = remote.run(
            "while [ ! -e /var/lib/cloud/instance/boot-finished ]; do sleep 0.2; done; "
            "findmnt -n -b -o FSTYPE,SIZE /shared || echo 'none 0'; "
            "tail -n 1 /var/log/amibake/shared-tmpfs.log || true; "
            "tail -n 1 /var/log/amibake/stage.log || true; "
            f"test -s /shared/{app}/manifest.json && echo staged || echo not-staged; "
            "test -e /etc/systemd/system/multi-user.target.wants/ecs.service "
            "&& echo ecs-enabled || echo ecs-disabled; "
            "grep -h '^ECS_CLUSTER=' /etc/ecs/ecs.config | tail -n 1 || echo ECS_CLUSTER=",
            stream=False,
            timeout_s=300,
        ).stdout.splitlines()
        fstype, size_bytes = [*out[0].split(), "0"][:2]
        sized = _SIZE.search("\n".join(out))
        report = {
            "fstype": fstype,
            "size_mb": int(size_bytes) // (1024 * 1024),
            "tmpfs_log": out[1] if len(out) > 1 else "",
            "stage_log": out[2] if len(out) > 2 else "",
            "staged": "staged" in out,
            "ecs_enabled": "ecs-enabled" in out,
            "ecs_cluster": next(
                (line.split("=", 1)[1] for line in out if line.startswith("ECS_CLUSTER=")), ""
            ),
        }
        problems = []
        if fstype != "tmpfs":
            problems.append(f"/shared is {fstype}, not a tmpfs")
        if sized is None:
            problems.append("the tmpfs unit logged no size")
        else:
            want = bake.tmpfs_mb(int(sized[2]), int(sized[3]), int(sized[4]))
            if abs(report["size_mb"] - want) > 1:
                problems.append(f"/shared is {report['size_mb']} MiB, expected {want}")
        if not report["staged"]:
            problems.append(f"nothing staged in /shared/{app}")
        if not report["ecs_enabled"]:
            problems.append("the ECS agent is not enabled")
        if report["ecs_cluster"] != bake.BOOT_TEST_CLUSTER:
            problems.append(
                f"the launch's user data did not set ECS_CLUSTER={bake.BOOT_TEST_CLUSTER} "
                f"(ecs.config says {report['ecs_cluster'] or 'nothing'})"
            )
        if not problems:  # the details only mean something once the basics hold
            problems += self._check_staged(state, remote, report)
        if problems:
            raise RemoteError(f"boot test of {state.image_id}: {'; '.join(problems)}")
        return report

    def _check_staged(self, state: BakeState, remote: Any, report: dict[str, Any]) -> list[str]:
        """Each app's staged build is the one for this family (or the fallback) and it runs."""
        expected = bake.fallbacks(state.artifacts)
        family = state.family.name
        problems = []
        host = cpu_module.from_facts(
            cpu_module.facts(remote.run(cpu_module.FACTS_SCRIPT, stream=False).stdout)
        )
        report["apps"] = {}
        for app, generic in expected.items():
            built = {a.family for a in state.artifacts if a.app == app}
            want = family if family in built else generic
            staged = json.loads(remote.run(f"cat /shared/{app}/manifest.json", stream=False).stdout)
            result = {"family": staged.get("family"), "smoke": "not run"}
            if staged.get("family") != want:
                problems.append(f"/shared/{app} holds the {staged.get('family')} build, not {want}")
            command = staged.get("smoke_command")
            verdict = cpu_module.verdict(
                str(staged.get("architecture")), set(staged.get("isa_features", [])), host
            )
            if command and verdict.runs:
                programs = list(staged.get("programs", []))
                ran = remote.run(
                    cpu_module.command_in(f"/shared/{app}", command, programs, verdict),
                    stream=False,
                    check=False,
                )
                ok = ran.exit_code == 0 and staged.get("smoke_expect", "") in ran.stdout
                result["smoke"] = "passed" if ok else f"failed: {ran.tail}"
                result["smoke_on"] = verdict.how
                if not ok:
                    problems.append(f"/shared/{app}: smoke run failed: {ran.tail}")
            elif command:
                result["smoke"] = f"skipped: this CPU {verdict.reason}"
            report["apps"][app] = result
        return problems

    def cleanup(self, state: BakeState) -> None:
        known = [state.boot_instance_id] if state.boot_instance_id else []
        terminate_launched(self.context, "boot-test", state.label, known)


class Record:
    """The image passed: keep it, and write what went into it to results/amis.json."""

    name = "record"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BakeState) -> None:
        # A kept image is the product, not a leftover: recorded, marked so gc leaves it, and no
        # longer tracked by the journal. Kept only once recorded and marked: one whose record or
        # tag failed is deleted by the cleanup. Recorded first: a SIGKILL between the two left
        # a marked image no record named, which neither gc nor bake --keep would ever delete
        # (billed for its snapshots); unmarked, gc deletes it and retires its record.
        record = {
            "image_id": state.image_id,
            "architecture": state.architecture,
            "region": self.context.cloud.config.region,
            "cloud": self.context.cloud.config.cloud,
            "base_ami": state.base_ami,
            "run_id": self.context.run_id,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "artifacts": {a.path.name: a.manifest for a in state.artifacts},
            "units": {
                path: hashlib.sha256(content.encode()).hexdigest()
                for path, (content, _) in sorted(state.files.items())
            },
            "boot_test": state.boot_report,
        }
        with bake.amis_changed(state.amis_file) as records:  # read (and checked) before too
            records.append(record)
        self.context.cloud.ec2.create_tags(
            Resources=[state.image_id, *state.snapshot_ids],
            Tags=[{"Key": tags.KEPT, "Value": "true"}],
        )
        state.keep_image = True
        self.context.deleted("image", state.image_id)
        for snapshot_id in state.snapshot_ids:
            self.context.deleted("snapshot", snapshot_id)

    def cleanup(self, state: BakeState) -> None:
        pass
