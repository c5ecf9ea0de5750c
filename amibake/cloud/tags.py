"""The tags every created resource carries, so ``amibake gc`` finds it even with no journal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

RUN_ID = "amibake:run-id"
OWNER = "amibake:owner"
EXPIRES = "amibake:expires"
STEP = "amibake:step"  # which step launched an instance, so its cleanup finds it by tag
LABEL = "amibake:label"  # which runner of the run (family or architecture) it belongs to
KEPT = "amibake:kept"  # a product (a baked image), not a leftover: gc leaves it alone
TOOL = "amibake"
# The local cloud tags each sandboxed instance with where its sshd listens (the one thing its
# address lookup reads); on AWS the instance's own IP is the address and the port is 22. Here, in
# a leaf, so the product and the local cloud both import it and neither imports the other.
LOCAL_SSH_TAG = "amibake-local:ssh"


def run_tags(run_id: str, owner: str, ttl: timedelta = timedelta(hours=6)) -> dict[str, str]:
    expires = (datetime.now(UTC) + ttl).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {RUN_ID: run_id, OWNER: owner, EXPIRES: expires}


def as_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def specification(resource_type: str, tags: dict[str, str]) -> dict[str, Any]:
    """One TagSpecifications entry: tags applied atomically at creation, never after."""
    return {"ResourceType": resource_type, "Tags": as_list(tags)}


def made_by(run_id: str, by: str, name: str) -> list[dict[str, Any]]:
    """EC2 describe filters for the resource of this name (`by`: key-name, group-name, name)
    that the run made: the name alone could be anyone's."""
    return [{"Name": by, "Values": [name]}, {"Name": f"tag:{RUN_ID}", "Values": [run_id]}]


def parse_expires(value: str) -> datetime | None:
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
