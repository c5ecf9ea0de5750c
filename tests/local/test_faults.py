"""The local cloud's AWS behaviour layer (`--faults`), and the product surviving each behaviour
with nothing left behind. Each test runs a local cloud of its own with one behaviour on, at a
seed chosen (by the same hash the layer uses) so the behaviour is certain to be met, and checks
the layer's own count that it was: a pass then means the product survived it, not missed it."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amibake import config, pipelines
from amibake.cloud import Cloud
from amibake.cloud.calls import describe_image
from amibake.cloud.ec2 import describe_new_image
from amibake.connect import connect
from amibake.errors import UserError
from amibake.local import control, faults
from tests.helpers import own_local_cloud, tagged_alive, tagged_images_alive, wait_until_clean
from tests.test_build import FIXTURES


def seed_where(condition: Callable[[faults.Faults], bool]) -> int:
    """The first seed whose draws meet `condition` (the layer's own hash: reproducible)."""
    return next(seed for seed in range(10_000) if condition(faults.Faults(seed=seed)))


@pytest.fixture
def faulty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, int], Cloud]]:
    """A local cloud of the test's own, with the behaviours asked for."""
    started: list[config.Config] = []

    def start(spec: str, seed: int) -> Cloud:
        cfg = own_local_cloud(tmp_path, monkeypatch, spec, seed)
        started.append(cfg)
        return connect(cfg)

    yield start
    for cfg in started:
        control.down(cfg)
    assert wait_until_clean(tmp_path / "cloud") == []


def met(cloud: Cloud) -> dict[str, dict[str, int]]:
    """What the layer did, by behaviour, from the local cloud's status."""
    assert cloud.endpoint_url is not None
    with urllib.request.urlopen(f"{cloud.endpoint_url}/_amibake/status", timeout=10) as answer:
        status: dict[str, Any] = json.loads(answer.read())
    found: dict[str, dict[str, int]] = status["faults"]
    return found


def test_behaviours_are_chosen_by_name_and_a_wrong_name_is_refused() -> None:
    every = faults.available()
    assert "image-consistency" in every
    assert faults.parse("none").names == []
    assert faults.parse("aws").names == list(every)
    assert "image-consistency" not in faults.parse("aws,-image-consistency").names
    assert faults.parse("image-consistency", 7).names == ["image-consistency"]
    with pytest.raises(UserError, match=r"no behaviour 'imgae-consistency'; use none, aws"):
        faults.parse("imgae-consistency")
    for behaviour in every.values():  # each says where AWS is documented to behave so
        assert behaviour.source and (behaviour.before or behaviour.after or behaviour.elsewhere)


def test_a_bake_survives_a_new_image_not_found_pending_failed_and_its_snapshot_in_use(
    faulty: Callable[[str, int], Cloud],
) -> None:
    from amibake.local.faults import images

    # A seed whose first image ends failed and whose second does not: the bake must delete
    # the failed one (its snapshot briefly in use) and make another.
    seed = seed_where(
        lambda f: (
            f.chance(images.FAILED, "image", 1, "failed")
            and not f.chance(images.FAILED, "image", 2, "failed")
        )
    )
    cloud = faulty("image-consistency", seed)
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    assert pipelines.build(cloud, request)[0].ok
    imaged: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        imaged.append(params["InstanceId"])

    cloud.ec2.meta.events.register("provide-client-params.ec2.CreateImage", record)
    try:
        outcome = pipelines.bake(cloud, pipelines.BakeRequest(families=["c5a"]))[0]
    finally:
        cloud.ec2.meta.events.unregister("provide-client-params.ec2.CreateImage", record)
    assert outcome.ok, outcome.error
    # The second image is of a fresh instance, cleaned anew: CreateImage had rebooted the first,
    # and its boot wrote back what the hygiene removed (machine-id, cloud-init, the bake key).
    assert len(imaged) == 2 and imaged[0] != imaged[1], imaged
    done = met(cloud)["image-consistency"]
    # IMDSv2 set once the image is available: a pending image's attributes cannot change, and
    # it is pending for minutes on AWS (here seconds, so a retry hid it).
    assert "pending image modified" not in done, done
    assert done["image not found yet"] > 0 and done["image pending"] > 0
    assert done["image failed"] > 0 and done["snapshot in use"] > 0
    state: Any = outcome.state
    run_id = state.run_id if hasattr(state, "run_id") else None
    kept = state.image_id
    from amibake.journal import Journal

    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    run_id = run_id or journal.last_run_id()
    assert tagged_alive(cloud, run_id) == []
    # Only the image that passed is left, with its snapshot: the failed one went, whole.
    left = tagged_images_alive(cloud, run_id)
    assert [x for x in left if x.startswith("image")] == [f"image {kept}"]
    assert len([x for x in left if x.startswith("snapshot")]) == 1


