"""From an instance id to a verified SSH connection: running, addressed, fingerprinted, open."""

from __future__ import annotations

import threading
import time
from typing import IO

import botocore.exceptions

from amibake.cloud.calls import error_code
from amibake.cloud.ec2 import describe_instance
from amibake.cloud.session import Cloud
from amibake.errors import CloudError, HostKeyMismatch, RemoteError
from amibake.progress import Progress
from amibake.remote import Remote, Sink, load_private_key, parse_fingerprints


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
            except (CloudError, RemoteError) as exc:
                last_problem = str(exc)
        else:
            last_problem = f"state {state}"
        progress.tick(last_problem)
        time.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise RemoteError(f"{instance_id}: SSH not reachable within {timeout_s:.0f}s: {last_problem}")
