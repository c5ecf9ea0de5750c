"""`amibake bake` on the local cloud: the image, its hygiene, its boot test, and nothing left
when a bake fails or is killed."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amibake import bake, cpu, pipelines, render
from amibake.cli import main
from amibake.cloud import Cloud
from amibake.errors import UserError
from amibake.journal import Journal
from amibake.local import control
from amibake.remote import parse_fingerprints
from amibake.runner import Interrupted
from tests.helpers import tagged_alive, tagged_images_alive, wait_for, wait_until_clean
from tests.test_build import FIXTURES

AL2_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2/recommended/image_id"
ARM64_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/arm64/recommended/image_id"


@pytest.fixture(scope="module")
def built(cloud: Cloud) -> Iterator[None]:
    """A trivial c5a artifact to bake (and nothing else in the artifacts directory). Its hello
    needs nothing beyond x86-64's baseline: every x86-64 machine runs it, an arm64 one under
    QEMU, so the family is data here."""
    artifacts = cloud.config.results_dir / "artifacts"
    shutil.rmtree(artifacts, ignore_errors=True)
    request = pipelines.BuildRequest(["c5a"], "trivial", "large", recipes_dir=FIXTURES)
    assert pipelines.build(cloud, request)[0].ok
    yield


def _last_run(cloud: Cloud) -> str:
    run_id = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert run_id is not None
    return run_id


def _image_files(cloud: Cloud, image_id: str) -> dict[str, tuple[str, int]]:
    """Each entry of the image's snapshot as the local cloud stores it, by path: its type as
    find(1) names it (f, d, l; c for an overlay whiteout) and its size. Read inside the
    daemon's namespaces: the store is mounted there only, and a plain user's sandboxes wrote
    their files as subordinate ids that map back only there (outside, ec2-user's home cannot
    even be listed)."""
    daemon = control.find(cloud.config)
    status = control.status(cloud.config)
    assert daemon is not None and status is not None
    enter = ["nsenter", f"--target={daemon.pid}", "--mount"]
    if os.geteuid() != 0:
        enter.insert(2, "--user")  # as root of the daemon's user namespace
    layer = f"{status['image_store']}/{image_id}/layer"
    found = subprocess.run(
        [*enter, "find", layer, "-mindepth", "1", "-printf", r"%y %s %P\0"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    entries = (line.split(" ", 2) for line in found.split("\0") if line)
    return {path: (kind, int(size)) for kind, size, path in entries}


def test_tmpfs_size_for_several_shapes() -> None:
    assert bake.tmpfs_mb(3800, 2, 700) == 2400  # c7i.large: 2 vCPUs
    assert bake.tmpfs_mb(15000, 8, 700) == 9400  # 2xlarge
    assert bake.tmpfs_mb(190000, 96, 700) == 122800  # 24xlarge
    assert bake.tmpfs_mb(4096, 2, 0) == 4096
    with pytest.raises(UserError, match="leaves -1904 MiB for /shared on 2 vCPUs"):
        bake.tmpfs_mb(4096, 2, 3000)


def test_the_size_check_judges_a_shape_by_what_is_available_at_boot(cloud: Cloud) -> None:
    """A c7i.large is 4096 MiB, of which about 85% is available at boot: a reserve of 1700 MiB
    a vCPU leaves 696 MiB of the nominal memory, but none of what its tmpfs unit will find."""
    bake.check_shapes(cloud, ["c7i"], 700)
    with pytest.raises(UserError, match=r"^c7i\.large: .* leaves -?\d+ MiB for /shared"):
        bake.check_shapes(cloud, ["c7i"], 1700)


def _artifacts() -> list[bake.Artifact]:
    return [
        bake.Artifact("kernels", f, "x86_64", t, Path(f"/x/kernels_{f}.tar.xz"), {})
        for f, t in (("c7i", "sapphirerapids"), ("c5", "skylake_avx512"), ("c6a", "zen3"))
    ]


def test_rendered_units_and_scripts_pass_their_checks() -> None:
    files = bake.render_files(_artifacts(), "x86_64", 700, "http://169.254.169.254")
    assert set(files) == {
        "/etc/systemd/system/amibake-shared-tmpfs.service",
        "/etc/systemd/system/amibake-stage.service",
        "/usr/local/libexec/amibake/shared-tmpfs",
        "/usr/local/libexec/amibake/stage",
        "/etc/systemd/system/ecs.service.d/amibake.conf",
    }
    # The agent waits for the stage, and does not start when it failed: Before= alone started it.
    drop_in = files["/etc/systemd/system/ecs.service.d/amibake.conf"][0].splitlines()
    assert {"Requires=amibake-stage.service", "After=amibake-stage.service"} <= set(drop_in)
    staging = files["/etc/systemd/system/amibake-stage.service"][0]
    assert "Before=ecs.service cloud-final.service" in staging.splitlines()
    stage = files["/usr/local/libexec/amibake/stage"][0]
    assert "imds=http://169.254.169.254" in stage  # the real endpoint by default
    # Of sapphirerapids (53 features), skylake_avx512 (33) and zen3 (32), zen3 asks least.
    assert "kernels_c6a.tar.xz" in stage
    unit = files["/etc/systemd/system/amibake-shared-tmpfs.service"][0]
    assert "Before=ecs.service" in unit and "AMIBAKE_RESERVE_MB_PER_VCPU=700" in unit


class _Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 as the stage script asks it: a token, then the instance type."""

    instance_type = ""

    def do_PUT(self) -> None:
        self._answer("token")

    def do_GET(self) -> None:
        self._answer(self.instance_type)

    def _answer(self, text: str) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *_: Any) -> None:
        pass


