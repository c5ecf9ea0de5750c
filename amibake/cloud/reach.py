"""From an instance id to a verified SSH connection: running, addressed, fingerprinted, open."""

from __future__ import annotations

import threading
import time
from typing import IO

import botocore.exceptions

from amibake.cloud.calls import error_code
from amibake.cloud.ec2 import describe_instance
from amibake.cloud.session import Cloud, NoAddress
from amibake.errors import CloudError, HostKeyMismatch, RemoteError, UserError
from amibake.progress import Progress
from amibake.remote import Remote, Sink, load_private_key, parse_fingerprints

# EC2 fills in a running instance's addresses at once, but a describe may lag the state by a few
# seconds (eventual consistency): past this, an instance running without the address SSH dials
# will never get one, and waiting the whole SSH timeout for it helps nobody.
ADDRESS_GRACE_S = 30.0


def no_address(cloud: Cloud, instance_id: str) -> UserError:
    if cloud.config.ssh_address == "public":
        fix = (
            "it was asked for one, so the account refuses public addresses here: set "
            'ssh_address = "private" and run from a machine that reaches the VPC (VPN, peering, '
            "an instance inside it)"
        )
    else:
        fix = 'set ssh_address = "public" to dial its public address'
    return UserError(
        f"{instance_id} is running without a {cloud.config.ssh_address} IPv4 address, so SSH "
        f"cannot reach it: {fix}"
    )


def describe(cloud: Cloud, instance_id: str) -> dict[str, object]:
    """Describe one instance; a NotFound right after launch is EC2's eventual consistency,
    retried for as long as EC2 may take to see a new instance (minutes)."""
    try:
        return describe_instance(cloud.ec2, instance_id)
    except botocore.exceptions.ClientError as exc:
        raise CloudError(f"describe {instance_id}: {exc}") from exc


def console_output(cloud: Cloud, instance_id: str) -> str:
    """The instance's console output as it is now. Without Latest, EC2 returns what it buffered
    at the last state change, which on AWS lags the boot by minutes, and every SSH connection
    waited for it; Nitro types (every family in the catalog) serve the latest output."""
    try:
        found = cloud.ec2.get_console_output(InstanceId=instance_id, Latest=True)
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if not code.startswith(("Unsupported", "InvalidParameter")):
            raise
        found = cloud.ec2.get_console_output(InstanceId=instance_id)  # a Xen type: buffered only
    return str(found.get("Output", "") or "")


def reach(
    cloud: Cloud,
    instance_id: str,
    private_key_pem: str,
    *,
    timeout_s: float | None = None,
    sink: Sink | None = None,
    log: IO[str] | None = None,
    cancel: threading.Event | None = None,
) -> Remote:
    """Wait for the instance and return an open, host-key-verified connection to it."""
    timeout_s = cloud.config.ssh_timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    progress = Progress(f"waiting for SSH on {instance_id}")
    key = load_private_key(private_key_pem)
    delay = 0.02
    last_problem = "not started"
    unaddressed_since: float | None = None
    while time.monotonic() < deadline:
        if cancel is not None and cancel.is_set():
            raise RemoteError(f"{instance_id}: cancelled while waiting for SSH")
        instance = describe(cloud, instance_id)
        state = instance["State"]["Name"]  # type: ignore[index]
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            reason = instance.get("StateReason", {}).get("Message", "")  # type: ignore[attr-defined]
            raise CloudError(f"{instance_id} is {state} before SSH was reachable {reason}".strip())
        if state == "running":
            try:
                host, port = cloud.ssh_endpoint(instance)
                fingerprints = parse_fingerprints(console_output(cloud, instance_id))
                if not fingerprints:
                    last_problem = "no host key fingerprints in the console output yet"
                else:
                    remote = Remote(
                        host, port, cloud.config.ssh_user, key, fingerprints, sink, log, cancel
                    )
                    remote.open()
                    progress.done("connected")
                    return remote
            except HostKeyMismatch:
                raise
            except NoAddress as exc:
                now = time.monotonic()
                unaddressed_since = unaddressed_since or now
                if now - unaddressed_since > ADDRESS_GRACE_S:
                    raise no_address(cloud, instance_id) from None
                last_problem = str(exc)
            except (CloudError, RemoteError) as exc:
                last_problem = str(exc)
        else:
            last_problem = f"state {state}"
        progress.tick(last_problem)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)  # SSH is tried at least once a second
    hint = ""
    if cloud.config.ssh_address == "public" and "address" not in last_problem:
        # Addressed but never answering: the usual cause is a subnet without a route to an
        # internet gateway, or a firewall between this machine and AWS.
        hint = (
            " (a public address that never answers: check the subnet routes to an internet "
            'gateway, or set ssh_address = "private" from inside the VPC)'
        )
    raise RemoteError(
        f"{instance_id}: SSH not reachable within {timeout_s:.0f}s: {last_problem}{hint}"
    )
