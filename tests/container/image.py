"""A tiny two-architecture image, built without a Docker daemon: a static C program for x86_64
and arm64 (the host's compiler and the cross compiler the Makefile installs), the host
architecture's variant with busybox's POSIX shell beside it and the other without one, made
into an OCI layout with umoci and an OCI index naming both."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

WORK_C = Path(__file__).with_name("work.c")
OCI = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
COMPILERS = {"amd64": ("gcc", "x86_64-linux-gnu-gcc"), "arm64": ("gcc", "aarch64-linux-gnu-gcc")}
INDEX = "application/vnd.oci.image.index.v1+json"


def host_architecture() -> str:
    return OCI[platform.machine()]


def _compiler(architecture: str) -> str:
    native, cross = COMPILERS[architecture]
    return native if architecture == host_architecture() else cross


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / digest).write_bytes(data)
    return f"sha256:{digest}"


def build(directory: Path, architectures: tuple[str, ...] = ("amd64", "arm64")) -> str:
    """An OCI layout in `directory` with tag ``multi`` (an index of `architectures`), plus one
    tag per architecture; returns the layout path for ``oci:PATH:TAG``."""
    layout = directory / "layout"
    _run("umoci", "init", "--layout", str(layout))
    entries = []
    for architecture in architectures:
        root = directory / f"root-{architecture}"
        (root / "usr/bin").mkdir(parents=True)
        _run(
            _compiler(architecture), "-O1", "-static", "-o", str(root / "usr/bin/work"), str(WORK_C)
        )
        if architecture == host_architecture() and shutil.which("busybox"):
            (root / "bin").mkdir()
            shutil.copy(shutil.which("busybox") or "", root / "bin/busybox")
            os.symlink("busybox", root / "bin/sh")
        image = f"{layout}:{architecture}"
        _run("umoci", "new", "--image", image)
        _run("umoci", "insert", "--image", image, str(root), "/")
        _run("umoci", "config", "--image", image, "--architecture", architecture, "--os", "linux")
        index = json.loads((layout / "index.json").read_text())
        found = next(
            m
            for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == architecture
        )
        entries.append(
            {
                "mediaType": found["mediaType"],
                "digest": found["digest"],
                "size": found["size"],
                "platform": {"architecture": architecture, "os": "linux"},
            }
        )
    data = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}).encode()
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].append(
        {
            "mediaType": INDEX,
            "digest": _blob(layout, data),
            "size": len(data),
            "annotations": {"org.opencontainers.image.ref.name": "multi"},
        }
    )
    (layout / "index.json").write_text(json.dumps(index))
    return str(layout)


def push_to_ecr(cloud: Any, directory: Path, repository: str, tag: str = "v1") -> Any:
    """Build the two-architecture image and push it to the cloud's ECR (a repository created
    for it); returns its fleet.container.ImageRef."""
    from fleet import container

    account = cloud.client("sts").get_caller_identity()["Account"]
    ecr = cloud.client("ecr")
    with contextlib.suppress(ecr.exceptions.RepositoryAlreadyExistsException):
        ecr.create_repository(repositoryName=repository)
    layout = build(directory)
    ref = container.ImageRef.parse(
        f"{account}.dkr.ecr.{cloud.config.region}.amazonaws.com/{repository}:{tag}"
    )
    container.push(cloud, f"oci:{layout}:multi", ref)
    return ref


def login_and_pull(cloud: Any, remote: Any, ref: Any, architecture: str) -> str:
    """On an instance (`remote`): docker login to the cloud's ECR as the product does, pull the
    image's `architecture` variant (amd64 | arm64) by digest; returns the name pulled."""
    from fleet import container

    image = container.lookup(cloud, ref)
    where = container.login(cloud, ref)
    remote.run(
        f"sudo -n docker login --username {where.username} --password-stdin "
        f"{'http' if where.insecure else 'https'}://{where.host}",
        stdin=where.password.encode(),
        stream=False,
    )
    pull: str = where.pull_name(ref, image.digest)
    remote.run(f"sudo -n docker pull --platform linux/{architecture} {pull}", stream=False)
    return pull


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.container.image REPOSITORY[:TAG]``: build the image and push it to the
    configured cloud's ECR (make demo: the local cloud's)."""
    import argparse

    from amibake import config
    from amibake.connect import connect

    parser = argparse.ArgumentParser(prog="python -m tests.container.image")
    parser.add_argument("repository", help="REPOSITORY[:TAG] in the account's ECR")
    args = parser.parse_args(argv)
    repository, _, tag = args.repository.partition(":")
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        ref = push_to_ecr(connect(config.load()), Path(scratch), repository, tag or "v1")
    print(f"pushed {ref} (linux/amd64 and linux/arm64)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
