"""What is alive (issue 27): `amibake ls` lists exactly what the cloud holds of amibake's, priced;
`gc --dry-run` marks each thing delete or keep and says why; `bake --keep N` retires older
images; `batch up --from-bake` names every family it leaves out and refuses an image that is
gone. On a local cloud of the module's own: a clean account, so "exactly" can be checked."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amibake import pipelines
from amibake.cli import main
from amibake.cloud import Cloud
from amibake.connect import connect
from amibake.journal import Journal
from amibake.local import control
from tests.helpers import own_local_cloud, wait_until_clean
from tests.test_build import request

CATALOG = Path(__file__).resolve().parent.parent / "amibake" / "catalog"
X86_BASE = "/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id"
ARM64_BASE = "/aws/service/ecs/optimized-ami/amazon-linux-2023/arm64/recommended/image_id"


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    """A local cloud and results of this module's own, with a trivial c5a artifact built (its
    hello needs nothing beyond x86-64's baseline: any machine runs it, an arm64 one under QEMU,
    so the family is data here, as in test_bake)."""
    root = tmp_path_factory.mktemp("inventory")
    with pytest.MonkeyPatch.context() as patch:
        cfg = own_local_cloud(root, patch)
        cloud = connect(cfg)
        try:
            assert pipelines.build(cloud, request())[0].ok
            yield cloud
        finally:
            control.down(cfg)
    assert wait_until_clean(root / "cloud") == []


def _bake(cloud: Cloud) -> str:
    outcome = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    assert outcome.ok, outcome.error
    return outcome.state.image_id  # type: ignore[union-attr, no-any-return]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _described_ec2(ec2: Any, mine: list[dict[str, Any]]) -> set[tuple[str, str]]:
    found = {
        ("instance", i["InstanceId"])
        for r in ec2.describe_instances(Filters=mine)["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in ("terminated", "shutting-down")
    }
    found |= {("volume", v["VolumeId"]) for v in ec2.describe_volumes(Filters=mine)["Volumes"]}
    found |= {("key-pair", k["KeyName"]) for k in ec2.describe_key_pairs(Filters=mine)["KeyPairs"]}
    found |= {
        ("security-group", g["GroupId"])
        for g in ec2.describe_security_groups(Filters=mine)["SecurityGroups"]
    }
    found |= {
        ("launch-template", t["LaunchTemplateId"])
        for t in ec2.describe_launch_templates(Filters=mine)["LaunchTemplates"]
    }
    found |= {
        ("image", i["ImageId"])
        for i in ec2.describe_images(Owners=["self"], Filters=mine)["Images"]
    }
    found |= {
        ("snapshot", s["SnapshotId"])
        for s in ec2.describe_snapshots(OwnerIds=["self"], Filters=mine)["Snapshots"]
    }
    return found


def described(cloud: Cloud) -> set[tuple[str, str]]:
    """amibake's resources as plain describes see them, written apart from amibake.inventory."""
    ec2, client = cloud.ec2, cloud.client("batch")
    found: set[tuple[str, str]] = set()
    for tag in ("amibake:run-id", "amibake:batch"):
        found |= _described_ec2(ec2, [{"Name": "tag-key", "Values": [tag]}])
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    fleets = sorted({r.resource_id for r in journal.alive() if r.kind == "fleet"})
    if fleets:
        found |= {
            ("fleet", f["FleetId"])
            for f in ec2.describe_fleets(FleetIds=fleets)["Fleets"]
            if not f["FleetState"].startswith("deleted")
        }
    for kind, items, name in (
        ("compute-environment", client.describe_compute_environments()["computeEnvironments"],
         "computeEnvironmentName"),
        ("job-queue", client.describe_job_queues()["jobQueues"], "jobQueueName"),
    ):  # fmt: skip
        found |= {
            (kind, e[name])
            for e in items
            if e["status"] not in ("DELETING", "DELETED")
            and {"amibake:run-id", "amibake:batch"} & set(e.get("tags", {}))
        }
    found |= {
        ("job-definition", f"{d['jobDefinitionName']}:{d['revision']}")
        for d in client.describe_job_definitions(status="ACTIVE")["jobDefinitions"]
        if {"amibake:run-id", "amibake:batch"} & set(d.get("tags", {}))
    }
    bucket = cloud.ssm.get_parameters(Names=["/amibake/batch/bucket"])["Parameters"]
    found |= {("bucket", p["Value"]) for p in bucket}
    for name in [p["Value"] for p in bucket]:  # a fleet run's files, by run and environment
        listed = cloud.client("s3").list_objects_v2(Bucket=name, Prefix="fleet/")
        for key in [o["Key"] for o in listed.get("Contents", [])]:
            if key.count("/") >= 3:
                found.add(("run-files", f"s3://{name}/{'/'.join(key.split('/')[:3])}/"))
    return found


