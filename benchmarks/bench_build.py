"""Issue 3's figures: what family tuning buys, and what the build tool itself costs."""

from __future__ import annotations

import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from amibake import catalog, flags, pipelines, recipes
from amibake.cloud import Cloud
from amibake.remote import Remote
from benchmarks import host_family

KERNEL_LINE = re.compile(r"kernel=(\w+) checksum=(\S+) seconds=\S+ throughput=([0-9.]+)")
PAIRS = 5
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "recipes"
EIGHT = ["c5", "c5a", "c6i", "c6a", "c7i", "c7a", "m5", "m7i"]


def _run_kernels(binary: Path) -> dict[str, tuple[str, float]]:
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {m[0]: (m[1], float(m[2])) for m in KERNEL_LINE.findall(out)}


def tuned_vs_generic() -> dict[str, Any]:
    family = catalog.family(host_family())
    compiler = flags.Compiler(
        "gcc",
        subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.strip(),
    )
    recipe = recipes.load("kernels")
    tuned = flags.for_family(family, compiler).cflags
    baseline = flags.for_build(family, compiler, generic=True).cflags
    label = f"family {family.name} ({flags.family_target(family).name})"
    source = recipe.source_path
    assert source is not None
    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for name, cflags in (("generic", f"-O2 {baseline}"), ("tuned", f"-O3 {tuned}")):
            binary = Path(tmp) / name
            command = (
                f"gcc {cflags} -ffp-contract=off -fopenmp -o {binary} {source / 'kernels.c'} -lm"
            )
            subprocess.run(command.split(), check=True)
            builds[name] = binary
        runs: dict[str, list[dict[str, tuple[str, float]]]] = {"generic": [], "tuned": []}
        for _ in range(PAIRS):  # alternate, so machine drift hits both alike
            for name, binary in builds.items():
                runs[name].append(_run_kernels(binary))
    kernels = sorted(runs["generic"][0])
    ratios = {}
    checksums_match = True
    for kernel in kernels:
        generic = statistics.median(r[kernel][1] for r in runs["generic"])
        tuned_speed = statistics.median(r[kernel][1] for r in runs["tuned"])
        ratios[kernel] = round(tuned_speed / generic, 3)
        sums = {r[kernel][0] for name in runs for r in runs[name]}
        checksums_match = checksums_match and len(sums) == 1
    geomean = math.exp(statistics.mean(math.log(r) for r in ratios.values()))
    return {
        "tuned_for": label,
        "tuned_flags": f"-O3 {tuned}",
        "generic_flags": f"-O2 {baseline}",
        "per_kernel_speedup": ratios,
        "geomean_speedup": round(geomean, 3),
        "goal": 1.4,
        "goal_met": geomean >= 1.4 and checksums_match,
        "checksums_identical": checksums_match,
        "pairs": PAIRS,
    }


def _count_calls(cloud: Cloud) -> tuple[dict[str, int], Any]:
    """Count EC2/SSM/STS API calls (botocore events) and SSH commands; returns the undo."""
    counts = {"api": 0, "ssh": 0}

    def count_api(**_: Any) -> None:
        counts["api"] += 1

    for service in ("ec2", "ssm", "sts"):
        cloud.client(service).meta.events.register("before-call.*.*", count_api)
    original = Remote.run

    def counted(self: Remote, *args: Any, **kw: Any) -> Any:
        counts["ssh"] += 1
        return original(self, *args, **kw)

    Remote.run = counted  # type: ignore[method-assign]

    def restore() -> None:
        Remote.run = original  # type: ignore[method-assign]

    return counts, restore