ZEN3 = "fpu sse2 pni ssse3 sse4_1 sse4_2 popcnt avx avx2 fma bmi1 bmi2"  # an AMD Milan's flags
SPR = f"{ZEN3} avx512f avx512bw avx512vl avx512_vpopcntdq avx512_bf16"  # a Sapphire Rapids'


BUILDS = {
    "c6i": ("icelake", ["avx512f", "avx512bw", "avx512vl", "avx2"]),
    "c7a": ("zen4", ["avx512f", "avx512vl", "avx512_vpopcntdq", "avx512_bf16", "avx2"]),
    "c6a": ("zen3", ["avx2", "fma", "sse3"]),
}


@pytest.mark.parametrize(
    ("image", "instance_type", "flags", "staged"),
    [
        ("c6i c7a c6a", "c6i.large", ZEN3, "c6i"),  # its family's own build, as built for it
        ("c6i c7a c6a", "c7i.large", SPR, "c7a"),  # none for it: the newest target it runs
        ("c6i c7a c6a", "m6a.large", ZEN3, "c6a"),  # c6i's and c7a's need AVX-512: not Milan's
        # Neither runs on Milan: nothing staged and the unit fails (the agent stays down). The
        # build needing fewest features, taken blind, was c6i's: SIGILL at its first AVX-512.
        ("c6i c7a", "m6a.large", ZEN3, None),
        ("c6i c7a c6a", "t2.large", "fpu sse2 pni", None),
    ],
)
def test_the_stage_takes_a_build_this_cpu_runs(
    tmp_path: Path, image: str, instance_type: str, flags: str, staged: str | None
) -> None:
    """Run the rendered stage script against CPUs given as data."""
    data = tmp_path / "data"
    data.mkdir()
    artifacts = []
    for family in image.split():
        target, needs = BUILDS[family]
        tree = tmp_path / family
        tree.mkdir()
        (tree / "built-for").write_text(family)
        path = data / f"kernels_{family}.tar.xz"
        subprocess.run(["tar", "-cJf", str(path), "-C", str(tree), "."], check=True)
        manifest = {"isa_features": needs}
        artifacts.append(bake.Artifact("kernels", family, "x86_64", target, path, manifest))
    _Imds.instance_type = instance_type
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        script = bake.render_files(artifacts, "x86_64", 700, endpoint)[f"{bake.LIBEXEC}/stage"][0]
        cpuinfo, shared = tmp_path / "cpuinfo", tmp_path / "shared"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        # The instance's paths, here the test's own.
        for real, here in (
            ("/proc/cpuinfo", cpuinfo),
            ("/shared/", f"{shared}/"),
            ("/var/log/amibake/", f"{tmp_path}/log/"),
            (bake.DATA_DIR, data),
        ):
            script = script.replace(real, str(here))
        ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    if staged is None:
        assert ran.returncode == 1 and not (shared / "kernels").exists(), ran.stdout
        assert "no kernels build in this image runs on this CPU" in ran.stderr
    else:
        assert ran.returncode == 0, ran.stderr
        assert (shared / "kernels" / "built-for").read_text() == staged, ran.stdout


def test_both_architectures_render_and_check_together() -> None:
    # One bake per architecture, their checks sharing one scratch directory.
    arm = [bake.Artifact("kernels", "c7g", "arm64", "neoverse_v1", Path("/x/k.tar.xz"), {})]
    with render.Checks() as checks:
        x86 = bake.render_files(_artifacts(), "x86_64", 700, "http://169.254.169.254", checks)
        arm64 = bake.render_files(arm, "arm64", 700, "http://169.254.169.254", checks)
    assert set(x86) == set(arm64)
    assert "kernels_c7g.tar.xz" in arm64["/usr/local/libexec/amibake/stage"][0]