def expected_cost(cloud: Cloud, item: dict[str, Any]) -> tuple[float, float]:
    """(USD an hour, USD a month) for one listed resource: its size times the published price."""
    ec2_prices = json.loads((CATALOG / "prices_us-east-1.json").read_text())["prices"]
    storage = json.loads((CATALOG / "storage_prices_us-east-1.json").read_text())["prices"]
    gib = 2**30
    if item["kind"] == "instance":
        described = cloud.ec2.describe_instances(InstanceIds=[item["id"]])["Reservations"][0]
        instance = described["Instances"][0]
        price = ec2_prices[instance["InstanceType"]]
        spot = instance.get("InstanceLifecycle") == "spot"
        return (statistics.median(price["spot"].values()) if spot else price["on_demand"]), 0.0
    if item["kind"] == "volume":
        volume = cloud.ec2.describe_volumes(VolumeIds=[item["id"]])["Volumes"][0]
        assert item["size_gib"] == volume["Size"]
        return 0.0, volume["Size"] * storage[f"ebs-{volume['VolumeType']}"]["usd_per_gb_month"]
    if item["kind"] == "snapshot":
        snapshot = cloud.ec2.describe_snapshots(SnapshotIds=[item["id"]])["Snapshots"][0]
        assert item["size_gib"] == snapshot["VolumeSize"]
        return 0.0, snapshot["VolumeSize"] * storage["ebs-snapshot"]["usd_per_gb_month"]
    if item["kind"] in ("bucket", "run-files"):
        name, _, prefix = item["id"].removeprefix("s3://").partition("/")
        objects = cloud.client("s3").list_objects_v2(Bucket=name, Prefix=prefix)["Contents"]
        if item["kind"] == "bucket":  # its own objects: the run files are listed as such
            objects = [o for o in objects if o["Key"].count("/") < 3]
        size = sum(o["Size"] for o in objects)
        assert (item["objects"], item["size_bytes"]) == (len(objects), size)
        return 0.0, size / gib * storage["s3-standard"]["usd_per_gb_month"]
    return 0.0, 0.0  # templates, groups, key pairs, images (their snapshots), Batch's pieces