def build_overhead(cloud: Cloud) -> dict[str, Any]:
    counts, restore = _count_calls(cloud)
    artifacts = cloud.config.results_dir / "artifacts"
    overheads, walls, api, ssh = [], [], [], []
    try:
        for _ in range(5):
            for stale in artifacts.glob("trivial_*"):
                stale.unlink()
            counts.update(api=0, ssh=0)
            request = pipelines.BuildRequest(
                [host_family()], "trivial", "large", recipes_dir=FIXTURES
            )
            started = time.perf_counter()
            outcome = pipelines.build(cloud, request)[0]
            wall = time.perf_counter() - started
            assert outcome.ok and outcome.state is not None, outcome.error
            walls.append(wall)
            overheads.append(wall - outcome.state.remote_seconds)
            api.append(counts["api"])
            ssh.append(counts["ssh"])
        one = statistics.median(walls)
        for stale in artifacts.glob("trivial_*"):
            stale.unlink()
        request = pipelines.BuildRequest(EIGHT, "trivial", "large", recipes_dir=FIXTURES)
        started = time.perf_counter()
        outcomes = pipelines.build(cloud, request)
        eight = time.perf_counter() - started
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        waiting = _waiting_recipe()
        try:
            # Three pairs, the ratio's median: one pair ranged 1.58-1.88 between runs here.
            pairs = [
                (_timed_build(cloud, [host_family()], waiting), _timed_build(cloud, EIGHT, waiting))
                for _ in range(3)
            ]
            one_run, eight_run = sorted(pairs, key=lambda p: p[1].wall / p[0].wall)[1]
            one_waiting, eight_waiting = one_run.wall, eight_run.wall
        finally:
            shutil.rmtree(waiting, ignore_errors=True)
        for stale in artifacts.glob("trivial_*"):
            stale.unlink()
        request = pipelines.BuildRequest([host_family()], "trivial", "large", recipes_dir=FIXTURES)
        pipelines.build(cloud, request)
        hit_start = time.perf_counter()
        hit = pipelines.build(cloud, request)[0]
        cache_hit_s = time.perf_counter() - hit_start
        assert hit.state is not None and hit.state.cache_hit
    finally:
        restore()
    return {
        "overhead_per_build_median_s": round(statistics.median(overheads), 3),
        "overhead_goal_s": 3.0,
        "overhead_goal_met": statistics.median(overheads) < 3.0,
        "build_wall_median_s": round(one, 3),
        "api_calls_per_build": int(statistics.median(api)),
        "ssh_commands_per_build": int(statistics.median(ssh)),
        # Every local "instance" shares this machine's 2 cores, so eight trivial builds contend
        # for CPU (gcc, sshd, xz, moto): this ratio measures the machine, not the tool.
        "eight_families_cpu_bound_wall_s": round(eight, 3),
        "eight_over_one_cpu_bound_ratio": round(eight / one, 3),
        # A remote build that waits 2 s (as a compile on the instance's own CPU does on AWS):
        # this ratio is the tool's own concurrency.
        "eight_families_waiting_wall_s": round(eight_waiting, 3),
        "eight_over_one_waiting_ratio": round(eight_waiting / one_waiting, 3),
        "eight_goal_ratio": 1.5,
        "eight_goal_met": eight_waiting / one_waiting <= 1.5,
        # Where the eight's time goes: CPU-seconds used on the whole machine (sandboxes, the
        # local cloud's daemon, this controller) against the 2 cores' capacity over the wall.
        "eight_waiting_machine_cpu_s": round(eight_run.machine_cpu, 2),
        "eight_waiting_controller_cpu_s": round(eight_run.controller_cpu, 2),
        "eight_waiting_machine_capacity_cpu_s": round(eight_waiting * (os.cpu_count() or 1), 2),
        "cache_hit_s": round(cache_hit_s, 3),
        "cache_hit_goal_s": 1.0,
    }


def _waiting_recipe() -> Path:
    """The trivial recipe whose build also waits 2 s, standing in for a remote compile."""
    root = Path(tempfile.mkdtemp(prefix="amibake-bench-recipes-"))
    shutil.copytree(FIXTURES / "trivial", root / "trivial")
    template = root / "trivial" / "build.sh.j2"
    template.write_text(
        template.read_text().replace("cd {{ src_dir }}", "cd {{ src_dir }}\nsleep 2")
    )
    return root


@dataclass
class Timed:
    wall: float
    machine_cpu: float  # every process's
    controller_cpu: float  # this process's own (the controller: steps, boto3, paramiko)


def _machine_cpu_s() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


def _own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def _timed_build(cloud: Cloud, families: list[str], recipes_dir: Path) -> Timed:
    for stale in (cloud.config.results_dir / "artifacts").glob("trivial_*"):
        stale.unlink()
    request = pipelines.BuildRequest(families, "trivial", "large", recipes_dir=recipes_dir)
    machine, own, started = _machine_cpu_s(), _own_cpu_s(), time.perf_counter()
    outcomes = pipelines.build(cloud, request)
    wall = time.perf_counter() - started
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    return Timed(wall, _machine_cpu_s() - machine, _own_cpu_s() - own)


def run(cloud: Cloud) -> dict[str, Any]:
    return {**tuned_vs_generic(), **build_overhead(cloud)}
