"""The media types of a container image's index (several architectures) and of its manifest
(one), in OCI's and Docker's spelling: ECR serves both. A leaf, so the product's image reader
and the local cloud's registry agree on them."""

from __future__ import annotations

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