def test_a_unit_systemd_would_reject_is_refused_at_render_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    units = tmp_path / "units"
    shutil.copytree(bake.UNITS_DIR, units)
    unit = units / "amibake-stage.service.j2"
    unit.write_text(unit.read_text().replace("Type=oneshot", "Type=oneshoot"))
    monkeypatch.setattr(bake, "UNITS_DIR", units)
    with pytest.raises(UserError, match=r"systemd-analyze verify: .*oneshoot"):
        bake.render_files(_artifacts(), "x86_64", 700, "http://169.254.169.254")


def test_the_user_data_template_renders_and_passes_its_checks() -> None:
    assert "ECS_CLUSTER=jobs" in bake.user_data(ecs_cluster="jobs")
    assert "ECS_CLUSTER" not in bake.user_data()


def test_user_data_over_16_kib_is_refused() -> None:
    bake.check_user_data("#!/bin/bash\n" + "echo fits\n" * 100)
    with pytest.raises(UserError, match="EC2 accepts at most 16384"):
        bake.check_user_data("#!/bin/bash\n" + "echo too much\n" * 2000)


def _baseline_runs(host: cpu.Cpu) -> str:
    """How this machine runs x86-64 baseline code: natively, or (arm64) under QEMU."""
    return cpu.verdict("x86_64", set(), host).how


def test_a_baked_image_holds_its_builds_runtime_packages(
    cloud: Cloud, built: None, tmp_path: Path, host: cpu.Cpu
) -> None:
    # An OpenMP build needs libgomp, which the base image lacks: the bake installs the recipe's
    # runtime packages into the image, and the boot test's smoke run proves they are there.
    recipe = tmp_path / "omp"
    shutil.copytree(FIXTURES / "trivial", recipe)
    toml = (recipe / "recipe.toml").read_text().replace('name = "trivial"', 'name = "omp"')
    toml = toml.replace('"-O2"', '"-O2 -fopenmp"')
    toml = toml.replace('packages = ["gcc"]', 'packages = ["gcc"]\nruntime_packages = ["libgomp"]')
    (recipe / "recipe.toml").write_text(toml)
    (recipe / "src" / "hello.c").write_text(
        "#include <stdio.h>\n#include <omp.h>\n"
        'int main(void) { printf("hello from %d threads\\n", omp_get_max_threads()); }\n'
    )
    request = pipelines.BuildRequest(["c5a"], "omp", "large", recipes_dir=tmp_path)
    artifacts = cloud.config.results_dir / "artifacts"
    try:
        assert pipelines.build(cloud, request)[0].ok
        outcome = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    finally:
        for path in artifacts.glob("omp_c5a.*"):
            path.unlink()
    assert outcome.ok, outcome.error
    report = outcome.state.boot_report  # type: ignore[union-attr]
    smoke_on = _baseline_runs(host)
    assert report["apps"]["omp"] == {"family": "c5a", "smoke": "passed", "smoke_on": smoke_on}


