"""`amibake build` on the local cloud: the artifact, the cache, and nothing left behind when a
run is killed at any step.

The trivial recipe's hello uses no instruction beyond its architecture's baseline, so the family
it is built for here is data: any x86-64 machine runs it (an arm64 one under QEMU). Tests that
run a tuned build's code take this machine's family at run time (the host_family fixture)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest

from amibake import catalog, cpu, flags, pipelines, recipes, runner
from amibake.cloud import Cloud
from amibake.journal import Journal
from amibake.runner import Interrupted
from amibake.sources import sha256_of
from tests.helpers import other_architecture_family, tagged_alive, wait_until_clean

FIXTURES = Path(__file__).parent / "recipes"
STEPS_THAT_CREATE = [
    "key-pair",
    "security-group",
    "launch-template",
    "launch",
    "connect",
    "build",
    "verify",
    "fetch",
]


def request(**kw: object) -> pipelines.BuildRequest:
    defaults: dict[str, object] = {
        "families": ["c5a"],
        "recipe": "trivial",
        "size": "large",
        "recipes_dir": FIXTURES,
    }
    return pipelines.BuildRequest(**{**defaults, **kw})  # type: ignore[arg-type]


def journal(cloud: Cloud) -> Journal:
    return Journal(cloud.config.results_dir / "journal.sqlite")


def assert_nothing_left(cloud: Cloud, run_id: str, local_dir: Path) -> None:
    assert tagged_alive(cloud, run_id) == []
    assert journal(cloud).alive(run_id) == []
    assert wait_until_clean(local_dir) == []


@pytest.mark.e2e
def test_kernels_build_for_this_machine_family(
    cloud: Cloud, local_dir: Path, host: cpu.Cpu, host_family: str
) -> None:
    outcome = pipelines.build(
        cloud,
        request(families=[host_family], recipe="kernels", recipes_dir=recipes.RECIPES_DIR),
    )[0]
    assert outcome.ok, outcome.error
    state = outcome.state
    assert state is not None and state.artifact is not None
    family = catalog.family(host_family)
    assert state.artifact.name == f"kernels_{host_family}.tar.xz"
    manifest = json.loads(
        state.artifact.with_name(f"kernels_{host_family}.manifest.json").read_text()
    )
    assert manifest["target"] == flags.family_target(family).name
    compiler = flags.Compiler.parse(manifest["compiler"])
    assert flags.for_family(family, compiler).cflags in manifest["cflags"]
    # The scan's features are the build's to run: this machine runs them, as its pick said.
    expected = cpu.verdict(family.architecture, set(manifest["isa_features"]), host)
    assert expected.runs, expected
    assert manifest["smoke"] == "passed" and manifest["smoke_on"] == expected.how
    assert "kernel=sieve checksum=" in manifest["smoke_output"]
    assert manifest["programs"] == ["bin/kernels"]
    with tarfile.open(state.artifact) as tar:
        names = set(tar.getnames())
        inner = json.loads(tar.extractfile("./manifest.json").read())  # type: ignore[union-attr]
        owners = {(m.uid, m.gid) for m in tar.getmembers()}
    assert {"./bin/kernels", "./manifest.json"} <= names
    assert inner["files"] == manifest["files"]
    assert owners == {(0, 0)}  # root's on every host that unpacks it, whoever built it
    run_id = journal(cloud).last_run_id()
    assert run_id is not None and journal(cloud).run_state(run_id) == "succeeded"
    assert_nothing_left(cloud, run_id, local_dir)


def test_the_same_inputs_never_build_twice(cloud: Cloud) -> None:
    _fresh(cloud)
    first = pipelines.build(cloud, request())[0]
    assert first.ok and not first.state.cache_hit  # type: ignore[union-attr]
    second = pipelines.build(cloud, request())[0]
    assert second.ok and second.state is not None and second.state.cache_hit
    assert second.state.instance_id == ""  # nothing was launched
    assert second.state.smoke == "passed (when built)"  # the cached build's, not "None"


def test_the_same_build_started_twice_at_once_builds_once(cloud: Cloud) -> None:
    # fleet tune's trials in flight can ask for the same build: both used to write the same
    # files (one fetch failed, the other's archive was corrupt).
    _fresh(cloud)
    with ThreadPoolExecutor(2) as pool:
        outcomes = [o[0] for o in pool.map(lambda _: pipelines.build(cloud, request()), "ab")]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    states = [o.state for o in outcomes]
    assert sorted(bool(s.cache_hit) for s in states) == [False, True]  # type: ignore[union-attr]
    built = next(s for s in states if not s.cache_hit)  # type: ignore[union-attr]
    sidecar = json.loads((built.artifacts_dir / f"{built.label}.manifest.json").read_text())  # type: ignore[union-attr]
    assert sidecar["artifact_sha256"] == sha256_of(built.artifact)  # type: ignore[union-attr,arg-type]


def test_a_run_waiting_for_another_to_build_the_same_stops_when_cancelled(cloud: Cloud) -> None:
    _fresh(cloud)
    locks = cloud.config.results_dir / "artifacts" / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    held = (locks / "trivial_c5a.lock").open("wb")
    fcntl.flock(held, fcntl.LOCK_EX)  # another run is building trivial_c5a
    pool = ThreadPoolExecutor(1)
    try:
        journal = Journal(cloud.config.results_dir / "journal.sqlite")
        before = journal.last_run_id()
        waiting = pool.submit(pipelines.build, cloud, request())
        deadline = time.monotonic() + 60
        # preflight done, the run journaled and opened (cancellable): it is at the cache step
        while (
            not (journal.last_run_id() != before and runner._open) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        time.sleep(0.5)  # and still waiting on the lock half a second on
        still_waiting = not waiting.done()
        asked = runner.cancel_all()
        try:
            outcomes = waiting.result(timeout=30)
        except Interrupted:
            outcomes = []
    finally:  # released before the pool is joined, so a failed assertion cannot hang here
        held.close()
        pool.shutdown(wait=True)
        runner.allow_runs()  # as the search does once its trials have stopped
    assert still_waiting and asked == 1
    assert all(not o.ok and "interrupted" in o.error for o in outcomes), outcomes
    assert journal.alive(journal.last_run_id() or "") == []  # it created nothing


def test_a_build_this_machine_cannot_run_is_kept_and_its_smoke_test_says_why(
    cloud: Cloud, host: cpu.Cpu, tmp_path: Path
) -> None:
    # An AMX instruction (in code never called, as behind a run-time CPU check) makes a c7i
    # build need amx_tile, which only Sapphire Rapids and newer have and QEMU cannot emulate.
    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    source = root / "trivial" / "src" / "hello.c"
    source.write_text(
        source.read_text()
        + '\n__attribute__((used)) static void tiles(void) { __asm__ volatile("tilerelease"); }\n'
    )
    outcome = pipelines.build(cloud, request(families=["c7i"], recipes_dir=root))[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None and "amx_tile" in outcome.state.isa_features
    if "amx_tile" in host.features and host.architecture == "x86_64":
        assert outcome.state.smoke == "passed"  # this machine has AMX
    else:  # reported, not failed: the build is for c7i's CPUs, not this machine's
        assert outcome.state.smoke.startswith("skipped: the build host ("), outcome.state.smoke
        assert "qemu-x86_64-static does not emulate amx_tile" in outcome.state.smoke
        assert "(it uses amx_tile: tilerelease)" in outcome.state.smoke  # the instruction


def test_a_run_whose_build_failed_is_recorded_as_failed(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    # One family's build fails, the other's succeeds: the run returns, and is a failure.
    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    template = root / "trivial" / "build.sh.j2"
    template.write_text(
        template.read_text()
        + '{% if family == "c6a" %}echo "broken on purpose"; exit 1{% endif %}\n'
    )
    outcomes = pipelines.build(cloud, request(families=["c5a", "c6a"], recipes_dir=root))
    assert [o.ok for o in outcomes] == [True, False]
    run_id = journal(cloud).last_run_id()
    assert run_id is not None and journal(cloud).run_state(run_id) == "failed"
    assert journal(cloud).run_detail(run_id) == "trivial_c6a failed; nothing left"
    assert_nothing_left(cloud, run_id, local_dir)


def test_several_families_build_concurrently(cloud: Cloud, local_dir: Path) -> None:
    calls: list[str] = []

    def count(event_name: str, **_: object) -> None:
        calls.append(event_name.rsplit(".", 1)[1])

    cloud.ec2.meta.events.register("before-call.ec2.*", count)
    try:
        outcomes = pipelines.build(cloud, request(families=["c6a", "c6i", "m5"]))
    finally:
        cloud.ec2.meta.events.unregister("before-call.ec2.*", count)
    assert [o.ok for o in outcomes] == [True, True, True], [o.error for o in outcomes]
    # What the three launches need alike is looked up once for the run.
    assert calls.count("DescribeVpcs") == 1 and calls.count("DescribeSubnets") == 1, calls
    assert calls.count("CreateSecurityGroup") == 3
    targets = {o.family: o.state.flags.target for o in outcomes}  # type: ignore[union-attr]
    assert targets == {"c6a": "zen3", "c6i": "icelake", "m5": "skylake_avx512"}
    run_id = journal(cloud).last_run_id()
    assert run_id is not None
    assert_nothing_left(cloud, run_id, local_dir)


def _fresh(cloud: Cloud) -> None:
    """Drop cached trivial artifacts so the next run builds."""
    for path in (cloud.config.results_dir / "artifacts").glob("trivial_*"):
        path.unlink()


@pytest.mark.parametrize("step", STEPS_THAT_CREATE)
def test_ctrl_c_after_any_step_leaves_nothing(cloud: Cloud, local_dir: Path, step: str) -> None:
    _fresh(cloud)

    def interrupt(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        pipelines.build(cloud, request(), on_boundary=interrupt)
    run_id = journal(cloud).last_run_id()
    assert run_id is not None and journal(cloud).run_state(run_id) == "interrupted"
    assert_nothing_left(cloud, run_id, local_dir)


@pytest.mark.parametrize("step", STEPS_THAT_CREATE)
def test_an_error_after_any_step_leaves_nothing(cloud: Cloud, local_dir: Path, step: str) -> None:
    _fresh(cloud)

    def explode(name: str) -> None:
        if name == step:
            raise RuntimeError(f"injected after {name}")

    with pytest.raises(RuntimeError, match="injected"):
        pipelines.build(cloud, request(), on_boundary=explode)
    run_id = journal(cloud).last_run_id()
    assert run_id is not None and journal(cloud).run_state(run_id) == "failed"
    assert_nothing_left(cloud, run_id, local_dir)


@pytest.mark.parametrize(
    "operation", ["ImportKeyPair", "CreateSecurityGroup", "CreateLaunchTemplate", "CreateFleet"]
)
def test_ctrl_c_while_a_create_call_is_in_flight_leaves_nothing(
    cloud: Cloud, local_dir: Path, operation: str
) -> None:
    """Ctrl-C lands as AWS answers a create: held until the run has recorded what was made,
    then the run unwinds it. Raised inside the call, it left the resource to gc's tag scan, and
    an instant fleet to nothing."""
    _fresh(cloud)

    def interrupt(**_: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    cloud.ec2.meta.events.register(f"after-call.ec2.{operation}", interrupt)
    try:
        with pytest.raises(Interrupted):
            pipelines.build(cloud, request())
    finally:
        cloud.ec2.meta.events.unregister(f"after-call.ec2.{operation}", interrupt)
    run_id = journal(cloud).last_run_id()
    assert run_id is not None and journal(cloud).run_state(run_id) == "interrupted"
    assert_nothing_left(cloud, run_id, local_dir)


def test_keep_on_error_keeps_the_instance_and_gc_removes_it(
    cloud: Cloud, local_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from amibake import gc

    _fresh(cloud)

    def explode(name: str) -> None:
        if name == "connect":
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError) as failed:
        pipelines.build(cloud, request(keep_on_error=True), on_boundary=explode)
    # What it keeps is the cloud's; the artifact lock is this process's and is let go, or the
    # next build of trivial_c5a in this process (a test, fleet tune's next trial) would wait
    # for it. Checked while the failure (and so the failed run's state) is still alive.
    assert failed.value is not None
    with (cloud.config.results_dir / "artifacts" / ".locks" / "trivial_c5a.lock").open("wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
    run_id = journal(cloud).last_run_id()
    assert run_id is not None
    kept = tagged_alive(cloud, run_id)
    assert any(k.startswith("instance") for k in kept)
    key_file = cloud.config.results_dir / "logs" / run_id / "c5a.pem"
    assert key_file.stat().st_mode & 0o777 == 0o600
    # The hint's ssh checks the host key the run verified: it reaches the kept instance, and
    # refuses a known_hosts that names another key (the hint had no host key checking).
    (hint,) = [r.getMessage() for r in caplog.records if "for debugging: ssh " in r.getMessage()]
    command = shlex.split(hint.split("for debugging: ", 1)[1])
    known = key_file.with_suffix(".known_hosts")
    assert f"UserKnownHostsFile={known}" in command and "StrictHostKeyChecking=yes" in command
    batch = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    reached = subprocess.run([command[0], *batch, *command[1:], "echo", "reached"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert reached.stdout.strip() == "reached", reached.stderr
    real = known.read_text()
    forged = real.split()[0] + " ssh-rsa " + paramiko.RSAKey.generate(1024).get_base64() + "\n"
    known.write_text(forged)
    refused = subprocess.run([command[0], *batch, *command[1:], "echo", "reached"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode != 0 and "reached" not in refused.stdout, refused
    leftovers = gc.find(cloud, journal(cloud), run_id=run_id)
    assert {x.kind for x in leftovers} >= {"instance", "key-pair", "security-group"}
    assert gc.delete(cloud, journal(cloud), leftovers) == (leftovers, [])
    assert not key_file.exists()  # it opened nothing once its key pair was gone
    assert not known.exists()
    assert_nothing_left(cloud, run_id, local_dir)


def test_a_build_for_the_other_architecture_runs_under_qemu_and_computes_the_same(
    cloud: Cloud, host: cpu.Cpu, host_family: str
) -> None:
    # Every local instance runs on this machine's CPU: the other architecture's family is
    # cross-compiled, and its smoke test runs under QEMU. Its checksums equal those of this
    # machine's native build: the cross build computes the same results.
    other = other_architecture_family(host)
    outcomes = pipelines.build(
        cloud,
        request(families=[host_family, other], recipe="kernels", recipes_dir=recipes.RECIPES_DIR),
    )
    assert [o.ok for o in outcomes] == [True, True], [o.error for o in outcomes]
    native, crossed = (o.state for o in outcomes)
    assert native is not None and crossed is not None
    assert crossed.manifest["architecture"] != host.architecture
    assert crossed.manifest["smoke"] == "passed" and crossed.manifest["smoke_on"] == "emulated"
    if not crossed.cache_hit:
        assert crossed.cc.endswith("-linux-gnu-gcc")  # the cross compiler
    flagship = flags.for_family(
        catalog.family(other), flags.Compiler.parse(crossed.manifest["compiler"])
    )
    assert flagship.cflags in crossed.manifest["cflags"]

    def checksums(manifest: dict[str, object]) -> list[str]:
        lines = str(manifest["smoke_output"]).splitlines()
        return [
            " ".join(w for w in line.split() if w.startswith(("kernel=", "checksum=")))
            for line in lines
        ]

    assert len(checksums(crossed.manifest)) == 4
    assert checksums(crossed.manifest) == checksums(native.manifest)


def test_instructions_beyond_the_target_fail_the_isa_scan(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    source = root / "trivial" / "src" / "hello.c"
    # A vector loop that -mavx512f turns into zmm code; zen2 (c5a's target) has no AVX-512.
    source.write_text(
        "#include <stdio.h>\nfloat a[4096], b[4096];\n"
        "int main(void) { for (int i = 0; i < 4096; i++) a[i] = a[i] * 2.0f + b[i];\n"
        '  printf("hello from %f\\n", a[7]); return 0; }\n'
    )
    template = root / "trivial" / "build.sh.j2"
    template.write_text(template.read_text().replace("{{ cflags }}", "{{ cflags }} -O3 -mavx512f"))
    _fresh(cloud)
    outcome = pipelines.build(cloud, request(recipes_dir=root))[0]
    assert not outcome.ok
    assert "ISA scan" in outcome.error and "beyond target zen2" in outcome.error
    assert "avx512f (v" in outcome.error  # named with an instruction that needs it
    run_id = journal(cloud).last_run_id()
    assert run_id is not None
    assert_nothing_left(cloud, run_id, local_dir)


def test_the_tmpfs_is_capped_by_the_recipe_and_a_missing_artifact_is_named(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    toml = root / "trivial" / "recipe.toml"
    toml.write_text(
        toml.read_text()
        .replace("tmpfs_max_mb = 256", "tmpfs_max_mb = 96")
        .replace('artifacts = ["bin/hello"]', 'artifacts = ["bin/hello", "bin/absent"]')
    )
    template = root / "trivial" / "build.sh.j2"
    template.write_text(
        template.read_text()
        + 'echo "shared tmpfs: $(df -m --output=size /shared | tail -1 | tr -d " ") MiB"\n'
    )
    _fresh(cloud)
    outcome = pipelines.build(cloud, request(recipes_dir=root))[0]
    assert not outcome.ok
    assert "build produced no bin/absent in" in outcome.error
    run_id = journal(cloud).last_run_id()
    assert run_id is not None
    logs = "".join(
        p.read_text() for p in (cloud.config.results_dir / "logs" / run_id).glob("*.log")
    )
    assert "shared tmpfs: 96 MiB" in logs
    assert_nothing_left(cloud, run_id, local_dir)


def test_the_launch_encrypts_the_base_image_s_own_root_volume_asks_imdsv2_and_opens_ssh_alone(
    cloud: Cloud,
) -> None:
    """Amazon Linux's root device is /dev/xvda, another base image's may be /dev/sda1: a mapping
    of /dev/xvda then added an empty encrypted volume and left the root as the image had it."""
    from amibake.steps.access import SecurityGroup
    from amibake.steps.launch import LaunchTemplate
    from amibake.steps.preflight import preflight_instance
    from amibake.steps.state import InstanceState
    from tests.helpers import base_ami

    volume = cloud.ec2.create_volume(AvailabilityZone=f"{cloud.config.region}a", Size=8)
    snapshot = cloud.ec2.create_snapshot(VolumeId=volume["VolumeId"])["SnapshotId"]
    other = cloud.ec2.register_image(
        Name=f"sda1-{time.time_ns()}",
        Architecture="x86_64",
        RootDeviceName="/dev/sda1",
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": snapshot}}],
    )["ImageId"]
    try:
        for image, root in ((base_ami(cloud), "/dev/xvda"), (other, "/dev/sda1")):
            state = InstanceState(family=catalog.family("c7i"), size="large", base_ami=image)
            preflight_instance(cloud, state)
            assert state.root_device == root
            with pipelines.open_run(cloud, "test root device") as context:
                group, step = SecurityGroup(context), LaunchTemplate(context)
                group.run(state)
                try:
                    (rule,) = cloud.ec2.describe_security_groups(
                        GroupIds=[state.security_group_id]
                    )["SecurityGroups"][0]["IpPermissions"]
                    step.run(state)
                    try:
                        data = cloud.ec2.describe_launch_template_versions(
                            LaunchTemplateId=state.launch_template_id
                        )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
                    finally:
                        step.cleanup(state)
                finally:
                    group.cleanup(state)
            # SSH alone, from the caller's address alone (the local cloud's is loopback's).
            assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22)
            assert [r["CidrIp"] for r in rule["IpRanges"]] == ["127.0.0.1/32"]
            assert not rule.get("Ipv6Ranges") and not rule.get("UserIdGroupPairs")
            (mapping,) = data["BlockDeviceMappings"]
            assert mapping["DeviceName"] == root and mapping["Ebs"]["Encrypted"] is True
            # IMDSv2 only, one hop: the instance's own processes, no container's (the local
            # cloud's IMDS asks a token of every call whatever the template says, so the
            # template itself is read here).
            metadata = data["MetadataOptions"]
            assert metadata["HttpTokens"] == "required"
            assert int(metadata["HttpPutResponseHopLimit"]) == 1
    finally:
        cloud.ec2.deregister_image(ImageId=other)
        cloud.ec2.delete_snapshot(SnapshotId=snapshot)
        cloud.ec2.delete_volume(VolumeId=volume["VolumeId"])
