"""Each instance has IMDSv2 at http://instance-data: a token first, and spot notices on demand."""

from __future__ import annotations

import json

import pytest

from amibake.cli import main
from amibake.cloud import Cloud
from tests.helpers import launch_and_reach

IMDS = "http://instance-data"
TOKEN = (
    f"TOKEN=$(curl -sf -X PUT {IMDS}/latest/api/token "
    "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60')"
)


def _get(path: str) -> str:
    return (
        f"{TOKEN}; curl -s -o /dev/null -w '%{{http_code}}' -H \"X-aws-ec2-metadata-token: $TOKEN\" "
        f"{IMDS}{path}"
    )


def test_no_token_no_answer(cloud: Cloud) -> None:
    instance_id, remote = launch_and_reach(cloud)
    with remote:
        without = remote.run(
            f"curl -s -o /dev/null -w '%{{http_code}}' {IMDS}/latest/meta-data/instance-id",
            stream=False,
        ).stdout
        with_token = remote.run(
            f'{TOKEN}; curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" '
            f"{IMDS}/latest/meta-data/instance-id",
            stream=False,
        ).stdout
        instance_type = remote.run(
            f'{TOKEN}; curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" '
            f"{IMDS}/latest/meta-data/instance-type",
            stream=False,
        ).stdout
    assert without == "401"
    assert with_token == instance_id
    assert instance_type == "c7i.large"
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])


def test_interruption_notice_appears_after_local_interrupt(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    instance_id, remote = launch_and_reach(cloud)
    with remote:
        before = remote.run(_get("/latest/meta-data/spot/instance-action"), stream=False).stdout
        assert main(["local", "interrupt", instance_id, "--json"]) == 0
        notice = json.loads(capsys.readouterr().out)["instance-action"]
        after = remote.run(
            f'{TOKEN}; curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" '
            f"{IMDS}/latest/meta-data/spot/instance-action",
            stream=False,
        ).stdout
    assert before == "404"
    assert json.loads(after) == notice
    assert notice["action"] == "terminate"
    cloud.ec2.terminate_instances(InstanceIds=[instance_id])