def test_gc_deletes_an_image_ec2_does_not_know_yet(faulty: Callable[[str, int], Cloud]) -> None:
    """A bake killed as its image was made, gc'd at once: DeregisterImage answers NotFound for
    an image EC2 does not know yet. gc took that for gone, journaled it deleted and said so,
    and the image became available, billed for its snapshot. It is now asked again within the
    image's window (NEW_IMAGE_VISIBLE_S), as the bake's own cleanup does."""
    from amibake import gc
    from amibake.journal import Journal
    from amibake.local.faults import images

    # Each try's image unseen for 2 s or more; a busy machine may take longer from the register
    # to gc's delete, and the next try's image is then the case.
    tries = 3
    seed = seed_where(
        lambda f: all(
            f.between(*images.UNSEEN_S, "image", n, "unseen") > 2.0 for n in range(1, tries + 1)
        )
    )
    cloud = faulty("image-consistency", seed)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    made = []
    for attempt in range(tries):
        run_id = f"ab-killedbake{attempt}"
        journal.start_run(run_id, "bake", cloud.config.cloud, cloud.config.region)
        image_id = cloud.ec2.register_image(
            Name=f"killed-as-made-{attempt}",
            Architecture="x86_64",
            RootDeviceName="/dev/xvda",
            TagSpecifications=[
                {"ResourceType": "image", "Tags": [{"Key": "amibake:run-id", "Value": run_id}]}
            ],
        )["ImageId"]
        made.append(image_id)
        journal.created(run_id, "image", image_id, cloud.config.region, "local")
        journal.finish_run(run_id, "failed", "killed as its image was made")  # not live: gc'd
        deleted, failures = gc.delete(cloud, journal, gc.find(cloud, journal, run_id=run_id))
        assert failures == [] and [r.resource_id for r in deleted] == [image_id]
        if met(cloud)["image-consistency"].get("image not found yet", 0) > 0:
            break
    else:
        raise AssertionError(f"gc came after each image's window, {tries} times: nothing tested")
    import time

    time.sleep(images.UNSEEN_S[1])  # past its window: EC2 knows the image, if it is there
    assert [i for i in made if describe_image(cloud.ec2, i) is not None] == [], "gc left it"


def test_a_deregistered_image_ec2_still_describes_is_gone(
    faulty: Callable[[str, int], Cloud],
) -> None:
    """EC2 describes a recently deregistered image for a while, State deregistered. Taken for
    alive by `describe_image`, `batch up --ami` registered environments on a dead image, and
    the journal's check (`inventory.still_there`) kept its entry for gc to delete again."""
    from amibake import inventory
    from amibake.local.faults import images

    # An image not failed, and described for 3 s at least once deregistered.
    seed = seed_where(
        lambda f: (
            f.between(*images.DEREGISTERED_S, "image", 1, "deregistered") > 3.0
            and not f.chance(images.FAILED, "image", 1, "failed")
        )
    )
    cloud = faulty("image-consistency", seed)
    image_id = cloud.ec2.register_image(
        Name="deregistered-soon", Architecture="x86_64", RootDeviceName="/dev/xvda"
    )["ImageId"]
    describe_new_image(cloud.ec2, image_id)  # seen once, as the product sees what it made
    cloud.ec2.deregister_image(ImageId=image_id)
    described = cloud.ec2.describe_images(ImageIds=[image_id])["Images"]
    assert [i["State"] for i in described] == ["deregistered"], described
    assert describe_image(cloud.ec2, image_id) is None
    assert not inventory.still_there(cloud, "image", image_id)
    assert met(cloud)["image-consistency"].get("deregistered image still described", 0) >= 2


