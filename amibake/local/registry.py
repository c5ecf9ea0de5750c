"""The local cloud's ECR: moto's ECR API for the control plane, a real OCI registry for the layers.

The registry is Debian's ``docker-registry`` (the CNCF distribution, 2.8), started by the daemon
on a loopback port of its own and stopped with it, its storage under the local cloud's
directory. ``GetAuthorizationToken`` answers that port as the ``proxyEndpoint``: the address AWS
tells every client to log in to and push to (``https://ACCOUNT.dkr.ecr.REGION.amazonaws.com`` on
AWS), so the product reaches the registry the same way on both clouds.

moto never sees a push (it goes to the registry, not through the API). ECR has one store behind
both its API and its registry: a pushed image *is* what DescribeImages lists, at once. So
DescribeImages and BatchGetImage are answered from the registry's own manifests, not from moto's
records of PutImage calls: nothing to keep in step, no push to lose, and an image deleted from the
registry is gone from the API too. Registering pushes into moto (the registry's notification
webhook) was the other way: asynchronous, so an image just pushed could be missing from
DescribeImages, which ECR never does. moto still owns the repositories (CreateRepository,
DescribeRepositories, DeleteRepository): an image call for a repository it does not know is
refused with RepositoryNotFoundException, as ECR does. BatchDeleteImage and DeleteRepository
delete in the registry (a tag, an image, a repository's images) as ECR does, before moto
forgets the repository.

What differs from ECR, on purpose: one registry serves every account and region (a repository
name is the registry path); a push to a repository that was never created is accepted (ECR
refuses it); the token is not checked; DescribeImages without ids lists tagged images only (ECR
lists an index's own manifests too, untagged).
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from amibake.cloud.media_types import INDEX_TYPES, MANIFEST_TYPES
from amibake.errors import EnvironmentProblem, LocalCloudError
from amibake.local.moto_gaps import BACKENDS
from amibake.local.sandbox import remove_tree

log = logging.getLogger("amibake.local")

TARGET_PREFIX = "AmazonEC2ContainerRegistry_V20150921."
SERVED = {
    "DescribeImages",
    "BatchGetImage",
    "BatchDeleteImage",
    "DeleteRepository",
    "GetAuthorizationToken",
    "GetDownloadUrlForLayer",
}
# Every kind of manifest, lists first: asked with all of them, the registry answers what was pushed.
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
START_TIMEOUT_S = 20.0
# The registry is on loopback: a proxy from the environment must never be asked for it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CONFIG = """version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""
StartResponse = Callable[..., Any]
_CREDENTIAL = re.compile(r"Credential=([^/]+)/[^/]+/([^/]+)/([^/]+)/")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Registry:
    """One ``docker-registry`` process on loopback, its storage in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.directory / "storage"

    def start(self) -> None:
        program = shutil.which("docker-registry")
        if program is None:
            raise EnvironmentProblem(
                "the local cloud's ECR needs docker-registry: sudo apt-get install docker-registry"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        self.port = _free_port()
        config = self.directory / "config.yml"
        config.write_text(CONFIG.format(storage=self.storage, port=self.port))
        with (self.directory / "registry.log").open("ab") as out:
            self.process = subprocess.Popen(
                [program, "serve", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                close_fds=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LocalCloudError(
                    f"docker-registry exited with code {self.process.returncode}; see "
                    f"{self.directory / 'registry.log'}"
                )
            try:
                with _OPENER.open(self.endpoint + "/v2/", timeout=2):
                    log.info("registry up at %s", self.endpoint)
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise LocalCloudError(f"docker-registry did not answer within {START_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        remove_tree(self.directory)

    # --- reading what was pushed ------------------------------------------------------------

    def _get(self, path: str, accept: str = ACCEPT) -> tuple[bytes, dict[str, str]] | None:
        request = urllib.request.Request(self.endpoint + path, headers={"Accept": accept})
        try:
            with _OPENER.open(request, timeout=30) as response:
                return response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise LocalCloudError(f"the registry answered {exc.code} for {path}") from None

    def tags(self, repository: str) -> list[str]:
        found = self._get(f"/v2/{repository}/tags/list", "application/json")
        return list(json.loads(found[0]).get("tags") or []) if found else []

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        found = self._get(f"/v2/{repository}/manifests/{reference}")
        if found is None:
            return None
        body, headers = found
        media_type = headers.get("Content-Type", "").split(";")[0]
        digest = headers.get("Docker-Content-Digest", "")
        return Manifest(body, media_type, digest)

    def _repository_dir(self, repository: str) -> Path:
        return self.storage / "docker/registry/v2/repositories" / repository

    def has_images(self, repository: str) -> bool:
        """Whether any manifest, tagged or not, is stored under the repository."""
        revisions = self._repository_dir(repository) / "_manifests/revisions"
        return any(revisions.glob("*/*/link"))  # a deleted one keeps its folder, not its link

    def untag(self, repository: str, tag: str) -> None:
        """The tag alone, its image kept (the registry's API deletes manifests, not tags)."""
        remove_tree(self._repository_dir(repository) / "_manifests/tags" / tag)

    def delete_manifest(self, repository: str, digest: str) -> None:
        """The image and every tag that names it."""
        request = urllib.request.Request(
            f"{self.endpoint}/v2/{repository}/manifests/{digest}", method="DELETE"
        )
        try:
            with _OPENER.open(request, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise LocalCloudError(
                    f"the registry answered {exc.code} deleting {digest}"
                ) from None
        tags = self._repository_dir(repository) / "_manifests/tags"
        for tag in tags.glob("*") if tags.is_dir() else []:
            if (tag / "current/link").is_file() and (tag / "current/link").read_text() == digest:
                remove_tree(tag)

    def delete_repository(self, repository: str) -> None:
        remove_tree(self._repository_dir(repository))

    def pushed_at(self, repository: str, tag: str) -> float:
        link = (
            self.storage / "docker/registry/v2/repositories" / repository / "_manifests/tags" / tag
        )
        try:
            return (link / "current/link").stat().st_mtime
        except OSError:
            return time.time()


class Manifest:
    def __init__(self, body: bytes, media_type: str, digest: str) -> None:
        self.body = body
        self.media_type = media_type
        self.digest = digest
        self.data: dict[str, Any] = json.loads(body)

    @property
    def size(self) -> int:
        """Bytes of the layers (ECR's imageSizeInBytes); of every variant for a list."""
        entries = self.data.get("manifests") or self.data.get("layers") or []
        return sum(int(e.get("size", 0)) for e in entries)


def _die_with_parent() -> None:
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


def _denied(
    environ: dict[str, Any], raw: bytes, action: str, account: str
) -> dict[str, Any] | None:
    """The AccessDeniedException reply for an ECR call the caller's policies do not allow, under
    IAM enforcement (moto's, which this front's calls otherwise bypass); None when allowed or
    not enforced. The decision is the local cloud's (amibake.local.authorization, through the
    check moto_gaps installs): by repository ARN, as AWS decides."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    if ActionAuthenticatorMixin.request_count < settings.INITIAL_NO_AUTH_ACTION_COUNT:
        return None
    from moto.iam.access_control import IAMRequest
    from werkzeug.datastructures import EnvironHeaders

    try:
        IAMRequest(
            account_id=account,
            method=str(environ.get("REQUEST_METHOD", "POST")),
            path=str(environ.get("PATH_INFO", "/")),
            data={},
            body=raw,
            headers=dict(EnvironHeaders(environ)),
            action=action,
        ).check_action_permitted("*")
    except Exception as exc:  # moto's RESTError: AccessDenied, InvalidClientTokenId, ...
        code = str(getattr(exc, "error_type", "") or type(exc).__name__)
        message = str(getattr(exc, "message", "") or exc)
        return {"__type": "AccessDeniedException" if code == "AccessDenied" else code,
                "message": message}  # fmt: skip
    return None


class EcrFront:
    """In front of moto's app: ECR's image calls answered from the registry; all else to moto."""

    def __init__(self, app: Callable[..., Iterable[bytes]], registry: Registry) -> None:
        self.app = app
        self.registry = registry

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        action = target.removeprefix(TARGET_PREFIX)
        if not target.startswith(TARGET_PREFIX) or action not in SERVED:
            return self.app(environ, start_response)
        scope = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        request = json.loads(raw or b"{}")
        from moto.iam.models import get_account_id_from

        account = str(get_account_id_from(scope.group(1))) if scope else "123456789012"
        region = scope.group(2) if scope else "us-east-1"
        denied = _denied(environ, raw, action, account)
        if denied is not None:  # as AWS: IAM decides before the registry is looked at
            return _reply(start_response, "400 Bad Request", denied)
        try:
            if action == "GetAuthorizationToken":
                body = self.authorization(account)
            else:
                registry_id = str(request.get("registryId") or account)
                self._repository(request.get("repositoryName", ""), registry_id, account, region)
                if action == "DescribeImages":
                    body = self.describe_images(request, registry_id)
                elif action == "GetDownloadUrlForLayer":
                    body = self.download_url(request)
                elif action == "BatchDeleteImage":
                    body = self.batch_delete_image(request)
                elif action == "DeleteRepository":
                    self.delete_repository(request, registry_id)
                    # moto forgets the repository (and answers with it) as for any other.
                    environ["wsgi.input"] = io.BytesIO(raw)
                    return self.app(environ, start_response)
                else:
                    body = self.batch_get_image(request, registry_id)
        except EcrError as exc:
            return _reply(
                start_response, "400 Bad Request", {"__type": exc.code, "message": str(exc)}
            )
        return _reply(start_response, "200 OK", body)

    @staticmethod
    def _repository(name: str, registry_id: str, account: str, region: str) -> None:
        from moto.ecr.models import ecr_backends

        with BACKENDS:
            repository = ecr_backends[account][region].repositories.get(name)
        if repository is None or repository.registry_id != registry_id:
            raise EcrError(
                "RepositoryNotFoundException",
                f"The repository with name '{name}' does not exist in the registry with id "
                f"'{registry_id}'",
            )

    def authorization(self, account: str) -> dict[str, Any]:
        token = base64.b64encode(b"AWS:local-cloud-" + account.encode()).decode()
        return {
            "authorizationData": [
                {
                    "authorizationToken": token,
                    "expiresAt": time.time() + 12 * 3600,  # ECR's tokens last 12 hours
                    "proxyEndpoint": self.registry.endpoint,
                }
            ]
        }

    def download_url(self, request: dict[str, Any]) -> dict[str, Any]:
        """Where a blob is read without credentials (a presigned S3 URL on AWS)."""
        repository, digest = request["repositoryName"], request["layerDigest"]
        url = f"{self.registry.endpoint}/v2/{repository}/blobs/{digest}"
        try:
            with _OPENER.open(urllib.request.Request(url, method="HEAD"), timeout=30):
                pass
        except urllib.error.HTTPError:
            raise EcrError(
                "LayersNotFoundException",
                f"The image layer {digest} does not exist in the repository '{repository}'",
            ) from None
        return {"downloadUrl": url, "layerDigest": digest}

    def _find(self, repository: str, image_id: dict[str, str]) -> tuple[Manifest | None, str]:
        reference = image_id.get("imageTag") or image_id.get("imageDigest") or ""
        manifest = self.registry.manifest(repository, reference) if reference else None
        digest = image_id.get("imageDigest")
        if manifest is not None and digest and manifest.digest != digest:
            return None, "ImageTagDoesNotMatchDigest"
        return manifest, "ImageNotFound"

    def describe_images(self, request: dict[str, Any], registry_id: str) -> dict[str, Any]:
        repository = request["repositoryName"]
        by_digest: dict[str, tuple[Manifest, list[str]]] = {}
        wanted = request.get("imageIds")
        for tag in self.registry.tags(repository) if not wanted else []:
            manifest = self.registry.manifest(repository, tag)
            if manifest is not None:
                by_digest.setdefault(manifest.digest, (manifest, []))[1].append(tag)
        for image_id in wanted or []:
            manifest, _ = self._find(repository, image_id)
            if manifest is None:
                said = ", ".join(f"{k}={v}" for k, v in image_id.items())
                raise EcrError(
                    "ImageNotFoundException",
                    f"The image with imageId {{{said}}} does not exist within the repository "
                    f"with name '{repository}' in the registry with id '{registry_id}'",
                )
            by_digest[manifest.digest] = (manifest, self._tags_of(repository, manifest.digest))
        details = []
        for digest, (manifest, tags) in by_digest.items():
            detail: dict[str, Any] = {
                "registryId": registry_id,
                "repositoryName": repository,
                "imageDigest": digest,
                "imageSizeInBytes": manifest.size,
                "imagePushedAt": max(
                    (self.registry.pushed_at(repository, t) for t in tags), default=time.time()
                ),
                "imageManifestMediaType": manifest.media_type,
            }
            if tags:
                detail["imageTags"] = sorted(tags)
            details.append(detail)
        return {"imageDetails": details}

    def batch_delete_image(self, request: dict[str, Any]) -> dict[str, Any]:
        """As ECR: a tag is removed, and its image with it when no other tag names it; a digest
        removes the image and all its tags. moto answered ImageNotFound for every image here
        (it never sees a push), and the registry kept them."""
        repository = request["repositoryName"]
        deleted, failures = [], []
        for image_id in request.get("imageIds", []):
            manifest, code = self._find(repository, image_id)
            if manifest is None:
                failures.append(
                    {"imageId": image_id, "failureCode": code, "failureReason": _reason(code)}
                )
                continue
            tags = self._tags_of(repository, manifest.digest)
            tag = image_id.get("imageTag")
            if tag and len(tags) > 1:
                self.registry.untag(repository, tag)
                tags = [tag]
            else:
                self.registry.delete_manifest(repository, manifest.digest)
            deleted += [{"imageDigest": manifest.digest, "imageTag": t} for t in tags] or [
                {"imageDigest": manifest.digest}
            ]
        return {"imageIds": deleted, "failures": failures}

    def delete_repository(self, request: dict[str, Any], registry_id: str) -> None:
        """As ECR: a repository that holds images is refused unless forced, and forced, goes with
        them. moto deleted it with its images left in the registry, and a repository made again
        under the name had them back."""
        repository = request["repositoryName"]
        if self.registry.has_images(repository) and not request.get("force"):
            raise EcrError(
                "RepositoryNotEmptyException",
                f"The repository with name '{repository}' in registry with id '{registry_id}' "
                "cannot be deleted because it still contains images",
            )
        self.registry.delete_repository(repository)

    def _tags_of(self, repository: str, digest: str) -> list[str]:
        return [
            t
            for t in self.registry.tags(repository)
            if (m := self.registry.manifest(repository, t)) and m.digest == digest
        ]

    def batch_get_image(self, request: dict[str, Any], registry_id: str) -> dict[str, Any]:
        repository = request["repositoryName"]
        accepted = request.get("acceptedMediaTypes") or [
            "application/vnd.docker.distribution.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.oci.image.manifest.v1+json",
        ]
        images, failures = [], []
        for image_id in request.get("imageIds", []):
            manifest, code = self._find(repository, image_id)
            if manifest is None:
                failures.append(
                    {"imageId": image_id, "failureCode": code, "failureReason": _reason(code)}
                )
            elif manifest.media_type not in accepted:
                failures.append(
                    {
                        "imageId": image_id,
                        "failureCode": "UnsupportedImageType",
                        "failureReason": f"the image's manifest is {manifest.media_type}, "
                        "not one of acceptedMediaTypes",
                    }
                )
            else:
                images.append(
                    {
                        "registryId": registry_id,
                        "repositoryName": repository,
                        "imageId": {**image_id, "imageDigest": manifest.digest},
                        "imageManifest": manifest.body.decode(),
                        "imageManifestMediaType": manifest.media_type,
                    }
                )
        return {"images": images, "failures": failures}


def _reason(code: str) -> str:
    return {
        "ImageNotFound": "Requested image not found",
        "ImageTagDoesNotMatchDigest": "Image tag does not match the requested digest",
    }.get(code, code)


class EcrError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _reply(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status,
        [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(data)))],
    )
    return [data]
