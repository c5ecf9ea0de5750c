"""Container workloads (issue 23): `fleet bench` with image = an ECR image and command = "... {args}".
On the local cloud an image built without a Docker daemon is pushed to its ECR and benchmarked
on two types, one x86_64 and one arm64 (Graviton): the variant of the other architecture than
this machine's runs under QEMU, marked emulated. Bad images are refused in one line, exit 2,
before anything is launched or recorded."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from amibake.cloud import Cloud
from amibake.errors import UserError
from fleet import bench, container, spec
from fleet.cli import main
from fleet.report import emulated
from fleet.results import Results
from tests.container import image as test_image
from tests.fleet.test_any_type import own_results
from tests.fleet.test_bench import assert_nothing_left

X86, GRAVITON = "c5a.large", "c7g.large"  # catalog types of each architecture


def native_type() -> str:
    """The type of this machine's architecture (the other runs under QEMU)."""
    return X86 if test_image.host_architecture() == "amd64" else GRAVITON


@pytest.fixture(scope="module")
def ref(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> container.ImageRef:
    found: container.ImageRef = test_image.push_to_ecr(
        cloud, tmp_path_factory.mktemp("image"), "fleet/work"
    )
    return found


@pytest.fixture(scope="module")
def host_only(
    cloud: Cloud, ref: container.ImageRef, tmp_path_factory: pytest.TempPathFactory
) -> container.ImageRef:
    """The same program, this machine's architecture only."""
    layout = test_image.build(tmp_path_factory.mktemp("one"), (test_image.host_architecture(),))
    single = container.ImageRef(ref.account, ref.region, ref.repository, "one-arch")
    container.push(cloud, f"oci:{layout}:{test_image.host_architecture()}", single)
    return single


def image_run(cloud: Cloud, **fields: Any) -> tuple[Results, str]:
    """A bench run of an image recorded (not run): its results and id. No warm-ups."""
    results = bench.results_db(cloud.config.results_dir)
    return results, bench.create(cloud, spec.load(None, {"warmups": 0, **fields}), results)


@pytest.mark.e2e
def test_an_image_is_benchmarked_on_an_x86_and_a_graviton_type(
    cloud: Cloud, ref: container.ImageRef, local_dir: Path, tmp_path: Path
) -> None:
    mine = own_results(cloud, tmp_path / "results")
    run_spec = spec.load(
        None,
        {
            "types": [X86, GRAVITON],
            "image": str(ref),
            "command": "work {args}",
            "args": {"n": 300000},
            "metric": {"kind": "file", "meaning": "rate", "unit": "iterations/s"},
            "replicates": 2,
            "warmups": 0,
            "concurrency": 2,
        },
    )
    results = bench.results_db(mine.config.results_dir)
    run_id = bench.create(mine, run_spec, results)
    summary = bench.execute(mine, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    # Under --faults aws a spot reclaim records a replicate interrupted and runs it again.
    assert set(rows.state) <= {"ok", "interrupted"}
    ok = rows[rows.state == "ok"]
    assert len(ok) == 4 and set(ok.instance_type) == {X86, GRAVITON} and (ok.metric > 0).all()
    facts = {e["instance_type"]: e for e in results.environments(run_id)}
    digest = container.lookup(mine, ref).digest
    host = container.EC2_ARCHITECTURE[test_image.host_architecture()]
    for instance_type, architecture in ((X86, "x86_64"), (GRAVITON, "arm64")):
        image = facts[instance_type]["image"]
        assert image["digest"] == digest and image["pull"].endswith(digest)
        assert image["emulated"] == (architecture != host)
        # The test image has busybox's shell in this machine's variant only.
        assert image["shell"] == (architecture == host)
        assert bool(image["not_measured"]) == (architecture != host)
    native, other = (X86, GRAVITON) if host == "x86_64" else (GRAVITON, X86)
    assert emulated(results, run_id) == {(other, "plain")}  # nothing built, nothing tuned
    del native
    assert_nothing_left(mine, results, run_id, local_dir)


def test_a_resumed_image_run_pulls_the_digest_its_tag_named_when_it_began(
    cloud: Cloud, ref: container.ImageRef, local_dir: Path, tmp_path: Path
) -> None:
    """A resume read the tag again: the tag moved between Ctrl-C and --resume, and the run
    pooled two images' replicates into one median. It pulls the digest recorded at its start."""
    from amibake.runner import Interrupted

    mine = own_results(cloud, tmp_path / "results")
    host = test_image.host_architecture()
    native = native_type()
    layout = test_image.build(tmp_path / "image", (host,))
    moving = container.ImageRef(ref.account, ref.region, ref.repository, "moving")
    container.push(mine, f"oci:{layout}:multi", moving)  # an index of one architecture
    first = container.lookup(mine, moving).digest
    results, run_id = image_run(
        mine,
        types=[native],
        image=str(moving),
        command="work {args}",
        args={"n": 1000},
        metric={"kind": "file", "meaning": "rate", "unit": "iterations/s"},
        replicates=2,
    )

    def ctrl_c_at_the_second(state: object, replicate: object) -> None:
        if getattr(replicate, "index", 0) == 1:
            raise KeyboardInterrupt

    with pytest.raises((Interrupted, KeyboardInterrupt)):
        bench.execute(mine, run_id, results, before_replicate=ctrl_c_at_the_second)
    container.push(mine, f"oci:{layout}:{host}", moving)  # the tag moves: a manifest now
    container._seen.clear()  # a resume is another process: nothing read before is known
    assert container.lookup(mine, moving).digest != first
    container._seen.clear()
    summary = bench.execute(mine, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    pulled = {e["image"]["digest"] for e in results.environments(run_id)}
    assert pulled == {first}, pulled
    assert len(results.replicates(run_id).query("state == 'ok'")) == 2
    assert_nothing_left(mine, results, run_id, local_dir)


def test_a_timed_out_image_replicate_leaves_no_container_beside_the_next(
    cloud: Cloud, host_only: container.ImageRef, local_dir: Path, tmp_path: Path
) -> None:
    """A timeout kills the replicate's process group: the docker client, not its container,
    which is dockerd's. The container ran on beside every later replicate (and the local
    runtime, which keeps the workload in a session of its own, shows it as a Docker host
    does). Each replicate here looks for the one before it still running, then runs past its
    timeout: found, it says value=9 and ends ok."""
    mine = own_results(cloud, tmp_path / "results")
    results, run_id = image_run(
        mine,
        types=[native_type()],
        image=str(host_only),
        # Shell built-ins only: the image's busybox has no applets on its PATH.
        command=(
            'if [ -s pid ] && read p <pid && kill -0 "$p" 2>/dev/null; then echo value=9; '
            "else echo $$ >pid; while :; do :; done; fi"
        ),
        metric="value=(\\d+)",
        timeout_s=1,
        replicates=2,
    )
    bench.execute(mine, run_id, results)
    rows = results.replicates(run_id)
    said = [(r.state, str(r.error).split(";")[0]) for r in rows.itertuples()]
    assert said == [("failed", "timed out after 1s")] * 2, rows[["state", "metric", "error"]]
    assert_nothing_left(mine, results, run_id, local_dir)


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str) -> str:
    """`fleet bench FILE` exits 2 with one line, no run recorded, no instance launched."""
    path = tmp_path / "bench.toml"
    path.write_text(body)
    assert main(["bench", str(path), "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert bench.results_db(tmp_path / "results").run_ids() == []
    return err


def test_an_image_without_the_architecture_of_a_type_is_refused_before_launch(
    cloud: Cloud,
    host_only: container.ImageRef,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    other = GRAVITON if test_image.host_architecture() == "amd64" else X86
    err = _refused(
        tmp_path,
        capsys,
        f'types = ["{other}"]\nimage = "{host_only}"\ncommand = "work"\n',
    )
    assert other in err and "push a multi-architecture image" in err


def test_a_tag_that_does_not_exist_is_refused_naming_the_tags(
    cloud: Cloud,
    ref: container.ImageRef,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    missing = container.ImageRef(ref.account, ref.region, ref.repository, "nope")
    err = _refused(tmp_path, capsys, f'types = ["{X86}"]\nimage = "{missing}"\ncommand = "work"\n')
    assert "has no tag 'nope'" in err and "v1" in err


def test_a_gpu_type_without_gpus_requested_is_refused(
    cloud: Cloud,
    ref: container.ImageRef,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    body = f'types = ["g5.xlarge"]\nimage = "{ref}"\ncommand = "work"\nallow_missing_price = true\n'
    err = _refused(tmp_path, capsys, body)
    assert "g5.xlarge has GPUs" in err and "gpus = N" in err
    # More GPUs than the type carries: Batch never places the job, docker run --gpus fails.
    err = _refused(tmp_path, capsys, body + "gpus = 8\n")
    assert "g5.xlarge has 1 GPU (1 x NVIDIA A10G" in err and "ask for at most 1" in err


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ('image = "app:latest"\ncommand = "work"', "is not an ECR image reference"),
        (
            'image = "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/app:v1"\ncommand = "w"',
            "is an ECR image of AWS's China partition",  # it was read as us-east-1's "app"
        ),
        ('image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/app"', "needs command"),
        ('command = "work"\ngpus = 1', "GPUs are given to an image's container"),
    ],
)
def test_a_bad_image_entry_is_one_line_with_its_fix(
    extra: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.toml"
    path.write_text(f'types = ["{X86}"]\n{extra}\n')
    with pytest.raises(UserError) as caught:
        spec.load(path, {})
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.e2e
def test_the_monitor_samples_the_workload_inside_an_image_with_a_shell(
    cloud: Cloud, ref: container.ImageRef, local_dir: Path, tmp_path: Path
) -> None:
    mine = own_results(cloud, tmp_path / "results")
    results, run_id = image_run(
        mine,
        types=[native_type()],
        image=str(ref),
        # A shell line (&&): this machine's variant has busybox's sh. Busy for 3 s whatever
        # the host's speed (a count of 600M iterations once fit in one second's sample), so
        # the 1 Hz monitor samples it more than once.
        command="work {args} && echo done-in-shell",
        args={"seconds": 3},
        metric={"kind": "regex", "pattern": "rate=([0-9.]+)", "meaning": "rate"},
        replicates=1,
    )
    summary = bench.execute(mine, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    row = rows[rows.state == "ok"].iloc[0]  # (one interrupted before it under --faults aws)
    assert row.state == "ok" and row.metric > 0
    assert row.monitor_samples >= 1 and row.rss_max_mb > 0
    # The tree it watched is the workload's: busy (sudo and sh around it sleep at 0%; on shared
    # two-core machines the busy loop has measured 25-99% of a core, by the load beside it). The
    # loop is born after the monitor's first look, so this fails if a new process's first sample
    # reads 0.0 (it did once in CI, where the run fit in one sample).
    with open(row.monitor_csv) as handle:
        busy = [float(r["tree_cpu_percent"]) for r in csv.DictReader(handle)]
    assert max(busy) > 5, busy
    image = results.environments(run_id)[0]["image"]
    assert image["shell"] and not image["emulated"] and image["not_measured"] == []
    assert_nothing_left(mine, results, run_id, local_dir)


def test_a_push_hands_skopeo_the_token_in_a_file_only_this_user_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ECR's token is a 12-hour password to the registry: it was on skopeo's command line,
    which every user of the machine reads in /proc/PID/cmdline."""
    import base64
    import json
    import os
    import subprocess

    secret = "the-registry-password"
    seen: dict[str, object] = {}

    def skopeo(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        authfile = Path(argv[argv.index("--dest-authfile") + 1])
        seen["argv"], seen["mode"] = argv, authfile.stat().st_mode & 0o777
        seen["auths"], seen["file"] = json.loads(authfile.read_text())["auths"], authfile
        return subprocess.CompletedProcess(argv, 0, "", "")

    login = container.Login("registry.example:5000", "AWS", secret, False)
    monkeypatch.setattr(container, "login", lambda cloud, ref: login)
    monkeypatch.setattr(container.shutil, "which", lambda name: "/usr/bin/skopeo")
    monkeypatch.setattr(container.subprocess, "run", skopeo)
    ref = container.ImageRef.parse("123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1")
    container.push(object(), "oci:/layout:multi", ref)  # type: ignore[arg-type]
    assert not any(secret in word for word in seen["argv"]), seen["argv"]  # type: ignore[attr-defined]
    assert seen["mode"] == 0o600
    token = base64.b64encode(f"AWS:{secret}".encode()).decode()
    assert seen["auths"] == {"registry.example:5000": {"auth": token}}
    assert not os.path.exists(seen["file"])  # type: ignore[arg-type]
