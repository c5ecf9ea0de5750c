"""`amibake build` bad input: one line, exit 2, and nothing created."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from amibake import pipelines
from amibake.cli import main
from amibake.cloud import Cloud
from amibake.errors import CloudError
from amibake.journal import Journal
from amibake.steps.preflight import SPOT_ROLE_PATH
from tests.helpers import ec2_error

FIXTURES = Path(__file__).parent / "recipes"


@pytest.fixture
def recipes_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    monkeypatch.setenv("AMIBAKE_RECIPES_DIR", str(root))
    return root / "trivial"


def _resources(cloud: Cloud) -> int:
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    return len(journal.alive()) + len(cloud.ec2.describe_key_pairs()["KeyPairs"])


def _fails_cleanly(cloud: Cloud, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    before = _resources(cloud)
    assert main(["build", *argv]) == 2
    # Spot's service-linked role is made only once every check has passed: bad input, even
    # on a fresh account, prints the one error line and makes nothing, not even the role.
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("amibake: error: ")
    assert _resources(cloud) == before, "bad input created something"
    return err


def test_unknown_family_lists_close_matches(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails_cleanly(cloud, capsys, "--family", "c7ii", "--recipe", "kernels")
    assert "unknown family 'c7ii'; did you mean c7i" in err


def test_recipe_toml_error_names_file_and_line(
    cloud: Cloud, recipes_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (recipes_dir / "recipe.toml").write_text('name = "trivial"\n[build\ntemplate = "x"\n')
    err = _fails_cleanly(cloud, capsys, "--family", "c5a", "--recipe", "trivial")
    assert "recipe.toml" in err and "line 2" in err


def test_template_with_undefined_variable(
    cloud: Cloud, recipes_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (recipes_dir / "build.sh.j2").write_text("#!/bin/bash\n{{ cc }} {{ optimisation }} hello.c\n")
    err = _fails_cleanly(cloud, capsys, "--family", "c5a", "--recipe", "trivial")
    assert "'optimisation' is undefined" in err


def test_arm64_family_with_an_x86_only_recipe(
    cloud: Cloud, recipes_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = recipes_dir / "recipe.toml"
    toml.write_text(toml.read_text().replace('["x86_64", "arm64"]', '["x86_64"]'))
    err = _fails_cleanly(cloud, capsys, "--family", "c7g", "--recipe", "trivial")
    assert "builds for x86_64 only; family c7g is arm64" in err


def test_tmpfs_larger_than_memory(
    cloud: Cloud, recipes_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = recipes_dir / "recipe.toml"
    toml.write_text(toml.read_text().replace("tmpfs_max_mb = 256", "tmpfs_max_mb = 999999"))
    # On an account without spot's service-linked role: the bad recipe must not make it.
    iam = cloud.client("iam")
    for role in iam.list_roles(PathPrefix=SPOT_ROLE_PATH)["Roles"]:
        iam.delete_service_linked_role(RoleName=role["RoleName"])
    err = _fails_cleanly(cloud, capsys, "--family", "c5a", "--recipe", "trivial")
    assert "tmpfs_max_mb 999999 is larger than the memory of c5a.large" in err
    assert iam.list_roles(PathPrefix=SPOT_ROLE_PATH)["Roles"] == [], "bad input made a role"


def test_size_the_family_does_not_offer(cloud: Cloud, capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails_cleanly(cloud, capsys, "--family", "c5a", "--size", "huge", "--recipe", "kernels")
    assert "size 'huge' is not offered for c5a" in err


def test_source_with_the_wrong_sha256(
    cloud: Cloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "zstd-1.5.6.tar.gz"
    fake.write_bytes(b"tampered")
    assert main(["source", "add", str(fake)]) == 2
    assert "matches no accepted source" in capsys.readouterr().err


def test_dry_run_shows_plan_and_script_and_creates_nothing(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _resources(cloud)
    assert main(["build", "--family", "c7a", "--recipe", "kernels", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)[0]
    assert plan["plan"][0] == "preflight" and plan["plan"][-1] == "fetch"
    assert "-mavx512f" in plan["flags"]  # zen4 on AL2023's gcc 11.4
    assert "-O3 -ffp-contract=off -fopenmp" in plan["build_script"]
    # What the build host installs first: amibake's tools, the recipe's build and runtime ones.
    assert plan["packages"] == ["tar", "xz", "gcc", "libgomp"]
    assert plan["created"] == []
    assert _resources(cloud) == before


def test_families_lists_targets_and_fallbacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["families", "--compiler", "gcc@10.2", "--json"]) == 0
    rows = {r["family"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["c7a"]["target"] == "zen4"
    assert "(fallback: zen2)" in rows["c7a"]["flags"]
    assert rows["c6g"]["arch"] == "arm64"


def _prepared(cloud: Cloud, families: list[str]) -> list[pipelines.BuildState]:
    request = pipelines.BuildRequest(families, "trivial", "large", recipes_dir=FIXTURES)
    return pipelines.prepare(request, cloud.config.results_dir)


def test_families_are_preflighted_side_by_side_and_shared_lookups_made_once(
    cloud: Cloud,
) -> None:
    """Each family's DryRun launch waits at a barrier for the others': checked one after
    another, the first would wait alone, the barrier would time out and the preflight fail."""
    states = _prepared(cloud, ["c5a", "c6i", "c7g"])
    together = threading.Barrier(len(states), timeout=10)
    calls: list[str] = []

    def meet(**_: Any) -> None:
        together.wait()

    def count(event_name: str, **_: Any) -> None:
        calls.append(event_name.rsplit(".", 1)[1])

    clients = [cloud.ec2, cloud.ssm]
    cloud.ec2.meta.events.register("before-call.ec2.RunInstances", meet)
    for client in clients:
        client.meta.events.register("before-call.*.*", count)
    try:
        pipelines.preflight_all(cloud, states)
    finally:
        cloud.ec2.meta.events.unregister("before-call.ec2.RunInstances", meet)
        for client in clients:
            client.meta.events.unregister("before-call.*.*", count)
    assert all(state.base_ami and state.cache_key for state in states)
    assert states[0].base_ami != states[2].base_ami  # x86_64 and arm64 AMIs, from one call
    assert sorted(calls) == sorted(
        ["GetParameters", "DescribeInstanceTypeOfferings", "DescribeInstanceTypes"]
        + ["DescribeImages"]  # the base images' root devices, all at once
        + ["RunInstances"] * 3
    )


def test_a_preflight_failing_for_one_family_of_several_names_it(cloud: Cloud) -> None:
    states = _prepared(cloud, ["c5a", "c7g", "c6i"])

    def refuse_graviton(request: Any, **_: Any) -> Any:
        body = request.body or b""
        if b"c7g." in (body if isinstance(body, bytes) else body.encode()):
            return ec2_error("UnauthorizedOperation", 403)
        return None

    event = "before-send.ec2.DescribeInstanceTypes"
    cloud.ec2.meta.events.register(event, refuse_graviton)
    try:
        with pytest.raises(CloudError, match=r"preflight for c7g: .*UnauthorizedOperation"):
            pipelines.preflight_all(cloud, states)
    finally:
        cloud.ec2.meta.events.unregister(event, refuse_graviton)


def test_a_client_first_wanted_by_many_threads_at_once_is_built_once(cloud: Cloud) -> None:
    fresh = Cloud(cloud.config, cloud.session, cloud.endpoint_url)
    start = threading.Barrier(8)

    def wanted(_: int) -> int:
        start.wait(timeout=10)
        return id(fresh.client("ec2"))

    with ThreadPoolExecutor(8) as pool:
        built = set(pool.map(wanted, range(8)))
    assert len(built) == 1, f"{len(built)} ec2 clients built for one Cloud"


def test_a_client_in_another_region_keeps_the_one_retry_policy(cloud: Cloud) -> None:
    """The Price List is served from us-east-1 whatever the run's region: its client is built as
    every other (the configured retry mode, timeouts, the denied action named), once."""
    pricing = cloud.client("pricing", region="us-east-1")
    assert pricing.meta.region_name == "us-east-1"
    assert pricing.meta.config.retries["mode"] == cloud.config.retry_mode
    # max_attempts counts every attempt, as the AWS config file's does (botocore's own key
    # counts retries: 10 made 11 attempts)
    assert pricing.meta.config.retries["total_max_attempts"] == cloud.config.max_attempts
    assert pricing.meta.config.read_timeout == cloud.ec2.meta.config.read_timeout
    assert cloud.client("pricing", region="us-east-1") is pricing
    assert cloud.client("sts", region="eu-west-1") is not cloud.client("sts")


@pytest.fixture
def no_aws_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """AWS as the cloud, with no credentials anywhere; returns the results directory."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to find here
    monkeypatch.setenv("AMIBAKE_CLOUD", "aws")
    results = tmp_path / "results"
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(results))
    return results


