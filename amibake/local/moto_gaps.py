"""Where moto differs from EC2 in a way amibake's (correct) requests run into, filled in moto's
backend so the request on the wire stays exactly what amibake sends to AWS (a rewritten request
would no longer match its signature, which moto checks once IAM enforcement is on)."""

from __future__ import annotations

from typing import Any


def apply() -> None:
    _create_image_snapshot_tags()


def _create_image_snapshot_tags() -> None:
    """CreateImage accepts a "snapshot" TagSpecification on EC2; moto raises NotImplementedError.

    The image is created without it, and its tags are then put on the image's snapshot.
    """
    from moto.ec2.models.amis import AmiBackend

    original = AmiBackend.create_image
    if getattr(original, "_amibake", False):
        return

    def create_image(
        self: Any,
        instance_id: str,
        name: str,
        description: str,
        tag_specifications: list[dict[str, Any]],
    ) -> Any:
        snapshot = [s for s in tag_specifications if s.get("ResourceType") == "snapshot"]
        others = [s for s in tag_specifications if s.get("ResourceType") != "snapshot"]
        image = original(self, instance_id, name, description, others)
        for spec in snapshot:
            for tag in spec.get("Tags", []):
                image.ebs_snapshot.add_tag(tag["Key"], tag["Value"])
        return image

    create_image._amibake = True  # type: ignore[attr-defined]
    AmiBackend.create_image = create_image  # type: ignore[method-assign]