@pytest.mark.e2e
def test_bake_boot_test_and_security_invariants(
    cloud: Cloud, built: None, local_dir: Path, host: cpu.Cpu
) -> None:
    sent: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        sent.append(params)

    cloud.ec2.meta.events.register("provide-client-params.ec2.ModifyImageAttribute", record)
    try:
        outcome = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    finally:
        cloud.ec2.meta.events.unregister("provide-client-params.ec2.ModifyImageAttribute", record)
    assert outcome.ok, outcome.error
    state = outcome.state
    assert state is not None
    image_id = state.image_id  # type: ignore[attr-defined]
    report = state.boot_report  # type: ignore[attr-defined]
    assert report["fstype"] == "tmpfs" and report["ecs_enabled"]
    assert report["ecs_cluster"] == "amibake-boot-test"  # the launch's user data ran
    smoke_on = _baseline_runs(host)
    assert report["apps"]["trivial"] == {"family": "c5a", "smoke": "passed", "smoke_on": smoke_on}
    # moto ignores ImdsSupport on images: assert on the request amibake sent.
    assert {"ImageId": image_id, "ImdsSupport": {"Value": "v2.0"}} in sent
    image = cloud.ec2.describe_images(ImageIds=[image_id])["Images"][0]
    assert image["Public"] is False
    permissions = cloud.ec2.describe_image_attribute(ImageId=image_id, Attribute="launchPermission")
    assert permissions["LaunchPermissions"] == []
    run_id = _last_run(cloud)
    snapshots = cloud.ec2.describe_snapshots(
        Filters=[{"Name": "tag:amibake:run-id", "Values": [run_id]}]
    )["Snapshots"]
    assert snapshots, "the image's snapshots carry the run's tags"
    # Hygiene, checked in the image's own layer. A deleted file that exists in a lower layer
    # (the host's own /etc/ssh keys) stays as an overlay whiteout (a 0/0 character device),
    # which every instance of the image sees as absent; only regular files are content.
    files = _image_files(cloud, image_id)
    regular = {path: size for path, (kind, size) in files.items() if kind == "f"}
    assert "usr/local/data/trivial_c5a.tar.xz" in regular
    host_keys = [path for path in files if path.startswith("etc/ssh/ssh_host_")]
    assert host_keys and not [k for k in host_keys if k in regular]
    assert "home/ec2-user/.ssh/authorized_keys" not in regular
    assert not [f for f in regular if f.startswith("var/lib/ecs/data/")]
    assert "var/cache/dnf" not in files  # what the bake's installs fetched
    assert regular["etc/machine-id"] == 0
    assert regular["etc/hostname"] == 0  # the build host's name is not the image's
    logs = {f: size for f, size in regular.items() if f.startswith("var/log/")}
    assert logs and not [f for f, size in logs.items() if size], logs
    assert not [f for f in regular if f.endswith("/.ssh/known_hosts")]
    record = json.loads((cloud.config.results_dir / "amis.json").read_text())[-1]
    assert record["image_id"] == image_id and "trivial_c5a.tar.xz" in record["artifacts"]
    # The product is kept; everything temporary is gone, and gc leaves the image alone.
    assert tagged_alive(cloud, run_id) == []
    assert main(["gc", "--run-id", run_id]) == 0
    assert cloud.ec2.describe_images(ImageIds=[image_id])["Images"]
    assert wait_until_clean(local_dir) == []


def test_the_build_host_rebooted_by_create_image_has_its_deadline_again(
    cloud: Cloud, built: None, local_dir: Path
) -> None:
    """CreateImage reboots the build host, and a reboot forgets its scheduled power-off (in
    /run): a bake SIGKILLed from there on would leave it to gc. But the hygiene removed
    cloud-init's record of the instance, so to cloud-init that boot is the instance's first: it
    writes new host keys and runs the user data again, whose last line is the deadline. Seen
    once the image is made: two boots on the console, the user data run twice, two host keys, and
    a power-off scheduled from the second boot."""
    minutes = cloud.config.instance_deadline_min
    seen: dict[str, Any] = {}

    def at(name: str) -> None:  # after each step
        if name == "hygiene":
            seen["before"] = time.time()
        if name != "create-image":
            return
        alive = tagged_alive(cloud, _last_run(cloud))
        instances = [r.split()[1] for r in alive if r.startswith("instance ")]
        assert len(instances) == 1, alive
        (instance_id,) = instances

        def console() -> str:
            return str(cloud.ec2.get_console_output(InstanceId=instance_id)["Output"])

        # The image can be available before the second boot's user data has run to its last
        # line (CI once read the deadline a moment early on a loaded host), as on EC2: wait for
        # cloud-init to say it finished on this boot, then read what it scheduled.
        boot = f"booting {instance_id}"

        def second_boot_ran_user_data() -> bool:
            boots = console().split(boot)
            return len(boots) == 3 and "cloud-init: user data finished" in boots[-1]

        wait_for(second_boot_ran_user_data, 30, "the second boot's user data to finish")
        seen["console"] = console()
        seen["shutdown_at"] = (control.status(cloud.config) or {})["instances"][instance_id][
            "shutdown_at"
        ]
        seen["id"] = instance_id

    outcomes = pipelines.bake(cloud, pipelines.BakeRequest(), on_boundary=at)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    console = seen["console"]
    assert console.count(f"booting {seen['id']}") == 2, console
    assert console.count("cloud-init: running user data") == 2, console
    assert len(parse_fingerprints(console)) == 2  # the hygiene removed the first boot's key
    powers_off = seen["shutdown_at"]
    assert powers_off is not None, "the rebooted build host has no deadline"
    assert seen["before"] <= powers_off - 60 * minutes <= time.time(), (seen, minutes)
    assert tagged_alive(cloud, _last_run(cloud)) == []  # the image is the bake's product
    assert wait_until_clean(local_dir) == []


