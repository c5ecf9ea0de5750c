"""A container image as a workload: its reference, what ECR says of it, and how an instance runs it.

A bench or tune file names ``image = "ACCOUNT.dkr.ecr.REGION.amazonaws.com/app:tag"`` and a
``command = "... {args}"`` run inside it. Before anything is launched, the image's manifest is
read through ECR's API (BatchGetImage, and the config blob through GetDownloadUrlForLayer for a
single-architecture image): a reference that does not parse, a tag that does not exist, a type
whose architecture the image lacks, or a GPU type run without its GPUs requested, is refused in
one line.

The registry's address is the ``proxyEndpoint`` of GetAuthorizationToken, as AWS tells every
client to use (the ECR host itself on AWS; the local cloud's loopback registry there): nothing else
differs between the clouds. Instances pull by digest, the one preflight read, so every replicate
runs the same bytes even when the tag moves during the run.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.exceptions

from amibake import instance_kinds
from amibake.cloud import Cloud
from amibake.cloud.calls import every
from amibake.cloud.media_types import INDEX_TYPES, MANIFEST_TYPES
from amibake.errors import EnvironmentProblem, UserError

# ECR's private registry host, the repository path, then a tag or a digest (none: "latest", as
# docker pulls it).
REFERENCE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com"
    r"/(?P<repository>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})|@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
EXAMPLE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1"
SHOWN_TAGS = 8  # a missing tag's error names this many of the repository's, then counts the rest
# OCI names architectures as Go does; EC2 and the AMIs as the kernel's x86_64 / arm64.
EC2_ARCHITECTURE = {"amd64": "x86_64", "arm64": "arm64"}
OCI_ARCHITECTURE = {v: k for k, v in EC2_ARCHITECTURE.items()}
# The presigned layer URLs are S3's (on AWS) or the local registry's (loopback): a proxy the
# user set for S3 is honoured, and a loopback address never goes through one.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_PROXIED = urllib.request.build_opener()


def _opener(url: str) -> urllib.request.OpenerDirector:
    host = urllib.parse.urlsplit(url).hostname or ""
    return _DIRECT if host == "localhost" or host.startswith("127.") else _PROXIED


@dataclass(frozen=True)
class ImageRef:
    account: str
    region: str
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        match = REFERENCE.match(text.strip())
        if match is None and ".amazonaws.com.cn/" in text:
            raise ValueError(
                f"{text!r} is an ECR image of AWS's China partition: amibake works in the "
                f"commercial partition's regions only (e.g. {EXAMPLE})"
            )
        if match is None:
            raise ValueError(
                f"{text!r} is not an ECR image reference: write ACCOUNT.dkr.ecr.REGION."
                f"amazonaws.com/REPOSITORY:TAG, e.g. {EXAMPLE}"
            )
        found = match.groupdict()
        tag = found["tag"] or ("" if found["digest"] else "latest")
        return cls(
            found["account"], found["region"], found["repository"], tag, found["digest"] or ""
        )

    @property
    def image_id(self) -> dict[str, str]:
        return {"imageDigest": self.digest} if self.digest else {"imageTag": self.tag}

    def __str__(self) -> str:
        host = f"{self.account}.dkr.ecr.{self.region}.amazonaws.com"
        return f"{host}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


@dataclass(frozen=True)
class Image:
    """What ECR holds under a reference: its digest and the architectures it has (EC2's names)."""

    reference: ImageRef
    digest: str
    architectures: tuple[str, ...]
    # Each architecture's own manifest (the index's entry; the image itself when single): what
    # a Batch job definition of that architecture pins.
    variants: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Login:
    """Where and how to reach a registry: GetAuthorizationToken's answer."""

    host: str  # host[:port] of the proxyEndpoint
    username: str
    password: str = field(repr=False)  # ECR's 12-hour token: never in a log or a traceback
    insecure: bool  # plain http: the local cloud's loopback registry

    def pull_name(self, ref: ImageRef, digest: str) -> str:
        return f"{self.host}/{ref.repository}@{digest}"


def login(cloud: Cloud, ref: ImageRef) -> Login:
    data = cloud.client("ecr").get_authorization_token(registryIds=[ref.account])
    entry = data["authorizationData"][0]
    username, _, password = base64.b64decode(entry["authorizationToken"]).decode().partition(":")
    endpoint = urllib.parse.urlparse(entry["proxyEndpoint"])
    return Login(endpoint.netloc, username, password, endpoint.scheme == "http")


# Read once per image and cloud for the life of the process (a run, or a tune's trials): the
# preflight's answer is the digest every instance pulls, even if the tag moves meanwhile.
_seen: dict[tuple[str, str, str], Image] = {}
_lock = threading.Lock()


def preflight(cloud: Cloud, reference: str, types: Iterable[str], gpus: int) -> Image:
    """The run's image as ECR has it, checked against every type the run may launch and the
    GPUs it asks for: a UserError naming the fix, before anything is launched."""
    ref = ImageRef.parse(reference)
    image = lookup(cloud, ref)
    for instance_type in types:
        kind = instance_kinds.kind_of(cloud, instance_type)
        carried = tuple(getattr(kind, "gpus", ()))
        problem = check(image, instance_type, kind.architecture, carried, gpus)
        if problem:
            raise UserError(problem)
    return image


def lookup(cloud: Cloud, ref: ImageRef) -> Image:
    """The image under `ref` as ECR has it; a UserError naming what is missing."""
    key = (str(cloud.endpoint_url or ""), cloud.config.region, str(ref))
    with _lock:
        if key in _seen:
            return _seen[key]
    image = _lookup(cloud, ref)
    with _lock:
        return _seen.setdefault(key, image)


def _lookup(cloud: Cloud, ref: ImageRef) -> Image:
    if ref.region != cloud.config.region:
        raise UserError(
            f"image {ref} is in {ref.region} and the run in {cloud.config.region}: push (or "
            f"replicate) it to {cloud.config.region}, or run with --region {ref.region}"
        )
    ecr = cloud.client("ecr")
    try:
        answer = ecr.batch_get_image(
            registryId=ref.account,
            repositoryName=ref.repository,
            imageIds=[ref.image_id],
            acceptedMediaTypes=[*INDEX_TYPES, *MANIFEST_TYPES],
        )
    except botocore.exceptions.ClientError as exc:
        if "RepositoryNotFound" in str(exc):
            raise UserError(
                f"image {ref}: ECR has no repository {ref.repository} in account {ref.account} "
                f"({ref.region}); create it and push the image (aws ecr create-repository)"
            ) from None
        raise
    if not answer.get("images"):
        tags = _tags(ecr, ref)
        more = f" and {len(tags) - SHOWN_TAGS} more" if len(tags) > SHOWN_TAGS else ""
        said = (
            f"; it has {', '.join(tags[:SHOWN_TAGS])}{more}" if tags else "; it has no tagged image"
        )
        what = f"digest {ref.digest}" if ref.digest else f"tag {ref.tag!r}"
        raise UserError(f"image {ref}: repository {ref.repository} has no {what}{said}")
    found = answer["images"][0]
    manifest = json.loads(found["imageManifest"])
    digest = found["imageId"]["imageDigest"]
    if found.get("imageManifestMediaType") in INDEX_TYPES or "manifests" in manifest:
        variants = {
            EC2_ARCHITECTURE.get(m.get("platform", {}).get("architecture", ""), ""): m["digest"]
            for m in manifest["manifests"]
            if m.get("platform", {}).get("os", "linux") == "linux"
        }
    else:
        variants = {_config_architecture(ecr, ref, manifest["config"]["digest"]): digest}
    variants.pop("", None)  # platforms EC2 has no instances of
    return Image(ref, digest, tuple(sorted(variants)), variants)


def _tags(ecr: Any, ref: ImageRef) -> list[str]:
    """Every tag in the repository: DescribeImages pages (by 100), and a first page taken for
    all named a few tags at random as what the repository has."""
    details = every(
        ecr,
        "describe_images",
        "imageDetails",
        registryId=ref.account,
        repositoryName=ref.repository,
    )
    return sorted(t for d in details for t in d.get("imageTags", []))


def _config_architecture(ecr: Any, ref: ImageRef, config_digest: str) -> str:
    url = ecr.get_download_url_for_layer(
        registryId=ref.account, repositoryName=ref.repository, layerDigest=config_digest
    )["downloadUrl"]
    try:
        with _opener(url).open(url, timeout=60) as response:
            return EC2_ARCHITECTURE.get(json.loads(response.read()).get("architecture", ""), "")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnvironmentProblem(
            f"{ref}: cannot read the image's configuration from ECR's layer URL ({reason}); "
            "check the network (or HTTPS_PROXY) to S3 in the region"
        ) from None


def check(
    image: Image, instance_type: str, architecture: str, gpus: tuple[str, ...], wanted: int
) -> str:
    """Why `image` cannot be benchmarked on the type as asked, or ''."""
    if architecture not in image.architectures:
        has = ", ".join(image.architectures) or "no linux"
        graviton = " (Graviton)" if architecture == "arm64" else ""
        return (
            f"{instance_type}{graviton} needs an {architecture} image and {image.reference} has "
            f"{has} only: push a multi-architecture image (an index with linux/"
            f"{OCI_ARCHITECTURE.get(architecture, architecture)}), or drop {instance_type}"
        )
    if gpus and not wanted:
        return (
            f"{instance_type} has GPUs ({', '.join(gpus)}) and the run requests none: add "
            f"gpus = N to the file so the container gets them, or pick a type without GPUs"
        )
    if wanted and not gpus:
        return f"{instance_type} has no GPU and the run requests gpus = {wanted}: pick a GPU type"
    carried = sum(int(g.split(" x ", 1)[0]) for g in gpus if g.split(" x ", 1)[0].isdigit())
    if gpus and wanted > carried:
        # Batch would never place the job (it waits RUNNABLE), and docker run --gpus fails
        # on an instance already paid for.
        return (
            f"{instance_type} has {carried} GPU{'s' * (carried != 1)} ({', '.join(gpus)}) and "
            f"the run requests gpus = {wanted}: ask for at most {carried}, or pick a larger type"
        )
    return ""


def push(cloud: Cloud, source: str, ref: ImageRef) -> None:
    """Copy an image (a skopeo transport: ``oci:DIR:TAG``, ``docker-archive:FILE``...) with every
    architecture it has to `ref`, logged in with ECR's token at its proxyEndpoint."""
    program = shutil.which("skopeo")
    if program is None:
        raise EnvironmentProblem("pushing an image needs skopeo: sudo apt-get install skopeo")
    where = login(cloud, ref)
    destination = f"docker://{where.host}/{ref.repository}:{ref.tag or 'latest'}"
    # The token (ECR's: a 12-hour password to the registry) goes in an auth file only this
    # user reads, never on the command line, which every user reads in /proc/PID/cmdline.
    with tempfile.TemporaryDirectory(prefix="amibake-ecr-") as private:
        authfile = Path(private) / "auth.json"
        token = base64.b64encode(f"{where.username}:{where.password}".encode()).decode()
        authfile.touch(mode=0o600)
        authfile.write_text(json.dumps({"auths": {where.host: {"auth": token}}}))
        done = subprocess.run(
            [
                program,
                "copy",
                "--all",
                "--quiet",
                f"--dest-tls-verify={'false' if where.insecure else 'true'}",
                "--dest-authfile",
                str(authfile),
                source,
                destination,
            ],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise UserError(f"skopeo could not push {source} to {ref}: {done.stderr.strip()[-300:]}")


# The replicate's container, by name: a timeout's SIGKILL to the replicate's process group ends
# the docker client, not the container (dockerd's), which ran on beside every later replicate.
CONTAINER_NAME = "fleet-workload"
# What the replicate wrapper runs once the workload's group is gone (FLEET_CLEANUP): nothing
# to remove is no error.
REMOVE_LINE = f"sudo -n docker rm -f {CONTAINER_NAME}"


def run_line(pull: str, architecture: str, command: str, shell: bool, gpus: int) -> str:
    """The shell line that runs `command` in the image on its instance (run by the replicate
    wrapper in the replicate's directory, which the container sees at the same path, with
    $FLEET_METRIC_FILE). With a POSIX shell in the image the command is a shell line; without
    one, its words are run as they are."""
    options = [
        "--rm",
        f"--name {CONTAINER_NAME}",  # one at a time on an instance: see REMOVE_LINE
        "--network host",
        f"--platform linux/{OCI_ARCHITECTURE[architecture]}",
        '-v "$PWD:$PWD"',
        '-w "$PWD"',
        # sudo keeps no environment: the metric file's path goes by value.
        '-e FLEET_METRIC_FILE="$FLEET_METRIC_FILE"',
    ]
    if gpus:
        options.append(f"--gpus {gpus}")
    if shell:
        run = f"--entrypoint /bin/sh {pull} -c {shlex.quote(command)}"
    else:
        words = shlex.split(command)
        run = f"--entrypoint {shlex.quote(words[0])} {pull} " + " ".join(
            map(shlex.quote, words[1:])
        )
    # As root: the AMI's docker socket is root's (ec2-user is not in the docker group).
    return f"sudo -n docker run {' '.join(options)} {run}"
