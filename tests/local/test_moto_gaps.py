"""amibake.local.moto_gaps: what it changes in moto answers as moto did, only sooner."""

from __future__ import annotations

from typing import Any

import pytest
from moto.ec2.models import EC2Backend
from moto.ec2.models.tags import TagBackend

from amibake.local import moto_gaps


def test_the_tags_of_one_resource_are_moto_s_own_answer() -> None:
    moto_gaps.apply()
    patched = TagBackend.describe_tags
    original: Any = getattr(patched, "__wrapped__", None)
    assert original is not None, "moto_gaps.apply did not replace TagBackend.describe_tags"
    backend = EC2Backend("us-east-1", "123456789012")
    # i-1 is a prefix of i-12: an id must match exactly, as moto's anchored patterns do.
    backend.create_tags(["i-1"], {"Name": "one", "amibake:run-id": "r1"})
    backend.create_tags(["i-12"], {"Name": "twelve"})
    backend.create_tags(["sg-1"], {"amibake:run-id": "r1"})
    backend.create_tags(["i-1"], {"later": "added"})
    filters: list[dict[str, list[str]] | None] = [
        {"resource-id": ["i-1"]},
        {"resource-id": ["i-12"]},
        {"resource-id": ["sg-1"]},
        {"resource-id": ["i-404"]},
        {"resource-id": ["i-1*"]},
        {"resource-id": ["i-1", "sg-1"]},
        {"resource-id": ["i-1"], "key": ["Name"]},
        {"key": ["amibake:run-id"]},
        None,
    ]
    for f in filters:
        assert patched(backend, f) == original(backend, f), f
    assert [t["key"] for t in patched(backend, {"resource-id": ["i-1"]})] == [
        "Name",
        "amibake:run-id",
        "later",
    ]


def test_one_resource_s_tags_are_not_found_by_scanning_every_tag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the change: moto scanned the region's whole tag table for each resource."""
    moto_gaps.apply()
    backend = EC2Backend("us-east-1", "123456789012")
    backend.create_tags(["i-1"], {"Name": "one"})

    class Unscannable(dict[str, dict[str, str]]):
        def copy(self) -> Any:
            raise AssertionError("the whole tag table was scanned")

        def items(self) -> Any:
            raise AssertionError("the whole tag table was scanned")

    monkeypatch.setattr(backend, "tags", Unscannable(backend.tags))
    assert backend.describe_tags(filters={"resource-id": ["i-1"]})[0]["value"] == "one"
