"""Describes and lists in pages, and request lists held to the API's limits (issue 26, findings 7
and 9), on a local cloud of the test's own whose fault layer answers as AWS does: every
paginated Describe/List cut to a page of a few items with a token, and a list longer than the
API takes refused. Each test checks the layer's count that it acted, then that the product saw
everything and left nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import botocore.exceptions
import pytest

from amibake import bake, catalog, gc
from amibake.cloud import Cloud
from amibake.cloud.calls import every
from amibake.cloud.tags import RUN_ID
from amibake.errors import UserError
from amibake.journal import Journal
from amibake.local.faults import Faults, pagination
from tests.helpers import launch
from tests.local.test_faults import faulty, met, seed_where  # noqa: F401 - faulty: a fixture

MANY = 7  # more than the largest page (pagination.PAGE), so every list pages


def page_size(faults: Faults, service: str, action: str) -> int:
    op = pagination.paged(service, action)
    assert op is not None
    low, high = pagination.PAGE
    return low + int(faults.draw("page", op.service, op.action) * (high - low + 1))


def test_a_describe_is_cut_to_a_page_and_its_token_continues(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    seed = seed_where(lambda f: page_size(f, "ec2", "DescribeVolumes") == 2)
    cloud = faulty("pagination", seed)
    ec2 = cloud.ec2
    volumes = [
        ec2.create_volume(AvailabilityZone=f"{cloud.config.region}a", Size=1)["VolumeId"]
        for _ in range(MANY)
    ]
    first = ec2.describe_volumes()
    assert len(first["Volumes"]) == 2 and first["NextToken"]
    seen = [v["VolumeId"] for p in ec2.get_paginator("describe_volumes").paginate() for v in
            p["Volumes"]]  # fmt: skip
    assert sorted(seen) == sorted(volumes)  # every one, each once
    # Named, they come whole (the EC2 guide's way to describe many); a call with no paginator
    # in botocore's model is never cut.
    assert len(ec2.describe_volumes(VolumeIds=volumes)["Volumes"]) == MANY
    for n in range(MANY):
        ec2.create_key_pair(KeyName=f"k{n}")
    assert len(ec2.describe_key_pairs()["KeyPairs"]) == MANY
    done = met(cloud)["pagination"]
    assert done["DescribeVolumes truncated"] >= 2 and done["DescribeVolumes continued"] >= 3


def test_json_iam_and_s3_lists_page_too(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    cloud = faulty("pagination", seed_where(lambda f: True))
    ssm, iam = cloud.ssm, cloud.client("iam")
    for n in range(MANY):
        ssm.put_parameter(Name=f"/paging/p{n}", Value=str(n), Type="String")
        iam.create_role(RoleName=f"paging-{n}", Path="/paging/", AssumeRolePolicyDocument="{}")
    first = ssm.get_parameters_by_path(Path="/paging")
    assert len(first["Parameters"]) < MANY and first["NextToken"]
    names = [
        p["Name"]
        for page in ssm.get_paginator("get_parameters_by_path").paginate(Path="/paging")
        for p in page["Parameters"]
    ]
    assert sorted(names) == [f"/paging/p{n}" for n in range(MANY)]
    listed = iam.list_roles(PathPrefix="/paging/")
    assert listed["IsTruncated"] and len(listed["Roles"]) < MANY
    roles = [
        r["RoleName"]
        for page in iam.get_paginator("list_roles").paginate(PathPrefix="/paging/")
        for r in page["Roles"]
    ]
    assert sorted(roles) == [f"paging-{n}" for n in range(MANY)]
    s3 = cloud.client("s3")
    s3.create_bucket(Bucket="paging")
    for n in range(MANY):
        s3.put_object(Bucket="paging", Key=f"k{n}", Body=b"x")
    listed = s3.list_objects_v2(Bucket="paging")
    assert listed["IsTruncated"] and listed["KeyCount"] == len(listed["Contents"]) < MANY
    keys = [o["Key"] for o in every(s3, "list_objects_v2", "Contents", Bucket="paging")]
    assert keys == [f"k{n}" for n in range(MANY)]
    done = met(cloud)["pagination"]
    assert done["GetParametersByPath truncated"] and done["ListRoles truncated"]
    assert done["ListObjectsV2 truncated"] == 2  # the two first requests; the rest continued


def test_a_list_longer_than_the_api_takes_is_refused_as_aws_does(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    cloud = faulty("request-limits", 0)
    types = x86_types()
    assert len(types) > 100
    with pytest.raises(botocore.exceptions.ClientError, match="InvalidParameterValue"):
        cloud.ec2.describe_instance_types(InstanceTypes=types)
    assert len(cloud.ec2.describe_instance_types(InstanceTypes=types[:100])["InstanceTypes"]) == 100
    with pytest.raises(botocore.exceptions.ClientError, match="ClientException"):
        cloud.client("batch").describe_jobs(jobs=[str(uuid.uuid4()) for _ in range(101)])
    with pytest.raises(botocore.exceptions.ClientError, match="ValidationException"):
        cloud.ssm.get_parameters(Names=[f"/p{n}" for n in range(11)])
    done = met(cloud)["request-limits"]
    assert done["DescribeInstanceTypes InstanceTypes over 100"] == 1
    assert done["DescribeJobs jobs over 100"] == 1 and done["GetParameters Names over 10"] == 1


def x86_types() -> list[str]:
    return [
        f.instance_type(s)
        for f in catalog.families().values()
        if f.architecture == "x86_64"
        for s in f.sizes
    ]


def test_bake_looks_up_every_size_of_the_x86_families_in_runs_the_api_takes(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    # Finding 9: every x86 family is 108 sizes; DescribeInstanceTypes takes 100.
    cloud = faulty("request-limits,pagination", seed_where(lambda f: True))
    families = sorted({t.partition(".")[0] for t in x86_types()})
    bake.check_shapes(cloud, families, reserve=256)
    # ... and the smallest of them all is the one measured (a reserve no size can leave room
    # for names it, wherever it fell among the runs).
    types = x86_types()
    shapes = [
        t
        for run in (types[:100], types[100:])
        for t in every(cloud.ec2, "describe_instance_types", "InstanceTypes", InstanceTypes=run)
    ]
    assert len(shapes) == len(types)
    least = min(t["MemoryInfo"]["SizeInMiB"] for t in shapes)
    smallest = "|".join(t["InstanceType"] for t in shapes if t["MemoryInfo"]["SizeInMiB"] == least)
    with pytest.raises(UserError, match=rf"^({smallest}): "):
        bake.check_shapes(cloud, families, reserve=10**6)
    assert "request-limits" not in met(cloud)  # nothing refused: no run over 100


def alive(cloud: Cloud, run_id: str) -> list[str]:
    """Everything tagged with the run that exists, every page read (independent of gc)."""
    ec2 = cloud.ec2
    tag = [{"Name": f"tag:{RUN_ID}", "Values": [run_id]}]
    found = [
        f"instance {i['InstanceId']}"
        for r in every(ec2, "describe_instances", "Reservations", Filters=tag)
        for i in r["Instances"]
        if i["State"]["Name"] not in ("terminated", "shutting-down")
    ]
    for kind, operation, key, name in (
        ("volume", "describe_volumes", "Volumes", "VolumeId"),
        ("snapshot", "describe_snapshots", "Snapshots", "SnapshotId"),
        ("security-group", "describe_security_groups", "SecurityGroups", "GroupId"),
        ("launch-template", "describe_launch_templates", "LaunchTemplates", "LaunchTemplateId"),
    ):
        found += [f"{kind} {x[name]}" for x in every(ec2, operation, key, Filters=tag)]
    return sorted(found)


def test_gc_finds_and_deletes_leftovers_past_the_first_page(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    # Leftovers of a run killed before its journal was written (found by tag alone), more of
    # each kind than a page holds: gc must read every page, and leave nothing.
    seed = seed_where(lambda f: page_size(f, "ec2", "DescribeInstances") == 1)
    cloud = faulty("pagination", seed)
    ec2, run_id = cloud.ec2, "paging-run"
    tagged = [{"Key": RUN_ID, "Value": run_id}]

    def spec(kind: str) -> list[dict[str, object]]:
        return [{"ResourceType": kind, "Tags": tagged}]

    zone = f"{cloud.config.region}a"
    made = []
    for n in range(MANY):
        volume = ec2.create_volume(AvailabilityZone=zone, Size=1, TagSpecifications=spec("volume"))
        made.append(f"volume {volume['VolumeId']}")
        snapshot = ec2.create_snapshot(
            VolumeId=volume["VolumeId"], TagSpecifications=spec("snapshot")
        )
        made.append(f"snapshot {snapshot['SnapshotId']}")
        group = ec2.create_security_group(
            GroupName=f"paging-{n}", Description="paging", TagSpecifications=spec("security-group")
        )
        made.append(f"security-group {group['GroupId']}")
        template = ec2.create_launch_template(
            LaunchTemplateName=f"paging-{n}",
            LaunchTemplateData={"InstanceType": "c7i.large"},
            TagSpecifications=spec("launch-template"),
        )["LaunchTemplate"]
        made.append(f"launch-template {template['LaunchTemplateId']}")
    for _ in range(2):  # two reservations: DescribeInstances pages by reservation
        instance_id, _pem = launch(cloud)
        ec2.create_tags(Resources=[instance_id], Tags=tagged)
        made.append(f"instance {instance_id}")
    assert alive(cloud, run_id) == sorted(made)

    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    leftovers = gc.find(cloud, journal, run_id=run_id)
    assert sorted(x.describe().split(" (")[0] for x in leftovers) == sorted(made)
    assert gc.delete(cloud, journal, leftovers) == (leftovers, [])
    assert alive(cloud, run_id) == []
    done = met(cloud)["pagination"]
    for action in ("Instances", "Volumes", "Snapshots", "SecurityGroups", "LaunchTemplates"):
        # Cut to a page, or (filtered) begun with an empty one: either way it paged.
        paged = done.get(f"Describe{action} truncated", 0)
        assert paged + done.get(f"Describe{action} empty filtered page", 0) > 0, action


def _push_small_image(host: str, repository: str, tag: str, n: int) -> None:
    """An image of its own (a config and no layer) under `tag`, put into the local cloud's
    registry over its HTTP API, as a push does; far faster than building one per tag."""
    import hashlib
    import json
    import urllib.parse
    import urllib.request

    config = json.dumps({"architecture": "amd64", "os": "linux", "created": str(n)}).encode()
    digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    base = f"http://{host}/v2/{repository}"
    start = urllib.request.Request(f"{base}/blobs/uploads/", method="POST")
    with urllib.request.urlopen(start, timeout=30) as answer:
        upload = urllib.parse.urljoin(f"http://{host}/", answer.headers["Location"])
    joined = "&" if "?" in upload else "?"
    put = urllib.request.Request(
        f"{upload}{joined}digest={digest}",
        data=config,
        method="PUT",
        headers={"Content-Type": "application/octet-stream"},
    )
    urllib.request.urlopen(put, timeout=30).close()
    media = "application/vnd.oci.image.manifest.v1+json"
    manifest = {
        "schemaVersion": 2,
        "mediaType": media,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest,
            "size": len(config),
        },
        "layers": [],
    }
    request = urllib.request.Request(
        f"{base}/manifests/{tag}",
        data=json.dumps(manifest).encode(),
        method="PUT",
        headers={"Content-Type": media},
    )
    urllib.request.urlopen(request, timeout=30).close()


def test_an_image_s_tags_are_read_past_the_first_page(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    """A tag that is not in the repository is refused naming the tags it has: all of them, read
    page after page (ECR's DescribeImages pages by 100 whatever the caller asks)."""
    from fleet import container

    cloud = faulty("pagination", seed_where(lambda f: True))
    ecr = cloud.client("ecr")
    ecr.create_repository(repositoryName="paging/app")
    account = cloud.client("sts").get_caller_identity()["Account"]
    missing = container.ImageRef(account, cloud.config.region, "paging/app", "v9")
    host = container.login(cloud, missing).host
    for n in range(MANY):
        _push_small_image(host, "paging/app", f"t{n}", n)
    first = ecr.describe_images(repositoryName="paging/app")
    assert len(first["imageDetails"]) < MANY and first["nextToken"]
    tags = ", ".join(f"t{n}" for n in range(MANY))
    with pytest.raises(UserError, match=f"has no tag 'v9'; it has {tags}$"):
        container.lookup(cloud, missing)
    assert met(cloud)["pagination"]["DescribeImages truncated"] >= 2


def test_a_filtered_describe_may_start_with_an_empty_page_and_batch_reads_past_it(
    faulty: Callable[[str, int], Cloud],  # noqa: F811
) -> None:
    # EC2 filters the page it read: the first page of a filtered describe may hold nothing and
    # a token. batch up looked for its own security group on that page alone, found none on the
    # second `up` and asked for a second group of the same name: InvalidGroup.Duplicate.
    from amibake import batch

    seed = seed_where(
        lambda f: f.chance(pagination.EMPTY_FIRST, "empty", "ec2", "DescribeSecurityGroups")
    )
    cloud = faulty("pagination", seed)
    vpc = cloud.ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])
    first = cloud.ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vpc["Vpcs"][0]["VpcId"]]}]
    )
    assert first["SecurityGroups"] == [] and first["NextToken"]
    _, made = batch._network(cloud)
    try:
        _, again = batch._network(cloud)
        assert again[0] == made[0]  # the group the first call made, found past the empty page
    finally:
        cloud.ec2.delete_security_group(GroupId=made[0])
    assert met(cloud)["pagination"]["DescribeSecurityGroups empty filtered page"] >= 2