def test_ls_lists_exactly_what_is_alive_priced_and_gc_dry_run_marks_it(
    account: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud = account
    image = _bake(cloud)
    assert main(["batch", "up", "--from-bake"]) == 0
    bucket = cloud.ssm.get_parameter(Name="/amibake/batch/bucket")["Parameter"]["Value"]
    cloud.client("s3").put_object(Bucket=bucket, Key="fleet/probe", Body=b"x" * 1000)
    # A SIGKILLed fleet run's files, their compute environment gone: a leftover of their own.
    orphan = "fleet/fb-0123456789/fleet-fb-0123456789-abcdef-0/"
    for name, size in (("payload.tar", 3000), ("r0/result.json", 200)):
        cloud.client("s3").put_object(Bucket=bucket, Key=orphan + name, Body=b"x" * size)

    def explode(name: str) -> None:
        if name == "launch":
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError):  # another family: c5a's build is cached, launching nothing
        pipelines.build(cloud, request(families=["c6a"], keep_on_error=True), on_boundary=explode)
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()

    listed = _json(capsys, "ls")
    seen = {(r["kind"], r["id"]) for r in listed["resources"]}
    assert seen == described(cloud)
    kinds = {kind for kind, _ in seen}
    assert {"instance", "image", "snapshot", "compute-environment", "job-queue"} <= kinds, kinds
    assert {"job-definition", "bucket", "key-pair", "security-group", "run-files"} <= kinds
    for item in listed["resources"]:
        hourly, monthly = expected_cost(cloud, item)
        assert (item["usd_per_hour"] or 0.0) == pytest.approx(hourly), item
        assert (item["usd_per_month"] or 0.0) == pytest.approx(monthly), item
        if item["kind"] in ("instance", "image", "snapshot", "volume", "key-pair"):
            assert item["age_s"] is not None and 0 <= item["age_s"] < 3600, item
    by_id = {r["id"]: r for r in listed["resources"]}
    assert by_id[bucket]["usd_per_month"] > 0  # 1000 bytes: a price, however small
    assert listed["total"]["usd_per_hour"] == pytest.approx(
        sum(r["usd_per_hour"] or 0 for r in listed["resources"])
    )
    assert "us-east-1 list prices of" in listed["basis"]
    # The run kept on error is gc's; the image, its snapshot and Batch's pieces are not.
    files = by_id[f"s3://{bucket}/{orphan}"]
    assert (files["objects"], files["size_bytes"], files["gc"]) == (2, 3200, "delete"), files
    assert by_id[bucket]["objects"] == 1, by_id[bucket]  # fleet/probe
    for item in listed["resources"]:
        leftover = item["run_id"] == run_id or item["kind"] == "run-files"
        assert item["gc"] == ("delete" if leftover else "keep"), item

    capsys.readouterr()
    assert main(["ls"]) == 0
    shown = capsys.readouterr().out
    assert image in shown and "\nprices: instances per hour from amibake/catalog/" in shown
    assert shown.split()[:7] == ["kind", "id", "run", "age", "size", "cost", "what"]  # all named

    capsys.readouterr()
    assert main(["gc", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    instance = next(i for k, i in seen if k == "instance")
    assert any(line.startswith(f"would delete instance {instance} (run {run_id}") for line in lines)
    assert any(
        line.startswith(f"keep image {image} ") and line.endswith("a baked image, the product "
        "(amibake bake --keep N retires older ones)") for line in lines
    ), lines  # fmt: skip
    snapshots = [i for k, i in seen if k == "snapshot"]
    assert any(
        line.startswith(f"keep snapshot {snapshots[0]} ")
        and line.endswith(f"the snapshot of baked image {image}")
        for line in lines
    ), lines
    assert any(
        line.startswith(f"keep compute-environment amibake-x86_64-{image} ")
        and line.endswith("registered by amibake batch up; amibake batch down removes it")
        for line in lines
    ), lines
    assert any(line.startswith(f"keep bucket {bucket} ") for line in lines), lines
    assert "nothing to clean up" not in "\n".join(lines)
    assert {(r["kind"], r["id"]) for r in _json(capsys, "ls")["resources"]} == seen  # dry

    # gc deletes the run's leftovers, batch down Batch's pieces: the image and snapshot stay.
    assert main(["gc"]) == 0
    s3 = cloud.client("s3")
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix=orphan)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["fleet/probe"]
    assert main(["batch", "down"]) == 0
    left = {(r["kind"], r["id"]) for r in _json(capsys, "ls")["resources"]}
    assert left == described(cloud)
    assert {kind for kind, _ in left} <= {"image", "snapshot", "security-group"}, left
    assert ("image", image) in left


def test_bake_keep_1_retires_the_older_images_and_their_snapshots(
    account: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud, ec2 = account, account.ec2
    older = _bake(cloud)
    older_snapshots = [
        m["Ebs"]["SnapshotId"]
        for m in ec2.describe_images(ImageIds=[older])["Images"][0]["BlockDeviceMappings"]
        if "Ebs" in m
    ]
    assert older_snapshots
    capsys.readouterr()
    assert main(["bake", "--keep", "1", "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    newest = summary["image_id"]
    retired = {r["image_id"]: r for r in summary["retired"]}
    assert older in retired and newest not in retired
    assert retired[older]["snapshots"] == older_snapshots
    mine = ec2.describe_images(Owners=["self"])["Images"]
    assert [i["ImageId"] for i in mine] == [newest]  # every older trivial x86_64 image went
    assert (
        ec2.describe_snapshots(
            OwnerIds=["self"], Filters=[{"Name": "snapshot-id", "Values": older_snapshots}]
        )["Snapshots"]
        == []
    )
    records = json.loads((cloud.config.results_dir / "amis.json").read_text())
    assert all(r.get("retired") for r in records if r["image_id"] != newest)
    assert not next(r for r in records if r["image_id"] == newest).get("retired")

    # Said in words too; and a second bake with --keep 2 keeps both.
    capsys.readouterr()
    assert main(["bake", "--keep", "2"]) == 0
    out = capsys.readouterr().out
    assert "retired" not in out
    assert len(ec2.describe_images(Owners=["self"])["Images"]) == 2


def test_the_snapshot_of_an_image_deregistered_by_hand_is_a_leftover_once_it_is_old(
    account: Cloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deregistering an image leaves its snapshots, billed. A baked image's snapshot is kept
    (amibake:kept), and gc kept it for ever once someone deregistered its image by hand. An hour
    after it began (here at once), a kept snapshot whose image is gone is gc's to delete; a
    younger one is kept, as a new image may not be listed yet."""
    from amibake import inventory

    ec2 = account.ec2
    image_id = _bake(account)
    other = _bake(account)  # the newest, which the module's later tests take
    (snapshot_id,) = [
        m["Ebs"]["SnapshotId"]
        for m in ec2.describe_images(ImageIds=[image_id])["Images"][0]["BlockDeviceMappings"]
        if "Ebs" in m
    ]
    ec2.deregister_image(ImageId=image_id)

    def listed() -> dict[str, Any]:
        (found,) = [r for r in _json(capsys, "ls")["resources"] if r["id"] == snapshot_id]
        return dict(found)

    assert listed()["gc"] == "keep"  # too young to be sure its image is gone
    monkeypatch.setattr(inventory, "ORPHANED_AFTER_S", 0.0)
    orphan = listed()
    assert orphan["gc"] == "delete" and f"of {image_id}, deregistered" in orphan["detail"], orphan
    assert main(["gc"]) == 0
    gone = ec2.describe_snapshots(
        OwnerIds=["self"], Filters=[{"Name": "snapshot-id", "Values": [snapshot_id]}]
    )["Snapshots"]
    assert gone == []
    kept = [i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]]
    assert other in kept, "gc should have left the other baked image alone"


def _record(image_id: str, architecture: str, family: str) -> dict[str, Any]:
    manifest = {"app": "trivial", "family": family, "architecture": architecture}
    return {
        "image_id": image_id,
        "architecture": architecture,
        "region": "us-east-1",
        "cloud": "local",
        "artifacts": {f"trivial_{family}.tar.xz": manifest},
    }


@pytest.fixture
def own_results(account: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Results of the test's own, in the module's account: an amis.json the test writes."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    return tmp_path / "amis.json"


def test_from_bake_registers_each_architecture_and_names_each_family_it_leaves_out(
    account: Cloud, own_results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud = account
    baked = [r for r in json.loads((cloud.config.results_dir / "amis.json").read_text())]
    x86 = next(r["image_id"] for r in reversed(baked) if not r.get("retired"))
    older = cloud.ssm.get_parameter(Name=X86_BASE)["Parameter"]["Value"]  # exists: data here
    arm = cloud.ssm.get_parameter(Name=ARM64_BASE)["Parameter"]["Value"]
    own_results.write_text(
        json.dumps(
            [
                _record(older, "x86_64", "c6i"),
                _record(x86, "x86_64", "c5a"),
                _record(arm, "arm64", "c7g"),
                {**_record(older, "x86_64", "c7i"), "region": "eu-west-1"},
            ]
        )
    )
    result = _json(capsys, "batch", "up", "--from-bake")
    assert result["queues"] == {
        "amibake-x86_64": f"amibake-x86_64-{x86}",
        "amibake-arm64": f"amibake-arm64-{arm}",
    }
    assert set(result["skipped"]) == {"c6i", "c7i"}
    assert result["skipped"]["c6i"].startswith(
        f"only the older image {older} holds it, and the amibake-x86_64 queue takes the newest "
        f"x86_64 image, {x86} (c5a): bake the families together (amibake bake --family c5a,c6i)"
    )
    assert result["skipped"]["c7i"] == (
        f"its image {older} was baked in local eu-west-1, not local us-east-1"
    )
    capsys.readouterr()
    assert main(["batch", "status"]) == 0
    status = capsys.readouterr().out
    assert f"image {x86}" in status and f"image {arm}" in status
    assert main(["batch", "down"]) == 0


def test_from_bake_refuses_an_image_that_no_longer_exists_creating_nothing(
    account: Cloud, own_results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After `amibake local down` (or a deregister) amis.json names an image EC2 no longer has:
    an environment on it could never start a host."""
    cloud = account
    gone = "ami-0123456789abcdef0"
    own_results.write_text(json.dumps([_record(gone, "x86_64", "c5a")]))

    def held() -> Any:
        return (
            sorted(described(cloud)),
            cloud.ssm.get_parameters(Names=["/amibake/batch/bucket"])["Parameters"],
            len(cloud.ec2.describe_security_groups()["SecurityGroups"]),
            cloud.client("iam").list_roles(PathPrefix="/amibake/")["Roles"],
        )

    before = held()
    capsys.readouterr()
    assert main(["batch", "up", "--from-bake"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"amibake: error: {own_results} names {gone} (x86_64: c5a), which does not exist in "
        "us-east-1 any more (deregistered, or the local cloud stopped): bake again (amibake "
        "bake), or pass --ami with an image that exists\n"
    )
    assert held() == before


def test_an_empty_account_is_said_so() -> None:
    """Without a cloud: the listing's words for nothing, and the basis of its prices."""
    from amibake import inventory

    assert inventory.table([], "us-east-1") == "amibake owns nothing in us-east-1"
    assert "(no prices for eu-west-1: these are us-east-1's)" in inventory.basis("eu-west-1")


def test_older_than_takes_a_run_whole_by_its_oldest_resource() -> None:
    """gc --older-than 1h judged each resource by its own age: a killed bake's key pair and
    launch template (an hour old) went, its boot-test instance (made later) stayed, billed,
    and its security group was refused as still in use for minutes."""
    from datetime import UTC, datetime, timedelta

    from amibake import inventory

    now = datetime.now(UTC)

    def made(kind: str, run_id: str, minutes_ago: int | None) -> inventory.Resource:
        created = None if minutes_ago is None else now - timedelta(minutes=minutes_ago)
        return inventory.Resource(kind, f"{kind}-{run_id}", run_id, created)

    bake = [made("key-pair", "ab-1", 70), made("instance", "ab-1", 20), made("image", "ab-1", None)]
    young = [made("key-pair", "ab-2", 30)]
    loose = [made("snapshot", "", 90), made("volume", "", 10)]
    picked = inventory.selected([*bake, *young, *loose], None, timedelta(hours=1))
    assert {r.resource_id for r in picked} == {
        "key-pair-ab-1", "instance-ab-1", "image-ab-1", "snapshot-",
    }  # fmt: skip
    assert inventory.selected([*bake, *young], "ab-2", None) == young
    assert inventory.selected([*bake, *young], "ab-2", timedelta(hours=1)) == []


def test_a_job_bucket_this_identity_may_not_read_does_not_stop_ls(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """S3's 403 for the recorded job bucket (another account's, or no s3:ListBucket) is a
    one-line error for batch, and aborted `amibake ls` and gc whole: the rest goes on listed,
    the bucket said not listed."""
    from amibake import batch, inventory

    monkeypatch.setattr(batch, "job_bucket", lambda cloud: "amibake-batch-us-east-1-0123")

    def refused(cloud: Cloud, name: str) -> bool:
        raise batch.UserError(f"the job bucket {name} is not this account's")

    monkeypatch.setattr(batch, "check_owned", refused)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    found = inventory.discover(cloud, journal, everything=True)
    assert not [r for r in found if r.kind in ("bucket", "run-files")], found
    assert "the job bucket not listed: the job bucket amibake-batch-us-east-1-0123" in caplog.text
