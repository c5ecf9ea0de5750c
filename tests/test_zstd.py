"""The real zstd release, built with family flags on the local cloud (about 40 s here), and
benchmarked by fleet with its recipe's own [bench] command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amibake import catalog, flags, pipelines, recipes, sources
from amibake.cloud import Cloud
from amibake.errors import UserError
from amibake.steps.state import Variant
from fleet import bench, spec


def test_zstd_builds_with_the_family_flags_and_round_trips(
    cloud: Cloud, local_dir: Path, host_family: str
) -> None:
    try:
        source = sources.resolve(recipes.load("zstd"))
    except UserError as exc:
        pytest.skip(f"zstd source not in the cache, so zstd is not built here: {exc}")
    outcome = pipelines.build(
        cloud,
        pipelines.BuildRequest([host_family], "zstd", "large", recipes_dir=recipes.RECIPES_DIR),
    )[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None and outcome.state.artifact is not None
    sidecar = outcome.state.artifact.with_name(f"zstd_{host_family}.manifest.json")
    manifest = json.loads(sidecar.read_text())
    assert manifest["source_sha256"] == source.sha256
    compiler = flags.Compiler.parse(manifest["compiler"])
    assert flags.for_family(catalog.family(host_family), compiler).cflags in manifest["cflags"]
    assert list(manifest["files"]) == ["bin/zstd"]
    assert manifest["smoke"] == "passed"  # a 4 MiB round trip through the built binary
    # What zstd uses only behind its own CPU check is not asked of the CPU that runs it.
    assert manifest["isa_dispatched"] == ["bmi1", "bmi2", "abm"]


def test_a_generic_zstd_build_runs_where_its_dispatched_instructions_do_not(
    cloud: Cloud, host_family: str
) -> None:
    # zstd's generic x86-64 build holds BMI2 code it runs only after asking the CPU: the scan
    # finds it, the recipe says so, and the build is not refused for it (beyond its target).
    try:
        sources.resolve(recipes.load("zstd"))
    except UserError as exc:
        pytest.skip(f"zstd source not in the cache, so zstd is not built here: {exc}")
    generic = Variant(name="generic", generic=True)
    outcome = pipelines.build(
        cloud,
        pipelines.BuildRequest(
            [host_family], "zstd", "large", recipes_dir=recipes.RECIPES_DIR, variant=generic
        ),
    )[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None
    assert outcome.state.manifest["target_used"] in ("x86_64", "aarch64")
    assert outcome.state.manifest["smoke"] == "passed"


def test_fleet_benchmarks_zstd_with_its_recipes_parameters(cloud: Cloud, host_family: str) -> None:
    # The recipe's command is `bin/zstd -b{level} -i{seconds}`: with its placeholders left as
    # they were, zstd printed its usage and every replicate failed.
    try:
        sources.resolve(recipes.load("zstd"))
    except UserError as exc:
        pytest.skip(f"zstd source not in the cache, so zstd is not benchmarked here: {exc}")
    bench_spec = spec.load(
        None, {"types": [f"{host_family}.large"], "recipe": "zstd", "replicates": 1, "warmups": 0}
    )
    assert bench_spec.command_line() == "bin/zstd -b3 -i2"  # the recipe's defaults
    results = bench.results_db(cloud.config.results_dir)
    run_id = bench.create(cloud, bench_spec, results)
    summary = bench.execute(cloud, run_id, results)
    rows = results.replicates(run_id)
    assert list(rows.state) == ["ok"], (summary, list(rows.get("error", [])))
    assert rows.metric[0] > 1  # MB/s compressed at level 3, read from zstd's own report