def _assert_bake_left_nothing(cloud: Cloud, local_dir: Path) -> None:
    run_id = _last_run(cloud)
    assert tagged_alive(cloud, run_id) == []
    assert tagged_images_alive(cloud, run_id) == []
    assert Journal(cloud.config.results_dir / "journal.sqlite").alive(run_id) == []
    assert wait_until_clean(local_dir) == []


def test_ctrl_c_before_create_image_leaves_nothing(
    cloud: Cloud, built: None, local_dir: Path
) -> None:
    def interrupt(name: str) -> None:
        if name == "hygiene":
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        pipelines.bake(cloud, pipelines.BakeRequest(), on_boundary=interrupt)
    _assert_bake_left_nothing(cloud, local_dir)


def test_ctrl_c_while_waiting_for_the_image_leaves_nothing(
    cloud: Cloud, built: None, local_dir: Path
) -> None:
    pressed = [False]
    base = cloud.ssm.get_parameter(
        Name="/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id"
    )["Parameter"]["Value"]

    def interrupt(params: dict[str, Any], **_: Any) -> None:
        # One Ctrl-C, while the bake polls for its new image (not the base-image preflight).
        if not pressed[0] and params["body"].get("ImageId.1") not in (None, base):
            pressed[0] = True
            raise KeyboardInterrupt

    cloud.ec2.meta.events.register("before-call.ec2.DescribeImages", interrupt)
    try:
        with pytest.raises(Interrupted):
            pipelines.bake(cloud, pipelines.BakeRequest())
    finally:
        cloud.ec2.meta.events.unregister("before-call.ec2.DescribeImages", interrupt)
    _assert_bake_left_nothing(cloud, local_dir)


# A bake as its own process, held (asleep) once a call of the given operation has returned
# (RunInstances: the boot test's, of the image this bake made): the moment a SIGKILL is to hit.
HELD_BAKE = """
import sys, time
import botocore.client
made, images = botocore.client.BaseClient._make_api_call, []
def hold():
    print("amibake-test-held", flush=True)
    time.sleep(300)
def call(self, name, params):
    # "CreateTags:kept" / "CreateTags:kept-before": as the image is marked kept (after, before)
    operation, _, which = sys.argv[1].partition(":")
    kept = name == "CreateTags" and any(t["Key"] == "amibake:kept" for t in params["Tags"])
    if which == "kept-before" and kept:
        hold()
    answer = made(self, name, params)
    if name == "CreateImage":
        images.append(answer["ImageId"])
    if which == "kept" and kept:
        hold()
    if not which and name == operation and (name != "RunInstances" or params.get("ImageId") in images):
        hold()
    return answer
botocore.client.BaseClient._make_api_call = call
from amibake.cli import main
sys.exit(main(["bake", "--yes"]))
"""