def _first_unseen(f: faults.Faults, kind: str, n: int = 1) -> bool:
    """Whether the cloud's first n resources of the kind are each unknown to EC2 for 2 s at
    least."""
    from amibake.local.faults import new_resources

    return all(
        new_resources.unseen(f, kind, i)
        and f.between(*new_resources.UNSEEN_S, f"new-{kind}", i) > 2.0
        for i in range(1, n + 1)
    )


@pytest.mark.parametrize("kind", ["security-group", "launch-template", "key-pair"])
def test_a_resource_its_delete_does_not_find_yet_is_deleted_all_the_same(
    faulty: Callable[[str, int], Cloud], kind: str
) -> None:
    """A build that fails at its launch cleans up a second after it made its key pair, security
    group and launch template, and EC2 does not know one of them yet. A group's or template's
    NotFound was taken for gone; a key pair's delete by name answered success and deleted
    nothing. Each was journaled deleted and left."""
    from amibake.journal import Journal
    from amibake.local.faults import new_resources

    others = [k for k in new_resources.KINDS if k != kind]
    cloud = faulty(
        "new-resources",
        seed_where(
            lambda f: (
                _first_unseen(f, kind)
                and not any(new_resources.unseen(f, other, 1) for other in others)
            )
        ),
    )
    from tests.test_build_faults import failing

    with failing(cloud, "CreateFleet", "InvalidParameterValue", times=1):
        outcome = pipelines.build(
            cloud, pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
        )[0]
    assert not outcome.ok and "InvalidParameterValue" in outcome.error, outcome.error
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert run_id is not None and tagged_alive(cloud, run_id) == []
    counts = met(cloud)["new-resources"]
    # A key pair is described until EC2 knows it, then deleted: its delete never meets it new.
    met_by = "a describe" if kind == "key-pair" else "its delete"
    assert list(counts) == [f"new {kind} not found by {met_by}"], counts


def test_a_new_group_a_describe_does_not_find_yet_is_not_taken_for_gone(
    faulty: Callable[[str, int], Cloud], capsys: pytest.CaptureFixture[str]
) -> None:
    """A describe of a security group EC2 made a second ago may answer NotFound. `ls` (and gc)
    beside a live build took that for gone and journaled the group deleted: the run's record of
    it lost, and after a SIGKILL only the tag scan could still find it. The journal's check of
    an entry (inventory.still_there, asked with how long EC2 may not know it yet) says there."""
    import time

    from amibake import inventory
    from amibake.cli import main
    from amibake.cloud.ec2 import NEW_INSTANCE_VISIBLE_S
    from amibake.journal import Journal

    # Two groups unseen at first: on a loaded machine more than a group's window may pass
    # between its create and the describe, and the second is then the one tested.
    cloud = faulty("new-resources", seed_where(lambda f: _first_unseen(f, "security-group", 2)))
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    run_id = "ab-beside00ls"
    groups: list[str] = []
    try:
        for attempt in range(2):
            group = cloud.ec2.create_security_group(
                GroupName=f"beside-ls-{attempt}", Description="a live run's"
            )
            groups.append(group["GroupId"])
            assert inventory.still_there(
                cloud, "security-group", groups[-1], NEW_INSTANCE_VISIBLE_S
            )
            if met(cloud).get("new-resources"):
                break
        assert met(cloud).get("new-resources") == {
            "new security-group not found by a describe": 1
        }, "each describe came after its group's window: nothing was tested"
        group_id = groups[-1]
        assert not inventory.still_there(cloud, "security-group", "sg-0000000000000000d", 0.0)
        # ls then lists it, and its journal entry stays.
        journal.start_run(run_id, "build", cloud.config.cloud, cloud.config.region)
        journal.created(run_id, "security-group", group_id, cloud.config.region, "local")
        assert main(["ls"]) == 0
        assert group_id in capsys.readouterr().out
        assert [r.resource_id for r in journal.alive(run_id)] == [group_id]
    finally:
        time.sleep(2.5)  # until EC2 knows them: the delete would not find them either
        for group_id in groups:
            cloud.ec2.delete_security_group(GroupId=group_id)