def test_expired_or_unrenewable_credentials_are_said_before_anything_is_made(
    no_aws_credentials: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session token from the environment ends, and botocore cannot renew it: a run that
    outlived it could not clean up (hashicorp/packer#7045). Already expired: one line, exit 2.
    Else a warning; none for keys that do not end."""
    from datetime import UTC, datetime, timedelta

    from amibake import config
    from amibake.cloud.session import open_cloud

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    ended = datetime.now(UTC) - timedelta(minutes=5)
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", ended.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert main(["build", "--family", "c5a", "--recipe", "kernels"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("amibake: error: the AWS credentials expired at ") and "renew" in err
    assert len(err.splitlines()) == 1, err
    assert not (no_aws_credentials / "journal.sqlite").exists()  # no run began

    caplog.set_level(logging.WARNING, logger="amibake")
    ends = datetime.now(UTC) + timedelta(minutes=30, seconds=30)
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", ends.strftime("%Y-%m-%dT%H:%M:%SZ"))
    open_cloud(config.load())  # no call is made: connecting asks nothing of AWS
    assert [r.getMessage()[:55] for r in caplog.records] == [
        "the AWS credentials expire in 30 min and cannot be rene"
    ]
    caplog.clear()
    monkeypatch.delenv("AWS_CREDENTIAL_EXPIRATION")
    open_cloud(config.load())
    assert "session token that cannot be renewed" in caplog.text
    caplog.clear()
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    open_cloud(config.load())
    assert caplog.records == []


def test_a_refusal_for_expired_credentials_says_how_to_renew_them() -> None:
    from amibake.cloud.session import name_expired_credentials

    parsed = {"Error": {"Code": "ExpiredToken", "Message": "The security token is expired"}}
    name_expired_credentials(parsed)
    assert parsed["Error"]["Message"].startswith("The security token is expired (AWS credentials")
    assert "amibake gc" in parsed["Error"]["Message"]
    other = {"Error": {"Code": "AccessDenied", "Message": "no"}}
    name_expired_credentials(other)
    assert other["Error"]["Message"] == "no"


@pytest.mark.parametrize(
    ("code", "attempts"), [("InsufficientInstanceCapacity", 1), ("InternalError", 3)]
)
def test_no_capacity_is_raised_at_once_and_other_server_errors_are_retried(
    code: str, attempts: int
) -> None:
    """EC2 answers "no capacity in this AZ" with HTTP 500, which botocore retried as transient
    (about 13 s) before the caller could try the next AZ: asked once, it raises the same error.
    An InternalError, also 500, is still retried up to max_attempts."""
    import http.server

    import boto3
    import botocore.exceptions

    from amibake.config import Config

    asked: list[str] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            asked.append(self.path)
            body = (
                f"<Response><Errors><Error><Code>{code}</Code><Message>no</Message></Error>"
                "</Errors><RequestID>r</RequestID></Response>"
            ).encode()
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        cloud = Cloud(Config(max_attempts=3), session, endpoint)
        with pytest.raises(botocore.exceptions.ClientError) as raised:
            cloud.ec2.run_instances(
                ImageId="ami-1", InstanceType="c7i.large", MinCount=1, MaxCount=1
            )
    finally:
        server.shutdown()
        server.server_close()
    assert raised.value.response["Error"]["Code"] == code
    assert len(asked) == attempts, asked


def test_no_aws_credentials_is_one_line_before_anything_is_recorded(
    tmp_path: Path, no_aws_credentials: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from amibake.cloud.session import NO_CREDENTIALS
    from fleet.cli import main as fleet_main
    from fleet.results import Results

    results = no_aws_credentials
    assert fleet_main(["bench", "--types", "c5a.large", "--command", "true"]) == 2
    assert capsys.readouterr().err == f"fleet: error: {NO_CREDENTIALS}\n"
    assert Results(results / "fleet.sqlite").run_ids() == []  # no run left "created" for good
    assert main(["build", "--family", "c5a", "--recipe", "kernels"]) == 2
    assert capsys.readouterr().err == f"amibake: error: {NO_CREDENTIALS}\n"
    # A tune checks before its first trial (each trial failed on it, and the search exited 0).
    tune_file = tmp_path / "t.toml"
    tune_file.write_text(
        'recipe = "kernels"\ntypes = ["c5a.large"]\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert fleet_main(["tune", str(tune_file)]) == 2
    assert capsys.readouterr().err == f"fleet: error: {NO_CREDENTIALS}\n"
    assert Results(results / "fleet.sqlite").run_ids() == []
    assert Journal(results / "journal.sqlite").last_run_id() is None


def test_a_region_the_local_cloud_does_not_serve_is_refused(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["build", "--family", "c5a", "--recipe", "kernels", "--region", "ap-south-1"]) == 2
    assert capsys.readouterr().err == (
        "amibake: error: the local cloud serves us-east-1, us-east-2, us-west-2, eu-west-1, not "
        "ap-south-1: pick one with --region\n"
    )


def test_a_bakes_flag_mistakes_are_named_before_any_cloud_is_asked(
    no_aws_credentials: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        ("--tmpfs-reserve-mb-per-vcpu", "-5"): (
            "--tmpfs-reserve-mb-per-vcpu: must be an integer from 0 to 32768, not -5"
        ),
        ("--family", "zz"): "unknown family 'zz'",
        ("--name", "nightly!"): "--name 'nightly!': an image name prefix is up to 105 letters",
        ("--name", "x" * 106): "an image name prefix is up to 105",
    }
    for flags, expected in cases.items():
        assert main(["bake", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("amibake: error: ") and expected in err, (flags, err)


def test_bake_build_dry_run_plans_the_builds_and_launches_nothing(
    cloud: Cloud, recipes_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`bake --build --dry-run` ran the real builds before its dry run (found by the cost
    work): a dry run makes nothing, and says what the builds and then the bake would do."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    before = _resources(cloud)
    assert main(["bake", "--build", "--recipe", "trivial", "--family", "c5a", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("c5a: plan preflight -> ") and "then: bake these artifacts" in out
    assert not (tmp_path / "results" / "artifacts").exists()
    assert Journal(tmp_path / "results" / "journal.sqlite").last_run_id() is None
    assert _resources(cloud) == before