def _kill_held_bake(held_at: str) -> None:
    """Run HELD_BAKE until it holds at `held_at`, then SIGKILL it."""
    bake_process = subprocess.Popen(
        [sys.executable, "-c", HELD_BAKE, held_at],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert bake_process.stdout is not None
        for line in bake_process.stdout:
            if line.strip() == "amibake-test-held":
                break
        else:
            raise AssertionError(f"the bake ended (rc {bake_process.wait()}) before {held_at}")
    finally:
        bake_process.kill()
        bake_process.wait()


@pytest.mark.parametrize("held_at", ["CreateImage", "RunInstances"])
def test_sigkill_mid_bake_then_gc_leaves_nothing(
    cloud: Cloud,
    built: None,
    local_dir: Path,
    capsys: pytest.CaptureFixture[str],
    held_at: str,
) -> None:
    """SIGKILL as the image is made (before the journal knows it: found by its tag) and in
    the boot test (its instance up from the image): gc deletes the image, its snapshot and the
    instances, and nothing is left. The image is not the product until it is kept."""
    _kill_held_bake(held_at)
    run_id = _last_run(cloud)
    assert tagged_images_alive(cloud, run_id), "the killed bake should have left its image"
    capsys.readouterr()
    assert main(["gc"]) == 0
    assert "deleted image ami-" in capsys.readouterr().out
    _assert_bake_left_nothing(cloud, local_dir)


@pytest.mark.parametrize("held_at", ["CreateTags:kept-before", "CreateTags:kept"])
def test_sigkill_as_the_image_is_kept_leaves_it_recorded_or_gone(
    cloud: Cloud,
    built: None,
    local_dir: Path,
    capsys: pytest.CaptureFixture[str],
    held_at: str,
) -> None:
    """SIGKILL as the image that passed is kept. It was marked kept before amis.json recorded
    it: killed between the two, it was a product no record named, never deleted by gc nor
    retired by bake --keep, its snapshot billed. Now recorded first: killed before its mark, gc
    deletes it and retires its record; after, it is the product, recorded."""
    amis_file = cloud.config.results_dir / "amis.json"
    before = [r["image_id"] for r in bake.baked(amis_file)] if amis_file.exists() else []
    _kill_held_bake(held_at)
    run_id = _last_run(cloud)
    capsys.readouterr()
    assert main(["gc"]) == 0
    records = {r["image_id"]: r for r in bake.baked(amis_file) if r["image_id"] not in before}
    left = [x.split()[1] for x in tagged_images_alive(cloud, run_id) if x.startswith("image")]
    try:
        # Whatever is left is recorded and live in amis.json; whatever amis.json names live is
        # left.
        live = sorted(i for i, r in records.items() if not r.get("retired"))
        assert sorted(left) == live, (left, records)
        assert left if held_at.endswith(":kept") else not left, left
        assert len(records) == 1, records  # recorded before it was marked, either way
    finally:
        for image_id in left:
            cloud.ec2.deregister_image(ImageId=image_id, DeleteAssociatedSnapshots=True)
        bake.mark_retired(amis_file, bake.retired_now(left))


def test_an_error_during_the_boot_test_leaves_nothing(
    cloud: Cloud, built: None, local_dir: Path
) -> None:
    base = cloud.ssm.get_parameter(
        Name="/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id"
    )["Parameter"]["Value"]

    launched: dict[str, str] = {}

    def explode(parsed: dict[str, Any], **_: Any) -> None:
        # The boot test's instance is the one launched from the new image.
        if parsed["Instances"][0]["ImageId"] != base:
            instance_id = parsed["Instances"][0]["InstanceId"]
            ec2 = cloud.ec2
            launched["behaviour"] = ec2.describe_instance_attribute(
                InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior"
            )["InstanceInitiatedShutdownBehavior"]["Value"]
            data = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
            launched["user_data"] = base64.b64decode(data["UserData"]["Value"]).decode()
            raise RuntimeError("injected during the boot test")

    cloud.ec2.meta.events.register("after-call.ec2.RunInstances", explode)
    try:
        with pytest.raises(RuntimeError, match="injected during the boot test"):
            pipelines.bake(cloud, pipelines.BakeRequest())
    finally:
        cloud.ec2.meta.events.unregister("after-call.ec2.RunInstances", explode)
    _assert_bake_left_nothing(cloud, local_dir)
    # Its deadline (amibake.deadline): a bake SIGKILLed in its boot test left it to gc.
    assert launched["behaviour"] == "terminate", launched
    assert "ECS_CLUSTER=amibake-boot-test" in launched["user_data"], launched
    assert launched["user_data"].rstrip().splitlines()[-1].startswith("shutdown -P --no-wall +")


@pytest.mark.parametrize("failing", ["tag", "record"])
def test_an_error_as_the_image_is_kept_leaves_nothing(
    cloud: Cloud, built: None, local_dir: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The image passed its boot test; marking it kept (amibake:kept) or writing amis.json
    fails. Before, it counted as kept from before the tag: left, unrecorded, to gc at best."""

    def explode(*_: Any, **__: Any) -> None:
        raise RuntimeError(f"injected as the image is kept ({failing})")

    def tag_fails(params: dict[str, Any], **_: Any) -> None:
        if "amibake:kept" in params["body"].values():
            explode()

    def record_fails(name: str) -> None:
        if name == "boot-test":  # amis.json is read (checked) before the bake, and read again
            monkeypatch.setattr(bake, "baked", explode)

    if failing == "tag":
        cloud.ec2.meta.events.register("before-call.ec2.CreateTags", tag_fails)
    try:
        with pytest.raises(RuntimeError, match="injected as the image is kept"):
            pipelines.bake(
                cloud,
                pipelines.BakeRequest(),
                on_boundary=record_fails if failing == "record" else None,
            )
    finally:
        cloud.ec2.meta.events.unregister("before-call.ec2.CreateTags", tag_fails)
    _assert_bake_left_nothing(cloud, local_dir)


def test_a_failed_boot_test_deregisters_the_image(
    cloud: Cloud, built: None, local_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    units = tmp_path / "units"
    shutil.copytree(bake.UNITS_DIR, units)
    stage = units / "stage.sh.j2"
    stage.write_text("#!/bin/bash\necho 'amibake-stage: (broken) staging nothing'\n")
    monkeypatch.setattr(bake, "UNITS_DIR", units)
    outcome = pipelines.bake(cloud, pipelines.BakeRequest())[0]
    assert not outcome.ok
    assert "nothing staged in /shared/trivial" in outcome.error
    _assert_bake_left_nothing(cloud, local_dir)


def _one_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["bake", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("amibake: error: "), err
    return err


def test_bake_bad_input(cloud: Cloud, built: None, capsys: pytest.CaptureFixture[str]) -> None:
    before = Journal(cloud.config.results_dir / "journal.sqlite").last_run_id()
    assert "no built artifact for c6a" in _one_line(capsys, "--family", "c6a")
    assert "does not exist" in _one_line(capsys, "--base-ami", "ami-0123456789abcdef0")
    arm = cloud.ssm.get_parameter(Name=ARM64_PARAMETER)["Parameter"]["Value"]
    assert "is arm64, but the artifacts are x86_64" in _one_line(capsys, "--base-ami", arm)
    al2 = cloud.ssm.get_parameter(Name=AL2_PARAMETER)["Parameter"]["Value"]
    assert "end of support on 2026-06-30" in _one_line(capsys, "--base-ami", al2)
    assert "leaves" in _one_line(capsys, "--tmpfs-reserve-mb-per-vcpu", "5000")
    # None of that started a run, let alone created anything.
    assert Journal(cloud.config.results_dir / "journal.sqlite").last_run_id() == before


def test_a_bake_on_a_base_image_rooted_elsewhere_encrypts_that_root(
    cloud: Cloud, built: None
) -> None:
    """The bake's launch template encrypts the volume mapped at the state's root device, which
    stayed Amazon Linux's /dev/xvda for any --base-ami: on an image rooted at /dev/sda1 the
    template added an empty encrypted volume, and the root went unencrypted into the image."""
    (default,) = pipelines.prepare_bake(cloud, pipelines.BakeRequest())
    assert default.root_device == "/dev/xvda"
    volume = cloud.ec2.create_volume(AvailabilityZone=f"{cloud.config.region}a", Size=8)
    snapshot = cloud.ec2.create_snapshot(VolumeId=volume["VolumeId"])["SnapshotId"]
    other = cloud.ec2.register_image(
        Name=f"sda1-{time.time_ns()}",
        Architecture=default.architecture,  # the built artifacts', whatever this machine is
        RootDeviceName="/dev/sda1",
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": snapshot}}],
    )["ImageId"]
    try:
        (state,) = pipelines.prepare_bake(cloud, pipelines.BakeRequest(base_ami=other))
        assert (state.base_ami, state.root_device) == (other, "/dev/sda1")
    finally:
        cloud.ec2.deregister_image(ImageId=other)
        cloud.ec2.delete_snapshot(SnapshotId=snapshot)
        cloud.ec2.delete_volume(VolumeId=volume["VolumeId"])


def test_bake_dry_run_renders_and_creates_nothing(
    cloud: Cloud, built: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bake", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)[0]
    assert plan["plan"][-3:] == ["create-image", "boot-test", "record"]
    assert "http://instance-data" in plan["files"]["/usr/local/libexec/amibake/stage"]
    assert plan["created"] == []


def test_bake_build_builds_what_is_missing_first(
    cloud: Cloud, built: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_RECIPES_DIR", str(FIXTURES))
    assert main(["bake", "--build", "--recipe", "trivial", "--family", "c5a,c6a", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    assert sorted(result["artifacts"]) == ["trivial_c5a.tar.xz", "trivial_c6a.tar.xz"]
    assert result["boot_test"]["staged"]
    assert main(["bake", "--build"]) == 2
    assert "--build needs --family" in capsys.readouterr().err
    assert main(["bake", "--family", "c5a"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("x86_64: ami-") and line.endswith("boot test passed"), line


def test_a_damaged_record_is_named_before_anything_is_made(
    cloud: Cloud,
    built: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from amibake.cli import main as amibake

    results = tmp_path / "results"
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(results))
    artifacts = results / "artifacts"
    artifacts.mkdir(parents=True)
    source = cloud.config.results_dir / "artifacts"
    for built_file in source.glob("trivial_c5a.*"):
        shutil.copy(built_file, artifacts)
    amis = results / "amis.json"
    # The record of images baked, cut short: the bake would fail after CreateImage appending
    # to it, and batch up --from-bake had a JSONDecodeError traceback.
    amis.write_text('[{"image_id": "ami-1", ')
    for argv in (["bake", "--dry-run"], ["batch", "up", "--from-bake"]):
        assert amibake(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"amibake: error: {amis} is damaged (JSONDecodeError: "), err
        assert err.endswith(
            "restore it, or move it away to start a new record of the images baked\n"
        )
    amis.write_text('[{"image_id": "ami-1"}]')  # valid JSON, a field missing
    assert amibake(["batch", "up", "--from-bake"]) == 2
    assert f"{amis} is damaged (KeyError: 'architecture')" in capsys.readouterr().err
    amis.unlink()
    manifest = next(artifacts.glob("*.manifest.json"))
    whole = json.loads(manifest.read_text())
    manifest.write_text("{")
    assert amibake(["bake", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"amibake: error: {manifest} is damaged (JSONDecodeError: "), err
    assert "build the family again (amibake build)" in err
    # The app names paths in root's commands at every boot of the image: no shell words.
    manifest.write_text(json.dumps({**whole, "app": "x;curl${IFS}h|sh"}))
    assert amibake(["bake", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{manifest} is damaged (ValueError: app 'x;curl${{IFS}}h|sh' is not a plain" in err
    assert Journal(results / "journal.sqlite").last_run_id() is None  # no run started


def _baked(image_id: str, cloud: Cloud) -> dict[str, Any]:
    return {"image_id": image_id, "architecture": "x86_64", "region": cloud.config.region,
            "cloud": cloud.config.cloud, "artifacts": {"a.tar": {"app": "trivial"}}}  # fmt: skip


def test_a_record_added_while_older_images_retire_is_kept(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bake --keep` read amis.json, deregistered (slow), then wrote back what it had read: a
    record another bake (or this bake's other architecture) added meanwhile was lost, and its
    image, tagged kept, was never retired, registered or gc'd."""
    amis = tmp_path / "amis.json"
    amis.write_text(json.dumps([_baked("ami-old", cloud), _baked("ami-new", cloud)]))

    def deregister(ec2: Any, image_id: str, snapshots: list[str]) -> None:
        def other_bake_records() -> None:
            with bake.amis_changed(amis) as records:
                records.append(_baked("ami-other", cloud))

        other = threading.Thread(target=other_bake_records)
        other.start()
        other.join(5)  # it records while this bake deregisters

    monkeypatch.setattr(bake, "describe_image", lambda ec2, image_id: {"ImageId": image_id})
    monkeypatch.setattr(bake, "snapshots_of", lambda image: [])
    monkeypatch.setattr(bake, "delete_image", deregister)
    retired = bake.retire_older(cloud, amis, "ami-new", keep=1, launched={})
    assert [r["image_id"] for r in retired] == ["ami-old"]
    deadline = time.monotonic() + 10
    while len(bake.baked(amis)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    records = {r["image_id"]: r for r in bake.baked(amis)}
    assert sorted(records) == ["ami-new", "ami-old", "ami-other"], records
    assert records["ami-old"].get("retired") and not records["ami-other"].get("retired")
    assert not list(tmp_path.glob(".amis.json.*.part"))


def test_bake_keep_leaves_an_image_batch_launches_from(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Retired, the image of a registered compute environment could start no host, and the
    queue's jobs waited RUNNABLE."""
    amis = tmp_path / "amis.json"
    baked = [_baked(i, cloud) for i in ("ami-old", "ami-used", "ami-new")]
    amis.write_text(json.dumps(baked))
    deregistered: list[str] = []
    monkeypatch.setattr(bake, "describe_image", lambda ec2, image_id: {"ImageId": image_id})
    monkeypatch.setattr(bake, "snapshots_of", lambda image: [])
    monkeypatch.setattr(bake, "delete_image", lambda ec2, i, s: deregistered.append(i))
    launched = {"ami-used": "amibake-x86_64-ami-used"}
    retired = bake.retire_older(cloud, amis, "ami-new", keep=1, launched=launched)
    assert [r["image_id"] for r in retired] == deregistered == ["ami-old"]
    assert not {r["image_id"]: r for r in bake.baked(amis)}["ami-used"].get("retired")
    assert "kept ami-used: Batch's compute environment amibake-x86_64-ami-used" in caplog.text


def test_bake_keep_without_leave_to_read_batch_retires_nothing_and_says_why(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An identity holding bake's policy of before (no batch:DescribeComputeEnvironments): the
    bake, paid for, failed after it had made the image."""
    import botocore.exceptions

    from amibake import batch, cli

    def denied(_: Cloud) -> dict[str, str]:
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "AccessDeniedException", "Message": "no"}},
            "DescribeComputeEnvironments",
        )

    monkeypatch.setattr(batch, "images_launched", denied)
    assert cli._batch_images(cloud) is None
    err = capsys.readouterr().err
    assert "--keep retired nothing" in err and "batch:DescribeComputeEnvironments" in err