def test_a_boot_test_refused_for_capacity_in_its_zone_launches_in_another(
    faulty: Callable[[str, int], Cloud],
) -> None:
    """RunInstances of the boot test refused InsufficientInstanceCapacity in the first subnet's
    zone: the bake launches it in another zone's subnet. Before, it failed after its build and
    image were paid for. The refusal is HTTP 500, which botocore retried as transient (ten
    attempts, about 13 s) before the next zone was tried: it is now asked once."""
    from amibake.local.faults import fleets, on_demand_capacity

    def first_zone_short(f: Any) -> bool:
        first, second = fleets.moto_zones("us-east-1")["c5a.large"][:2]
        return on_demand_capacity.short(
            f, "us-east-1", "c5a.large", first
        ) and not on_demand_capacity.short(f, "us-east-1", "c5a.large", second)

    cloud = faulty("on-demand-capacity", seed_where(first_zone_short))
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    assert pipelines.build(cloud, request)[0].ok
    outcome = pipelines.bake(cloud, pipelines.BakeRequest(families=["c5a"]))[0]
    assert outcome.ok, outcome.error
    assert met(cloud)["on-demand-capacity"] == {"no on-demand capacity in the AZ": 1}
    from amibake.journal import Journal

    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert run_id is not None and tagged_alive(cloud, run_id) == []


@pytest.mark.parametrize("keep_on_error", [False, True], ids=["", "keep-on-error"])
def test_spot_reclaim_mid_build_reruns_it_on_a_new_instance(
    faulty: Callable[[str, int], Cloud], tmp_path: Path, keep_on_error: bool
) -> None:
    """A reclaim is not the run's failure: --keep-on-error kept the first attempt's launch
    template, security group and key pair beside a run that then succeeded."""
    from amibake.local.faults import spot
    from tests.test_build_faults import _recipe_variant

    # The first spot instance gets its notice within a second and is taken back five seconds
    # later, mid-build (the build sleeps 8 s); the second is left alone.
    seed = seed_where(
        lambda f: (
            f.chance(spot.RECLAIMED, "spot", 1, "reclaimed")
            and f.between(*spot.NOTICE_AFTER_S, "spot", 1, "notice") < 1.0
            and not f.chance(spot.RECLAIMED, "spot", 2, "reclaimed")
        )
    )
    cloud = faulty("spot-reclaim", seed)
    root = _recipe_variant(tmp_path, "sleep 8")
    outcome = pipelines.build(
        cloud,
        pipelines.BuildRequest(
            ["c5a"], "trivial", "large", recipes_dir=root, keep_on_error=keep_on_error
        ),
    )[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None and outcome.state.attempt == 1  # on a second instance
    assert met(cloud)["spot-reclaim"]["spot instance reclaimed"] == 1
    from amibake.journal import Journal

    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    run_id = journal.last_run_id()
    assert run_id is not None and journal.run_state(run_id) == "succeeded"
    assert tagged_alive(cloud, run_id) == [] and journal.alive(run_id) == []


def test_a_baked_image_stages_its_build_though_imds_answers_late_at_boot(
    faulty: Callable[[str, int], Cloud],
) -> None:
    # Every instance's IMDS refuses (503) for its first seconds: the image's stage unit asks it
    # the instance type at boot, and must retry rather than leave /shared empty.
    cloud = faulty("imds-late", seed_where(lambda f: True))
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    assert pipelines.build(cloud, request)[0].ok
    outcome = pipelines.bake(cloud, pipelines.BakeRequest(families=["c5a"]))[0]
    assert outcome.ok, outcome.error
    state: Any = outcome.state
    assert state.boot_report["apps"]["trivial"]["smoke"] == "passed"
    assert met(cloud)["imds-late"]["imds unready at boot"] >= 2  # the build host and boot test
