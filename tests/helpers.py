"""Test helpers: launching on the local cloud, an independent look for leftovers, and EC2 errors
to inject on the wire."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.awsrequest import AWSResponse

from amibake import config, cpu, ssh_keys
from amibake.cloud import Cloud
from amibake.cloud.calls import every, made_once
from amibake.cloud.reach import reach
from amibake.remote import Remote

if TYPE_CHECKING:
    import pytest

BASE_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id"


def pick_family(machine: cpu.Cpu) -> str:
    """The family the suite's fixtures take for `machine` (cpu.best_family)."""
    family = cpu.best_family(machine)
    assert family, f"no family's build runs on {machine}: install qemu-user-static (make install)"
    return family


def other_architecture_family(machine: cpu.Cpu) -> str:
    """The best family of the other architecture this machine runs (under QEMU): for tests of
    cross builds."""
    other = "arm64" if machine.architecture == "x86_64" else "x86_64"
    family = cpu.best_family(machine, architecture=other)
    assert family, f"no {other} family's build runs on {machine}: install qemu-user-static"
    return family


def base_ami(cloud: Cloud) -> str:
    return cloud.ssm.get_parameter(Name=BASE_AMI_PARAMETER)["Parameter"]["Value"]


def launch(
    cloud: Cloud, *, image_id: str | None = None, user_data: str | None = None
) -> tuple[str, str]:
    """Launch one instance with a fresh key pair; return (instance id, private key PEM)."""
    # Imported, as the product does: under --faults aws a create's answer may be lost and the
    # create sent again (lost-answers); RunInstances carries botocore's own ClientToken.
    private, public = ssh_keys.ed25519()
    name = f"test-{uuid.uuid4().hex[:8]}"
    made_once(
        lambda: cloud.ec2.import_key_pair(KeyName=name, PublicKeyMaterial=public.encode()),
        "InvalidKeyPair.Duplicate",
        lambda: name,
        "the test's key pair",
        within_s=0.0,
    )
    extra: dict[str, Any] = {"UserData": user_data} if user_data else {}
    reservation = cloud.ec2.run_instances(
        ImageId=image_id or base_ami(cloud),
        InstanceType="c7i.large",
        MinCount=1,
        MaxCount=1,
        KeyName=name,
        MetadataOptions={"HttpTokens": "required"},
        **extra,
    )
    return reservation["Instances"][0]["InstanceId"], private


def launch_and_reach(cloud: Cloud, **kw: Any) -> tuple[str, Remote]:
    instance_id, pem = launch(cloud, **kw)
    return instance_id, reach(cloud, instance_id, pem, timeout_s=30)


def leftovers(directory: Path) -> list[str]:
    """Processes, mounts and sandbox directories of a local cloud that should be gone.

    Written independently of amibake.local's own cleanup, so it can catch that code missing one.
    """
    found: list[str] = []
    marker = str(directory.resolve() / "sandboxes")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            root = os.readlink(proc / "root")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if root.startswith(marker) or marker in cmdline:
            found.append(f"process {proc.name}: {cmdline[:80]}")
    for line in Path("/proc/mounts").read_text().splitlines():
        if str(directory.resolve()) in line:
            found.append(f"mount {line}")
    sandboxes = directory / "sandboxes"
    if sandboxes.exists():
        found += [f"directory {p}" for p in sandboxes.iterdir()]
    return found


# Shell that returns once cloud-init has finished an instance's boot: sshd answers before the
# user data has run (as on EC2), so what the user data makes is read after this.
BOOT_FINISHED = "while [ ! -e /var/lib/cloud/instance/boot-finished ]; do sleep 0.05; done"


def wait_for(condition: Any, timeout_s: float = 60.0, what: str = "the condition") -> None:
    """Poll ``condition`` until it holds: for what happens asynchronously (a guest's boot, a
    job's state) where a single look races it on a loaded host."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.2)


def wait_until_clean(directory: Path, timeout_s: float = 15.0) -> list[str]:
    """Leftovers after giving asynchronous teardown (the reconcile loop) a moment: up to 15 s,
    a 1 s loop and a sandbox's stop on a loaded host (it returns as soon as nothing is left)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = leftovers(directory)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def tagged_alive(cloud: Cloud, run_id: str) -> list[str]:
    """Everything in the cloud tagged with the run id that still exists (independent of gc),
    read to the last page: a leftover on a second page must not pass for nothing left."""
    ec2 = cloud.ec2
    tag = [{"Name": "tag:amibake:run-id", "Values": [run_id]}]
    alive = [
        f"instance {i['InstanceId']} {i['State']['Name']}"
        for r in every(ec2, "describe_instances", "Reservations", Filters=tag)
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    alive += [f"key-pair {k['KeyName']}" for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]]
    alive += [
        f"security-group {g['GroupId']}"
        for g in every(ec2, "describe_security_groups", "SecurityGroups", Filters=tag)
    ]
    alive += [
        f"launch-template {t['LaunchTemplateId']}"
        for t in every(ec2, "describe_launch_templates", "LaunchTemplates", Filters=tag)
    ]
    # DescribeFleets without ids never lists instant fleets (on AWS, and under the local cloud's
    # fleet-errors): the run's fleets are asked for by the ids its journal holds.
    from amibake.journal import Journal

    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    fleet_ids = sorted(
        {r.resource_id for r in journal.resources(run_id) if r.kind == "fleet"}
        | {
            f["FleetId"]
            for f in every(ec2, "describe_fleets", "Fleets")
            if {"Key": "amibake:run-id", "Value": run_id} in f.get("Tags", [])
        }
    )
    alive += [
        f"fleet {f['FleetId']} {f['FleetState']}"
        for f in (ec2.describe_fleets(FleetIds=fleet_ids)["Fleets"] if fleet_ids else [])
        if not f["FleetState"].startswith("deleted")
    ]
    alive += [
        f"volume {v['VolumeId']}" for v in every(ec2, "describe_volumes", "Volumes", Filters=tag)
    ]
    client = cloud.client("batch")  # one deleted is described DELETED for a while, as on AWS
    alive += [
        f"compute-environment {e['computeEnvironmentName']}"
        for e in every(client, "describe_compute_environments", "computeEnvironments")
        if e.get("tags", {}).get("amibake:run-id") == run_id and e.get("status") != "DELETED"
    ]
    alive += [
        f"job-queue {q['jobQueueName']}"
        for q in every(client, "describe_job_queues", "jobQueues")
        if q.get("tags", {}).get("amibake:run-id") == run_id and q.get("status") != "DELETED"
    ]
    return alive


