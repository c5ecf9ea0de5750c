"""`amibake build` on the local cloud: the artifact, the cache, and nothing left behind when a
run is killed at any step."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from amibake import pipelines, runner
from amibake.cloud import Cloud
from amibake.journal import Journal
from amibake.runner import Interrupted
from amibake.sources import sha256_of
from tests.helpers import tagged_alive, wait_until_clean

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


def test_kernels_build_for_this_machine_family(cloud: Cloud, local_dir: Path) -> None:
    outcome = pipelines.build(
        cloud, request(recipe="kernels", recipes_dir=pipelines.recipes.RECIPES_DIR)
    )[0]
    assert outcome.ok, outcome.error
    state = outcome.state
    assert state is not None and state.artifact is not None
    assert state.artifact.name == "kernels_c5a.tar.xz"
    manifest = json.loads(state.artifact.with_name("kernels_c5a.manifest.json").read_text())
    assert manifest["target"] == "zen2"
    assert "-march=znver2" in manifest["cflags"]
    assert manifest["compiler"].startswith("gcc@")
    assert manifest["smoke"] == "passed"  # this machine runs zen2 code
    with tarfile.open(state.artifact) as tar:
        names = set(tar.getnames())
        inner = json.loads(tar.extractfile("./manifest.json").read())  # type: ignore[union-attr]
    assert {"./bin/kernels", "./manifest.json"} <= names
    assert inner["files"] == manifest["files"]
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
        while journal.last_run_id() == before and time.monotonic() < deadline:
            time.sleep(0.1)  # preflight done, the run opened: it is at the cache step
        time.sleep(0.5)
        still_waiting = not waiting.done()
        asked = runner.cancel_all()
        try:
            outcomes = waiting.result(timeout=30)
        except Interrupted:
            outcomes = []
    finally:  # released before the pool is joined, so a failed assertion cannot hang here
        held.close()
        pool.shutdown(wait=True)
    assert still_waiting and asked == 1
    assert all(not o.ok and "interrupted" in o.error for o in outcomes), outcomes
    assert journal.alive(journal.last_run_id() or "") == []  # it created nothing


def test_an_avx512_family_builds_and_reports_the_skipped_smoke_test(cloud: Cloud) -> None:
    outcome = pipelines.build(cloud, request(families=["c7i"]))[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None
    assert outcome.state.flags is not None and outcome.state.flags.target == "sapphirerapids"
    # This machine (zen2) cannot run Sapphire Rapids code: reported, not failed.
    assert outcome.state.smoke.startswith("skipped: this host's CPU cannot run sapphirerapids")


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


def test_keep_on_error_keeps_the_instance_and_gc_removes_it(cloud: Cloud, local_dir: Path) -> None:
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
    leftovers = gc.find(cloud, journal(cloud), run_id=run_id)
    assert {x.kind for x in leftovers} >= {"instance", "key-pair", "security-group"}
    assert gc.delete(cloud, journal(cloud), leftovers) == []
    assert_nothing_left(cloud, run_id, local_dir)


def test_a_graviton_family_builds_and_its_isa_scan_reads_arm64(cloud: Cloud) -> None:
    # Every local instance runs on this machine's CPU: arm64 builds go through the cross gcc.
    outcome = pipelines.build(
        cloud,
        request(families=["c7g"], recipe="kernels", recipes_dir=pipelines.recipes.RECIPES_DIR),
    )[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None and outcome.state.cc == "aarch64-linux-gnu-gcc"
    assert "-mcpu=neoverse-v1" in outcome.state.manifest["cflags"]
    assert outcome.state.isa_features == ["sve"]  # neoverse-v1 has SVE, and the scan saw it
    # The smoke test names the cross build, not x86's lack of arm64 features.
    assert outcome.state.smoke == (
        "skipped: cross-compiled with aarch64-linux-gnu-gcc; this host cannot run neoverse_v1"
    )


def test_instructions_beyond_the_target_fail_the_isa_scan(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    source = root / "trivial" / "src" / "hello.c"
    # A vector loop that -mavx512f turns into zmm code; zen2 (c5a) has no AVX-512.
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
    assert "ISA scan" in outcome.error and "avx512f, beyond target zen2" in outcome.error
    run_id = journal(cloud).last_run_id()
    assert run_id is not None
    assert_nothing_left(cloud, run_id, local_dir)


def test_the_tmpfs_is_capped_by_the_recipe_and_a_missing_artifact_is_named(
    cloud: Cloud, local_dir: Path, tmp_path: Path
) -> None:
    import shutil

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
