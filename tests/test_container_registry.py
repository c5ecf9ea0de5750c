"""The local cloud's ECR: moto's API over a real registry. An image built without a Docker
daemon (two architectures in one OCI index) is pushed with skopeo under its ECR name, and ECR's
API then says what the registry holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake.cloud import Cloud, media_types
from amibake.errors import UserError
from fleet import container
from tests.container import image as test_image

pytestmark = pytest.mark.usefixtures("cloud")


@pytest.fixture(scope="module")
def pushed(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> container.ImageRef:
    account = cloud.client("sts").get_caller_identity()["Account"]
    ecr = cloud.client("ecr")
    ecr.create_repository(repositoryName="bench/app")
    layout = test_image.build(tmp_path_factory.mktemp("image"))
    ref = container.ImageRef.parse(
        f"{account}.dkr.ecr.{cloud.config.region}.amazonaws.com/bench/app:v1"
    )
    container.push(cloud, f"oci:{layout}:multi", ref)
    only = container.ImageRef(ref.account, ref.region, ref.repository, "host-only")
    container.push(cloud, f"oci:{layout}:{test_image.host_architecture()}", only)
    return ref


def test_a_pushed_index_is_what_ecr_describes(cloud: Cloud, pushed: container.ImageRef) -> None:
    ecr = cloud.client("ecr")
    details = ecr.describe_images(repositoryName="bench/app")["imageDetails"]
    assert sorted(t for d in details for t in d.get("imageTags", [])) == ["host-only", "v1"]
    got = ecr.batch_get_image(
        repositoryName="bench/app",
        imageIds=[{"imageTag": "v1"}],
        acceptedMediaTypes=list(media_types.INDEX_TYPES),
    )
    assert not got["failures"]
    manifest = got["images"][0]
    assert manifest["imageManifestMediaType"] == test_image.INDEX
    one = ecr.describe_images(repositoryName="bench/app", imageIds=[{"imageTag": "v1"}])
    assert one["imageDetails"][0]["imageDigest"] == manifest["imageId"]["imageDigest"]


def test_lookup_reads_the_architectures_of_an_index_and_of_a_single_image(
    cloud: Cloud, pushed: container.ImageRef
) -> None:
    assert container.lookup(cloud, pushed).architectures == ("arm64", "x86_64")
    host = container.EC2_ARCHITECTURE[test_image.host_architecture()]
    only = container.ImageRef(pushed.account, pushed.region, pushed.repository, "host-only")
    assert container.lookup(cloud, only).architectures == (host,)


def test_a_tag_or_repository_that_does_not_exist_is_refused_naming_what_exists(
    cloud: Cloud, pushed: container.ImageRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = container.ImageRef(pushed.account, pushed.region, pushed.repository, "v2")
    with pytest.raises(UserError, match=r"has no tag 'v2'; it has host-only, v1$"):
        container.lookup(cloud, missing)
    # A repository of many tags: the first few, and how many more (not a silent cut at 8).
    many = [f"t{n:02}" for n in range(11)]
    with monkeypatch.context() as patch:
        patch.setattr(container, "_tags", lambda ecr, ref: many)
        with pytest.raises(UserError, match=r"; it has t00, .*, t07 and 3 more$"):
            container.lookup(cloud, missing)
    nowhere = container.ImageRef(pushed.account, pushed.region, "nothing-here", "v1")
    with pytest.raises(UserError, match="no repository nothing-here"):
        container.lookup(cloud, nowhere)
    ecr = cloud.client("ecr")
    with pytest.raises(ecr.exceptions.ImageNotFoundException):
        ecr.describe_images(repositoryName="bench/app", imageIds=[{"imageTag": "v2"}])


def test_images_and_repositories_are_deleted_as_ecr_deletes_them(
    cloud: Cloud, tmp_path: Path
) -> None:
    """moto answered ImageNotFound for a pushed image, deleted a repository holding images
    without force, and the registry kept them: a repository made again had them back."""
    import botocore.exceptions

    account = cloud.client("sts").get_caller_identity()["Account"]
    ecr = cloud.client("ecr")
    ecr.create_repository(repositoryName="gone/app")
    layout = test_image.build(tmp_path / "image", (test_image.host_architecture(),))
    host = f"{account}.dkr.ecr.{cloud.config.region}.amazonaws.com/gone/app"
    for tag in ("v1", "v2"):  # one image, two tags
        container.push(cloud, f"oci:{layout}:multi", container.ImageRef.parse(f"{host}:{tag}"))
    digest = container.lookup(cloud, container.ImageRef.parse(f"{host}:v1")).digest

    def tags() -> list[str]:
        details = ecr.describe_images(repositoryName="gone/app")["imageDetails"]
        return sorted(t for d in details for t in d.get("imageTags", []))

    # A tag of an image that has another: the tag alone goes.
    answer = ecr.batch_delete_image(repositoryName="gone/app", imageIds=[{"imageTag": "v1"}])
    assert answer["imageIds"] == [{"imageDigest": digest, "imageTag": "v1"}], answer
    assert answer["failures"] == [] and tags() == ["v2"]
    missing = ecr.batch_delete_image(repositoryName="gone/app", imageIds=[{"imageTag": "v1"}])
    assert [f["failureCode"] for f in missing["failures"]] == ["ImageNotFound"]
    # A repository holding images is kept unless forced.
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        ecr.delete_repository(repositoryName="gone/app")
    assert refused.value.response["Error"]["Code"] == "RepositoryNotEmptyException"
    assert tags() == ["v2"]
    ecr.delete_repository(repositoryName="gone/app", force=True)
    ecr.create_repository(repositoryName="gone/app")  # made again: empty, as on ECR
    assert ecr.describe_images(repositoryName="gone/app")["imageDetails"] == []
    # The last tag of an image takes the image with it (a single manifest: an index's own
    # manifests are images of the repository too, untagged).
    single = f"oci:{layout}:{test_image.host_architecture()}"
    container.push(cloud, single, container.ImageRef.parse(f"{host}:v3"))
    ecr.batch_delete_image(repositoryName="gone/app", imageIds=[{"imageTag": "v3"}])
    assert ecr.describe_images(repositoryName="gone/app")["imageDetails"] == []
    ecr.delete_repository(repositoryName="gone/app")  # empty: no force needed


def test_the_registry_address_is_the_proxy_endpoint_on_loopback(
    cloud: Cloud, pushed: container.ImageRef
) -> None:
    where = container.login(cloud, pushed)
    assert where.host.startswith("127.0.0.1:") and where.insecure
    assert where.username == "AWS" and where.password


@pytest.mark.parametrize(
    "text",
    [
        "app:v1",
        "12345.dkr.ecr.us-east-1.amazonaws.com/app:v1",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/App:v1",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:",
    ],
)
def test_a_reference_that_does_not_parse_says_how_to_write_one(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"ACCOUNT\.dkr\.ecr\.REGION\.amazonaws\.com/REPOSITORY:TAG"
    ):
        container.ImageRef.parse(text)


def test_a_reference_without_tag_is_latest() -> None:
    ref = container.ImageRef.parse("123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/app")
    assert (ref.repository, ref.tag, ref.region) == ("team/app", "latest", "eu-west-1")


def test_the_registry_is_gone_after_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from amibake.connect import connect
    from amibake.local import control
    from tests.helpers import own_local_cloud

    cfg = own_local_cloud(tmp_path, monkeypatch)
    connect(cfg)
    daemon = control.find(cfg)
    assert daemon is not None
    assert control.registry_processes(cfg.local_dir)
    control.down(cfg)
    assert not control.registry_processes(cfg.local_dir)
    assert not (cfg.local_dir / "registry").exists()


def test_a_registry_outliving_a_killed_daemon_is_found_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the daemon: its registry dies with it (PDEATHSIG), and whatever is left of it
    (its storage) goes with `amibake local down`, as a crashed daemon's sandboxes do."""
    import os
    import signal
    import time

    from amibake.connect import connect
    from amibake.local import control
    from tests.helpers import own_local_cloud

    cfg = own_local_cloud(tmp_path, monkeypatch)
    connect(cfg)
    daemon = control.find(cfg)
    assert daemon is not None
    registry = control.registry_processes(cfg.local_dir)
    assert registry
    os.kill(daemon.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while control.registry_processes(cfg.local_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not control.registry_processes(cfg.local_dir)
    assert (cfg.local_dir / "registry").exists()  # left behind, until:
    said = control.down(cfg)
    assert not (cfg.local_dir / "registry").exists()
    assert any("registry" in line for line in said), said


def test_layer_urls_skip_a_proxy_for_loopback_only_and_fail_in_one_line() -> None:
    """ECR's layer URLs are S3's on AWS, where the user's HTTPS_PROXY must be honoured, and the
    local registry's on loopback, which no proxy reaches (review: every proxy was skipped, and a
    refused connection was a urllib traceback)."""
    from types import SimpleNamespace

    from amibake.errors import EnvironmentProblem
    from fleet import container

    assert container._opener("http://127.0.0.1:5000/v2/app/blobs/x") is container._DIRECT
    s3 = "https://prod-us-east-1-starport-layer-bucket.s3.us-east-1.amazonaws.com/x"
    assert container._opener(s3) is container._PROXIED
    nowhere = SimpleNamespace(
        get_download_url_for_layer=lambda **_: {"downloadUrl": "http://127.0.0.1:1/blob"}
    )
    ref = container.ImageRef.parse("123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1")
    with pytest.raises(EnvironmentProblem) as caught:
        container._config_architecture(nowhere, ref, "sha256:" + "0" * 64)
    assert "cannot read the image's configuration" in str(caught.value)
    assert "\n" not in str(caught.value)