def tagged_images_alive(cloud: Cloud, run_id: str) -> list[str]:
    """Images and snapshots tagged with the run id (a failed bake must leave none)."""
    ec2 = cloud.ec2
    tag = [{"Name": "tag:amibake:run-id", "Values": [run_id]}]
    alive = [
        f"image {i['ImageId']}"
        for i in every(ec2, "describe_images", "Images", Owners=["self"], Filters=tag)
        if i.get("State") != "deregistered"  # EC2 describes one for a while after
    ]
    alive += [
        f"snapshot {s['SnapshotId']}"
        for s in every(ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"], Filters=tag)
    ]
    return alive


class _Body:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def ec2_error(code: str, status: int) -> AWSResponse:
    """An EC2 error response, for a before-send hook to return instead of sending the request."""
    body = (
        f"<Response><Errors><Error><Code>{code}</Code><Message>injected</Message></Error>"
        "</Errors><RequestID>injected</RequestID></Response>"
    ).encode()
    return AWSResponse("https://ec2.local", status, {}, _Body(body))  # type: ignore[arg-type]


@contextmanager
def ctrl_c_when(
    ready: Callable[[], bool], delay_s: float, timeout_s: float = 120
) -> Iterator[None]:
    """Inside the block, a thread waits until `ready()`, then `delay_s`, then sends this
    process SIGINT, as a terminal's Ctrl-C would. The signal cannot leak into another test: the
    sender gives up when the block ends first, and the KeyboardInterrupt handler is this
    block's own, restored only once the sender has stopped (a stray signal is then dropped)."""
    done = threading.Event()
    inside = threading.Event()
    inside.set()

    def send() -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if done.wait(0.2) or time.monotonic() > deadline:
                return
        if not done.wait(delay_s):
            os.kill(os.getpid(), signal.SIGINT)

    def interrupt(signum: int, frame: object) -> None:
        if inside.is_set():
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield
    finally:
        inside.clear()
        done.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)


def free_port_and_range() -> tuple[int, str]:
    """A free port for a local cloud of a test's own, and the loopback range its sandboxes take,
    made from the port (127.<high byte>.<low byte>.0/24): two clouds running at once hold two
    ports, so never one range, whether in this process, another pytest-xdist worker or a suite
    in another checkout. A range taken from the port modulo 50 let two of them meet once they
    ran side by side. Never a port whose range is the default 127.77 (a developer's own cloud).

    Outside the kernel's ephemeral range: a port picked by bind(0) comes from that range, so
    between the pick and the daemon's bind (a session's first local-cloud test may come minutes
    later) any outgoing connection on the machine could be given it.
    """
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = range(20_000, low) if low > 21_000 else range(high + 1, 65_536)
    chooser = random.SystemRandom()  # not the tests' seeded random: workers must differ
    while True:
        port = chooser.choice(ports)
        if port >> 8 == 77:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken: another suite's cloud, or a service
        return port, f"127.{port >> 8}.{port & 255}.0/24"


def own_local_cloud(
    directory: Path, monkeypatch: pytest.MonkeyPatch, faults: str = "none", seed: int = 0
) -> config.Config:
    """The config of a local cloud of the test's own (its directory, a free port, its own
    loopback range, its results), for tests that change the account (delete its default VPC,
    turn AWS behaviours on). The caller connects, and takes it down with control.down."""
    port, subnet = free_port_and_range()
    monkeypatch.setenv("AMIBAKE_CLOUD", "local")
    monkeypatch.setenv("AMIBAKE_LOCAL_DIR", str(directory / "cloud"))
    monkeypatch.setenv("AMIBAKE_LOCAL_PORT", str(port))
    monkeypatch.setenv("AMIBAKE_LOCAL_SUBNET", subnet)
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(directory / "results"))
    monkeypatch.setenv("AMIBAKE_LOCAL_FAULTS", faults)
    monkeypatch.setenv("AMIBAKE_LOCAL_FAULTS_SEED", str(seed))
    return config.load()


def left_queue(cloud: Cloud, environment: str, run_id: str) -> str:
    """A fleet run's job queue on `environment`, tagged and journaled as a run leaves it when
    its controller is SIGKILLed: what gc finds and deletes. Returns its name."""
    from amibake import batch
    from amibake.journal import Journal

    client = cloud.client("batch")
    name = f"fleet-{run_id.removeprefix('ab-')}"
    client.create_job_queue(
        jobQueueName=name,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
        tags={"amibake:run-id": run_id},
    )
    batch.wait_valid(client, "job queue", name)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    journal.created(run_id, "job-queue", name, cloud.config.region, "local")
    return name
