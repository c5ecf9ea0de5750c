"""Faults injected into real runs on the local cloud: each ends in a recovered run or a clear
error, and never in a leak."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from amibake import gc, pipelines
from amibake.cli import main
from amibake.cloud import Cloud
from amibake.connect import connect
from amibake.errors import CloudError
from amibake.journal import Journal
from amibake.runner import new_run_id
from amibake.steps import launch
from tests.helpers import ec2_error, tagged_alive, wait_until_clean
from tests.test_build import FIXTURES, assert_nothing_left, request
from tests.test_recipes import copy_recipe


@contextmanager
def hooked(cloud: Cloud, event: str, handler: Any) -> Iterator[None]:
    """A botocore event handler on the cloud's EC2 client for the block's duration."""
    cloud.ec2.meta.events.register(event, handler)
    try:
        yield
    finally:
        cloud.ec2.meta.events.unregister(event, handler)


@contextmanager
def failing(
    cloud: Cloud, operation: str, code: str, times: int, status: int = 400
) -> Iterator[list[int]]:
    """The next `times` calls of an operation fail on the wire with `code` (botocore parses and
    retries them as it would a real response)."""
    hits = [0]

    def handler(**_: Any) -> AWSResponse | None:
        if hits[0] < times:
            hits[0] += 1
            return ec2_error(code, status)
        return None

    with hooked(cloud, f"before-send.ec2.{operation}", handler):
        yield hits


@pytest.fixture(autouse=True)
def fresh_artifacts(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in (cloud.config.results_dir / "artifacts").glob("trivial_*"):
        path.unlink()
    monkeypatch.setattr(launch, "CAPACITY_BACKOFF_S", 0.05)


def _last_run(cloud: Cloud) -> str:
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert run_id is not None
    return run_id


@pytest.mark.parametrize(
    "operation",
    ["ImportKeyPair", "CreateSecurityGroup", "DescribeInstances", "DeleteSecurityGroup"],
)
def test_throttling_on_create_describe_and_cleanup_is_retried(
    cloud: Cloud, local_dir: Path, operation: str
) -> None:
    with failing(cloud, operation, "RequestLimitExceeded", times=2, status=503) as hits:
        outcome = pipelines.build(cloud, request())[0]
    assert hits[0] == 2
    assert outcome.ok, outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def _no_capacity(
    markets: set[str], code: str = "InsufficientInstanceCapacity", calls: list[str] | None = None
) -> Any:
    def handler(params: dict[str, Any], **_: Any) -> Any:
        # before-call sees the serialized EC2 query request.
        market = params["body"]["TargetCapacitySpecification.DefaultTargetCapacityType"]
        if calls is not None:
            calls.append(market)
        if market not in markets:
            return None
        parsed = {
            "Errors": [
                {
                    "ErrorCode": code,
                    "ErrorMessage": "injected",
                    "Lifecycle": market,
                }
            ],
            "Instances": [],
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }
        return AWSResponse("https://ec2.local", 200, {}, None), parsed  # type: ignore[arg-type]

    return handler


def test_no_capacity_in_any_pool_names_the_pools_and_leaves_nothing(
    cloud: Cloud, local_dir: Path
) -> None:
    handler = _no_capacity({"spot", "on-demand"})
    with hooked(cloud, "before-call.ec2.CreateFleet", handler):
        outcomes = pipelines.build(cloud, request(families=["c5a", "c6a"]))
    assert len(outcomes) == 2
    for o in outcomes:
        assert not o.ok
        assert f"no capacity for {o.family} after trying {o.family}.large/" in o.error
        assert f"{o.family}.xlarge/" in o.error
        assert "--on-demand-fallback" in o.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def test_a_spot_quota_is_named_as_the_quota_and_not_retried(cloud: Cloud, local_dir: Path) -> None:
    calls: list[str] = []
    handler = _no_capacity({"spot"}, code="MaxSpotInstanceCountExceeded", calls=calls)
    with hooked(cloud, "before-call.ec2.CreateFleet", handler):
        outcome = pipelines.build(cloud, request())[0]
    assert not outcome.ok
    assert "quota refused the launch (MaxSpotInstanceCountExceeded: injected)" in outcome.error
    assert "Service Quotas" in outcome.error and "no capacity" not in outcome.error
    assert calls == ["spot"]  # a quota is not retried as a capacity shortage would be
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def test_a_refusal_that_is_not_capacity_is_not_called_no_capacity(
    cloud: Cloud, local_dir: Path
) -> None:
    """An override EC2 will not launch (Unsupported: the type not offered there; a parameter
    it refuses) was reported "no capacity", which sends a user to another region or time."""
    handler = _no_capacity({"spot"}, code="Unsupported")
    with hooked(cloud, "before-call.ec2.CreateFleet", handler):
        outcome = pipelines.build(cloud, request())[0]
    assert not outcome.ok
    assert "EC2 Fleet refused c5a after trying c5a.large/" in outcome.error, outcome.error
    assert "not for capacity (Unsupported: injected)" in outcome.error
    assert "no capacity" not in outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)

    def short_and_unsupported(params: dict[str, Any], **_: Any) -> Any:
        market = params["body"]["TargetCapacitySpecification.DefaultTargetCapacityType"]
        errors = [{"ErrorCode": code, "ErrorMessage": "injected", "Lifecycle": market}
                  for code in ("Unsupported", "InsufficientInstanceCapacity")]  # fmt: skip
        parsed = {"Errors": errors, "Instances": [], "ResponseMetadata": {"HTTPStatusCode": 200}}
        return AWSResponse("https://ec2.local", 200, {}, None), parsed  # type: ignore[arg-type]

    # Beside pools short of capacity, a type missing in one AZ is common: that is no capacity.
    with hooked(cloud, "before-call.ec2.CreateFleet", short_and_unsupported):
        outcome = pipelines.build(cloud, request())[0]
    assert "no capacity for c5a after trying" in outcome.error, outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def test_spot_without_capacity_falls_back_to_on_demand_when_allowed(
    cloud: Cloud, local_dir: Path
) -> None:
    handler = _no_capacity({"spot"})
    with hooked(cloud, "before-call.ec2.CreateFleet", handler):
        outcome = pipelines.build(cloud, request(on_demand_fallback=True))[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None and outcome.state.market == "on-demand"
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


@pytest.mark.parametrize(
    ("operation", "code", "times"),
    [
        # Eventual consistency: an instance is not found right after its launch.
        ("DescribeInstances", "InvalidInstanceID.NotFound", 2),
        # A type without the latest console output: the buffered one is read instead.
        ("GetConsoleOutput", "UnsupportedOperation", 1),
    ],
)
def test_refusals_a_build_expects_are_recovered_from(
    cloud: Cloud, local_dir: Path, operation: str, code: str, times: int
) -> None:
    with failing(cloud, operation, code, times=times) as hits:
        outcome = pipelines.build(cloud, request())[0]
    assert hits[0] == times
    assert outcome.ok, outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def _recipe_variant(tmp_path: Path, build_line: str) -> Path:
    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    template = root / "trivial" / "build.sh.j2"
    template.write_text(
        template.read_text().replace("cd {{ src_dir }}", f"cd {{{{ src_dir }}}}\n{build_line}")
    )
    return root


def test_a_failing_build_script_is_a_clear_error(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    root = _recipe_variant(tmp_path, "echo 'compiler says no' >&2; exit 3")
    outcome = pipelines.build(cloud, request(recipes_dir=root))[0]
    assert not outcome.ok
    assert "exited 3" in outcome.error and "compiler says no" in outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def _runs(results: Path) -> set[Path]:
    return set(results.glob("logs/*"))


def _wait_for_log(results: Path, marker: str, before: set[Path], timeout_s: float = 120) -> None:
    """Wait for a marker in the log of a run that was not there before (not an older test's)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in (p for run in _runs(results) - before for p in run.glob("*.log")):
            if marker in log.read_text(errors="replace"):
                return
        time.sleep(0.05)
    raise AssertionError(f"{marker!r} never appeared in the build logs")


def _signal_ssh_sessions(local_dir: Path, signum: int) -> int:
    """Send a signal to the per-connection sshd processes of this local cloud's sandboxes (not
    the listeners, and not another test worker's); how many there were."""
    marker = str(local_dir.resolve() / "sandboxes")
    sent = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            root_dir = os.readlink(proc / "root")
        except OSError:
            continue
        if root_dir.startswith(marker) and "sshd: ec2-user" in cmdline:
            # It may be gone already, with the session's sshd killed just before it.
            with suppress(ProcessLookupError):
                os.kill(int(proc.name), signum)
                sent += 1
    return sent


def test_ssh_dropping_mid_build_is_a_clear_error(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    root = _recipe_variant(tmp_path, "echo amibake-test-sleeping; sleep 300")

    before = _runs(cloud.config.results_dir)

    def drop_connections() -> None:
        _wait_for_log(cloud.config.results_dir, "amibake-test-sleeping", before)
        # As a network drop would end them.
        _signal_ssh_sessions(local_dir, signal.SIGKILL)

    failures: list[BaseException] = []

    def dropper_body() -> None:
        try:
            drop_connections()
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    dropper = threading.Thread(target=dropper_body)
    dropper.start()
    started = time.monotonic()
    outcome = pipelines.build(cloud, request(recipes_dir=root))[0]
    dropper.join()
    assert not failures, f"dropping the connections failed: {failures[0]!r}"
    assert not outcome.ok
    assert "connection lost" in outcome.error
    # it did not wait for the 300 s sleep (launch to teardown took 5-8 s here, more when loaded)
    assert time.monotonic() - started < 120
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def test_a_build_on_a_connection_gone_silent_fails_on_its_keepalives_leaving_nothing(
    cloud: Cloud, local_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network that drops packets, or a host gone without a reset, ends no connection: a
    command's reads waited on the silent peer for ever, and the run with them, its instance
    billed and its cleanup never reached. Here the instance's sshd for the connection is
    stopped (SIGSTOP) mid-build: the TCP connection stands and nothing answers on it. The
    keepalives go unanswered, the connection is closed, and the build fails and cleans up."""
    from amibake import remote

    monkeypatch.setattr(remote, "KEEPALIVE_S", 1.0)
    monkeypatch.setattr(remote, "SILENCE_S", 3.0)
    root = _recipe_variant(tmp_path, "echo amibake-test-sleeping; sleep 300")
    before = _runs(cloud.config.results_dir)
    stopped: list[int] = []
    waited_on: list[bool] = []
    ended = threading.Event()

    def silence() -> None:
        try:
            _wait_for_log(cloud.config.results_dir, "amibake-test-sleeping", before)
            stopped.append(_signal_ssh_sessions(local_dir, signal.SIGSTOP))
        finally:
            if not ended.wait(60):  # it waits on: the connection ended, so that the build ends
                waited_on.append(True)
                _signal_ssh_sessions(local_dir, signal.SIGKILL)

    silencer = threading.Thread(target=silence)
    silencer.start()
    try:
        outcome = pipelines.build(cloud, request(recipes_dir=root))[0]
    finally:
        ended.set()
        silencer.join()
    assert stopped and stopped[0] > 0, "no sshd session of the build was found to stop"
    assert not waited_on, "the build was still waiting on its silent connection after 60s"
    assert not outcome.ok
    assert "connection lost" in outcome.error and "no answer to SSH keepalives" in outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def _sleeping_build(
    cloud: Cloud, tmp_path: Path, **env: str
) -> tuple[subprocess.Popen[bytes], set[Path]]:
    """`amibake build` in a process of its own, of a recipe that sleeps once it has said
    amibake-test-sleeping; and the runs the journal had before it."""
    root = _recipe_variant(tmp_path, "echo amibake-test-sleeping; sleep 300")
    before = _runs(cloud.config.results_dir)
    build = subprocess.Popen(
        [sys.executable, "-m", "amibake", "build", "--family", "c5a", "--recipe", "trivial"],
        env={**os.environ, "AMIBAKE_RECIPES_DIR": str(root), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return build, before


@pytest.mark.e2e
def test_sigkill_mid_build_then_gc_leaves_nothing(
    cloud: Cloud, local_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, before = _sleeping_build(cloud, tmp_path)
    try:
        _wait_for_log(cloud.config.results_dir, "amibake-test-sleeping", before)
    finally:
        build.kill()
        build.wait()
    run_id = _last_run(cloud)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    assert tagged_alive(cloud, run_id), "the killed build should have left its resources"
    assert journal.run_state(run_id) == "running"  # nothing could close it
    assert main(["gc"]) == 0
    assert "deleted instance" in capsys.readouterr().out
    assert tagged_alive(cloud, run_id) == []
    assert journal.alive(run_id) == []
    # gc closed the record: the run was killed, and what it left is gone.
    assert journal.run_state(run_id) == "killed"
    detail = journal.run_detail(run_id) or ""
    assert detail.startswith("its process ended without closing it; ")
    assert detail.endswith("resources left; cleaned up by gc"), detail
    assert wait_until_clean(local_dir) == []


def test_a_sigkilled_build_s_instance_ends_itself_at_its_deadline(
    cloud: Cloud, local_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its controller gone without cleanup (SIGKILL, a crash, a laptop asleep), an instance ran
    on, billed, until someone ran gc. Each launch has a deadline: user data schedules a
    power-off at boot, the controller pushes it back while connected, and the instance, made to
    terminate on a power-off, ends itself once nobody renews it (here 1 minute)."""
    from amibake.local import control as local_control

    build, before = _sleeping_build(cloud, tmp_path, AMIBAKE_INSTANCE_DEADLINE_MIN="1")

    def deadline_of(instance_id: str) -> float | None:
        found = (local_control.status(cloud.config) or {}).get("instances", {})
        return found.get(instance_id, {}).get("shutdown_at")

    try:
        _wait_for_log(cloud.config.results_dir, "amibake-test-sleeping", before)
        run_id = _last_run(cloud)
        (instance_id,) = [
            r.split()[1] for r in tagged_alive(cloud, run_id) if r.startswith("instance ")
        ]
        first = deadline_of(instance_id)
        # A minute away at most (its shutdown rounds the time to the second).
        assert first is not None and first - time.time() <= 61, first
        capsys.readouterr()
        assert main(["local", "status"]) == 0
        shown = [line for line in capsys.readouterr().out.splitlines() if instance_id in line]
        assert shown and "powers off" in shown[0], shown
        # Renewed while the controller lives: every third of the deadline.
        deadline = time.monotonic() + 40
        while (deadline_of(instance_id) or 0) <= first + 5:
            assert time.monotonic() < deadline, "the controller never renewed the deadline"
            time.sleep(1)
    except BaseException:
        build.kill()
        build.wait()
        main(["gc"])  # failed here: its instance must not be left beside the next tests
        raise
    build.kill()
    build.wait()
    described = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        reservations = cloud.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        described = reservations[0]["Instances"][0]
        if described["State"]["Name"] == "terminated":
            break
        time.sleep(2)
    assert described["State"]["Name"] == "terminated", described["State"]
    assert described["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown", described
    assert main(["gc"]) == 0  # the rest of the run: its key pair, group, template
    assert tagged_alive(cloud, run_id) == []
    assert wait_until_clean(local_dir) == []


def test_gc_dry_run_lists_without_deleting(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    def explode(name: str) -> None:
        if name == "launch":
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError):
        pipelines.build(cloud, request(keep_on_error=True), on_boundary=explode)
    run_id = _last_run(cloud)
    assert main(["gc", "--dry-run", "--run-id", run_id]) == 0
    listed = capsys.readouterr().out
    assert "would delete instance" in listed and "would delete key-pair" in listed
    assert tagged_alive(cloud, run_id)
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    assert journal.run_state(run_id) == "failed"  # kept on error: failed, and says it left
    assert "resources left" in (journal.run_detail(run_id) or "")
    assert main(["gc", "--run-id", run_id]) == 0
    assert tagged_alive(cloud, run_id) == []
    assert (journal.run_detail(run_id) or "").endswith("resources left; cleaned up by gc")


def test_unknown_older_than_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gc", "--older-than", "two hours"]) == 2
    assert "use a number and a unit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("run_id", "said"),
    [
        # A fleet run's resources carry its amibake runs' ids: gc by its id found nothing.
        ("fb-d631d59499", "is a fleet run; its resources carry its amibake runs' ids: fleet kill"),
        ("ab-d631d59499", "is not an amibake run id (ab- and 12 hex digits"),  # one digit short
    ],
)
def test_gc_refuses_a_run_id_it_could_never_find(
    capsys: pytest.CaptureFixture[str], run_id: str, said: str
) -> None:
    assert main(["gc", "--run-id", run_id]) == 2
    out, err = capsys.readouterr()
    assert out == "" and said in err and err.count("\n") == 1, err


def test_gc_says_each_deletion_once_and_a_failed_one_only_as_failed(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion was said twice (the log line, then the result), and one that failed was said
    "deleted" too, above its failure."""
    run_id = new_run_id()
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    journal.start_run(run_id, "build", "local", cloud.config.region)
    journal.finish_run(run_id, "killed")  # its process died: gc leaves a live run's alone
    tags = [{"Key": "amibake:run-id", "Value": run_id}]
    name = f"amibake-{run_id}"
    cloud.ec2.create_key_pair(
        KeyName=name, TagSpecifications=[{"ResourceType": "key-pair", "Tags": tags}]
    )
    journal.created(run_id, "key-pair", name, cloud.config.region, "local")
    group = cloud.ec2.create_security_group(
        GroupName=name,
        Description="gc test",
        TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
    )["GroupId"]
    journal.created(run_id, "security-group", group, cloud.config.region, "local")

    def in_use(ec2: Any, group_id: str, unseen_for: float = 0.0) -> None:
        raise CloudError(f"{group_id} is still in use (DependencyViolation)")

    with monkeypatch.context() as patch:
        patch.setattr(gc, "delete_security_group", in_use)
        assert main(["gc", "--run-id", run_id]) == 1
    out, err = capsys.readouterr()
    assert (out + err).count(f"deleted key-pair {name}") == 1, out + err
    assert "deleted security-group" not in out + err, out + err
    assert f"{group} is still in use" in out, out
    assert main(["gc", "--run-id", run_id, "--json"]) == 0
    deleted = json.loads(capsys.readouterr().out)["deleted"]
    # dated by the journal (EC2 says no creation time of a group)
    assert deleted == [f"security-group {group} (run {run_id}, 0.0h old)"], deleted
    assert tagged_alive(cloud, run_id) == []


def test_gc_names_the_regions_it_did_not_look_in(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run in another region whose process died: its key pair is there, and in the journal.
    there = connect(replace(cloud.config, region="eu-west-1"))
    run_id = new_run_id()
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    journal.start_run(run_id, "build", "local", "eu-west-1")
    journal.finish_run(run_id, "killed")
    name = f"amibake-{run_id}"
    there.ec2.create_key_pair(
        KeyName=name,
        KeyType="ed25519",
        TagSpecifications=[
            {"ResourceType": "key-pair", "Tags": [{"Key": "amibake:run-id", "Value": run_id}]}
        ],
    )
    journal.created(run_id, "key-pair", name, "eu-west-1", "local")
    assert main(["gc", "--run-id", run_id]) == 0
    out, err = capsys.readouterr()
    assert out == "nothing to clean up in us-east-1\n"
    assert err.endswith(
        "amibake gc: the journal lists resources in eu-west-1 not known to be deleted, and this "
        "looked in us-east-1 only: run amibake gc --region eu-west-1\n"
    ), err
    assert main(["gc", "--run-id", run_id, "--region", "eu-west-1"]) == 0
    assert f"deleted key-pair {name}" in capsys.readouterr().out
    assert (
        there.ec2.describe_key_pairs(Filters=[{"Name": "tag:amibake:run-id", "Values": [run_id]}])[
            "KeyPairs"
        ]
        == []
    )
    assert journal.alive(run_id) == []


def test_no_default_vpc_is_named_with_how_to_create_it_before_anything_is_made(
    cloud: Cloud, local_dir: Path
) -> None:
    # AWS refuses a launch that names no subnet, DryRun included, where the default VPC is gone.
    before = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    with (
        failing(cloud, "RunInstances", "VPCIdNotSpecified", times=1) as hits,
        pytest.raises(CloudError) as raised,
    ):
        pipelines.build(cloud, request())
    assert hits[0] == 1
    assert str(raised.value) == (
        "no default VPC in us-east-1: name the subnets to launch in (subnet_ids in amibake.toml, "
        "AMIBAKE_SUBNET_IDS or --subnet), or create it with 'aws ec2 create-default-vpc "
        "--region us-east-1'"
    )
    assert Journal(cloud.config.results_dir / "journal.sqlite").last_run_id() == before


def test_no_default_vpc_at_the_security_group_step_leaves_nothing(
    cloud: Cloud, local_dir: Path
) -> None:
    def no_vpcs(**_: Any) -> Any:
        parsed = {"Vpcs": [], "ResponseMetadata": {"HTTPStatusCode": 200}}
        return AWSResponse("https://ec2.local", 200, {}, None), parsed  # type: ignore[arg-type]

    with hooked(cloud, "before-call.ec2.DescribeVpcs", no_vpcs):
        outcome = pipelines.build(cloud, request())[0]
    assert not outcome.ok
    assert "no default VPC in us-east-1" in outcome.error and "create-default-vpc" in outcome.error
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def test_ssh_waits_for_the_latest_console_output_not_the_buffered_one(
    cloud: Cloud, local_dir: Path
) -> None:
    # On AWS the buffered output lags the boot by minutes; the host key is read from the latest.
    asked: list[object] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        asked.append(params["body"].get("Latest"))

    with hooked(cloud, "before-call.ec2.GetConsoleOutput", record):
        outcome = pipelines.build(cloud, request())[0]
    assert outcome.ok, outcome.error
    assert asked and set(asked) == {"true"}, asked


def test_a_recipe_that_does_not_ask_for_gcc_is_told_to(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    # The base image has no compiler (as the ECS-optimized AMI): the recipe must install one.
    toml = copy_recipe(tmp_path) / "recipe.toml"
    toml.write_text(toml.read_text().replace('packages = ["gcc"]', "packages = []"))
    outcome = pipelines.build(cloud, request(recipes_dir=toml.parent.parent))[0]
    assert not outcome.ok
    assert outcome.error.endswith(f"has no gcc to build c5a: add gcc to the packages of {toml}")
    assert_nothing_left(cloud, _last_run(cloud), local_dir)


def _pid_started(journal: Journal, run_id: str, when: str) -> None:
    """The run's process as recorded: `when` it started (another process's pid, reused)."""
    import sqlite3

    with sqlite3.connect(journal.path) as db:
        db.execute("UPDATE runs SET pid_started = ? WHERE run_id = ?", (when, run_id))


def test_gc_leaves_a_live_run_s_resources_and_takes_them_once_it_is_dead(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc deleted whatever was not kept, live runs' too: a bake's image before it was kept, a
    bench's instances, a colleague's run in the same results dir. A run whose process is alive
    (this one) keeps its resources; one whose pid another process has taken since is dead."""
    run_id = new_run_id()
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    journal.start_run(run_id, "build", "local", cloud.config.region)
    name = f"amibake-{run_id}"
    tags = [{"Key": "amibake:run-id", "Value": run_id}]
    cloud.ec2.create_key_pair(
        KeyName=name, TagSpecifications=[{"ResourceType": "key-pair", "Tags": tags}]
    )
    journal.created(run_id, "key-pair", name, cloud.config.region, "local")
    assert journal.live_runs() == {run_id: os.getpid()}
    for args in ([], ["--run-id", run_id]):
        assert main(["gc", *args]) == 0
        out = capsys.readouterr().out
        assert f"keep key-pair {name}" in out and f"run {run_id} is running (pid {os.getpid()})" in out, out  # fmt: skip
        assert tagged_alive(cloud, run_id) == [f"key-pair {name}"]
    assert journal.run_state(run_id) == "running"
    _pid_started(journal, run_id, "1")  # the pid is another process's now
    assert journal.live_runs() == {}
    assert main(["gc"]) == 0
    assert f"deleted key-pair {name}" in capsys.readouterr().out
    assert tagged_alive(cloud, run_id) == []
    assert journal.run_state(run_id) == "killed"


@pytest.mark.parametrize("hours", [6, -1], ids=["unexpired", "past-its-expiry"])
def test_gc_leaves_a_run_no_journal_here_knows_until_its_expiry_unless_given_its_id(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], hours: int
) -> None:
    """A shared account: a colleague's, or CI's, build runs from another machine's results
    dir. This journal has never heard of it; gc took its live instance, key pair and group
    as leftovers. Until its resources' amibake:expires it may be running: kept, and said why."""
    from datetime import timedelta

    from amibake.cloud import tags as tag_names

    run_id = new_run_id()
    assert run_id not in Journal(cloud.config.results_dir / "journal.sqlite").known_runs()
    name = f"amibake-{run_id}"
    theirs = tag_names.run_tags(
        run_id, "arn:aws:iam::123456789012:user/colleague", timedelta(hours=hours)
    )
    cloud.ec2.create_key_pair(
        KeyName=name, TagSpecifications=[tag_names.specification("key-pair", theirs)]
    )
    assert main(["gc"]) == 0
    out = capsys.readouterr().out
    if hours < 0:
        assert f"deleted key-pair {name}" in out, out
    else:
        assert f"keep key-pair {name}" in out, out
        assert f"run {run_id} is not in this journal" in out and "amibake:expires" in out, out
        assert tagged_alive(cloud, run_id) == [f"key-pair {name}"]
        assert main(["gc", "--run-id", run_id]) == 0  # asked by id: taken as stopped
        assert f"deleted key-pair {name}" in capsys.readouterr().out
    assert tagged_alive(cloud, run_id) == []


@pytest.mark.parametrize("hours_ago", [0, 7], ids=["recent", "past-its-expiry"])
def test_gc_leaves_a_run_another_machine_runs_unless_given_its_id_or_long_past(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], hours_ago: int
) -> None:
    """A results dir shared between machines: whether another's run lives cannot be told here.
    Past its resources' amibake:expires (6 h) it is taken for dead: a container's or a CI
    machine's name is gone with it, and its instances were kept for ever."""
    import sqlite3

    run_id = new_run_id()
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    journal.start_run(run_id, "build", "local", cloud.config.region)
    with sqlite3.connect(journal.path) as db:
        db.execute(
            "UPDATE runs SET host = 'ci-runner-7', started = started - ? WHERE run_id = ?",
            (hours_ago * 3600, run_id),
        )
    name = f"amibake-{run_id}"
    cloud.ec2.create_key_pair(
        KeyName=name,
        TagSpecifications=[
            {"ResourceType": "key-pair", "Tags": [{"Key": "amibake:run-id", "Value": run_id}]}
        ],
    )
    journal.created(run_id, "key-pair", name, cloud.config.region, "local")
    assert main(["gc"]) == 0
    out = capsys.readouterr().out
    if hours_ago:
        assert f"deleted key-pair {name}" in out, out
    else:
        assert f"run {run_id} is running on ci-runner-7" in out, out
        assert main(["gc", "--run-id", run_id]) == 0
        assert f"deleted key-pair {name}" in capsys.readouterr().out
    assert tagged_alive(cloud, run_id) == []
